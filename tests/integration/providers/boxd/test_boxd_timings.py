"""boxd at the production cluster's timings (`scripts/boxd-emulator --production-timings`): a start takes
~12 s there, as the seed document pins it. The provider's create, start after a stop, and execs around them
wait it out with the real SDK, and nothing is made twice. The two waits run side by side: one box is created
while another (made before the start was slowed) is started after its stop, so the module waits one twelve
seconds, not two."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.boxd_emulator import running_emulator
from tests.boxd_emulator.machines import PRODUCTION_START_SECONDS, PRODUCTION_STOP_SECONDS

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"


@pytest.fixture(scope="module")
def emu(box_image: str) -> Iterator:
    with running_emulator(image=box_image, start_seconds=PRODUCTION_START_SECONDS) as running:
        timings = running.control.configure(stop_seconds=PRODUCTION_STOP_SECONDS)
        # configure answers with every setting it has (the key exchange's and snapshots' too): these two are ours.
        assert {key: timings[key] for key in ("start_seconds", "stop_seconds")} == {
            "start_seconds": PRODUCTION_START_SECONDS, "stop_seconds": PRODUCTION_STOP_SECONDS}
        yield running


def _box_spec(name: str):
    from ansible_collections.agentbox.box.plugins.module_utils.core._naming import box_labels
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec

    box_id = secrets.token_hex(8)
    labels = box_labels(box=name, box_id=box_id, project="0" * 16, workspace="/tmp", branch="",
                        image_fingerprint="", provider="boxd", engine="", checkpoint=None)  # fmt: skip
    return BoxSpec(name=name, box_id=box_id, project="0" * 16, workspace="/tmp", image=IMAGE, labels=labels)


def test_create_stop_and_start_wait_out_a_twelve_second_start(emu) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    def provider() -> BoxdProvider:  # one each: a thread of its own, a channel of its own
        return BoxdProvider(token=emu.token, base_url=emu.base_url)

    made, restarted = f"btm-{secrets.token_hex(3)}", f"btm-{secrets.token_hex(3)}"
    # The box to restart is made at the default start, then stopped; the production start from here on.
    emu.control.configure(start_seconds=0.3)
    try:
        assert provider().create(_box_spec(restarted)).state == "running"
    finally:
        emu.control.configure(start_seconds=PRODUCTION_START_SECONDS)
    try:
        assert provider().stop(restarted).state == "stopped"

        def create_and_exec() -> tuple[str, bytes]:
            mine = provider()
            facts = mine.create(_box_spec(made))
            return facts.state, mine.exec(made, ["echo", "made"]).stdout

        def start_and_exec() -> tuple[str, int]:
            mine = provider()
            state = mine.start(restarted).state
            return state, mine.exec(restarted, ["sh", "-c", "echo again; exit 4"]).rc

        with ThreadPoolExecutor(2) as pool:
            creating, starting = pool.submit(create_and_exec), pool.submit(start_and_exec)
            assert creating.result() == ("running", b"made\n")
            assert starting.result() == ("running", 4)
        # One machine each: neither the slow create nor the slow start made a second one.
        machines = {name: [m for m in emu.control.state()["machines"] if m["labels"].get("io.agentbox.box") == name]
                    for name in (made, restarted)}  # fmt: skip
        for name, found in machines.items():
            assert len(found) == 1 and found[0]["status"] == "running", (name, machines)
    finally:
        for name in (made, restarted):
            provider().destroy(name)
    assert provider().find(made) is None and provider().find(restarted) is None
