"""The relay against a hostile box: raw requests on its socket, from inside the box, on the real engine.

Malformed, oversized, wrong-shaped and badly named requests each get an error answer and the relay
keeps serving; a flood is cut by the per-box rate limit and the box is served again afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import docker
import pytest

from tests.integration.relay import test_relay as shared
from tests.integration.relay.test_relay import DEADLINE, ctl, in_box

# The same module-scoped fixtures as test_relay (a private HOME and relay, one origin, boxes).
engine = shared.engine
host = shared.host
project = shared.project
make_box = shared.make_box
box = shared.box

pytestmark = pytest.mark.integration

# Runs in the box: send each argument raw on the relay socket (hex, or "@N": a request of N bytes),
# print each answer's last line.
RAW_CLIENT = r"""
import json, socket, sys
for raw in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/agentbox/relay/relay.sock")
    if raw.startswith("@"):
        data = b'{"v": 1, "op": "open", "args": {"url": "https://x.invalid/' + b"a" * int(raw[1:]) + b'"}}\n'
    else:
        data = bytes.fromhex(raw)
    try:
        s.sendall(data)
    except OSError:
        pass
    reader = s.makefile("rb")
    last = b""
    for line in reader:
        last = line
    print(last.decode().strip() or "{}")
    s.close()
"""


def raw(engine: docker.DockerClient, box: str, *lines: bytes | str) -> list[dict]:
    args = [line if isinstance(line, str) else line.hex() for line in lines]
    rc, out, err = in_box(engine, box, ["python3", "-c", RAW_CLIENT, *args])
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def request(op: str, **args: object) -> bytes:
    return (json.dumps({"v": 1, "op": op, "args": args}) + "\n").encode()


def test_malformed_and_bad_requests_get_errors_and_the_relay_keeps_serving(
    host: shared.Host, box: str, engine: docker.DockerClient
) -> None:
    answers = raw(
        engine,
        box,
        b"{not json\n",
        b'{"v": 1, "op": "exec", "args": {"argv": ["sh"]}}\n',
        b'{"v": 1, "op": "git.push", "args": {"refspec": "+HEAD:main"}}\n',
        request("git.push", **{"as": "a..b"}),
        request("git.push", **{"as": "--force"}),
        request("git.push", **{"as": "x.lock"}),
        request("git.push", remote="ext::sh -c touch% /tmp/pwned"),
        request("git.fetch", remote="/etc"),
        request("open", url="file:///etc/shadow"),
        request("checkpoint", name="../../escape"),
    )
    assert [a["type"] for a in answers] == ["error"] * 10
    assert all(a["rc"] == 2 for a in answers), answers
    assert "not one JSON object" in answers[0]["message"]
    assert "unknown operation" in answers[1]["message"]
    assert "unknown arguments: refspec" in answers[2]["message"]
    assert all("not a valid branch name" in a["message"] or "not a branch name" in a["message"] for a in answers[3:6])
    assert "not a remote name" in answers[6]["message"] and "not a remote name" in answers[7]["message"]
    # Still serving.
    rc, out, _err = ctl(engine, box, "open", "https://example.invalid/after")
    assert rc == 0 and "https://example.invalid/after" in out
    rejected = [e for e in host.audit() if e["box"] == box and e["decision"] == "rejected"]
    assert len(rejected) >= 10


def test_oversized_request_is_refused_and_the_relay_keeps_serving(box: str, engine: docker.DockerClient) -> None:
    [answer] = raw(engine, box, "@200000")
    assert answer["type"] == "error" and "bytes" in answer["message"]
    rc, _out, _err = ctl(engine, box, "open", "https://example.invalid/still")
    assert rc == 0


def test_unknown_remote_is_refused_with_the_remotes_listed(box: str, engine: docker.DockerClient) -> None:
    rc, _out, err = ctl(engine, box, "git", "push", "--remote", "upstream")
    assert rc == 2 and "has no remote 'upstream'" in err and "origin" in err


def test_a_flood_is_rate_limited_then_served_again(
    box: str, make_box: Callable[[], str], engine: docker.DockerClient
) -> None:
    flooder = make_box()
    answers = raw(engine, flooder, *[request("open", url=f"https://example.invalid/{n}") for n in range(40)])
    limited = [a for a in answers if a["type"] == "error" and "too many requests" in a["message"]]
    served = [a for a in answers if a["type"] == "result"]
    assert limited and served
    # The limit is per box: another box is served at once.
    assert ctl(engine, box, "open", "https://example.invalid/other-box")[0] == 0
    # The bucket refills: the flooder is served again (waiting on the answer itself, with a deadline).
    deadline = time.monotonic() + DEADLINE
    while True:
        [answer] = raw(engine, flooder, request("open", url="https://example.invalid/later"))
        if answer["type"] == "result":
            break
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)


# Root in the box makes the fetch-back's size check lie: `wc` says every bundle is empty, so the
# in-box script sends any bundle inline, whatever its size.
LYING_WC = 'mv /usr/bin/wc /usr/bin/wc.real && printf "#!/bin/sh\\necho 0\\n" > /usr/bin/wc && chmod 755 /usr/bin/wc'
BIG_COMMIT = (
    "head -c $((INLINE + 512 * 1024)) /dev/urandom > big.bin && git add big.bin && "
    "git -c user.email=agent@box.invalid -c user.name=agent commit -q -m big"
)


def test_an_inline_bundle_over_the_limit_is_refused_on_the_host(
    host: shared.Host, make_box: Callable[[], str], project: dict, engine: docker.DockerClient
) -> None:
    """The in-box script keeps an inline bundle to INLINE_BUNDLE_LIMIT, but the box can replace
    what it runs: the host reads no more than the limit and refuses, and no host branch moves."""
    from ansible_collections.agentbox.box.plugins.module_utils.git._ship import INLINE_BUNDLE_LIMIT

    hostile = make_box()
    container = engine.containers.get(f"agentbox-{hostile}")
    lied = container.exec_run(["sh", "-c", LYING_WC], user="root")
    assert lied.exit_code == 0, lied.output
    made = container.exec_run(["sh", "-c", BIG_COMMIT], user="vscode", workdir="/workspace",
                              environment={"INLINE": str(INLINE_BUNDLE_LIMIT)})
    assert made.exit_code == 0, made.output
    branch = f"refs/heads/agentbox/{hostile}"
    before = shared.git(project["workspace"], "rev-parse", "--verify", "-q", branch, check=False).strip()
    fetched = host.module("agentbox_worktree", {"box": hostile, "state": "fetched"})
    assert fetched["failed"] and "bytes" in fetched["msg"] and "refused, nothing fetched" in fetched["msg"], fetched
    assert shared.git(project["workspace"], "rev-parse", "--verify", "-q", branch, check=False).strip() == before
    assert not shared.origin_ref(project, branch)


# Runs in the box: a push that offers its bundle on the socket, then answers the host's "bundle"
# message as argv[1] says (over: a size over the host's limit; short: fewer bytes than it gave;
# garbage: bytes that are no bundle); prints the final answer.
HOSTILE_BUNDLE = r"""
import json, os, socket, subprocess, sys
mode = sys.argv[1]
tip = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
s = socket.socket(socket.AF_UNIX)
s.connect("/run/agentbox/relay/relay.sock")
s.sendall(b'{"v": 1, "op": "git.push", "args": {}, "bundles": true}\n')
reader = s.makefile("rb")
asked = json.loads(reader.readline())
assert asked["type"] == "bundle", asked
if mode == "over":
    s.sendall(json.dumps({"tip": tip, "size": asked["limit"] + 1}).encode() + b"\n")
