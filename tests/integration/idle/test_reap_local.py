"""agentbox_reap on the local Docker engine (not only Daytona): an idle box is paused, a box without an
idle signal is kept; check mode pauses nothing. Scoped to the test's own workspace, so no other box is looked at."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, make_repo, run_module

pytestmark = pytest.mark.integration


@pytest.fixture
def two_boxes(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[dict]:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    token = secrets.token_hex(3)
    names = {"idle": f"reap-idle-{token}", "quiet": f"reap-quiet-{token}"}
    try:
        for name in names.values():
            made = run_module("agentbox_box", {"name": name, "workspace": str(repo), "image": box_image, "boot": False})
            assert made.get("failed") is not True, made
        hour_ago = int(time.time()) - 3600
        # The idle agent: a heartbeat an hour old and nothing under /workspace changed since.
        idle = docker_client.containers.get(f"agentbox-{names['idle']}")
        heartbeat = idle.exec_run(["sh", "-c", f"mkdir -p ~/.agentbox && touch -d @{hour_ago} ~/.agentbox/last-activity"],
                                  user="vscode")  # fmt: skip
        aged = idle.exec_run(["sh", "-c", f"find /workspace/ -exec touch -h -d @{hour_ago} {{}} +"], user="root")
        assert heartbeat.exit_code == 0 and aged.exit_code == 0, (heartbeat.output, aged.output)
        yield {"names": names, "workspace": str(repo), "client": docker_client}
    finally:
        for name in names.values():
            run_module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})


def states(two_boxes: dict) -> dict[str, str]:
    client = two_boxes["client"]
    return {role: client.containers.get(f"agentbox-{name}").status for role, name in two_boxes["names"].items()}


def test_reap_on_docker_pauses_only_the_idle_box(two_boxes: dict) -> None:
    names = two_boxes["names"]
    args = {"provider": "docker", "workspace": two_boxes["workspace"], "idle_timeout": 1}
    planned = run_module("agentbox_reap", args, check_mode=True)
    assert planned.get("failed") is not True, planned
    actions = {entry["name"]: entry["action"] for entry in planned["boxes"]}
    assert actions == {names["idle"]: "would_pause", names["quiet"]: "kept"}, planned["boxes"]
    assert planned["paused"] == [names["idle"]] and states(two_boxes) == {"idle": "running", "quiet": "running"}

    done = run_module("agentbox_reap", args)
    assert done.get("failed") is not True and done["changed"] is True, done
    by_name = {entry["name"]: entry for entry in done["boxes"]}
    assert by_name[names["idle"]]["action"] == "paused" and by_name[names["quiet"]]["action"] == "kept"
    assert "no idle signal" in by_name[names["quiet"]]["reason"]
    assert by_name[names["idle"]]["idle_seconds"] >= 3600 and by_name[names["idle"]]["idle_timeout"] == 1
    assert states(two_boxes) == {"idle": "paused", "quiet": "running"}

    again = run_module("agentbox_reap", args)
    assert again["changed"] is False and again["paused"] == []
