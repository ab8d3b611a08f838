"""The header a box sends before a push's bundle on its socket, and the request's offer to send one."""

from __future__ import annotations

import json

import pytest

from ansible_collections.agentbox.box.plugins.module_utils._relay_protocol import (
    MAX_BUNDLE_BYTES,
    RequestError,
    bundle_header,
    parse_request,
)

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
