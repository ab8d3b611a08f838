"""Stopping a box lets its services stop gracefully, whether the box was running or paused."""

from __future__ import annotations

import io
import secrets
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, make_repo, run_module

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
MARKER = "/home/vscode/stopped-gracefully"
# A service that records the SIGTERM the supervisor's shutdown sends it (`docker stop` alone
# SIGTERMs only PID 1, then SIGKILLs everything).
PROJECT = f"""\
services:
  sentinel:
    command: |
      trap 'echo graceful > {MARKER}; exit 0' TERM
      while :; do sleep 0.2; done
"""


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    client = docker.from_env()
    if not any(IMAGE in image.tags for image in client.images.list(name="agentbox/box")):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    return client


@pytest.fixture
def box(engine: docker.DockerClient, tmp_path: Path) -> Iterator[str]:
    repo = make_repo(tmp_path / "ws", {"agentbox.yaml": PROJECT})
    chown_tree(repo)
    name = f"stop-{secrets.token_hex(3)}"
    made = run_module("agentbox_box", {"name": name, "workspace": str(repo)})
    try:
        assert made.get("failed") is not True, made
        yield name
    finally:
        run_module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})


def read_marker(engine: docker.DockerClient, name: str) -> str | None:
    """The marker file, read from the stopped container's filesystem (no process runs)."""
    try:
        stream, _stat = engine.containers.get(f"agentbox-{name}").get_archive(MARKER)
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.extractfile(tar.getmembers()[0])
        return member.read().decode() if member else None


def wait_running(engine: docker.DockerClient, name: str) -> None:
    done = engine.containers.get(f"agentbox-{name}").exec_run(
        ["agentbox-ctl", "wait-ready", "--timeout", "60"], user="vscode"
    )
    assert done.exit_code == 0, done.output.decode()
    status = engine.containers.get(f"agentbox-{name}").exec_run(["agentbox-ctl", "status"], user="vscode")
    assert b"sentinel" in status.output, status.output.decode()


def test_stopping_a_paused_box_shuts_its_services_down_gracefully(engine, box):
    wait_running(engine, box)
    paused = run_module("agentbox_box", {"name": box, "state": "paused"})
    assert paused["box"]["state"] == "paused", paused
    stopped = run_module("agentbox_box", {"name": box, "state": "stopped"})
    assert stopped.get("failed") is not True and stopped["box"]["state"] == "stopped", stopped
    assert read_marker(engine, box) == "graceful\n"


def test_stopping_a_running_box_shuts_its_services_down_gracefully(engine, box):
    wait_running(engine, box)
    stopped = run_module("agentbox_box", {"name": box, "state": "stopped"})
    assert stopped.get("failed") is not True and stopped["box"]["state"] == "stopped", stopped
    assert read_marker(engine, box) == "graceful\n"
