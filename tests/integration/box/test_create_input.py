"""A box name too long for a Docker container's hostname is a clear error before any side effect, and the
longest that fits makes a box with that hostname (real engine, real git). The other bad input to a create
(names git refuses, bare repositories, workspace paths, merges, rebases, an invalid agentbox.yaml) is proven
in-process on the fake provider: tests/unit/box/test_box_module.py."""

from __future__ import annotations

import secrets
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo, run_module

pytestmark = pytest.mark.integration


def nothing_made(name: str, repo: Path | None) -> None:
    """No container, no volume, no agentbox branch and no worktree registration was left."""
    client = docker.from_env()
    assert not client.containers.list(all=True, filters={"name": f"^agentbox-{name.strip()}$"})
    assert not client.volumes.list(filters={"label": f"io.agentbox.box={name.strip()}"})
    if repo is not None:
        assert git(repo, "for-each-ref", "refs/heads/agentbox/") == ""
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def create(workspace: Path | str, name: str | None, **extra: object) -> dict:
    args: dict[str, object] = {"workspace": str(workspace), "state": "started", **extra}
    if name is not None:
        args["name"] = name
    return run_module("agentbox_box", args)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    made = make_repo(tmp_path / "ws", {"README.md": "hello\n", "a.txt": "base\n"})
    chown_tree(made)
    return made


def test_a_name_too_long_for_the_container_hostname_fails_before_any_side_effect(repo: Path) -> None:
    """The name rule allows 63 characters, but a Docker box's hostname is agentbox-<box> and Linux takes
    at most 64 (runc: `sethostname: invalid argument`): 55 is the longest name a Docker box can take."""
    stem = f"long-{secrets.token_hex(3)}-"
    too_long = stem + "x" * (56 - len(stem))
    result = create(repo, too_long)
    assert result["failed"], result
    assert f"box name '{too_long}' is 56 characters" in result["msg"], result["msg"]
    assert "hostname" in result["msg"] and "at most 55" in result["msg"], result["msg"]
    nothing_made(too_long, repo)
    longest = stem + "y" * (55 - len(stem))
    try:
        made = create(repo, longest, boot=False, checkpoint="none")
        assert not made.get("failed"), made.get("msg")
        hostname = docker.from_env().containers.get(f"agentbox-{longest}").attrs["Config"]["Hostname"]
        assert hostname == f"agentbox-{longest}"  # the contract's "hostname the same" holds
    finally:
        run_module("agentbox_box", {"name": longest, "state": "absent", "delete_branch": True})
