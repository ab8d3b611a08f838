"""The idle policy on Daytona, through the emulator (real containers from agentbox/box:latest): the same rules
as on the local engine. Agents working, idle for 10 minutes and none, `max_running: 1`: only the idle one is
paused, which on Daytona stops (and archives) the sandbox. Time is injected (the state's `since`, the module's
test-only `now`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import run_module
from tests.daytona_emulator import running_emulator

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
PROJECT = "d" * 16


@pytest.fixture
def daytona_fleet(tmp_path: Path) -> Iterator[dict]:
    if not docker.from_env().images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

    with running_emulator(image=IMAGE) as (api_url, api_key, admin):
        provider = DaytonaProvider(api_key=api_key, api_url=api_url)
        suffix = uuid.uuid4().hex[:4]
        names = {role: f"dti-{role}-{suffix}" for role in ("working", "idle10", "none")}
        now = float(int(time.time()))
        try:
            for name in names.values():
                box_id = uuid.uuid4().hex[:8]
                labels = _naming.box_labels(box=name, box_id=box_id, project=PROJECT, workspace="/nowhere", branch="",
                                            image_fingerprint="", provider="daytona", engine=api_url)  # fmt: skip
                provider.create(BoxSpec(name=name, box_id=box_id, project=PROJECT, workspace="/nowhere", image=IMAGE,
                                        labels=labels))  # fmt: skip
            for role, (state, ago) in {"working": ("working", 3600), "idle10": ("idle", 600)}.items():
                since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - ago))
                script = ('agentbox-ctl agent-state "$1" --session claude && '
                          'sed -i "s/\\"since\\": \\"[^\\"]*\\"/\\"since\\": \\"$2\\"/" /run/agentbox/agents/claude.state.json')  # fmt: skip
                provider.exec(names[role], ["sh", "-c", script, "sh", state, since]).check("setting the agent state")
            yield {"names": names, "admin": admin, "api_url": api_url, "api_key": api_key, "now": now,
                   "state_file": str(tmp_path / "paused.json")}  # fmt: skip
        finally:
            for name in names.values():
                provider.destroy(name)


def test_daytona_boxes_follow_the_same_rules(daytona_fleet: dict) -> None:
    names = daytona_fleet["names"]
    args = {"provider": "daytona", "daytona_api_url": daytona_fleet["api_url"], "daytona_api_key": daytona_fleet["api_key"],
            "project": PROJECT, "max_running": 1, "idle_minutes": 1, "now": daytona_fleet["now"],
            "state_file": daytona_fleet["state_file"]}  # fmt: skip
    done = run_module("agentbox_idle", args)
    assert done.get("failed") is not True, done
    assert done["paused"] == [names["idle10"]] and done["stopped"] == [], done["boxes"]
    by_name = {entry["name"]: entry for entry in done["boxes"]}
    assert by_name[names["idle10"]]["idle_seconds"] == 600
    assert by_name[names["working"]]["action"] == "keep" and by_name[names["none"]]["action"] == "keep"
    states = {s["name"]: s["state"] for s in daytona_fleet["admin"].state()["sandboxes"]}
    assert states[names["working"]] == "started" and states[names["none"]] == "started", states
    assert states[names["idle10"]] != "started", states  # stopped, then archived by Daytona's own rule
