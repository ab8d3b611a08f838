"""The header a box sends before a push's bundle on its socket, and the request's offer to send one."""

from __future__ import annotations

import json

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_protocol import (
    BUNDLE_GRACE,
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_RECEPTIONS,
    RequestError,
    bundle_behind_at,
    bundle_header,
    parse_request,
)
from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_server import BundleGate

TIP = "a" * 40


def test_a_push_may_offer_its_bundle_and_only_as_a_boolean() -> None:
    line = {"v": 1, "op": "git.push", "args": {}}
    assert parse_request(json.dumps(line).encode()).bundles is False
    assert parse_request(json.dumps({**line, "bundles": True}).encode()).bundles is True
    with pytest.raises(RequestError, match="'bundles' must be true or false"):
        parse_request(json.dumps({**line, "bundles": "yes"}).encode())


def test_good_headers() -> None:
    assert bundle_header(b'{"tip": "%s", "size": 0}\n' % TIP.encode()) == {"tip": TIP, "size": 0}
    assert bundle_header(json.dumps({"tip": TIP, "size": MAX_BUNDLE_BYTES}).encode())["size"] == MAX_BUNDLE_BYTES
    assert bundle_header(b'{"missing": true}') == {"missing": True}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "not one JSON object"),
        (b"\xff\xfe", "not one JSON object"),
        (b"[1]", "must be a JSON object"),
        (json.dumps({"tip": TIP, "size": MAX_BUNDLE_BYTES + 1}).encode(), "over the"),
        (json.dumps({"tip": TIP, "size": -1}).encode(), "whole number"),
        (json.dumps({"tip": TIP, "size": True}).encode(), "whole number"),
        (json.dumps({"tip": TIP, "size": 1.5}).encode(), "whole number"),
        (json.dumps({"tip": TIP}).encode(), "must be"),
        (json.dumps({"tip": TIP, "size": 1, "path": "/etc"}).encode(), "must be"),
        (json.dumps({"tip": "x" * 65, "size": 1}).encode(), "must be"),
        (json.dumps({"missing": True, "tip": TIP}).encode(), "must be"),
    ],
)
def test_bad_headers_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        bundle_header(raw)


def test_a_bundle_keeps_a_mib_a_second_after_a_grace() -> None:
    assert bundle_behind_at(0) == BUNDLE_GRACE == 10
    assert bundle_behind_at(10 << 20) == BUNDLE_GRACE + 10
    assert bundle_behind_at(MAX_BUNDLE_BYTES) == BUNDLE_GRACE + 1024  # all of the biggest bundle, at the rate
    assert bundle_behind_at(1 << 20, grace=3) == 4


@pytest.mark.parametrize(
    ("environ", "grace", "slots"),
    [
        ({}, BUNDLE_GRACE, MAX_BUNDLE_RECEPTIONS),
        ({"AGENTBOX_RELAY_BUNDLE_GRACE": "2.5", "AGENTBOX_RELAY_BUNDLE_SLOTS": "1"}, 2.5, 1),
        ({"AGENTBOX_RELAY_BUNDLE_GRACE": "0", "AGENTBOX_RELAY_BUNDLE_SLOTS": "0"}, BUNDLE_GRACE, MAX_BUNDLE_RECEPTIONS),
        ({"AGENTBOX_RELAY_BUNDLE_GRACE": "nan", "AGENTBOX_RELAY_BUNDLE_SLOTS": "1.5"}, BUNDLE_GRACE, MAX_BUNDLE_RECEPTIONS),
        ({"AGENTBOX_RELAY_BUNDLE_GRACE": "-1", "AGENTBOX_RELAY_BUNDLE_SLOTS": "x"}, BUNDLE_GRACE, MAX_BUNDLE_RECEPTIONS),
    ],
)
def test_the_bundle_bounds_shrink_only_to_positive_numbers(environ: dict, grace: float, slots: int) -> None:
    gate = BundleGate(environ)
    assert (gate.grace, gate.slots) == (grace, slots)


def test_a_reception_over_the_cap_is_refused_and_a_freed_slot_serves_again() -> None:
    gate = BundleGate({"AGENTBOX_RELAY_BUNDLE_SLOTS": "2"})
    with gate.slot("box-a"), gate.slot("box-b"):
        with pytest.raises(RequestError, match=r"receiving 2 other push.*run the same command again"):
            with gate.slot("box-c"):
                pass
        assert gate.busy == 2
    with pytest.raises(ValueError), gate.slot("box-a"):
        raise ValueError("the reception failed")
    assert gate.busy == 0
    with gate.slot("box-c"):
        assert gate.busy == 1


def test_a_box_never_holds_two_slots() -> None:
    # Fairness: whatever lets one box start a second reception (another connection), the other slot stays the
    # other boxes'.
    gate = BundleGate({"AGENTBOX_RELAY_BUNDLE_SLOTS": "2"})
    with gate.slot("slow"):
        with pytest.raises(RequestError, match=r"another push's bundle now \(one at a time per box\)"):
            with gate.slot("slow"):
                pass
        assert gate.busy == 1
        with gate.slot("other"):
            assert gate.busy == 2
    assert gate.busy == 0


def test_a_bundle_sent_below_the_minimum_rate_is_cut_after_the_grace_and_frees_its_slot(tmp_path) -> None:
    """A box declares 64 MiB and sends a byte every 50 ms: far below the rate, so it is cut once the grace has
    passed (the old deadline, 60 s plus 1 s per MiB, was 124 s away), and another box takes the slot at once."""
    import asyncio
    import socket
    import threading

    from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_server import SocketBundles

    declared = 64 << 20
    gate = BundleGate({"AGENTBOX_RELAY_BUNDLE_GRACE": "1", "AGENTBOX_RELAY_BUNDLE_SLOTS": "1"})
    host_end, box_end = socket.socketpair()
    done = threading.Event()

    def slow_box() -> None:  # the box's side: the header, then a byte at a time until the host cuts it
        reader = box_end.makefile("rb")
        assert json.loads(reader.readline())["type"] == "bundle"
        box_end.sendall(json.dumps({"tip": TIP, "size": declared}).encode() + b"\n")
        while not done.wait(0.05):
            try:
                box_end.sendall(b"x")
            except OSError:
                return

    async def push() -> tuple[str, int]:
        reader, writer = await asyncio.open_unix_connection(sock=host_end)
        bundles = SocketBundles(reader, writer, asyncio.get_running_loop(), gate, "slow")
        try:
            # The guard only: the old code waited for its deadline here.
            await asyncio.wait_for(bundles._receive("/workspace", "refs/heads/b", TIP, "", str(tmp_path / "b")), 30)
        except RequestError as exc:
            return str(exc), gate.busy
        finally:
            writer.close()
        return "not cut", gate.busy

    sender = threading.Thread(target=slow_box)
    sender.start()
    try:
        message, busy = asyncio.run(push())
    finally:
        done.set()
        sender.join()
        box_end.close()
    assert f"bundle of {declared} bytes came slower than the 1 MiB/s the host requires after 1 s" in message
    assert "cut, nothing fetched" in message
    assert busy == 0
    with gate.slot("other"):  # the slot serves the next box
        assert gate.busy == 1
