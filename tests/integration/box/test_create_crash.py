"""Crash-safe create: `create_box.yml` SIGKILLed (its whole process group, Ansible's worker included) at
each point of a create; the next create or destroy of that name finds what was left and cleans it.

The create is held at a named point by the test-only wait point AGENTBOX_TEST_PAUSE_AT (see
plugins/module_utils/core/_journal.py): the real create code runs up to there, then waits to be killed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, chown_tree, git, make_repo, run_module
from tests.integration.box.conftest import box_task

pytestmark = pytest.mark.integration

PLAYBOOK = REPO / "playbooks" / "create_box.yml"
BIG = 300 * 1024 * 1024  # the figure: a 300 MB untracked file (sparse here)
DEADLINE = 180.0


def wait_until(predicate: Callable[[], object], what: str, timeout: float = DEADLINE) -> object:
    """Poll a state until it holds; fail after `timeout` seconds saying what never happened."""
    tick = threading.Event()
    remaining = timeout
    while remaining > 0:
        value = predicate()
        if value:
            return value
        tick.wait(0.1)
        remaining -= 0.1
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


def start_create(repo: Path, name: str, pause_at: str | None, report: Path | None,
                 home: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    if pause_at and report:
        env |= {"AGENTBOX_TEST_PAUSE_AT": pause_at, "AGENTBOX_TEST_PAUSE_FILE": str(report)}
    if home is not None:
        env["HOME"] = str(home)
    argv = [str(REPO / ".venv/bin/ansible-playbook"), str(PLAYBOOK), "-e", f"workspace={repo}", "-e", f"box={name}",
            "-e", "checkpoint=none"]
    # Its own process group: the kill reaches ansible-playbook and every worker it forked.
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)


def paused_at(proc: subprocess.Popen, report: Path) -> int:
    """Wait for the create to reach its wait point; the pid of the process that holds it there."""
    def reached() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"the create ended (rc {proc.returncode}) before its wait point:\n{proc.stdout.read()}")
        return report.read_text() if report.exists() else None

    text = str(wait_until(reached, f"create reaching {report.name}"))
    return int(text.split()[1])


def kill(proc: subprocess.Popen, worker: int) -> None:
    """SIGKILL the worker that runs the create (Ansible puts it in a session of its own, so a kill
    of the playbook's process group alone does not reach it), then the playbook's whole group."""
    os.kill(worker, signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_until(lambda: not os.path.exists(f"/proc/{worker}") or _zombie(worker), f"worker {worker} exiting")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def in_box(client: docker.DockerClient, name: str, script: str) -> tuple[int, str]:
    """(exit code, stdout) of a script run as root in the box; stderr is shown when it fails."""
    run = subprocess.run(["docker", "exec", "-u", "root", f"agentbox-{name}", "sh", "-c", script],
                         capture_output=True, text=True, check=False)
    return run.returncode, run.stdout if run.returncode == 0 else run.stdout + run.stderr


def registrations(repo: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in git(repo, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def agentbox_branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/agentbox/").split()


def index_copies(pid: int) -> list[str]:
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"agentbox-index-{pid}-")]


def relays_of(home: Path) -> list[int]:
    """Pids of relay daemons a create started for this HOME (creating a box starts one)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if any(b"_relay_main" in arg for arg in argv) and f"HOME={home}".encode() in environ:
            pids.append(int(entry))
    return pids


def make_home(request: pytest.FixtureRequest) -> Path:
    """A HOME of another controller user: its own journal; removed, with the relay it got, at the end.
    Short: the relay's unix socket lives under $HOME and its path may not pass 107 bytes."""
    home = Path(tempfile.mkdtemp(prefix="cs-home-"))

    def remove() -> None:
        for pid in relays_of(home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(home, ignore_errors=True)

    request.addfinalizer(remove)
    return home


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "ws", {"README.md": "hello\n", "src/app.py": "print(1)\n"})
    (repo / "src/app.py").write_text("print(2)\n")  # a tracked change
    (repo / "notes.txt").write_text("untracked\n")
    chown_tree(repo)
    return repo


@pytest.fixture
def names(client: docker.DockerClient) -> Iterator[list[str]]:
    """Boxes a test makes; whatever is left is destroyed (in-process: a clean-up, not a check)."""
    made: list[str] = []
    yield made
    for name in made:
        box_task({"name": name, "state": "absent", "delete_branch": True})


# The wait points, in the order a create reaches them.
POINTS = ["reserved", "index-copied", "created", "seeding", "streaming", "seeded"]


def through_ansible(point: str) -> bool:
    """The recovering create and destroy of one point run through Ansible, as a user's would; the other
    points run the same task in-process (box_task): the recovery is the task's, not Ansible's."""
    return point == "created"


@pytest.mark.parametrize("point", POINTS)
def test_a_create_killed_at_each_point_is_finished_by_the_next_create(
    client: docker.DockerClient, workspace: Path, tmp_path: Path, names: list[str], point: str
) -> None:
    name = f"kill-{point}-{os.urandom(3).hex()}"
    names.append(name)
    if point == "streaming":
        with open(workspace / "big.bin", "wb") as handle:
            handle.truncate(BIG)
        chown_tree(workspace)
    index_before = (workspace / ".git" / "index").read_bytes()
    report = tmp_path / "paused"
    proc = start_create(workspace, name, point, report)
    worker = paused_at(proc, report)
    # What the kill leaves behind, checked while the worker is still held at the point.
    assert agentbox_branches(workspace) == [f"agentbox/{name}"]
    if point == "index-copied":
        assert index_copies(worker), "the private index copy exists while the carry-over is captured"
    if point in ("created", "seeding", "seeded"):
        assert client.containers.get(f"agentbox-{name}").labels["io.agentbox.box"] == name
    if point == "seeding":
        assert in_box(client, name, "test -e /etc/agentbox/seed.json")[0] != 0, "no seed record before the files"
    if point == "streaming":
        # The engine holds the container's lock while it extracts an archive (inspect and exec wait),
        # so the half-written file is looked at in the engine's storage directly.
        info = client.info()
        assert info["Driver"] == "overlay2", "this probe reads overlay2's layer directories"
        pattern = f"{info['DockerRootDir']}/overlay2/*/diff/home/vscode/.agentbox-worktrees/{name}/big.bin"
        partial = wait_until(lambda: glob.glob(pattern), "part of big.bin reaching the box")
        assert 0 < os.path.getsize(partial[0]) < BIG
    kill(proc, worker)
    if point == "streaming":
        # Cut inside big.bin: the seed record, the stream's last member, never reached the box.
        assert in_box(client, name, "test -e /etc/agentbox/seed.json")[0] != 0, "no seed record after a cut stream"
    old_id = None
    try:
        old_id = client.containers.get(f"agentbox-{name}").labels["io.agentbox.id"]
    except docker.errors.NotFound:
        pass

    args = {"name": name, "workspace": str(workspace), "checkpoint": "none"}
    result = run_module("agentbox_box", args) if through_ansible(point) else box_task(args)
    assert not result["failed"], result
    assert result["changed"] is True
    assert result["recovered"]["stage"] == {"reserved": "reserved", "index-copied": "reserved",
                                            "created": "seeding", "seeding": "seeding",
                                            "streaming": "seeding", "seeded": "booting"}[point]
    assert result["recovered"]["box_id"] != result["box"]["id"]
    box = result["box"]
    assert box["state"] == "running" and box["branch"] == f"agentbox/{name}"
    assert box["id"] != old_id
    # One box, one registration, one branch: nothing of the killed run is left.
    assert [c.name for c in client.containers.list(all=True, filters={"label": f"io.agentbox.box={name}"})] == [
        f"agentbox-{name}"]
    # Its Docker volume, its editor server volumes (_editor_volumes) and its git layer (overlay, upper,
    # work) of the new id only, each once; its worktree is registered in that layer, never in the host repository.
    layer = f"agentbox-{name}-{box['id']}-git0"
    assert sorted(v.name for v in client.volumes.list(filters={"label": f"io.agentbox.box={name}"})) == sorted([
        f"agentbox-{name}-cursor-server", f"agentbox-{name}-docker", f"agentbox-{name}-vscode-server",
        layer, f"{layer}-upper", f"{layer}-work"])
    assert registrations(workspace)[1:] == []
    assert agentbox_branches(workspace) == [f"agentbox/{name}"]
    assert not index_copies(worker), "the killed worker's index copy was removed"
    code, seed = in_box(client, name, "cat /etc/agentbox/seed.json")
    assert code == 0, seed
    record = json.loads(seed)
    assert record["modified"] == 1
    assert record["untracked"] == (2 if point == "streaming" else 1)
    assert in_box(client, name, "cat /workspace/notes.txt")[1] == "untracked\n"
    if point == "streaming":
        code, size = in_box(client, name, "stat -c %s /workspace/big.bin")
        assert (code, size.strip()) == (0, str(BIG))
    assert (workspace / ".git" / "index").read_bytes() == index_before
    # And destroy removes everything.
    args = {"name": name, "state": "absent", "delete_branch": True}
    gone = run_module("agentbox_box", args) if through_ansible(point) else box_task(args)
    assert not gone["failed"] and gone["changed"], gone
    assert not client.containers.list(all=True, filters={"label": f"io.agentbox.box={name}"})
    assert not client.volumes.list(filters={"label": f"io.agentbox.box={name}"})
    assert registrations(workspace)[1:] == [] and agentbox_branches(workspace) == []


@pytest.mark.parametrize("point", ["reserved", "seeding"])
def test_a_destroy_after_a_killed_create_removes_everything(
    client: docker.DockerClient, workspace: Path, tmp_path: Path, names: list[str], point: str
) -> None:
    name = f"killd-{os.urandom(3).hex()}"
    names.append(name)
    report = tmp_path / "paused"
    proc = start_create(workspace, name, point, report)
    kill(proc, paused_at(proc, report))
    args = {"name": name, "state": "absent"}
    result = run_module("agentbox_box", args) if point == "reserved" else box_task(args)
    assert not result["failed"], result
    assert result["changed"] is True and result["recovered"]["stage"] in ("reserved", "seeding")
    assert not client.containers.list(all=True, filters={"label": f"io.agentbox.box={name}"})
    assert not client.volumes.list(filters={"label": f"io.agentbox.box={name}"})
    assert registrations(workspace)[1:] == []
    # The branch the killed create reserved held nothing: it goes too.
    assert agentbox_branches(workspace) == []


def test_a_half_made_box_is_never_reported_ok(client: docker.DockerClient, workspace: Path, tmp_path: Path,
                                              names: list[str], request: pytest.FixtureRequest) -> None:
    """Killed mid-seed on a controller whose journal this run cannot see (another HOME): the box has
    no seed record, and create says so instead of calling it healthy."""
    name = f"half-{os.urandom(3).hex()}"
    names.append(name)
    other_home = make_home(request)
    report = tmp_path / "paused"
    proc = start_create(workspace, name, "seeding", report, home=other_home)
    kill(proc, paused_at(proc, report))
    result = run_module("agentbox_box", {"name": name, "workspace": str(workspace)})
    assert result["failed"], result
    assert "its create never finished" in result["msg"] and "destroy_box.yml" in result["msg"]
