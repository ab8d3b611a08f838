"""`agentbox-ctl init`, the set-up wizard in the box, run here from the checkout as the box runs it
(`python3 -I agentbox-ctl`): the same inspection and file as init.yml's module (the host's own
module_utils/project, imported as agentbox_project), an existing file kept unless --force, --dry-run and
--diff writing nothing, a workspace it cannot classify getting the minimal file and what to fill in, an
image without the wizard's code saying to rebuild it, and the box_image role handing the image's build that code
(module_utils/project as agentbox_project, byte for byte). tests/integration/inbox/test_ctl_init_in_box.py runs it
in a real box."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import yaml
from ansible.template import trust_as_template

from ansible_collections.agentbox.box.plugins.module_utils.tasks._init_task import run_init_task
from tests.conftest import REPO
from tests.unit.support.templating import render

FILES = REPO / "roles" / "inbox_supervisor" / "files"
PROJECT = REPO / "plugins" / "module_utils" / "project"
PYTHON_APP = {
    "pyproject.toml": '[project]\nname = "shop"\nversion = "1"\n[project.optional-dependencies]\ntest = ["pytest"]\n',
    "app.py": "from flask import Flask\napp = Flask(__name__)\n",
}


def ctl(*args: str, ctl_path: Path = FILES / "agentbox-ctl") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ctl_path), *args], env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def project(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_init_writes_what_init_yml_writes_and_leaves_no_bytecode(tmp_path: Path) -> None:
    root = project(tmp_path / "shop", PYTHON_APP)
    before = set(PROJECT.rglob("__pycache__")) | set(FILES.rglob("__pycache__"))
    done = ctl("init", "--workspace", str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    written = (root / "agentbox.yaml").read_text()
    host, _warnings = run_init_task({"workspace": str(root), "force": True}, check_mode=True)
    assert written == host["content"]  # one inspection, one renderer: the host's
    assert "flask --app app:app run" in written and "pip install -q -e '.[test]'" in written
    assert done.stdout.splitlines()[0] == f"wrote {root}/agentbox.yaml: {'; '.join(host['found'])}"
    assert "tests: .venv/bin/python -m pytest" in done.stdout and "fill in" not in done.stdout
    assert oct((root / "agentbox.yaml").stat().st_mode & 0o777) == "0o644"
    valid = ctl("validate", "--json", str(root / "agentbox.yaml"))
    assert json.loads(valid.stdout)["valid"] is True
    assert set(PROJECT.rglob("__pycache__")) | set(FILES.rglob("__pycache__")) == before
    again = ctl("init", "--workspace", str(root))  # the same text: nothing to do
    assert again.returncode == 0 and "nothing changed" in again.stdout


def test_an_existing_file_is_kept_unless_forced_and_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = project(tmp_path / "shop", {**PYTHON_APP, "agentbox.yaml": "services: {}\n"})
    refused = ctl("init", "--workspace", str(root))
    assert refused.returncode == 1
    assert refused.stderr == (f"agentbox-ctl init: {root}/agentbox.yaml exists; nothing written: pass --force to "
                              "replace it (--dry-run --diff --force shows what would change)\n")
    assert (root / "agentbox.yaml").read_text() == "services: {}\n"
    shown = ctl("init", "--workspace", str(root), "--force", "--dry-run", "--diff")
    assert shown.returncode == 0, shown.stderr
    assert f"--- {root}/agentbox.yaml\n+++ {root}/agentbox.yaml\n" in shown.stdout
    assert "-services: {}\n" in shown.stdout and "+  web:\n" in shown.stdout
    assert "nothing written (--dry-run)" in shown.stdout
    assert (root / "agentbox.yaml").read_text() == "services: {}\n"
    printed = ctl("init", "--workspace", str(root), "--force", "--dry-run")
    assert printed.stdout.startswith("# agentbox.yaml: what every box of this project installs and runs.")
    assert (root / "agentbox.yaml").read_text() == "services: {}\n"
    forced = ctl("init", "--workspace", str(root), "--force", "--diff")
    assert forced.returncode == 0 and "+  web:\n" in forced.stdout and "wrote " in forced.stdout
    assert "flask --app app:app run" in (root / "agentbox.yaml").read_text()
    assert [path.name for path in root.iterdir() if path.name.startswith(".agentbox")] == []  # no temporary left
    # A pipe (or a link to nowhere) in its place is there too: kept, and never opened (a pipe would block).
    piped = project(tmp_path / "piped", PYTHON_APP)
    os.mkfifo(piped / "agentbox.yaml")
    kept = ctl("init", "--workspace", str(piped))
    assert kept.returncode == 1 and "agentbox.yaml exists; nothing written" in kept.stderr
    assert stat.S_ISFIFO((piped / "agentbox.yaml").lstat().st_mode)


def test_a_workspace_it_cannot_classify_gets_the_minimal_file_and_what_to_fill_in(tmp_path: Path) -> None:
    root = project(tmp_path / "notes", {"README.md": "just notes\n"})
    done = ctl("init", "--workspace", str(root))
    assert done.returncode == 0, done.stderr
    assert "fill in: could not tell how to install or run this project: fill in tasks.install" in done.stdout
    text = (root / "agentbox.yaml").read_text()
    assert text.endswith("\ntasks: {}\nservices: {}\n") and "# Fill in what a fresh box needs" in text
    missing = ctl("init", "--workspace", str(tmp_path / "gone"))
    assert missing.returncode == 1 and "is not a directory: run it in a box (its /workspace) or pass --workspace" \
        in missing.stderr


def test_an_image_without_the_wizards_code_says_to_rebuild_it(tmp_path: Path) -> None:
    """agentbox-ctl installed as in an older image: its package in a lib directory, no agentbox_project beside it."""
    lib = tmp_path / "lib"
    shutil.copytree(FILES / "agentbox_inbox", lib / "agentbox_inbox", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(FILES / "agentbox-ctl", lib / "agentbox-ctl")
    root = project(tmp_path / "shop", PYTHON_APP)
    done = ctl("init", "--workspace", str(root), ctl_path=lib / "agentbox-ctl")
    assert done.returncode == 1 and not (root / "agentbox.yaml").exists()
    assert f"is not in {lib}/agentbox_project" in done.stderr and "playbooks/build_image.yml" in done.stderr
    # Laid out from the libraries the box_image role hands the image's build (to /usr/local/lib/agentbox), it runs.
    for path, text in image_libraries().items():
        (lib / path).parent.mkdir(exist_ok=True)
        (lib / path).write_text(text, encoding="utf-8")
    done = ctl("init", "--workspace", str(root), ctl_path=lib / "agentbox-ctl")
    assert done.returncode == 0 and (root / "agentbox.yaml").is_file(), done.stderr


def image_libraries() -> dict[str, str]:
    """The `libraries` the box_image role passes to agentbox_image, rendered by Ansible's templating."""
    tasks = yaml.safe_load((REPO / "roles" / "box_image" / "tasks" / "main.yml").read_text(encoding="utf-8"))
    task = next(t for t in tasks if "libraries" in t.get("agentbox.box.agentbox_image", {}))
    variables: dict[str, object] = {name: trust_as_template(value) for name, value in task["vars"].items()
                                    if name.startswith(("_box_image_librar", "_box_image_project"))}  # fmt: skip
    variables["role_path"] = str(REPO / "roles" / "box_image")
    return render(task["agentbox.box.agentbox_image"]["libraries"], variables)


def test_the_image_ships_the_hosts_project_code_beside_agentbox_inbox() -> None:
    libraries = image_libraries()
    project = {f"agentbox_project/{path.name}": path.read_text(encoding="utf-8") for path in PROJECT.glob("*.py")}
    assert {"agentbox_project/_project_scan.py", "agentbox_project/_project_plan.py"} <= set(project)
    assert {path: text for path, text in libraries.items() if path.startswith("agentbox_project/")} == project
    assert libraries["agentbox_inbox/wizard.py"] == (FILES / "agentbox_inbox" / "wizard.py").read_text(encoding="utf-8")
