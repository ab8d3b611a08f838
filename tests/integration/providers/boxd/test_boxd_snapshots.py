"""boxd's snapshots, sleep states and egress list as the provider meets them, through the emulator and the
real SDK: a capture is pending, then ready, and saving a name that exists makes a new version of it; an
archived snapshot makes no machine; a hibernated machine is woken (`wake`), not resumed; the egress list is
in force before the box boots (in the create's spec for a restore)."""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.boxd_emulator import running_emulator
from tests.integration.providers.boxd.test_boxd_provider import World
from tests.integration.providers.boxd.test_boxd_provider_guarantees import spec_of

pytestmark = pytest.mark.integration

PROJECT = "0" * 16  # spec_of's project


@pytest.fixture(scope="module")
def world(box_image: str) -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-bsn-", dir="/tmp"))
    root.chmod(0o755)
    try:
        with running_emulator(image=box_image) as emu:
            yield World(emu, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def box(world: World) -> Iterator[str]:
    provider = world.provider()
    name = f"bs-{secrets.token_hex(3)}"
    provider.create(spec_of(world, name))
    try:
        yield name
    finally:
        provider.destroy(name)


def calls(world: World, since: int) -> list[str]:
    return [r["method"] for r in world.emu.control.requests()[since:]]


def test_a_hibernated_box_is_woken_by_start_and_resume(world: World, box: str) -> None:
    from boxd import Boxd

    provider = world.provider()
    machine_id = provider.find(box).container
    sdk = Boxd(token=world.token, base_url=world.base_url, max_retries=0)
    try:
        for bring_back in (provider.resume, provider.start):
            sdk.machines.hibernate(machine_id)
            assert provider.find(box).state == "paused"
            since = len(world.emu.control.requests())
            assert bring_back(box).state == "running"
            assert "WakeVm" in calls(world, since) and "ResumeVm" not in calls(world, since)
            assert world.emu.control.machine(machine_id)["status"] == "running"
        provider.pause(box)  # suspended: resume is the call that brings it back
        since = len(world.emu.control.requests())
        assert provider.resume(box).state == "running"
        assert "ResumeVm" in calls(world, since)
    finally:
        sdk.close()


def test_a_checkpoint_waits_for_its_version_and_never_saves_over_a_name(world: World, box: str) -> None:
    """The capture is pending a while (the emulator's snapshot_seconds); commit returns once it is ready. A
    name that exists would get a new version on boxd, over what it holds: the provider refuses it first."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = world.provider()
    store = provider.checkpoint_store()
    image = store.snapshot_name(PROJECT, "wait")
    world.emu.control.configure(snapshot_seconds=1.5)
    try:
        since = len(world.emu.control.requests())
        made = provider.commit(box, image, {})
        snapshot = store.snapshot(image)
        assert (snapshot.status, snapshot.version) == ("ready", 1) and made["id"] == snapshot.id
        assert calls(world, since).count("GetSnapshot") >= 3  # it was looked at while pending
        since = len(world.emu.control.requests())
        with pytest.raises(ProviderError, match="exists already; nothing was captured"):
            provider.commit(box, image, {})
        assert "CreateSnapshot" not in calls(world, since)
        assert store.snapshot(image).version == 1
    finally:
        world.emu.control.configure(snapshot_seconds=0.3)
        store.delete_snapshot(image)


def test_a_failed_capture_fails_the_checkpoint_and_leaves_no_snapshot(world: World, box: str) -> None:
    import grpc

    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = world.provider()
    store = provider.checkpoint_store()
    image = store.snapshot_name(PROJECT, "fail")
    world.emu.control.configure(snapshot_seconds=60)

    def fail_the_capture() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                world.emu.control.fail_snapshot(image, "no space left on the worker")
                return
            except grpc.RpcError:  # not made yet
                time.sleep(0.05)

    worker = threading.Thread(target=fail_the_capture)
    worker.start()
    try:
        with pytest.raises(ProviderError, match="failed on boxd, and nothing was recorded"):
            provider.commit(box, image, {})
    finally:
        worker.join(90)
        world.emu.control.configure(snapshot_seconds=0.3)
    assert store.snapshot(image) is None


def test_an_archived_checkpoint_says_it_cannot_be_restored(world: World, box: str) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.checkpoint._checkpoint_records import CheckpointError

    provider = world.provider()
    store = provider.checkpoint_store()
    image = store.snapshot_name(PROJECT, "cold")
    provider.commit(box, image, {})
    try:
        assert store.restorable(PROJECT, "cold").image == image
        world.emu.control.archive_snapshot(image)
        assert not provider.image_exists(image)
        since = len(world.emu.control.requests())
        with pytest.raises(CheckpointError, match=r"cannot be restored: boxd has archived snapshot .*unarchive"):
            store.restorable(PROJECT, "cold")
        assert "CreateVmFromSnapshot" not in calls(world, since)
    finally:
        store.delete_snapshot(image)


def test_the_egress_list_is_in_force_before_the_box_boots(world: World, box: str) -> None:
    """From an image (boxd takes no spec next to one): set as soon as the machine exists, before it is
    waited for, ports exposed or anything run in it. From a checkpoint: in the create's spec, no later call."""
    provider = world.provider(egress_allow=["github.com", "10.1.0.0/16"])
    name, restored = f"be-{secrets.token_hex(3)}", f"br-{secrets.token_hex(3)}"
    image = provider.checkpoint_store().snapshot_name(PROJECT, "egress")
    try:
        since = len(world.emu.control.requests())
        facts = provider.create(spec_of(world, name))
        made = calls(world, since)
        # Next after the create (and the SDK's own re-read of the machine it made): no wait, no port, no exec.
        assert made[made.index("CreateVm") + 1:made.index("SetVmEgressAllow")] == ["GetVm"], made
        assert world.emu.control.machine(facts.container)["egress_allow"] == ["github.com", "10.1.0.0/16"]

        provider.commit(name, image, {})
        since = len(world.emu.control.requests())
        facts = provider.create(dataclasses.replace(spec_of(world, restored), image=image))
        assert "CreateVmFromSnapshot" in calls(world, since) and "SetVmEgressAllow" not in calls(world, since)
        recorded = world.emu.control.machine(facts.container)
        assert recorded["egress_allow"] == ["github.com", "10.1.0.0/16"]
        assert recorded["labels"]["io.agentbox.box"] == restored  # the spec's labels over the snapshot's
    finally:
        provider.destroy(restored)
        provider.destroy(name)
        provider.checkpoint_store().delete_snapshot(image)
