"""fleet_status.yml from anywhere and its page in a real headless Chromium (issue 18, items 3 and 4).

Two real boxes of one workspace carry the same uncommitted host files; one commits on top. The
collection is built and installed (ansible-galaxy) into a temp collections path and the playbook
runs from another directory, both by FQCN and by path, with no ansible.cfg but the one
scripts/ansible-user-config.sh writes into a temp HOME. Then the page is loaded in Chromium at
1400 and 800 px with a measuring script added to a copy (tests/integration/support/fleet_page.py): one row
per box with git's numbers, nothing wider than the window, every branch name on one line.

The boxes are made and removed by the agentbox_box module's own main (tests/conftest.py (run_module_direct)),
not through Ansible: the tests are about the installed collection's playbook. The run by FQCN is made once
(`by_fqcn`): its table and its page are read by both tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, chown_tree, git, make_repo, run_module_direct
from tests.integration.support.fleet_page import measure_page

pytestmark = pytest.mark.integration

VENV_BIN = REPO / ".venv" / "bin"


def env_without_config(home: Path, collections: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(HOME=str(home), ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1",
               PATH=f"{VENV_BIN}:{env.get('PATH', '')}",
               GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="safe.directory", GIT_CONFIG_VALUE_0="*")  # fmt: skip
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-ncfleet-"))
    root.chmod(0o755)
    prefix = f"ncf-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-a", f"{prefix}-b"]
    try:
        workspace = make_repo(root / "ws", {"app.py": "".join(f"line {i}\n" for i in range(10)), "README.md": "r\n"})
        # Host work in progress, carried into both boxes: one modified file, one untracked file.
        (workspace / "README.md").write_text("r\nwip\n")
        (workspace / "notes.md").write_text("notes\n")
        chown_tree(workspace)
        for name in names:
            made = run_module_direct("agentbox_box", {"name": name, "workspace": str(workspace)})
            assert not made["failed"], made
        # Box a commits one change on top; box b leaves everything as carried.
        made = run_module_direct("agentbox_box_info", {"name": names[0]})  # the container name, from the module
        container = made["box"]["container"]
        subprocess.run(["docker", "exec", "-u", "vscode", "-w", "/workspace", container, "sh", "-c",
                        "echo more >> app.py && git add app.py && git -c user.name=A -c user.email=a@x.invalid "
                        "commit -q -m 'Box a works'"], check=True)  # fmt: skip
        home = root / "home"
        home.mkdir()
        collections = root / "collections"
        env = env_without_config(home, collections)
        subprocess.run(["bash", str(REPO / "scripts" / "ansible-user-config.sh")], env=env, check=True)
        built = root / "built"
        run([str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(built), str(REPO)],
            cwd=root, env=env)  # fmt: skip
        [tarball] = built.glob("agentbox-box-*.tar.gz")
        run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "--force", "-p", str(collections), str(tarball)],
            cwd=root, env=env)  # fmt: skip
        inventory = root / "t.agentbox.yml"
        inventory.write_text(f"plugin: agentbox.box.boxes\ninclude: ['{prefix}-*']\n")
        elsewhere = root / "elsewhere"
        elsewhere.mkdir()
        yield {"root": root, "names": names, "workspace": workspace, "env": env, "inventory": inventory,
               "elsewhere": elsewhere}  # fmt: skip
    finally:
        for name in names:
            run_module_direct("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})
        shutil.rmtree(root, ignore_errors=True)


def table_lines(output: str, names: list[str]) -> dict[str, list[str]]:
    """The table's lines as printed: one per box, whatever the result format."""
    rows = {}
    for line in output.splitlines():
        cells = line.strip().lstrip("-").strip().strip("'\",").split()
        if cells and cells[0] in names and cells[0] not in rows:  # the first: PLAY RECAP names them again
            rows[cells[0]] = cells
    return rows


