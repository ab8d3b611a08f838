"""playbooks/checkpoints.yml on the real engine (issue 33 item 16): a box of a fresh workspace, a checkpoint
taken of it, listed (from the workspace, no -e workspace), removed in check mode (nothing goes), removed
(image, manifest and default go), listed again; a name the project does not have is refused with what
to do, before anything is removed, and so is one a box runs on.

The box, one checkpoint and the info are made through `ansible localhost -m` (the modules' path);
what only sets up or clears state for the playbook is done by the library in-process."""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.conftest import REPO, chown_tree, make_repo, run_module

pytestmark = pytest.mark.integration

VENV_BIN = REPO / ".venv" / "bin"


def checkpoints(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    """checkpoints.yml by path, run from the workspace as a user would (its project is $PWD's)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "PWD": str(workspace)}
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            str(REPO / "playbooks" / "checkpoints.yml"), *args]  # fmt: skip
    return subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=600, check=False)


def flat(text: str) -> str:
    """Output with every run of whitespace one space: the YAML result format folds long lines."""
    return " ".join(text.split())


def table_row(stdout: str, name: str) -> list[str] | None:
    """The cells of the table line of checkpoint `name` (the YAML result format prints the table as a block)."""
    for line in stdout.splitlines():
        cells = line.split()
        if cells and cells[0] == name:
            return cells
    return None


@pytest.fixture(scope="module")
def project(docker_client: docker.DockerClient, box_image: str) -> Iterator[dict]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-ckpts-"))
    root.chmod(0o755)
    box = f"ckpts-{secrets.token_hex(3)}"
    workspace = make_repo(root / "ws", {"app.py": "print('hi')\n"})
    chown_tree(workspace)
    project_id = hashlib.sha1(str(workspace).encode()).hexdigest()[:16]
    try:
        made = run_module("agentbox_box", {"name": box, "workspace": str(workspace)})
        assert not made["failed"], made
        yield {"root": root, "box": box, "workspace": workspace, "project": project_id, "client": docker_client}
    finally:
        destroy(box)
        for image in docker_client.images.list(filters={"label": f"io.agentbox.project={project_id}"}):
            for tag in image.tags:
                docker_client.images.remove(tag, force=True)
        shutil.rmtree(Path.home() / ".agentbox" / "checkpoints" / project_id, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def destroy(box: str) -> None:
    """Remove the box and its branch, as agentbox_box state=absent delete_branch=true does."""
    provider = DockerProvider()
    facts = provider.find(box)
    if facts is not None:
        _box.destroy_box(provider, facts, delete_branch=True)


def image_exists(client: docker.DockerClient, reference: str) -> bool:
    try:
        client.images.get(reference)
    except docker.errors.ImageNotFound:
        return False
    return True


def test_checkpoints_lists_then_removes_one_in_check_mode_and_for_real(project: dict) -> None:
    workspace, box, client = project["workspace"], project["box"], project["client"]
    name = f"warm-{secrets.token_hex(3)}"
    image = f"agentbox-ckpt-{project['project']}:{name}"
    manifest = Path.home() / ".agentbox" / "checkpoints" / project["project"] / name / "manifest.json"
    taken = run_module("agentbox_checkpoint", {"box": box, "name": name, "set_default": True})
    assert not taken["failed"], taken
    assert image_exists(client, image) and manifest.is_file()

    listed = checkpoints(workspace)
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-2000:]
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    row = table_row(listed.stdout, name)
    assert row is not None, listed.stdout[-3000:]
    # NAME, CREATED (date, time), SIZE (number, unit), FROM BOX, DEFAULT, KEPT, NOTES
    assert row[1] == today and float(row[3]) > 0 and row[4].endswith("B"), row
    assert row[5:] == [box, "yes", "yes", "-"], row
    assert f"1 checkpoint of {workspace} (project {project['project']}, docker)" in flat(listed.stdout)
    assert "remove one: ansible-playbook playbooks/checkpoints.yml -e checkpoint=NAME -e state=absent" in flat(listed.stdout)

    planned = checkpoints(workspace, "-e", f"checkpoint={name}", "-e", "state=absent", "--check")
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-2000:]
    assert f"would remove: checkpoint {name} ({image}," in flat(planned.stdout)
    assert "it is the project default: new boxes would start without a checkpoint" in flat(planned.stdout)
    assert image_exists(client, image) and manifest.is_file()  # check mode: nothing went

    removed = checkpoints(workspace, "-e", f"checkpoint={name}", "-e", "state=absent")
    assert removed.returncode == 0, removed.stdout[-3000:] + removed.stderr[-2000:]
    assert f"removed: checkpoint {name} ({image}," in flat(removed.stdout)
    assert "it was the project default: new boxes start without a checkpoint now" in flat(removed.stdout)
    assert "left: none" in flat(removed.stdout)
    assert not image_exists(client, image) and not manifest.exists()
    info = run_module("agentbox_checkpoint_info", {"workspace": str(workspace)})
    assert info["checkpoints"] == [] and not info["default"]

    again = checkpoints(workspace)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert table_row(again.stdout, name) is None
    assert f"0 checkpoints of {workspace}" in flat(again.stdout)
    assert "take one: ansible-playbook playbooks/checkpoint.yml -e box=NAME" in flat(again.stdout)


def test_checkpoints_refuses_a_name_the_project_does_not_have_and_one_a_box_runs_on(project: dict) -> None:
    workspace, box, client = project["workspace"], project["box"], project["client"]
    kept = f"kept-{secrets.token_hex(3)}"
    provider = DockerProvider()
    taken = _checkpoint.capture(provider, _checkpoint.plan_capture(provider, provider.find(box), kept))
    assert taken["name"] == kept, taken
    image = f"agentbox-ckpt-{project['project']}:{kept}"
    try:
        for args in ([], ["--check"]):
            refused = checkpoints(workspace, "-e", "checkpoint=no-such-checkpoint", "-e", "state=absent", *args)
            assert refused.returncode == 2, refused.stdout[-3000:]
            assert f"no checkpoint no-such-checkpoint in the project of {workspace} (docker);" in flat(refused.stdout)
            assert f"it has: {kept}" in flat(refused.stdout)
            assert "List them: ansible-playbook playbooks/checkpoints.yml" in flat(refused.stdout)
        # From another directory the workspace is named: the same name is found there and listed alone.
        listed = checkpoints(project["root"], "-e", f"workspace={workspace}", "-e", f"checkpoint={kept}")
        assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-2000:]
        assert table_row(listed.stdout, kept) is not None
        assert f"-e checkpoint=NAME -e state=absent -e workspace={workspace}" in flat(listed.stdout)
        assert image_exists(client, image)  # nothing was removed

        # A checkpoint a box runs on is refused too, saying what to do, and nothing of it goes.
        made = _box.create_box(provider, _box.CreateRequest(name=f"{box}-from", workspace=str(workspace), checkpoint=kept))
        assert made.facts.state == "running", made
        busy = checkpoints(workspace, "-e", f"checkpoint={kept}", "-e", "state=absent")
        assert busy.returncode == 2, busy.stdout[-3000:]
        assert "Destroy the boxes that run on it first" in flat(busy.stdout), busy.stdout[-3000:]
        manifest = Path.home() / ".agentbox" / "checkpoints" / project["project"] / kept / "manifest.json"
        assert image_exists(client, image) and manifest.is_file()
    finally:
        destroy(f"{box}-from")
        found = _checkpoint.find_checkpoint(provider, project["project"], kept)
        if found is not None:
            _checkpoint.remove(provider, found)
