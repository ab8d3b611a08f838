"""The agent tests' fixtures: a World (tests/integration/agent/world.py) and a workspace whose git config names
the host user (test_agent_boxd.py gives its world a boxd emulator of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo
from tests.integration.agent.world import World


@pytest.fixture
def world(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[World]:
    made = World(docker_client, tmp_path)
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "ws", {"README.md": "hello\n"})
    git(repo, "config", "user.name", "Host Person")
    git(repo, "config", "user.email", "host.person@example.invalid")
    chown_tree(repo)
    return repo