def fleet_status(fleet: dict, playbook: str, page: Path) -> subprocess.CompletedProcess:
    """fleet_status.yml run from another directory, with the installed collection and no ansible.cfg."""
    env = {**fleet["env"], "PWD": str(fleet["elsewhere"])}
    return run([str(VENV_BIN / "ansible-playbook"), "-i", str(fleet["inventory"]), playbook,
                "-e", f"fleet_status_html={page}"], cwd=fleet["elsewhere"], env=env)  # fmt: skip


@pytest.fixture(scope="module")
def by_fqcn(fleet: dict) -> dict:
    """The playbook by its FQCN, run once: its output and its page (the tests only read them)."""
    page = fleet["elsewhere"] / "fleet-fqcn.html"
    return {"done": fleet_status(fleet, "agentbox.box.fleet_status", page), "page": page}


@pytest.mark.parametrize("how", ["fqcn", "path"])
def test_fleet_status_from_another_directory_and_installed_collection(fleet, by_fqcn, how):
    if how == "fqcn":
        done, page = by_fqcn["done"], by_fqcn["page"]
    else:
        page = fleet["elsewhere"] / f"fleet-{how}.html"
        done = fleet_status(fleet, str(REPO / "playbooks" / "fleet_status.yml"), page)
    everything = done.stdout + done.stderr
    assert "[WARNING]" not in everything, everything[-4000:]
    assert "\\n" not in done.stdout  # real lines, not a JSON string
    a, b = fleet["names"]
    rows = table_lines(done.stdout, fleet["names"])
    assert set(rows) == {a, b}, done.stdout[-3000:]
    # BOX STATE BRANCH BASE AHEAD BEHIND FILES + - UNCOMMITTED
    assert rows[a][:10] == [a, "running", f"agentbox/{a}", "main", "1", "0", "2", "2", "0", "2"]
    assert rows[b][:10] == [b, "running", f"agentbox/{b}", "main", "0", "0", "1", "1", "0", "2"]
    assert page.is_file()


def test_fleet_page_in_chromium_at_1400_and_800(fleet, by_fqcn):
    page = by_fqcn["page"]
    a, b = fleet["names"]
    # What git on the host says: a is one commit ahead of main, b none (they share the host's .git).
    for name, ahead in ((a, "1"), (b, "0")):
        behind_ahead = git(fleet["workspace"], "rev-list", "--left-right", "--count", f"main...agentbox/{name}").split()
        assert behind_ahead == ["0", ahead]
    for width in (1400, 800):
        measured = measure_page(page, width)
        assert measured["scrollWidth"] <= measured["clientWidth"], (width, measured["wide"])
        assert measured["wide"] == [], (width, measured["wide"])
        assert measured["broken"] == [], (width, measured["broken"])  # every branch name on one line
        rows = {row["box"]: row for row in measured["rows"]}
        assert sorted(rows) == [a, b]
        for name in (a, b):
            row = rows[name]
            assert row["state"] == "running" and row["branch"] == f"agentbox/{name}"
            assert (row["provider"], row["engine"]) == ("docker", "local")
            assert re.fullmatch(r"127\.0\.0\.1:\d+", row["web"]) and row["web_href"] == f"http://{row['web']}/"
            assert row["right"] <= measured["clientWidth"]
        assert (rows[a]["ahead"], rows[a]["behind"], rows[a]["files"]) == ("1", "0", "2")
        assert (rows[a]["insertions"], rows[a]["deletions"], rows[a]["uncommitted"]) == ("+2", "−0", "2")
        assert (rows[b]["ahead"], rows[b]["files"], rows[b]["uncommitted"]) == ("0", "1", "2")
        # Zeros are muted; real changes are not.
        assert "zero" in rows[b]["ahead_class"] and "zero" in rows[a]["behind_class"] and "zero" in rows[a]["deletions_class"]
        assert "zero" not in rows[a]["ahead_class"]
        # The two carried-over files are the same in both boxes: the fleet has 2 uncommitted files, not 4.
        assert measured["uncommittedTile"] == "2"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", measured["generated"] or "")
