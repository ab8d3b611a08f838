"""Fixtures of the workflow tests: a fake provider whose boxes are directories (fake_provider.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import provider_as


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of this test for the journal, ssh entries and relay registrations. Its path is too
    long for a unix socket, so a create takes its documented no-relay path instead of starting a
    relay daemon that would outlive the test."""
    path = tmp_path / ("home-" + "h" * 80)
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    return path


@pytest.fixture
def fake(tmp_path: Path, home: Path) -> Iterator[FakeProvider]:
    """Boxes on the host's filesystem, sharing it as the local engine does (git layers)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the fake provider mounts and chroots")
    provider = FakeProvider(tmp_path / "engine")
    yield provider
    for name in list(provider.boxes):
        provider.destroy(name)


@pytest.fixture
def remote_fake(tmp_path: Path, home: Path) -> Iterator[FakeProvider]:
    """Boxes that cannot see the host's files, as a remote engine or Daytona: the repo is shipped."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the fake provider mounts and chroots")
    provider = FakeProvider(tmp_path / "remote-engine", shares_host_filesystem=False)
    yield provider
    for name in list(provider.boxes):
        provider.destroy(name)


@pytest.fixture
def fake_docker(fake: FakeProvider) -> Iterator[FakeProvider]:
    """The fake provider standing in for the local engine (provider: docker, the modules' default) for
    modules run in-process (tests/unit/support/inprocess.py)."""
    with provider_as("docker", fake):
        yield fake
