"""Which creates a pooled box can serve (box/_pool_claim), and a create on an engine with no pool asking
nothing of it, without an engine."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _pool_claim
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec


def spec(**changes: Any) -> BoxSpec:
    given: dict[str, Any] = {"name": "b", "box_id": "i1", "project": "p", "workspace": "/w",
                             "image": "agentbox/box:latest", "labels": {}, "ports": [80]}
    return BoxSpec(**{**given, **changes})


@pytest.mark.parametrize(("changes", "restore", "boot", "says"), [
    ({}, None, True, ""),
    ({"bind_paths": ["/w/.git"], "mounts": {"/h": "/run/r"}}, None, True, ""),  # the engine's store judges these
    ({}, object(), True, "a checkpoint restore starts from the checkpoint's image"),
    ({"env": {"A": "1"}}, None, True, "env is set at docker create"),
    ({"ports": [80, 8080, 3000]}, None, True, "ports 3000, 8080 are published at docker create"),
    ({"resources": {"memory": "2g"}}, None, True, "memory, cpus and pids_limit"),
    ({"egress": True}, None, True, "an egress policy puts the box on its own network"),
    ({"secrets": {"k": "v"}}, None, True, "secrets are written as the box is made"),
    ({}, None, False, "boot=false asks for a box not booted"),
])
def test_what_a_request_fixes_at_docker_create_keeps_it_from_a_pooled_box(
    changes: dict, restore: Any, boot: bool, says: str
) -> None:
    why = _pool_claim.unservable(spec(**changes), restore, boot)
    assert why.startswith(says) if says else why == ""


class NoPoolProvider:
    name, engine = "docker", "local"

    def pool_store(self) -> Any:
        raise AssertionError("a create with no pool set must not ask the engine for pooled boxes")


def test_a_create_with_no_pool_set_asks_the_engine_nothing_and_says_nothing(tmp_path: Path) -> None:
    facts, line = _pool_claim.claim(NoPoolProvider(), spec(), None, "fp", path=str(tmp_path / "pools.json"))  # type: ignore[arg-type]
    assert (facts, line) == (None, "")


def test_the_identity_file_line_quotes_what_it_writes(tmp_path: Path) -> None:
    line = _pool_claim.identity_command(NoPoolProvider(), spec(workspace="/w/it's $HOME"))  # type: ignore[arg-type]
    assert line is not None
    target = tmp_path / "box.env"
    ran = subprocess.run(["sh", "-c", line.replace(_pool_claim.IDENTITY_FILE, str(target))
                          .replace("/etc/agentbox", str(tmp_path))], capture_output=True, text=True, check=True)
    assert ran.returncode == 0
    assert target.read_text() == ("AGENTBOX=1\nAGENTBOX_BOX_NAME=b\nAGENTBOX_BOX_ID=i1\nAGENTBOX_PROJECT=p\n"
                                  "AGENTBOX_HOST_WORKSPACE='/w/it'\"'\"'s $HOME'\n")


def test_a_provider_without_a_pool_gets_no_identity_file_line() -> None:
    """Its boxes are never claimed ones, and its exec may not run as root (Daytona's toolbox without sudo)."""
    assert _pool_claim.identity_command(object(), spec()) is None  # type: ignore[arg-type]
