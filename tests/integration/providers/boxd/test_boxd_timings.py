"""boxd at the production cluster's timings (`scripts/boxd-emulator --production-timings`): a start takes
~12 s there, as the seed document pins it. The provider's create, start after a stop, and execs around them
wait it out with the real SDK, and nothing is made twice."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

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

    provider = BoxdProvider(token=emu.token, base_url=emu.base_url)
    name = f"btm-{secrets.token_hex(3)}"
    facts = provider.create(_box_spec(name))
    try:
        assert facts.state == "running", facts
        assert provider.exec(name, ["echo", "made"]).stdout == b"made\n"
        assert provider.stop(name).state == "stopped"
        assert provider.start(name).state == "running"
        assert provider.exec(name, ["sh", "-c", "echo again; exit 4"]).rc == 4
        machines = [m for m in emu.control.state()["machines"] if m["labels"].get("io.agentbox.box") == name]
        assert len(machines) == 1 and machines[0]["status"] == "running", machines
    finally:
        provider.destroy(name)
    assert provider.find(name) is None
