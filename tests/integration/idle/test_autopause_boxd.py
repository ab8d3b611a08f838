"""The idle policy on boxd, through the boxd emulator with the real SDK (machines are real containers from
agentbox/box:latest): the same rules as on the local engine. Agents working, idle for 10 minutes and none,
`max_running: 1`: only the idle one is paused, which on boxd suspends the machine (memory kept). Time is
injected (the state's `since`, the module's test-only `now`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.boxd_emulator import running_emulator
from tests.conftest import run_module

pytestmark = pytest.mark.integration

PROJECT = "b" * 16


@pytest.fixture
def boxd_fleet(tmp_path: Path, box_image: str) -> Iterator[dict]:
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    with running_emulator(image=box_image) as emu:
        provider = BoxdProvider(token=emu.token, base_url=emu.base_url)
        suffix = uuid.uuid4().hex[:4]
        names = {role: f"bxi-{role}-{suffix}" for role in ("working", "idle10", "none")}
        now = float(int(time.time()))
        try:
            for name in names.values():
                box_id = uuid.uuid4().hex[:8]
                labels = _naming.box_labels(box=name, box_id=box_id, project=PROJECT, workspace="/nowhere", branch="",
                                            image_fingerprint="", provider="boxd", engine=emu.base_url)  # fmt: skip
                provider.create(BoxSpec(name=name, box_id=box_id, project=PROJECT, workspace="/nowhere",
                                        image=box_image, labels=labels))  # fmt: skip
            for role, (state, ago) in {"working": ("working", 3600), "idle10": ("idle", 600)}.items():
                since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - ago))
                script = ('agentbox-ctl agent-state "$1" --session claude && '
                          'sed -i "s/\\"since\\": \\"[^\\"]*\\"/\\"since\\": \\"$2\\"/" /run/agentbox/agents/claude.state.json')  # fmt: skip
                provider.exec(names[role], ["sh", "-c", script, "sh", state, since]).check("setting the agent state")
            ids = {role: provider.find(name).container for role, name in names.items()}
            yield {"names": names, "ids": ids, "emu": emu, "now": now, "state_file": str(tmp_path / "paused.json")}
        finally:
            for name in names.values():
                provider.destroy(name)


def test_boxd_boxes_follow_the_same_rules(boxd_fleet: dict) -> None:
    names, emu = boxd_fleet["names"], boxd_fleet["emu"]
    args = {"provider": "boxd", "boxd_base_url": emu.base_url, "project": PROJECT, "max_running": 1,
            "idle_minutes": 1, "now": boxd_fleet["now"], "state_file": boxd_fleet["state_file"]}
    env = {"BOXD_TOKEN": emu.token}  # a token used as-is, as the emulator takes it
    done = run_module("agentbox_idle", args, env=env)
    assert done.get("failed") is not True, done
    assert done["paused"] == [names["idle10"]] and done["stopped"] == [], done["boxes"]
    by_name = {entry["name"]: entry for entry in done["boxes"]}
    assert by_name[names["idle10"]]["idle_seconds"] == 600
    assert by_name[names["working"]]["action"] == "keep" and by_name[names["none"]]["action"] == "keep"
    status = {role: emu.control.machine(machine_id)["status"] for role, machine_id in boxd_fleet["ids"].items()}
    assert status == {"working": "running", "idle10": "suspended", "none": "running"}, status
    # A second pass sees the box paused and leaves it so (its observation is of running boxes only).
    again = run_module("agentbox_idle", {**args, "now": boxd_fleet["now"] + 60}, env=env)
    assert again.get("failed") is not True and again["paused"] == [], again
    assert emu.control.machine(boxd_fleet["ids"]["idle10"])["status"] == "suspended"
