# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks of a workspace before a box is made from it: each refusal comes before any side effect
and says what to do.

A path Docker or git cannot carry, a bare repository, a repository half-way through a merge or a
rebase, and an invalid agentbox.yaml are all refused here, so a create never fails (or, worse,
succeeds with a plain copy) half-way through.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import stat
import sys
from types import ModuleType
from typing import Any

from ._naming import NameError_

PROJECT_FILE = "agentbox.yaml"
# The in-box supervisor's own file: its validator is the one the box will run, so create uses it too.
# From this file's directory up to the collection's: one ".." per part of the name after "plugins".
_UP = [".."] * len(__name__.rpartition(".plugins.")[2].split("."))
_CTL = os.path.join(os.path.dirname(__file__), *_UP, "roles", "inbox_supervisor", "files", "agentbox-ctl")
_ctl_module: ModuleType | None = None

# What a repository in the middle of an operation leaves in its git directory, and what to do.
_IN_PROGRESS = (
    ("rebase-merge", "a rebase", "git rebase --continue", "git rebase --abort"),
    ("rebase-apply/applying", "a git am", "git am --continue", "git am --abort"),
    ("rebase-apply", "a rebase", "git rebase --continue", "git rebase --abort"),
    ("MERGE_HEAD", "a merge", "git commit", "git merge --abort"),
    ("CHERRY_PICK_HEAD", "a cherry-pick", "git cherry-pick --continue", "git cherry-pick --abort"),
    ("REVERT_HEAD", "a revert", "git revert --continue", "git revert --abort"),
)


class PreflightError(NameError_):
    """The workspace cannot become a box as it is; the message says what to do."""


def check_workspace_path(path: str) -> None:
    """Refuse paths that Docker's bind-mount syntax or git's line-based output would cut apart."""
    if ":" in path:
        raise PreflightError(
            f"workspace path {path!r} contains ':', which Docker cannot bind-mount (it separates the parts of a "
            "volume); move or clone the repository to a path without ':' and pass that"
        )
    if any(char in path for char in "\n\r\0"):
        raise PreflightError(
            f"workspace path {path!r} contains a line break; move or clone the repository to a path without one"
        )


def check_not_bare(workspace: str) -> None:
    """A bare repository (or a .git directory itself) has no working tree to give a box."""
    if os.path.exists(os.path.join(workspace, ".git")):
        return
    looks_like_git_dir = all(os.path.exists(os.path.join(workspace, entry)) for entry in ("HEAD", "objects", "refs"))
    if looks_like_git_dir:
        raise PreflightError(
            f"workspace {workspace!r} is a bare git repository (or a .git directory), which has no working tree: "
            f"clone it (git clone {workspace} DIR) or add a worktree (git -C {workspace} worktree add DIR) "
            "and pass DIR as the workspace"
        )


def _git_dir(root: str) -> str | None:
    """The repository's own git directory, read from `.git` without running git."""
    dot_git = os.path.join(root, ".git")
    if os.path.isdir(dot_git):
        return dot_git
    try:
        with open(dot_git, encoding="utf-8") as handle:
            first = handle.readline().strip()
    except OSError:
        return None
    if not first.startswith("gitdir:"):
        return None
    target = first.removeprefix("gitdir:").strip()
    return target if os.path.isabs(target) else os.path.join(root, target)


def check_no_operation_in_progress(roots: list[str]) -> None:
    """Refuse a repository half-way through a merge, rebase, am, cherry-pick or revert."""
    for root in roots:
        git_dir = _git_dir(root)
        if git_dir is None:
            continue
        for marker, what, finish, abort in _IN_PROGRESS:
            if os.path.exists(os.path.join(git_dir, marker)):
                raise PreflightError(
                    f"the repository at {root} is in the middle of {what}: finish it ({finish}) or abort it "
                    f"({abort}), then create the box"
                )


def _ctl() -> ModuleType | None:
    """agentbox-ctl loaded as a module (None where the collection's roles are not installed)."""
    global _ctl_module
    if _ctl_module is None and os.path.isfile(_CTL):
        loader = importlib.machinery.SourceFileLoader("agentbox_ctl_validator", _CTL)
        spec = importlib.util.spec_from_loader(loader.name, loader)
        if spec is None:
            return None
        module = importlib.util.module_from_spec(spec)
        sys.modules[loader.name] = module  # its dataclasses look their module up while it executes
        loader.exec_module(module)
        _ctl_module = module
    return _ctl_module


_parsed: dict[tuple[str, int, int, int], Any] = {}  # one parse per file as it is: a create reads it twice


def _project_config(workspace: str) -> Any:
    """The workspace's agentbox.yaml as the supervisor's validator reads it (None: no file, or no validator
    here); an invalid file raises PreflightError with every problem at once."""
    path = os.path.join(workspace, PROJECT_FILE)
    try:
        found = os.stat(path)
    except OSError:
        return None
    ctl = _ctl()
    if ctl is None or not stat.S_ISREG(found.st_mode):
        return None  # not a file, or away from the collection's roles: the box's supervisor reports the file
    key = (path, found.st_ino, found.st_size, found.st_mtime_ns)
    if key not in _parsed:
        _parsed.clear()
        _parsed[key] = ctl.load_config_file(path)
    config, issues = _parsed[key]
    if config is None:
        errors = sum(1 for issue in issues if issue.severity == "error")
        raise PreflightError(
            f"{path} is invalid ({errors} error{'s' if errors != 1 else ''}); fix it (check it with "
            "agentbox-ctl validate) and create the box again:\n" + "\n".join(issue.render(path) for issue in issues)
        )
    return config


def check_project_file(workspace: str) -> None:
    """Validate the workspace's agentbox.yaml with the supervisor's validator; every problem at once."""
    _project_config(workspace)


def project_egress(workspace: str) -> dict[str, Any]:
    """The egress keys of the workspace's agentbox.yaml, as the supervisor's parser reads them:
    {"egress": word, "egress_allow": [entries], "lines": {key: line}, "allow_lines": [line per entry]},
    only the keys the file has ({} without a file). An invalid file is refused as check_project_file does."""
    config = _project_config(workspace)
    if config is None:
        return {}
    found: dict[str, Any] = {key: getattr(config, key) for key in ("egress", "egress_allow") if key in config.egress_lines}
    if found:
        found.update(lines=dict(config.egress_lines), allow_lines=list(config.egress_allow_lines),
                     path=os.path.join(workspace, PROJECT_FILE))
    return found


def project_text_issues(text: str, path: str) -> tuple[bool, list[str]] | None:
    """The supervisor's validator on `text` as the agentbox.yaml at `path`, before anything is written:
    (valid, every issue as `<file>:<line>: <severity>: ...`); None where the collection's roles are not installed."""
    ctl = _ctl()
    if ctl is None:
        return None
    config, issues = ctl.parse_config(text, path)
    return config is not None, [issue.render(path) for issue in issues]
