"""What the playbooks print tells the truth (issue 18, item 2), checked through ansible-playbook
against the real engine and real git: carried counts on every path (worktree, plain copy,
checkpoint restore), the checkpoint a box came from, one port form in create and list, the
socket named when the engine is down, and delete_branch on a box that is already gone."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import REPO, chown_tree, git, make_repo, run_module_direct
from tests.integration.box.conftest import box_task

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"


class Player:
    """Runs the collection's playbooks as a user would, from `cwd`, with its own HOME (checkpoint
    manifests stay out of the real ~/.agentbox)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.made: list[str] = []

    def env(self, cwd: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.home),
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PWD": str(cwd),
            **(extra or {}),
        }

    def run(self, name: str, *extra: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        argv = [str(PLAYBOOK), str(REPO / "playbooks" / name)]
        for item in extra:
            argv += ["-e", item]
        return subprocess.run(argv, cwd=cwd, env=self.env(cwd, env), capture_output=True, text=True, timeout=900, check=False)

    def ok(self, name: str, *extra: str, cwd: Path = REPO) -> str:
        done = self.run(name, *extra, cwd=cwd)
        assert done.returncode == 0, f"{name} {extra}\n{done.stdout[-5000:]}\n{done.stderr[-2000:]}"
        return done.stdout

    def create(self, workspace: Path, box: str, *extra: str) -> str:
        self.made.append(box)
        return self.ok("create_box.yml", f"workspace={workspace}", f"box={box}", *extra)

    def module(self, module: str, args: dict[str, Any]) -> dict[str, Any]:
        """A module's own main (run_module_direct) in this HOME: set-up or a check a test's playbook is not about."""
        return run_module_direct(module, args, env={"HOME": str(self.home)})

    def make(self, workspace: Path, box: str, *, boot: bool = True) -> None:
        """A box for a test about what comes after its create: the task create_box.yml runs, in-process
        (box_task), in this HOME; `boot=False` where nothing in the box needs to run."""
        self.made.append(box)
        made = box_task({"name": box, "workspace": str(workspace), "boot": boot}, env={"HOME": str(self.home)})
        assert not made["failed"], made


def flat(output: str) -> str:
    """Ansible's YAML callback folds long messages: compare with whitespace runs made single spaces."""
    return " ".join(output.split())


def restore_hint(output: str) -> str:
    """checkpoint.yml's restore command, unfolded (YAML may wrap it over lines)."""
    found = re.search(r"restore: +(ansible-playbook playbooks/create_box\.yml .*?)'?(?: PLAY RECAP| TASK \[|$)", flat(output))
    assert found, output[-3000:]
    return found.group(1).strip().rstrip("'")


def line(output: str, key: str) -> str:
    found = re.search(rf"^\s*-?\s*'?{key}:\s+(.*?)'?$", output, re.M)
    assert found, f"no {key!r} line in:\n{output[-3000:]}"
    return found.group(1).strip()


@pytest.fixture(scope="module")
def player() -> Iterator[Player]:
    """One HOME for the module's tests (each works in its own workspace and boxes, so nothing of one is
    another's); its boxes, relay and checkpoint images go at the end."""
    if not docker.from_env().images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    # Short: the relay that creating a box starts keeps its unix socket under HOME (107 bytes at most).
    home = Path(tempfile.mkdtemp(prefix="abh-", dir="/tmp"))
    made = Player(home)
    yield made
    # A clean-up, not a check: in-process, in the module's HOME (its journal and relay registrations).
    for box in made.made:
        box_task({"name": box, "state": "absent"}, env={"HOME": str(home)})
    run_module_direct("agentbox_relay", {"state": "stopped"}, env={"HOME": str(home)})  # relay.yml: proven elsewhere
    shutil.rmtree(home, ignore_errors=True)
    engine = docker.from_env()
    for box in made.made:
        for image in engine.images.list(filters={"label": f"io.agentbox.box={box}"}):  # checkpoint images taken
            for tag in image.tags:
                engine.images.remove(tag, force=True)


def name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@pytest.fixture(scope="module")
def plain_box(player: Player) -> Iterator[tuple[Path, str, str]]:
    """A box create_box.yml made from a plain directory (not a git workspace): (workspace, box, what create
    printed). Its tests only read it."""
    plain = Path(tempfile.mkdtemp(prefix="abp-", dir="/tmp"))
    plain.chmod(0o755)  # uid 1000 in the box, as with tmp_path
    (plain / "sub").mkdir()
    for rel in ("a.txt", "b.txt", "sub/c.txt"):
        (plain / rel).write_text(rel)
    box = name("nc-copy")
    yield plain, box, player.create(plain, box)
    shutil.rmtree(plain, ignore_errors=True)


def test_plain_copy_counts_the_files_it_copied(plain_box: tuple[Path, str, str]) -> None:
    _plain, _box, out = plain_box
    assert line(out, "carried") == "3 files copied (not a git workspace)"
    assert line(out, "from") == "the workspace (no checkpoint)"


def test_ports_read_the_same_in_create_and_list(player: Player, plain_box: tuple[Path, str, str]) -> None:
    plain, box, out = plain_box
    created_ports = line(out, "ports")
    assert re.fullmatch(r"127\.0\.0\.1:\d+->80", created_ports), created_ports
    listed = player.ok("list_boxes.yml", f"workspace={plain}")
    row = next(text for text in listed.splitlines() if box in text)
    assert created_ports in row.split(), row


def test_a_create_from_a_checkpoint_names_it_counts_what_it_carried_and_warns_of_host_edits_left_out(
    player: Player, tmp_path: Path
) -> None:
    """A restore by name names the checkpoint and counts what it carried. Issue 33, item 15: set_default=true
    changes every later create, so the summary says the checkpoint came as the project default; and an
    untracked file the host edited after the checkpoint is not copied over the box's own (the box wins),
    which one warning says, naming the file."""
    repo = make_repo(tmp_path / "ws", {"README.md": "hello\n", "app.py": "v1\n", "gone.txt": "x\n"})
    (repo / "app.py").write_text("v2\n")
    git(repo, "rm", "-q", "gone.txt")
    (repo / "notes").mkdir()
    (repo / "notes/one.md").write_text("one\n")
    (repo / "two.txt").write_text("two\n")
    chown_tree(repo)
    source = name("nc-src")
    out = player.create(repo, source)
    assert line(out, "carried") == "1 modified, 1 deleted, 0 renamed, 2 untracked"
    checkpoint = f"warm-{secrets.token_hex(2)}"
    saved = player.ok("checkpoint.yml", f"box={source}", f"checkpoint={checkpoint}", "set_default=true")
    hint = restore_hint(saved)
    assert "-e provider=docker" in hint and "-e engine" not in hint  # the local engine
    # A third untracked file arrives after the checkpoint: two are in the checkpoint already, one is copied.
    (repo / "three.txt").write_text("three\n")
    chown_tree(repo)
    restored = name("nc-rst")
    out = player.create(repo, restored, f"checkpoint={checkpoint}")
    assert line(out, "from") == f"checkpoint {checkpoint}"  # asked for by name: no note
    assert line(out, "carried") == "1 modified, 1 deleted, 0 renamed, 3 untracked"
    engine = docker.from_env()
    files = engine.containers.get(f"agentbox-{restored}").exec_run(
        ["sh", "-c", "cd /workspace && cat notes/one.md two.txt three.txt app.py"], user="vscode"
    )
    assert files.output == b"one\ntwo\nthree\nv2\n"
    # The host edits an untracked file the checkpoint has; the next create comes from the project default.
    (repo / "two.txt").write_text("edited on the host after the checkpoint\n")
    os.utime(repo / "two.txt", (time.time() + 5, time.time() + 5))  # past the checkpoint's second, whatever the clock
    chown_tree(repo)
    by_default = name("nc-dfr")
    done = player.run("create_box.yml", f"workspace={repo}", f"box={by_default}")
    player.made.append(by_default)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    said = f"from: checkpoint {checkpoint} (project default; -e checkpoint=none for a fresh box)"
    assert said in flat(done.stdout), done.stdout
    warnings = [w for w in flat(done.stderr).split("[WARNING]: ") if "untracked" in w]
    assert len(warnings) == 1, done.stderr
    assert "the host's version of 1 untracked file(s) was NOT copied into the box" in warnings[0], warnings
    assert "two.txt (changed on the host after the checkpoint)" in warnings[0], warnings
    for image in engine.images.list(filters={"label": "io.agentbox.kind=checkpoint"}):
        if any(tag.endswith(f":{checkpoint}") for tag in image.tags):
            for tag in image.tags:
                engine.images.remove(tag, force=True)


def test_delete_branch_of_a_box_already_destroyed(player: Player, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "ws")
    chown_tree(repo)
    box = name("nc-gone")
    player.make(repo, box, boot=False)  # destroyed at once: the branch and the output are the subject
    out = flat(player.ok("destroy_box.yml", f"box={box}"))
    assert f"destroyed {box}" in out and "branches deleted: none" in out
    assert git(repo, "branch", "--list", f"agentbox/{box}").strip() == f"agentbox/{box}"
    again = flat(player.ok("destroy_box.yml", f"box={box}", "delete_branch=true", cwd=repo))
    assert f"no box called {box} (already gone)" in again
    assert f"branches deleted: {repo}:agentbox/{box}" in again
    assert git(repo, "branch", "--list", f"agentbox/{box}") == ""
    third = flat(player.ok("destroy_box.yml", f"box={box}", "delete_branch=true", f"workspace={repo}"))
    assert f"no box called {box} (already gone): no branch agentbox/{box} to delete" in third
    assert git(repo, "status", "--porcelain") == ""  # the host's tree untouched


def test_delete_branch_of_a_destroyed_box_from_outside_its_workspace(player: Player, tmp_path: Path) -> None:
    """Issue 33, item 13: the box's labels went with it, but its destroy recorded where its branch stays, so
    destroy_box.yml -e delete_branch=true run from another repository deletes it there, not in $PWD's."""
    repo = make_repo(tmp_path / "ws")
    chown_tree(repo)
    box = name("nc-out")
    player.make(repo, box, boot=False)
    # destroy_box.yml's own output: the test above; here the destroy that records where the branch stays.
    gone = box_task({"name": box, "state": "absent"}, env={"HOME": str(player.home)})
    assert not gone["failed"] and gone["destroyed"]["box_removed"], gone  # what "destroyed BOX" reports
    elsewhere = make_repo(tmp_path / "elsewhere")
    out = flat(player.ok("destroy_box.yml", f"box={box}", "delete_branch=true", cwd=elsewhere))
    assert f"no box called {box} (already gone); worktrees removed: 0; branches deleted: {repo}:agentbox/{box}" in out
    assert git(repo, "branch", "--list", f"agentbox/{box}") == ""
    # Nothing left: it says where it looked, and how to look elsewhere.
    again = flat(player.ok("destroy_box.yml", f"box={box}", "delete_branch=true", cwd=elsewhere))
    assert f"no branch agentbox/{box} to delete in {elsewhere} (-e workspace=PATH looks in another)" in again


def test_engine_down_names_the_socket(player: Player, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "ws")
    down = {"AGENTBOX_ENGINE": f"unix://{tmp_path}/no-engine.sock"}
    for playbook, extra in (("create_box.yml", (f"workspace={repo}", "box=nc-down")), ("list_boxes.yml", ())):
        done = player.run(playbook, *extra, env=down)
        assert done.returncode != 0
        said = flat(done.stdout)
        assert f"the box engine at unix://{tmp_path}/no-engine.sock does not answer" in said, said[-2000:]
        assert "scripts/ensure-box-engine.sh" in said and "isolation=none" in said
    # With isolation=none the user's own engine is used: its message names DOCKER_HOST.
    done = player.run("create_box.yml", f"workspace={repo}", "box=nc-down", "isolation=none",
                      env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    said = flat(done.stdout)
    assert done.returncode != 0 and f"the Docker engine at unix://{tmp_path}/no-engine.sock does not answer" in said
    assert "point DOCKER_HOST at a running engine" in said
