"""best_of on the local engine, run in-process (agentbox_best_of's main, the task best_of.yml calls; the playbook
itself is test_best_of.py's): a check whose program the box image lacks is refused before any box, by one
throwaway container of the image; `from` a running box forks it (its commit and its uncommitted work, through a
checkpoint removed after) and the adopted run is pushed to the workspace's remote by the relay's own push.
Custom agent commands only: the runs' agents are not what these tests are about."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo
from tests.integration.box.conftest import box_task
from tests.unit.support.inprocess import run_module_inprocess

pytestmark = pytest.mark.integration

BOX_GIT = "git -c user.name=Box -c user.email=box@example.invalid"


def _workspace(root: Path) -> Path:
    repo = make_repo(root / "ws", {"README.md": "base\n", ".gitignore": "out.log\n"})
    git(repo, "config", "user.name", "Host Person")
    git(repo, "config", "user.email", "host.person@example.invalid")
    chown_tree(repo)
    return repo


def _boxes_of(client: docker.DockerClient, workspace: Path) -> set[str]:
    return {c.name for c in client.containers.list(all=True, filters={"label": f"io.agentbox.workspace={workspace}"})}


def test_a_check_program_missing_from_the_box_image_or_an_unknown_checkpoint_is_refused_before_any_box(
    docker_client: docker.DockerClient, box_image: str, tmp_path: Path
) -> None:
    workspace = _workspace(tmp_path)
    args = {"workspace": str(workspace), "task": "t", "agents": [{"name": "a", "command": "true"}]}
    refused = run_module_inprocess("agentbox_best_of", {**args, "check": "python3 -c pass && no-such-tool-7 --all"})
    assert refused["failed"], refused
    assert (f"no-such-tool-7 (of check 'python3 -c pass && no-such-tool-7 --all') not found in image {box_image} "
            "as the box user runs it") in refused["msg"]  # fmt: skip
    assert "python3" not in refused["msg"].split(" (of check")[0]  # the image has python3: only the missing is named
    unknown = run_module_inprocess("agentbox_best_of", {**args, "check": "true", "from": "no-such-checkpoint"})
    assert unknown["failed"] and unknown["msg"].startswith("from=no-such-checkpoint: "), unknown["msg"]
    assert _boxes_of(docker_client, workspace) == set()


def test_from_a_running_box_forks_its_exact_state_and_push_sends_the_adopted_branch(
    docker_client: docker.DockerClient, box_image: str, tmp_path: Path
) -> None:
    workspace = _workspace(tmp_path)
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    chown_tree(origin)
    git(workspace, "remote", "add", "origin", str(origin))
    source = f"bo-src-{secrets.token_hex(3)}"
    made = box_task({"name": source, "workspace": str(workspace)})
    assert not made["failed"], made.get("msg")
    container = docker_client.containers.get(f"agentbox-{source}")
    try:
        # The source box's state: a commit of its own, an edit and a new file not committed.
        work = (f"{BOX_GIT} commit -q --allow-empty -m 'box commit' && echo committed > committed.txt && git add committed.txt"
                f" && {BOX_GIT} commit -q -m 'box file' && echo changed >> README.md && echo fork-state > wip.txt")  # fmt: skip
        assert container.exec_run(["bash", "-c", work], user="vscode", workdir="/workspace").exit_code == 0
        winner_command = "cat wip.txt committed.txt > out.txt && grep -q changed README.md && echo readme >> out.txt"
        result = run_module_inprocess("agentbox_best_of", {
            "workspace": str(workspace), "task": "Use the box's work.", "from": source, "poll": 0.5,
            "agents": [{"name": "uses-fork", "command": winner_command}, {"name": "ignores", "command": "echo no > out.txt"}],
            "check": "grep -q fork-state out.txt && grep -q readme out.txt && grep -q committed out.txt",
            "adopt": "auto", "keep": "none", "push": True,
        })  # fmt: skip
        assert not result["failed"], result.get("msg")
        runs = result["runs"]
        assert [(r["agent"], r["state"], r["check_rc"]) for r in runs] == [("uses-fork", "done", 0), ("ignores", "done", 1)]
        # Each run's diff is its agent's alone: the fork's uncommitted work was committed before it started.
        assert runs[0]["files"] == ["out.txt"] and runs[1]["files"] == ["out.txt"]
        fork = result["fork"]
        assert fork["box"] == source and fork["removed"] is True  # keep=none: no box starts from it any more
        checkpoints = run_module_inprocess("agentbox_checkpoint_info", {"workspace": str(workspace)})
        assert fork["checkpoint"] not in [c["name"] for c in checkpoints["checkpoints"]]

        # The adopted branch, as the host repository has it, pushed to origin by the relay's push.
        branch = result["adopted"]["branch"]
        adopted = git(workspace, "rev-parse", branch).strip()
        assert result["adopted"]["commit"] == adopted == result["pushed"]["commit"]
        assert result["pushed"]["rc"] == 0 and result["pushed"]["remote"] == "origin"
        assert git(origin, "rev-parse", f"refs/heads/{branch}").strip() == adopted
        assert git(workspace, "show", f"{branch}:out.txt") == "fork-state\ncommitted\nreadme\n"
        subjects = git(workspace, "log", "--format=%s", f"main..{branch}").splitlines()
        assert subjects[0] == "best_of: run 1 (uses-fork)" and {"box commit", "box file"} <= set(subjects)

        # keep=none: every run's box is gone; the source box is as it was, its work still uncommitted.
        assert _boxes_of(docker_client, workspace) == {f"agentbox-{source}"}
        status = container.exec_run(["git", "status", "--porcelain=v1"], user="vscode", workdir="/workspace")
        assert sorted(status.output.decode().splitlines()) == [" M README.md", "?? wip.txt"]
    finally:
        box_task({"name": source, "workspace": str(workspace), "state": "absent", "delete_branch": True})
