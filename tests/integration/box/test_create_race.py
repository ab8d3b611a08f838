"""Creates of one name racing each other, someone else's container under the name, and what a box
leaves behind when its container is removed by hand (real engine, real git).

The racing creates are agentbox_box's own main, each in a fresh Python as Ansible runs it on the target
(the name's lock and journal are the task's, not Ansible's: create_box.yml's path is proven in
test_create_crash.py), made with boot=False (seed, worktree and branch are the create's, nothing needs to run
in the box); destroy_box.yml's words while a create holds the name still come from the playbook.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import REPO, chown_tree, git, make_repo
from tests.integration.box.conftest import box_task
from tests.integration.box.test_create_crash import (
    agentbox_branches,
    in_box,
    make_home,
    paused_at,
    registrations,
    wait_until,
)

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "ws", {"README.md": "hello\n"})
    (repo / "notes.txt").write_text("untracked\n")
    chown_tree(repo)
    return repo


@pytest.fixture
def names() -> Any:
    """Boxes a test makes; whatever is left is destroyed (in-process: a clean-up, not a check)."""
    made: list[str] = []
    yield made
    for name in made:
        box_task({"name": name, "state": "absent", "delete_branch": True})


def start_create(repo: Path, name: str, pause_at: str, report: Path, home: Path | None = None) -> subprocess.Popen:
    """A create of `name` by agentbox_box's main in a fresh Python (its arguments in a file beside `report`, as
    tests.conftest.run_module_direct passes them), held at `pause_at` until `report` is removed. Its stdout is
    the module's JSON result (`result`)."""
    args = {"name": name, "workspace": str(repo), "image": IMAGE, "checkpoint": "none", "state": "started",
            "boot": False, "_ansible_check_mode": False, "_ansible_diff": True}  # fmt: skip
    args_file = report.with_name(f"{report.name}.args.json")
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    pythonpath = os.pathsep.join(p for p in (str(REPO / ".collections"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "AGENTBOX_TEST_PAUSE_AT": pause_at,
           "AGENTBOX_TEST_PAUSE_FILE": str(report)}  # fmt: skip
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.Popen([sys.executable, "-m", "ansible_collections.agentbox.box.plugins.modules.agentbox_box",
                             str(args_file)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip


def result(out: str) -> dict[str, Any]:
    """The module's JSON result from a create's output (its stdout, stderr folded in after it)."""
    start = out.index("{")
    parsed, _end = json.JSONDecoder().raw_decode(out[start:])
    return parsed


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    outputs = []
    for proc in procs:
        out, _err = proc.communicate(timeout=600)
        outputs.append((proc.returncode, out))
    return outputs


def healthy(client: docker.DockerClient, workspace: Path, name: str) -> None:
    """One running box of that name, seeded, with its worktree registered in its own git layer (never
    in the host repo) and one branch in the host repo."""
    boxes = client.containers.list(all=True, filters={"label": f"io.agentbox.box={name}"})
    assert [(c.name, c.status) for c in boxes] == [(f"agentbox-{name}", "running")]
    code, record = in_box(client, name, "cat /etc/agentbox/seed.json")
    assert code == 0 and json.loads(record)["untracked"] == 1
    assert registrations(workspace)[1:] == []
    code, listed = in_box(client, name, "git -C /workspace worktree list --porcelain | grep -c agentbox-worktrees")
    assert code == 0 and listed.strip() == "1", listed
    assert agentbox_branches(workspace) == [f"agentbox/{name}"]


def test_four_creates_of_one_name_on_one_controller(client: docker.DockerClient, workspace: Path, tmp_path: Path,
                                                    names: list[str]) -> None:
    name = f"race-{os.urandom(3).hex()}"
    names.append(name)
    report = tmp_path / "winner"
    # Whichever run takes the name first is held once its container exists, while the others arrive.
    procs = [start_create(workspace, name, "created", report) for _attempt in range(4)]
    paused_at_pid = wait_until(lambda: report.exists() and report.read_text(), "one create taking the name")
    assert paused_at_pid
    losers = wait_until(lambda: [p for p in procs if p.poll() is not None] if sum(
        p.poll() is not None for p in procs) == 3 else None, "three creates giving up")
    for proc in losers:
        out, _err = proc.communicate()
        assert proc.returncode != 0 and result(out)["failed"] is True, out
        assert f"box '{name}' is being created by another run right now" in result(out)["msg"], out
    report.unlink()  # let the winner go on
    (winner,) = [p for p in procs if p not in losers]
    out, _err = winner.communicate(timeout=600)
    assert winner.returncode == 0 and not result(out).get("failed"), out
    healthy(client, workspace, name)


def test_four_creates_of_one_name_from_four_controllers(client: docker.DockerClient, workspace: Path,
                                                        tmp_path: Path, names: list[str],
                                                        request: pytest.FixtureRequest) -> None:
    """No shared lock (four users' journals): the engine's container name decides, and each loser
    undoes only what it made itself."""
    name = f"race4-{os.urandom(3).hex()}"
    names.append(name)
    reports = [tmp_path / f"held-{i}" for i in range(4)]
    procs = [start_create(workspace, name, "reserved", report, home=make_home(request)) for report in reports]
    for proc, report in zip(procs, reports, strict=True):
        paused_at(proc, report)  # all four have their branch and are past the "does it exist?" check
    assert sorted(agentbox_branches(workspace)) == sorted(
        [f"agentbox/{name}", f"agentbox/{name}-2", f"agentbox/{name}-3", f"agentbox/{name}-4"])
    for report in reports:
        report.unlink()
    results = finish(procs)
    winners = [out for rc, out in results if rc == 0 and not result(out).get("failed")]
    losers = [out for rc, out in results if rc != 0]
    assert len(winners) == 1 and len(losers) == 3, results
    for out in losers:
        said = result(out)["msg"]
        assert f"a container called 'agentbox-{name}' already exists on engine local: pick another box name" in said, out
    # The winner's box is whole; each loser took back its own branch and nothing else.
    boxes = client.containers.list(all=True, filters={"label": f"io.agentbox.box={name}"})
    assert len(boxes) == 1 and boxes[0].status == "running"
    branch = boxes[0].labels["io.agentbox.branch"]
    assert agentbox_branches(workspace) == [branch]
    assert registrations(workspace)[1:] == []
    assert client.volumes.get(f"agentbox-{name}-docker").name
    code, record = in_box(client, name, "cat /etc/agentbox/seed.json")
    assert code == 0 and json.loads(record)["branch"] == branch


def test_someone_elses_container_under_the_name_is_never_touched(
    client: docker.DockerClient, workspace: Path, names: list[str]
) -> None:
    name = f"theirs-{os.urandom(3).hex()}"
    theirs = client.containers.create(IMAGE, ["sleep", "infinity"], name=f"agentbox-{name}")
    try:
        refused = box_task({"name": name, "workspace": str(workspace), "boot": False})
        assert refused["failed"], refused
        assert "was not made by agentbox" in refused["msg"] and "pick another box name" in refused["msg"]
        gone = box_task({"name": name, "state": "absent"})
        assert gone["failed"] and "was not made by agentbox" in gone["msg"], gone
        theirs.reload()
        assert theirs.status == "created" and "io.agentbox.box" not in theirs.labels
        assert agentbox_branches(workspace) == [] and registrations(workspace)[1:] == []
    finally:
        theirs.remove(force=True)


def test_destroy_after_docker_rm_removes_the_leftovers(
    client: docker.DockerClient, workspace: Path, names: list[str]
) -> None:
    name = f"rmf-{os.urandom(3).hex()}"
    names.append(name)
    made = box_task({"name": name, "workspace": str(workspace), "checkpoint": "none", "boot": False})
    assert not made["failed"], made
    client.containers.get(f"agentbox-{name}").remove(force=True)  # by hand, as `docker rm -f` would
    gone = box_task({"name": name, "state": "absent"})
    assert not gone["failed"] and gone["changed"], gone
    destroyed = gone["destroyed"]
    # Its Docker volume, its editor server volumes (_editor_volumes) and its git layer (overlay, upper,
    # work); its registration lived in that layer.
    removed = sorted(destroyed["volumes_removed"])
    assert [v for v in removed if "-git0" not in v] == [
        f"agentbox-{name}-cursor-server", f"agentbox-{name}-docker", f"agentbox-{name}-vscode-server"]
    assert len([v for v in removed if "-git0" in v]) == 3, removed
    assert destroyed["worktrees_removed"] == []
    assert not destroyed["worktrees_not_found"], destroyed  # a git layer's registration is not looked for
    assert destroyed["branches_deleted"] == [f"{workspace}:agentbox/{name}"]  # it held no commits
    assert not client.volumes.list(filters={"label": f"io.agentbox.box={name}"})
    assert registrations(workspace)[1:] == [] and agentbox_branches(workspace) == []
    # Nothing is left to trip the next create of that name.
    again = box_task({"name": name, "workspace": str(workspace), "checkpoint": "none", "boot": False})
    assert not again["failed"] and again["changed"], again
    healthy(client, workspace, name)


def test_leftovers_with_commits_keep_the_branch(client: docker.DockerClient, workspace: Path,
                                                names: list[str]) -> None:
    name = f"rmfc-{os.urandom(3).hex()}"
    names.append(name)
    made = box_task({"name": name, "workspace": str(workspace), "checkpoint": "none", "boot": False})
    assert not made["failed"], made
    code, out = in_box(client, name, "cd /workspace && su vscode -c 'git add notes.txt && git -c user.name=a "
                                     "-c user.email=a@b commit -qm work'")
    assert code == 0, out
    client.containers.get(f"agentbox-{name}").remove(force=True)
    # A create of the name finds the leftovers too, and starts clean (on the next free branch).
    again = box_task({"name": name, "workspace": str(workspace), "checkpoint": "none", "boot": False})
    assert not again["failed"], again
    assert again["box"]["branch"] == f"agentbox/{name}-2"
    assert git(workspace, "log", "-1", "--format=%s", f"agentbox/{name}").strip() == "work"


def test_destroy_of_a_box_whose_workspace_moved(client: docker.DockerClient, workspace: Path, tmp_path: Path,
                                                names: list[str]) -> None:
    name = f"moved-{os.urandom(3).hex()}"
    names.append(name)
    made = box_task({"name": name, "workspace": str(workspace), "checkpoint": "none", "boot": False})
    assert not made["failed"], made
    moved = tmp_path / "moved-ws"
    shutil.move(str(workspace), str(moved))
    gone = box_task({"name": name, "state": "absent", "workspace": str(moved)})
    assert not gone["failed"] and gone["changed"], gone
    # Registered in the box's own git layer: nothing to find in the moved repository, and nothing claimed.
    assert gone["destroyed"]["worktrees_removed"] == [], gone
    assert registrations(moved)[1:] == []
    assert not client.containers.list(all=True, filters={"label": f"io.agentbox.box={name}"})


def test_a_destroy_during_a_create_says_the_destroy_failed(client: docker.DockerClient, workspace: Path,
                                                           tmp_path: Path, names: list[str]) -> None:
    """destroy_box.yml while a create of that name holds its lock names the destroy, not the create."""
    name = f"dwc-{os.urandom(3).hex()}"
    names.append(name)
    report = tmp_path / "creating"
    creating = start_create(workspace, name, "created", report)
    try:
        paused_at(creating, report)
        env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
        destroy = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/destroy_box.yml"),
                                  "-e", f"box={name}"], cwd=REPO, env=env, capture_output=True, text=True,
                                 check=False)  # fmt: skip
        said = " ".join(destroy.stdout.split())
        assert destroy.returncode != 0, said
        assert f"destroy of box '{name}' failed: box '{name}' is being created by another run right now" in said, said
        assert "then destroy it again" in said and "create of box" not in said, said
    finally:
        report.unlink(missing_ok=True)  # let the create go on: the refused destroy took nothing from it
    out, _err = creating.communicate(timeout=600)
    assert creating.returncode == 0 and not result(out).get("failed"), out
    healthy(client, workspace, name)
