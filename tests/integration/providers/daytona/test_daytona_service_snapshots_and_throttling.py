"""The daytona provider against the emulator behaving as the real Daytona service does (issue 19), part two:
checkpoint snapshots (a capture whose answer is lost, inactive snapshots and their activation) and Daytona's rate
limits and the retry deadline. Part one, with the helpers both share, is test_daytona_service_behaviour.py;
the split keeps each module well inside the suite's per-module budget.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest

from tests.integration.providers.daytona.test_daytona_service_behaviour import Emu, serving_emulator, spec, unique

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def emu() -> Iterator[Emu]:
    yield from serving_emulator()


@pytest.fixture(autouse=True)
def _clean_settings(emu: Emu) -> Iterator[None]:
    yield
    emu.admin.clear_faults()


@pytest.fixture(scope="module")
def snapshotted(emu: Emu) -> Iterator[tuple[str, str]]:
    """(box, snapshot): a box with /workspace/kept.txt and a snapshot of it, shared by the snapshot tests. Each
    test puts the snapshot in the state its case needs (deactivated, how long ago) and leaves it active."""
    from ansible_collections.agentbox.box.plugins.module_utils.providers._snapshot_store import snapshot_name

    provider = emu.provider()
    source, image = unique("src"), snapshot_name("c" * 16, "old")
    try:
        provider.create(spec(source))
        provider.exec(source, ["sh", "-c", "echo kept > /workspace/kept.txt"]).check("write")
        provider.commit(source, image, {})
        yield source, image
    finally:
        provider.destroy(source)
        provider.delete_snapshot(image)


def test_a_capture_whose_answer_is_lost_waits_for_its_snapshot(emu: Emu, snapshotted: tuple[str, str]) -> None:
    """The snapshot exists only once the capture ends; a lost answer must not be read as a failed capture."""
    from ansible_collections.agentbox.box.plugins.module_utils.providers._snapshot_store import snapshot_name

    provider = emu.provider()
    name = snapshotted[0]  # a box with /workspace/kept.txt, captured again here
    image = snapshot_name("c" * 16, "lost")
    # The box is shared: the emulator's auto-stop may have stopped it while other tests ran. This test is about a
    # running box's capture, so it starts from one.
    if provider.find(name).state != "running":
        provider.start(name)
    assert provider.find(name).state == "running"
    try:
        emu.admin.set_config(transition_seconds=2)  # captures (and the rest) take a while
        emu.admin.add_fault(method="POST", path=r"^/api/sandbox/[^/]+/snapshot$", action="drop_after", times=1)
        made = provider.commit(name, image, {})
        assert made["id"]
        assert provider.find(name).state == "running"
    finally:
        emu.admin.set_config(transition_seconds=0)
        provider.delete_snapshot(image)


def test_an_inactive_snapshot_is_activated_to_restore_from(emu: Emu, snapshotted: tuple[str, str]) -> None:
    """Daytona deactivates snapshots unused for 14 days; a restore activates it rather than calling it gone."""
    provider = emu.provider()
    restored, image = unique("rst"), snapshotted[1]
    try:
        emu.admin.deactivate_unused_snapshot(image)
        assert provider.image_exists(image)  # not a broken checkpoint
        provider.create(spec(restored, image=image))
        assert provider.exec(restored, ["cat", "/workspace/kept.txt"]).check("read").stdout == b"kept\n"
        assert emu.sdk().snapshot.get(image).state == "active"
    finally:
        provider.destroy(restored)


def test_a_snapshot_still_being_deactivated_is_activated_once_daytona_lets_it(
    emu: Emu, snapshotted: tuple[str, str]
) -> None:
    """Daytona refuses an activation within 10 minutes of the deactivation (400 "deactivation is still in
    progress"); the restore asks again until it is let through (here 10 emulated minutes are 4 s)."""
    provider = emu.provider()
    restored, image = unique("rst"), snapshotted[1]
    try:
        emu.admin.set_config(minute_seconds=0.4)
        emu.admin.deactivate_unused_snapshot(image, ago_minutes=0)
        since = emu.admin.requests()[-1]["seq"]
        provider.create(spec(restored, image=image))
        activations = [r["status"] for r in emu.admin.requests(since) if r["path"].endswith("/activate")]
        assert activations[0] == 400 and activations[-1] == 200, activations
        assert emu.sdk().snapshot.get(image).state == "active"
    finally:
        emu.admin.set_config(minute_seconds=60)
        provider.destroy(restored)


def test_a_snapshot_another_client_is_activating_is_waited_for(emu: Emu, snapshotted: tuple[str, str]) -> None:
    """Two restores from one inactive snapshot: the one whose activation comes second is refused with 400
    "cannot be activated - it is in pending state", and waits for the snapshot to be active."""
    provider = emu.provider()
    restored, image = unique("rst"), snapshotted[1]
    failure: list[BaseException] = []
    try:
        emu.admin.deactivate_unused_snapshot(image)
        emu.admin.set_config(snapshot_activation_seconds=3)
        held = emu.admin.add_fault(method="POST", path=r"/activate$", action="hold", times=1)

        def restore() -> None:
            try:
                provider.create(spec(restored, image=image))
            except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
                failure.append(exc)

        worker = threading.Thread(target=restore)
        worker.start()
        deadline = time.monotonic() + 60
        while not [f for f in emu.admin.faults() if f["id"] == held["id"] and f["matched"]]:
            assert time.monotonic() < deadline, "the provider never asked to activate the snapshot"
            time.sleep(0.05)
        emu.sdk().snapshot.activate(emu.sdk().snapshot.get(image))  # the other client, first: pending
        emu.admin.release_fault(held["id"])
        worker.join(120)
        assert not worker.is_alive() and not failure, failure
        assert provider.exec(restored, ["true"]).rc == 0
    finally:
        emu.admin.set_config(snapshot_activation_seconds=1)
        provider.destroy(restored)


def test_rate_limits_are_waited_out_as_the_throttler_asks(emu: Emu) -> None:
    """Daytona's throttlers answer 429 with `Retry-After-<throttler>` (no plain Retry-After), per window."""
    provider = emu.provider()
    name = unique("thr")
    try:
        provider.create(spec(name))
        emu.admin.set_config(throttle_limits={"sandbox-lifecycle": 1}, throttle_window_seconds=8)
        since = emu.admin.requests()[-1]["seq"]
        provider.stop(name)  # the window's one lifecycle call
        assert provider.start(name).state == "running"  # refused until the window ends, then made
        throttled = [r for r in emu.admin.requests(since) if r.get("outcome") == "throttled"]
        assert throttled and all(r["path"].endswith("/start") for r in throttled)
    finally:
        emu.admin.set_config(throttle_limits={})
        provider.destroy(name)


def test_retries_stop_at_the_retry_deadline_when_rate_limits_never_end(emu: Emu) -> None:
    """Every answer is a 429 asking, as Daytona's throttler does, for a 2 s wait (`Retry-After-<throttler>`
    only): the retries stop at the overall deadline (10 s here) whatever the retry count allows, and the error
    says so, with the attempts made and the wait asked for."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = emu.provider(retries=1000, retry_deadline=10)
    name = unique("ddl")
    emu.admin.add_fault(method="GET", path=f"^/api/sandbox/{name}$", action="status", status=429, times=0,
                        headers={"Retry-After-authenticated": "2", "X-RateLimit-Remaining-authenticated": "0"})  # fmt: skip
    since = max((entry["seq"] for entry in emu.admin.requests()), default=0)
    began = time.monotonic()
    with pytest.raises(ProviderError) as refused:
        provider.find(name)
    spent = time.monotonic() - began
    message = str(refused.value)
    found = re.search(r"Daytona answered 429 after (\d+) attempts \(retrying would pass the 10 s retry deadline\)",
                      message)  # fmt: skip
    assert found and "it asks to wait 2 s" in message, message
    attempts = int(found.group(1))
    assert 2 <= attempts <= 6, message  # each retry waited the 2 s asked: at most 1 + 10 / 2 attempts fit
    served = [r for r in emu.admin.requests(since) if r["path"] == f"/api/sandbox/{name}"]
    assert len(served) == attempts and all(r["status"] == 429 for r in served)
    assert spent < 10 + 90  # the deadline and the last call's own time, not 1000 retries


def test_lifecycle_retries_stop_at_the_retry_deadline_too(emu: Emu) -> None:
    """A start whose every POST is refused by the sandbox-lifecycle throttler (2 s asked each time): converge's
    own retries stop at the same overall deadline as api_call's (10 s here), saying so, not at the 300 s
    start timeout nor after 1000 retries."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = emu.provider(retries=1000, retry_deadline=10)
    name = unique("lcd")
    try:
        provider.create(spec(name))
        provider.stop(name)
        emu.admin.add_fault(method="POST", path="/start$", action="status", status=429, times=0,
                            headers={"Retry-After-sandbox-lifecycle": "2"})  # fmt: skip
        began = time.monotonic()
        with pytest.raises(ProviderError, match=r"retrying would pass the 10 s retry deadline") as refused:
            provider.start(name)
        assert time.monotonic() - began < 10 + 30, refused.value  # the deadline and a last call, not 300 s
        assert "start of box" in str(refused.value), refused.value
    finally:
        emu.admin.clear_faults()
        provider.destroy(name)
