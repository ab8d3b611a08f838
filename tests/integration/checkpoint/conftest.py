"""Fixtures of the checkpoint tests: the engine with the box image, and a lab (lab.py) per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import docker
import pytest

from tests.integration.checkpoint.lab import Lab, open_lab


@pytest.fixture(scope="module")
def client(docker_client: docker.DockerClient, box_image: str) -> docker.DockerClient:
    """The engine, with the box image on it (the top conftest fails the test when either is missing)."""
    return docker_client


@pytest.fixture
def lab(client: Any) -> Iterator[Lab]:
    """A lab of this test's own: for a test that changes what it makes."""
    with open_lab(client) as world:
        yield world