elif mode == "short":
    s.sendall(json.dumps({"tip": tip, "size": 1000}).encode() + b"\n" + b"x" * 10)
    s.shutdown(socket.SHUT_WR)
else:
    s.sendall(json.dumps({"tip": tip, "size": 4096}).encode() + b"\n" + os.urandom(4096))
print(reader.readline().decode().strip())
"""


def test_a_bundle_sent_on_the_socket_is_bounded_and_checked(
    host: shared.Host, make_box: Callable[[], str], project: dict, engine: docker.DockerClient
) -> None:
    """A box's client answers the host's request for its push's bundle with a size over the limit,
    fewer bytes than it said, or bytes that are no bundle: each push is refused with a message, no
    host or origin branch moves, and the relay keeps serving the box."""
    hostile = make_box()
    shared.commit_in_box(engine, hostile, "work to push")
    branch = f"refs/heads/agentbox/{hostile}"
    before = shared.git(project["workspace"], "rev-parse", "--verify", "-q", branch, check=False).strip()
    answers = {}
    for mode in ("over", "short", "garbage"):
        rc, out, err = in_box(engine, hostile, ["python3", "-c", HOSTILE_BUNDLE, mode])
        assert rc == 0, err
        answers[mode] = json.loads(out.strip().splitlines()[-1])
    assert "over the" in answers["over"]["stderr"] and answers["over"]["rc"] != 0, answers
    assert "short" in answers["short"]["stderr"] and answers["short"]["rc"] != 0, answers
    assert answers["garbage"]["rc"] != 0 and "bundle" in answers["garbage"]["stderr"], answers
    assert shared.git(project["workspace"], "rev-parse", "--verify", "-q", branch, check=False).strip() == before
    assert not shared.origin_ref(project, branch)
    assert ctl(engine, hostile, "open", "https://example.invalid/after")[0] == 0


def test_a_push_from_a_local_box_sends_its_bundle_on_the_socket_without_an_exec(
    make_box: Callable[[], str], project: dict, engine: docker.DockerClient
) -> None:
    """agentbox-ctl git push of a local box: the commits travel on the box's relay socket; the
    engine records no exec that makes a bundle in the box during the push (the seed record is still
    read with an exec, once a minute per box), only the test's own agentbox-ctl."""
    pusher = make_box()
    head = shared.commit_in_box(engine, pusher, "sent on the socket")
    container = engine.containers.get(f"agentbox-{pusher}")
    since = time.time() - 1
    rc, out, err = ctl(engine, pusher, "git", "push")
    until = time.time() + 1
    assert rc == 0, err
    assert "fetched 1 new commit(s)" in out + err
    assert shared.origin_ref(project, f"refs/heads/agentbox/{pusher}") == head
    events = engine.events(since=since, until=until, decode=True,
                           filters={"container": container.id, "type": "container"})
    started = [event["Action"] for event in events if event["Action"].startswith("exec_start")]
    assert any("agentbox-ctl git push" in action for action in started), started
    assert not [action for action in started if "bundle" in action and "agentbox-ctl" not in action], started
