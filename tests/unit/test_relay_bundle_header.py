"""The header a box sends before a push's bundle on its socket, and the request's offer to send one."""

from __future__ import annotations

import json

import pytest

from ansible_collections.agentbox.box.plugins.module_utils._relay_protocol import (
    BUNDLE_DEADLINE_CAP,
    BUNDLE_FLOOR,
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_RECEPTIONS,
    RequestError,
    bundle_deadline,
    bundle_header,
    parse_request,
)
from ansible_collections.agentbox.box.plugins.module_utils._relay_server import BundleGate

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


def test_a_bundles_deadline_is_a_floor_plus_a_second_per_mib_capped() -> None:
    assert bundle_deadline(0) == BUNDLE_FLOOR == 60
    assert bundle_deadline(10 << 20) == BUNDLE_FLOOR + 10
    assert bundle_deadline(MAX_BUNDLE_BYTES) == BUNDLE_FLOOR + 1024 <= BUNDLE_DEADLINE_CAP
    assert bundle_deadline(4 * MAX_BUNDLE_BYTES) == BUNDLE_DEADLINE_CAP
    assert bundle_deadline(1 << 20, floor=3) == 4


@pytest.mark.parametrize(
    ("environ", "floor", "slots"),
    [
        ({}, BUNDLE_FLOOR, MAX_BUNDLE_RECEPTIONS),
        ({"AGENTBOX_RELAY_BUNDLE_FLOOR": "2.5", "AGENTBOX_RELAY_BUNDLE_SLOTS": "1"}, 2.5, 1),
        ({"AGENTBOX_RELAY_BUNDLE_FLOOR": "0", "AGENTBOX_RELAY_BUNDLE_SLOTS": "0"}, BUNDLE_FLOOR, MAX_BUNDLE_RECEPTIONS),
        ({"AGENTBOX_RELAY_BUNDLE_FLOOR": "nan", "AGENTBOX_RELAY_BUNDLE_SLOTS": "1.5"}, BUNDLE_FLOOR, MAX_BUNDLE_RECEPTIONS),
        ({"AGENTBOX_RELAY_BUNDLE_FLOOR": "-1", "AGENTBOX_RELAY_BUNDLE_SLOTS": "x"}, BUNDLE_FLOOR, MAX_BUNDLE_RECEPTIONS),
    ],
)
def test_the_bundle_bounds_shrink_only_to_positive_numbers(environ: dict, floor: float, slots: int) -> None:
    gate = BundleGate(environ)
    assert (gate.floor, gate.slots) == (floor, slots)


def test_a_reception_over_the_cap_is_refused_and_a_freed_slot_serves_again() -> None:
    gate = BundleGate({"AGENTBOX_RELAY_BUNDLE_SLOTS": "2"})
    with gate.slot(), gate.slot():
        with pytest.raises(RequestError, match=r"receiving 2 other push.*run the same command again"):
            with gate.slot():
                pass
        assert gate.busy == 2
    with pytest.raises(ValueError), gate.slot():
        raise ValueError("the reception failed")
    assert gate.busy == 0
    with gate.slot():
        assert gate.busy == 1
