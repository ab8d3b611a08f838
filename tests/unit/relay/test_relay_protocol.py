"""The relay's request checks and policy, without a relay: what is refused, what waits for the user."""

from __future__ import annotations

import json

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_protocol import (
    MAX_REQUEST_BYTES,
    RateLimiter,
    RequestError,
    approval_reason,
    parse_request,
    shown,
)

OWN = "agentbox/fix-login"


def request(op: str, **args: object) -> bytes:
    return json.dumps({"v": 1, "op": op, "args": args}).encode()


def test_push_defaults_to_origin_and_own_branch_needs_no_approval() -> None:
    parsed = parse_request(request("git.push"))
    assert parsed.args == {"as": None, "remote": "origin", "force": False, "delete": False}
    assert approval_reason(parsed, OWN) is None
    assert approval_reason(parse_request(request("git.push", **{"as": OWN})), OWN) is None


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ({"as": "main"}, "pushes to main"),
        ({"as": "agentbox/other-box"}, "pushes to agentbox/other-box"),
        ({"force": True}, "force-pushes agentbox/fix-login"),
        ({"delete": True, "as": "old"}, "deletes the remote branch old"),
    ],
)
def test_writes_elsewhere_wait_for_the_user(args: dict, reason: str) -> None:
    assert reason in (approval_reason(parse_request(request("git.push", **args)), OWN) or "")


def test_pr_merge_waits_and_the_rest_does_not() -> None:
    assert approval_reason(parse_request(request("gh.pr", action="merge", number=7)), OWN) == "merges pull request #7"
    for line in (
        request("gh.pr", action="create", title="t"),
        request("git.fetch"),
        request("git.pull", branch="main"),
        request("checkpoint", name="warm"),
        request("open", url="https://example.invalid/x"),
    ):
        assert approval_reason(parse_request(line), OWN) is None


@pytest.mark.parametrize(
    "name",
    ["a..b", "x.lock", "-f", "--force", "refs/heads/main", "HEAD", "has space", "trailing/", "/lead", "a@{1}",
     "back\\slash", "co:lon", "q?", "star*", "brack[et", "nl\nx", "", "tilde~1", "caret^"],
)
def test_bad_branch_names_are_refused_by_gits_rules(name: str) -> None:
    with pytest.raises(RequestError):
        parse_request(request("git.push", **{"as": name}))


@pytest.mark.parametrize("remote", ["https://evil.invalid/x.git", "../elsewhere", "/tmp/repo", "-u", "a b", "ext::sh"])
def test_remote_must_be_a_plain_name(remote: str) -> None:
    with pytest.raises(RequestError, match="not a remote name"):
        parse_request(request("git.fetch", remote=remote))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"not json", "not one JSON object"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"v": 2, "op": "git.push"}', "protocol version"),
        (b'{"v": 1, "op": "shell", "args": {}}', "unknown operation"),
        (b'{"v": 1, "op": "git.push", "args": {"cmd": "rm -rf /"}}', "unknown arguments: cmd"),
        (b'{"v": 1, "op": "git.push", "args": {"force": "yes"}}', "must be a bool"),
        (b'{"v": 1, "op": "git.push", "args": [], "x": 1}', "unknown request fields: x"),
        (b'{"v": 1, "op": "git.push", "timeout": 99999}', "'timeout'"),
        (b'{"v": 1, "op": "checkpoint", "args": {}}', "--name"),
        (b'{"v": 1, "op": "checkpoint", "args": {"name": "Bad Name"}}', "invalid checkpoint name"),
        (b'{"v": 1, "op": "open", "args": {"url": "file:///etc/passwd"}}', "http://"),
        (b'{"v": 1, "op": "open", "args": {"url": "javascript:alert(1)"}}', "http://"),
        (b'{"v": 1, "op": "gh.pr", "args": {"action": "merge"}}', "number"),
        (b"\xff\xfe", "not one JSON object"),
    ],
)
def test_malformed_requests_get_a_message(line: bytes, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_request(line)


def test_oversized_request_is_refused() -> None:
    line = request("open", url="https://example.invalid/" + "a" * MAX_REQUEST_BYTES)
    with pytest.raises(RequestError, match="limit"):
        parse_request(line)


def test_describe_is_one_line_of_what_was_asked() -> None:
    parsed = parse_request(request("git.push", **{"as": "main", "force": True}))
    assert parsed.describe() == "as=main force remote=origin"


def test_look_alike_branch_names_are_escaped_and_flagged_on_the_approval_line() -> None:
    import asyncio

    from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_server import Pending

    look_alike = "m\u0430in"  # a Cyrillic а: git's rules accept it, and it reads as main
    parsed = parse_request(request("git.push", **{"as": look_alike}))
    reason = approval_reason(parsed, OWN) or ""
    loop = asyncio.new_event_loop()
    try:
        pending = Pending(id="3fa9c1", box="fix-login", box_id="0755d20b", request=parsed, reason=reason, asked=0.0,
                          deadline=600.0, decision=loop.create_future())
        line = pending.line()
    finally:
        loop.close()
    flag = "[not plain ASCII: U+0430 CYRILLIC SMALL LETTER A]"
    assert line == f"3fa9c1 fix-login git.push as=m\\u0430in {flag} remote=origin"
    assert reason == f"pushes to m\\u0430in {flag}, which is not the box's own branch {OWN}"
    assert look_alike not in line and look_alike not in reason
    assert shown("feature/login") == "feature/login"  # plain ASCII is shown as it is
    assert shown("a\u200bb") == "a\\u200bb [not plain ASCII: U+200B ZERO WIDTH SPACE]"


def test_rate_limiter_allows_a_burst_then_refills() -> None:
    limiter = RateLimiter(burst=3, per_minute=60)
    assert [limiter.allow("box", now=100.0) for _attempt in range(4)] == [True, True, True, False]
    assert limiter.allow("other", now=100.0)  # per box
    assert not limiter.allow("box", now=100.5)
    assert limiter.allow("box", now=101.6)
