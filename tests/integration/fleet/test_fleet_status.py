"""The fleet on real boxes: `ansible-inventory --graph` over the boxes inventory plugin, a command
across a project's boxes, and playbooks/fleet_status.yml over three boxes with different changes
(numbers checked against git on the host), its HTML page rendered by headless Chromium.

The fleet is made, worked on and removed for the module without Ansible (the agentbox_box module's own main,
tests/conftest.py (run_module_direct), and `docker exec` as the box user): the tests are about the inventory,
the connection and fleet_status.yml, which run through Ansible.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import run_module_direct
from tests.integration.support.fleet_page import chromium_binary

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = REPO / ".venv" / "bin"
BOX_UID = 1000
# The screenshot stays in the test's temp dir; to refresh docs/img/fleet_status.png on purpose, name it here.
SCREENSHOT_COPY = os.environ.get("AGENTBOX_FLEET_SCREENSHOT")
GIT_ID = ["-c", "user.name=Agent", "-c", "user.email=agent@example.invalid"]


def ansible_env() -> dict[str, str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="safe.directory", GIT_CONFIG_VALUE_0="*")
    return env


def run(argv: list[str], check: bool = True, cwd: Path = REPO) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=cwd, env=ansible_env(), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{argv[:3]} exited {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def host_git(workspace: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-c", "safe.directory=*", *GIT_ID, "-C", str(workspace), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def in_box(name: str, script: str) -> None:
    """Run a script in the box as its user, in /workspace."""
    subprocess.run(["docker", "exec", "-u", "vscode", "-w", "/workspace", f"agentbox-{name}", "bash", "-ec", script],
                   check=True, capture_output=True)  # fmt: skip


@pytest.fixture(scope="module")
def fleet():
    """Three boxes of one workspace, each with different work; one of them stopped."""
    root = Path(tempfile.mkdtemp(prefix="agentbox-fleet-"))
    prefix = f"fleet-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"]
    try:
        workspace = root / "ws"
        workspace.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main", str(workspace)], check=True)
        (workspace / "app.py").write_text("".join(f"line {i}\n" for i in range(20)))
        (workspace / "README.md").write_text("readme\n")
        host_git(workspace, "add", "-A")
        host_git(workspace, "commit", "-q", "-m", "initial")
        subprocess.run(["chown", "-R", f"{BOX_UID}:{BOX_UID}", str(root)], check=True)
        # Made side by side, with boot=False: the inventory, the connection and fleet_status.yml read the boxes'
        # labels, git and files, and run nothing the boot starts.
        with ThreadPoolExecutor(len(names)) as pool:
            made = list(pool.map(lambda name: run_module_direct(
                "agentbox_box", {"name": name, "workspace": str(workspace), "boot": False}), names))
        for created in made:
            assert not created["failed"], created
        inv = root / "inv" / "fleet.agentbox.yml"
        inv.parent.mkdir()
        inv.write_text(f"plugin: agentbox.box.boxes\ninclude: ['{prefix}-*']\n")
        commit = f"git {' '.join(GIT_ID)} commit -q"
        # a: two commits (2 files, +7 -2 against main), then one modified file and one untracked file.
        in_box(names[0], textwrap.dedent(f"""\
            printf 'new %s\\n' 1 2 3 4 5 > feature.py && git add feature.py && {commit} -m 'Add feature'
            sed -i '1,2d' app.py && printf 'x\\ny\\n' >> app.py && git add app.py && {commit} -m 'Rework app ✓'
            echo extra >> feature.py
            echo scratch > notes.txt
            """))  # fmt: skip
        # b: no commit; three lines appended to a tracked file, nothing else.
        in_box(names[1], "printf 'b1\\nb2\\nb3\\n' >> app.py\n")
        # c: one commit, then stopped; main moves on by two commits meanwhile (c is behind by 2).
        in_box(names[2], f"echo c > c.txt && git add c.txt && {commit} -m 'Commit in c'\n")
        # Stopped through the collection, which brings the box's branch into the host repository first.
        stopped = run_module_direct("agentbox_box", {"name": names[2], "state": "stopped"})
        assert not stopped["failed"], stopped
        for index in range(2):
            (workspace / f"main{index}.txt").write_text("main\n")
            host_git(workspace, "add", "-A")
            host_git(workspace, "commit", "-q", "-m", f"main moves {index}")
        subprocess.run(["chown", "-R", f"{BOX_UID}:{BOX_UID}", str(root)], check=True)
        yield {"names": names, "root": root, "workspace": workspace, "inv": inv, "prefix": prefix}
    finally:
        for name in names:
            run_module_direct("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})
            subprocess.run(["docker", "rm", "-f", "-v", f"agentbox-{name}"], capture_output=True, check=False)
            subprocess.run(
                ["docker", "volume", "rm", "-f", f"agentbox-{name}-docker"], capture_output=True, check=False
            )
        shutil.rmtree(root, ignore_errors=True)


def test_inventory_graph_shows_the_groups(fleet):
    a, b, c = fleet["names"]
    graph = run([str(VENV_BIN / "ansible-inventory"), "-i", str(fleet["inv"]), "--graph"]).stdout
    project = json.loads(run([str(VENV_BIN / "ansible-inventory"), "-i", str(fleet["inv"]), "--list"]).stdout)
    groups = {name: set(value.get("hosts", [])) for name, value in project.items() if isinstance(value, dict)}
    for group in ("@docker:", "@docker_ssh:", "@daytona:", "@running:", "@paused:", "@stopped:", "@engine_local:"):
        assert group in graph, graph
    assert groups["running"] == {a, b} and groups["stopped"] == {c} and groups["docker"] == {a, b, c}
    assert groups["engine_local"] == {a, b, c}
    project_groups = [name for name in groups if name.startswith("project_")]
    assert len(project_groups) == 1 and groups[project_groups[0]] == {a, b, c}
    host = json.loads(run([str(VENV_BIN / "ansible-inventory"), "-i", str(fleet["inv"]), "--host", a]).stdout)
    assert host["ansible_connection"] == "agentbox.box.box" and host["agentbox_branch"] == f"agentbox/{a}"


def test_unreachable_engine_is_a_warning_and_the_rest_loads(fleet):
    inv = fleet["root"] / "inv" / "broken.agentbox.yml"
    inv.write_text(f"plugin: agentbox.box.boxes\ninclude: ['{fleet['prefix']}-*']\nengines: ['root@127.0.0.1:1']\n")
    listed = run([str(VENV_BIN / "ansible-inventory"), "-i", str(inv), "--list"])
    assert "root@127.0.0.1:1" in listed.stderr and "could not be listed" in listed.stderr
    hosts = json.loads(listed.stdout)["_meta"]["hostvars"]
    assert set(fleet["names"]) <= set(hosts)


def test_command_across_a_projects_running_boxes(fleet):
    a, b, _c = fleet["names"]
    out = run([str(VENV_BIN / "ansible"), "-i", str(fleet["inv"]), "running", "-m", "ansible.builtin.command",
               "-a", "git -C /workspace rev-parse --abbrev-ref HEAD", "-o"]).stdout  # fmt: skip
    assert f"{a} | CHANGED | rc=0 | (stdout) agentbox/{a}" in out
    assert f"{b} | CHANGED | rc=0 | (stdout) agentbox/{b}" in out


class RowParser(html.parser.HTMLParser):
    """Rows of the fleet table from Chromium's serialised DOM: box name -> {field: text}."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self._box: str | None = None
        self._field: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "tr" and "box-row" in (values.get("class") or ""):
            self._box = values["data-box"]
            self.rows[self._box] = {"state": values.get("data-state") or ""}
        elif self._box and values.get("data-field"):
            self._field = values["data-field"]
            self.rows[self._box][self._field] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "span"):
            self._field = None
        if tag == "tr":
            self._box = None

    def handle_data(self, data: str) -> None:
        if self._box and self._field:
            self.rows[self._box][self._field] += data.strip()


