"""The lifecycle playbooks refuse missing or bad arguments with a message saying what to pass, before
any task that changes something (two playbooks here, run for real; every playbook's check, its conditions, its
message and its place as the play's first task with nothing to keep its failure from ending the play, in-process
in tests/unit/playbooks/test_playbook_arguments.py); prune_checkpoints.yml removes only what nothing refers to."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, make_repo
from tests.integration.box.conftest import box_task

pytestmark = pytest.mark.integration

VENV_BIN = REPO / ".venv" / "bin"


def playbook(name: str, *args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    if home is not None:
        env["HOME"] = str(home)
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            f"playbooks/{name}", *args]  # fmt: skip
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def recap(stdout: str) -> dict[str, int]:
    line = next(line for line in reversed(stdout.splitlines()) if line.startswith("localhost"))
    return {key: int(value) for key, value in (item.split("=") for item in line.split(":", 1)[1].split())}


# A bad value of two playbooks (a check on extra vars, and one on the inventory's groups): the play stops at its
# check, nothing else runs, ansible-playbook exits 2. Every playbook's conditions and message, and that its check
# is its play's first task with nothing that would keep a failure from ending the play, are read in-process:
# tests/unit/playbooks/test_playbook_arguments.py.
MISSING = [
    ("checkpoint.yml", [], "pass the box to checkpoint: -e box=NAME"),
    ("fleet_create.yml", ["-e", "count=2"], "No engines in inventory group 'engines'"),
]


@pytest.mark.parametrize(("name", "args", "message"), MISSING, ids=[f"{m[0]}:{' '.join(m[1]) or 'none'}" for m in MISSING])
def test_missing_or_bad_arguments_fail_first_with_what_to_pass(name: str, args: list[str], message: str) -> None:
    done = playbook(name, *args)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-2000:]
    assert message in done.stdout, done.stdout[-3000:]
    # The check is the first task and the play stops there: nothing ran that could change anything.
    expected = {"ok": 0, "changed": 0, "unreachable": 0, "failed": 1, "skipped": 0, "rescued": 0, "ignored": 0}
    assert recap(done.stdout) | {"ok": 0} == expected
    assert "TASK [" in done.stdout and done.stdout.count("TASK [") == 1, done.stdout[-3000:]


def test_switch_to_a_box_that_does_not_exist_says_how_to_list_them(docker_client: docker.DockerClient) -> None:
    missing = f"nobox-{secrets.token_hex(4)}"
    done = playbook("switch_box.yml", "-e", f"box={missing}")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"no box called {missing}: list them with playbooks/list_boxes.yml" in done.stdout
    assert recap(done.stdout)["changed"] == 0


# -- prune_checkpoints.yml ----------------------------------------------------------------------------------
@pytest.fixture
def checkpoint_images(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[dict]:
    """Three checkpoint tags of one workspace's project (on the box image's layers, nothing is built):
    `orphan` (nothing refers to it), `kept` (a manifest does) and `used` (a container runs from it)."""
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming

    workspace = make_repo(tmp_path / "ws")
    project = _naming.project_id(str(workspace))
    home = tmp_path / "home"
    refs = {name: _naming.checkpoint_image(project, name) for name in ("orphan", "kept", "used")}
    image = docker_client.images.get(box_image)
    for ref in refs.values():
        repository, tag = ref.rsplit(":", 1)
        image.tag(repository, tag)
    manifest = home / ".agentbox" / "checkpoints" / project / "kept" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"name": "kept", "image": refs["kept"]}))
    user = docker_client.containers.create(refs["used"], ["true"], name=f"agentbox-test-prune-{secrets.token_hex(4)}")
    try:
        yield {"workspace": workspace, "home": home, "refs": refs, "client": docker_client}
    finally:
        user.remove(force=True, v=True)
        for ref in refs.values():
            try:
                docker_client.images.remove(ref)
            except docker.errors.ImageNotFound:
                pass


def _tags(client: docker.DockerClient, refs: dict[str, str]) -> set[str]:
    present = set()
    for name, ref in refs.items():
        try:
            client.images.get(ref)
            present.add(name)
        except docker.errors.ImageNotFound:
            pass
    return present


def test_prune_checkpoints_removes_only_what_nothing_refers_to(checkpoint_images: dict) -> None:
    refs, client = checkpoint_images["refs"], checkpoint_images["client"]
    scope = ["-e", f"workspace={checkpoint_images['workspace']}"]
    planned = playbook("prune_checkpoints.yml", "--check", *scope, home=checkpoint_images["home"])
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-2000:]
    assert f"would remove: {refs['orphan']}" in planned.stdout, planned.stdout[-3000:]
    assert _tags(client, refs) == {"orphan", "kept", "used"}  # check mode removed nothing

    done = playbook("prune_checkpoints.yml", *scope, home=checkpoint_images["home"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"removed: {refs['orphan']}" in done.stdout, done.stdout[-3000:]
    assert _tags(client, refs) == {"kept", "used"}

    again = playbook("prune_checkpoints.yml", *scope, home=checkpoint_images["home"])
    assert again.returncode == 0 and "removed: nothing" in again.stdout, again.stdout[-3000:]


def test_prune_checkpoints_keeps_to_the_project_it_is_run_in(docker_client: docker.DockerClient, box_image: str,
                                                             tmp_path: Path) -> None:
    """Run from workspace A without -e workspace, prune offers only A's orphan checkpoint image, never B's (an
    engine holds other projects' and other users' checkpoints, whose manifests this HOME does not have);
    -e all_projects=true offers both."""
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming

    workspaces = {key: make_repo(tmp_path / f"ws-{key}") for key in ("a", "b")}
    refs = {key: _naming.checkpoint_image(_naming.project_id(str(path)), "orphan") for key, path in workspaces.items()}
    image = docker_client.images.get(box_image)
    for ref in refs.values():
        image.tag(*ref.rsplit(":", 1))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "HOME": str(tmp_path / "home"), "PWD": str(workspaces["a"])}

    def prune(*args: str) -> str:
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e",
                f"ansible_python_interpreter={sys.executable}", str(REPO / "playbooks/prune_checkpoints.yml"), *args]
        done = subprocess.run(argv, cwd=workspaces["a"], env=env, capture_output=True, text=True, timeout=600,
                              check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return " ".join(done.stdout.split())

    try:
        here = prune("--check")
        assert refs["a"] in here and refs["b"] not in here and "this project only" in here, here[-3000:]
        everywhere = prune("--check", "-e", "all_projects=true")
        assert refs["a"] in everywhere and refs["b"] in everywhere, everywhere[-3000:]
        assert _tags(docker_client, refs) == {"a", "b"}  # check mode removed nothing
    finally:
        for ref in refs.values():
            try:
                docker_client.images.remove(ref)
            except docker.errors.ImageNotFound:
                pass


# -- create_box.yml with image= and checkpoint=none ---------------------------------------------------------
def test_create_box_with_another_image_and_no_checkpoint(docker_client: docker.DockerClient, box_image: str,
                                                         tmp_path: Path) -> None:  # fmt: skip
    from tests.conftest import chown_tree

    workspace = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(workspace)
    repository, tag = f"agentbox-test/other-{secrets.token_hex(4)}", "v1"
    docker_client.images.get(box_image).tag(repository, tag)  # the same layers under another name
    name = f"img-{secrets.token_hex(3)}"
    try:
        done = playbook("create_box.yml", "-e", f"workspace={workspace}", "-e", f"box={name}",
                        "-e", f"image={repository}:{tag}", "-e", "checkpoint=none", home=tmp_path / "home")  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        # The image was there: the build task was skipped, and the box runs the image that was asked for.
        assert "TASK [Build the box image (it is missing)]" in done.stdout
        assert recap(done.stdout)["skipped"] >= 1
        container = docker_client.containers.get(f"agentbox-{name}")
        assert container.attrs["Config"]["Image"] == f"{repository}:{tag}"
        assert container.labels.get("io.agentbox.checkpoint", "") == ""
        assert f"box:       {name} (docker)" in done.stdout and f"branch:    agentbox/{name}" in done.stdout
    finally:  # a clean-up, not a check: in-process (destroy_box.yml's output is test_playbook_output's)
        box_task({"name": name, "state": "absent", "delete_branch": True}, env={"HOME": str(tmp_path / "home")})
        docker_client.images.remove(f"{repository}:{tag}")
