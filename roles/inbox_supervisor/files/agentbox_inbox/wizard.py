# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""`agentbox-ctl init`: the set-up wizard of `playbooks/init.yml`, run in the box on its own /workspace.

The inspection and the rendered file are the host's own code, not a copy: the collection's
plugins/module_utils/project (`_project_scan`, `_project_plan`), which the box image installs as the package
`agentbox_project` beside this one (/usr/local/lib/agentbox/agentbox_project), and which a checkout holds at
plugins/module_utils/project. The text is checked with this package's validator (`agentbox-ctl validate`)
before it is written. Everything happens in the box and is written only into the box's workspace: no host
relay is asked, and the host treats the file as any other file of the box's (checked when it reads it).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import os
import sys
import tempfile
from types import ModuleType
from typing import Any

from .common import DEFAULT_CONFIG, EXIT_FAILED, EXIT_OK
from .config import parse_config

PROJECT_PACKAGE = "agentbox_project"
READ_LIMIT = 4 << 20  # of an existing agentbox.yaml, compared with the new text (a few KiB)
_HERE = os.path.dirname(os.path.abspath(__file__))
# Where the project code is: beside this package (the image, the role), else in the checkout holding it.
PROJECT_DIRS = (
    os.path.join(os.path.dirname(_HERE), PROJECT_PACKAGE),
    os.path.join(_HERE, os.pardir, os.pardir, os.pardir, os.pardir, "plugins", "module_utils", "project"),
)


def project_modules() -> tuple[ModuleType, ModuleType]:
    """The host's `_project_scan` and `_project_plan`, imported as the package agentbox_project."""
    wrote, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in the image or a checkout
    try:
        if PROJECT_PACKAGE not in sys.modules:
            folder = next((os.path.normpath(d) for d in PROJECT_DIRS
                           if os.path.isfile(os.path.join(d, "_project_scan.py"))), None)
            if folder is None:
                raise FileNotFoundError(f"the set-up wizard's code ({PROJECT_PACKAGE}) is not in "
                                        f"{os.path.normpath(PROJECT_DIRS[0])}: this box's image is older than "
                                        "agentbox-ctl init; rebuild it (ansible-playbook playbooks/build_image.yml)")
            spec = importlib.util.spec_from_file_location(PROJECT_PACKAGE, os.path.join(folder, "__init__.py"),
                                                          submodule_search_locations=[folder])
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {PROJECT_PACKAGE} from {folder}")
            package = importlib.util.module_from_spec(spec)
            sys.modules[PROJECT_PACKAGE] = package
            spec.loader.exec_module(package)
        return (importlib.import_module(f"{PROJECT_PACKAGE}._project_scan"),
                importlib.import_module(f"{PROJECT_PACKAGE}._project_plan"))
    finally:
        sys.dont_write_bytecode = wrote


def default_workspace() -> str:
    return os.path.dirname(os.environ.get("AGENTBOX_CONFIG", DEFAULT_CONFIG))


def _fail(message: str) -> int:
    sys.stderr.write(f"agentbox-ctl init: {message}\n")
    return EXIT_FAILED


def _read(path: str) -> str | None:
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path):
        return ""  # a link to nowhere, a directory, a pipe: there, and not ours to replace without --force
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(READ_LIMIT)
    except OSError:
        return ""


def _write(path: str, text: str) -> None:
    """Whole or not at all (a rename); as root, owned like the workspace, so the box user can edit it."""
    folder = os.path.dirname(path)
    descriptor, temporary = tempfile.mkstemp(prefix=".agentbox.yaml.", dir=folder)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            os.fchmod(handle.fileno(), 0o644)
            if os.geteuid() == 0:
                owner = os.stat(folder)
                os.fchown(handle.fileno(), owner.st_uid, owner.st_gid)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def cmd_init(args: argparse.Namespace) -> int:
    workspace = os.path.abspath(args.workspace or default_workspace())
    if not os.path.isdir(workspace):
        return _fail(f"{workspace} is not a directory: run it in a box (its /workspace) or pass --workspace DIR")
    try:
        scan, plan_module = project_modules()
    except (OSError, ImportError) as exc:
        return _fail(str(exc))
    path = os.path.join(workspace, plan_module.PROJECT_FILE)
    plan = scan.scan_workspace(workspace)
    text = plan_module.render(plan)
    config, issues = parse_config(text, path)
    if config is None:  # the wizard's own mistake: never write a file no box would run
        return _fail(f"the proposed {path} is invalid, nothing written (please report it):\n"
                     + "\n".join(issue.render(path) for issue in issues))
    old = _read(path)
    if old == text:
        print(f"{path} is already what init would write: nothing changed")
        return EXIT_OK
    if old is not None and not args.force:
        return _fail(f"{path} exists; nothing written: pass --force to replace it "
                     "(--dry-run --diff --force shows what would change)")
    if args.diff:
        sys.stdout.writelines(difflib.unified_diff((old or "").splitlines(keepends=True), text.splitlines(keepends=True),
                                                   path if old is not None else "/dev/null", path))
    elif args.dry_run:
        sys.stdout.write(text)
    if args.dry_run:
        print(f"{path}: nothing written (--dry-run)")
    else:
        _write(path, text)
        print(f"wrote {path}" + (f": {'; '.join(plan.found)}" if plan.found else ""))
    if plan.tests:
        print(f"tests: {' ; '.join(plan.tests)}")
    left = plan_module.fill_in(plan)
    if left:
        print(f"fill in: {left}")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """`agentbox-ctl init` on the command line's subcommands."""
    p = sub.add_parser("init", help="write /workspace/agentbox.yaml from what the workspace holds (the set-up wizard)")
    p.add_argument("--workspace", help="the project's directory (default: /workspace)")
    p.add_argument("--force", action="store_true", help="replace an existing agentbox.yaml")
    p.add_argument("--dry-run", action="store_true", help="write nothing; print the file (or, with --diff, the change)")
    p.add_argument("--diff", action="store_true", help="print the change as a unified diff")
    p.set_defaults(func=cmd_init)