def chromium(*args: str) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="agentbox-chromium-")
    try:
        return subprocess.run(
            [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def test_fleet_status_numbers_table_and_html(fleet, tmp_path):
    a, b, c = fleet["names"]
    workspace = fleet["workspace"]
    page = tmp_path / "fleet_status.html"
    out = run([str(VENV_BIN / "ansible-playbook"), "-i", str(fleet["inv"]), "playbooks/fleet_status.yml",
               "-e", f"fleet_status_html={page}"]).stdout  # fmt: skip
    # What git on the host says about each branch (the boxes share the host's .git).
    expected = {}
    for name in (a, b, c):
        behind, ahead = host_git(workspace, "rev-list", "--left-right", "--count", f"main...agentbox/{name}").split()
        expected[name] = {"ahead": int(ahead), "behind": int(behind)}
    assert expected[a] == {"ahead": 2, "behind": 2} and expected[c] == {"ahead": 1, "behind": 2}
    assert expected[b] == {"ahead": 0, "behind": 2}
    # a: feature.py +6 (5 committed, 1 uncommitted), app.py +2 -2 -> 2 files +8 -2; 2 uncommitted (1 modified, 1 new)
    # b: app.py +3 -> 1 file +3 -0; 1 uncommitted.  c (stopped, read on the host): c.txt +1; uncommitted unknown.
    want = {
        a: ("running", 2, 2, 2, 8, 2, "2", "Rework app ✓"),
        b: ("running", 0, 2, 1, 3, 0, "1", "initial"),
        c: ("stopped", 1, 2, 1, 1, 0, "-", "Commit in c"),
    }
    table = out[out.index("BOX ") : out.index("3 boxes")]
    lines = [line.strip() for line in table.splitlines() if line.strip()]
    header = lines[0]
    assert header.split() == ["BOX", "STATE", "BRANCH", "BASE", "AHEAD", "BEHIND", "FILES", "+", "-",
                              "UNCOMMITTED", "LAST", "COMMIT", "AGE", "AGENT"]  # fmt: skip
    # Aligned: every column starts at the same offset on every line.
    state_column = header.index("STATE")
    for name, (state, ahead, behind, files, plus, minus, uncommitted, subject) in want.items():
        line = next(line for line in lines if line.startswith(name + " "))
        assert line[state_column:].startswith(state), line
        cells = line.split()
        assert cells[:10] == [name, state, f"agentbox/{name}", "main", str(ahead), str(behind), str(files), str(plus),
                              str(minus), uncommitted], line  # fmt: skip
        assert subject in line
        assert expected[name]["ahead"] == ahead and expected[name]["behind"] == behind

    # The page: self-contained, rendered by Chromium, one row per box with its numbers.
    source = page.read_text(encoding="utf-8")
    # Nothing loaded from anywhere (the boxes' web URLs are plain links, on 127.0.0.1).
    assert "<script" not in source and "<link" not in source and "src=" not in source and "url(" not in source
    assert all(url.startswith("http://127.0.0.1:") for url in re.findall(r"https?://[^\"<\s]+", source))
    dom = chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    parser = RowParser()
    parser.feed(dom.stdout)
    assert sorted(parser.rows) == sorted(want)
    for name, (state, ahead, behind, files, plus, minus, uncommitted, _subject) in want.items():
        row = parser.rows[name]
        assert row["state"] == state
        assert (row["ahead"], row["behind"], row["files"]) == (str(ahead), str(behind), str(files))
        assert (row["insertions"], row["deletions"]) == (f"+{plus}", f"−{minus}")
        assert row["uncommitted"] == (uncommitted if uncommitted != "-" else "–")
    shot = tmp_path / "fleet.png"
    taken = chromium(f"--screenshot={shot}", "--window-size=1400,600", "--hide-scrollbars", page.as_uri())
    assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr[-2000:]
    if SCREENSHOT_COPY:
        shutil.copyfile(shot, SCREENSHOT_COPY)


def test_fleet_status_playbook_passes_ansible_lint(tmp_path):
    """ansible-lint (production profile) on a copy: the checkout's collection symlinks loop for its file walker."""
    collection = tmp_path / "collections" / "ansible_collections" / "agentbox" / "box"
    skip = shutil.ignore_patterns(".venv*", ".collections", ".git", "collections", "tests", "benchmarks", "__pycache__")
    shutil.copytree(REPO, collection, ignore=skip, symlinks=True)
    project = tmp_path / "project"
    shutil.copytree(REPO / "playbooks" / "templates", project / "playbooks" / "templates")
    shutil.copyfile(REPO / "playbooks" / "fleet_status.yml", project / "playbooks" / "fleet_status.yml")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    env = {**ansible_env(), "ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections")}
    env.pop("ANSIBLE_CONFIG", None)
    lint = subprocess.run(
        [str(VENV_BIN / "ansible-lint"), "--offline", "--profile", "production", "playbooks/fleet_status.yml"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout[-3000:] + lint.stderr[-3000:]
