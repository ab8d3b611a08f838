"""The bounds on bundles that local boxes send over their relay sockets, on the real engine.

A box that trickles its bundle is cut once it falls below the minimum rate after the grace, its
temporary file removed, and the same box pushes right after; a push over the cap on bundles received
at once is refused with a message to run it again, and goes through once the slot is free. This
module's relay runs with the grace and the cap shrunk (AGENTBOX_RELAY_BUNDLE_GRACE,
AGENTBOX_RELAY_BUNDLE_SLOTS) and its own TMPDIR, so what it leaves there is seen.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from tests.integration.relay import test_relay as shared
from tests.integration.relay.test_relay import DEADLINE, ctl

# The same module-scoped fixtures as test_relay, with this module's host (and so its own relay).
engine = shared.engine
project = shared.project
make_box = shared.make_box
box = shared.box

pytestmark = pytest.mark.integration

GRACE = 3  # seconds before the minimum rate applies here (10 by default)
DECLARED = 1 << 20  # the slow sender's bundle: 1 MiB


@pytest.fixture(scope="module")
def host() -> Iterator[shared.Host]:
    home = tempfile.mkdtemp(prefix="abb-", dir="/tmp")
    os.chmod(home, 0o755)
    scratch = Path(home, "tmp")
    scratch.mkdir(mode=0o755)  # host git runs as the repository's owner and reads the bundle there
    made = shared.Host(home)
    made.env.update(AGENTBOX_RELAY_BUNDLE_GRACE=str(GRACE), AGENTBOX_RELAY_BUNDLE_SLOTS="1", TMPDIR=str(scratch))
    made.relay("start")  # before any box: creating one finds it running and leaves it so
    yield made
    made.relay("stop", check=False)
    shutil.rmtree(home, ignore_errors=True)


def leftovers(host: shared.Host) -> list[str]:
    return sorted(path.name for path in Path(host.env["TMPDIR"]).glob("agentbox-fetch-*"))


class Pusher:
    """`agentbox-ctl git push` spoken by the test on the box's socket (its host end): it offers its
    bundle, then answers the host's "bundle" message as the test says."""

    def __init__(self, host: shared.Host, box: str):
        relay = Path(host.home, ".agentbox/relay")
        [box_id] = [r["id"] for r in map(json.loads, map(Path.read_text, relay.glob("boxes/*.json"))) if r["name"] == box]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(DEADLINE)  # the hang guard of every read
        self.sock.connect(str(relay / "sock" / box_id / "relay.sock"))
        self.sock.sendall(b'{"v": 1, "op": "git.push", "args": {}, "bundles": true}\n')
        self.reader = self.sock.makefile("rb")

    def answer(self) -> dict:
        line = self.reader.readline()
        assert line, "the relay closed the connection without an answer"
        return json.loads(line)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def test_a_bundle_trickled_below_the_rate_is_cut_and_the_box_pushes_right_after(
    host: shared.Host, box: str, project: dict, engine: docker.DockerClient
) -> None:
    head = shared.commit_in_box(engine, box, "pushed after a slow sender")
    pusher = Pusher(host, box)
    try:
        asked = pusher.answer()
        assert asked["type"] == "bundle", asked
        pusher.sock.sendall(json.dumps({"tip": head, "size": DECLARED}).encode() + b"\n")
        # One byte whenever the host has said nothing for 0.2 s: far inside the 30 s per-read
        # timeout, far below the minimum rate. Until the host answers, or the hang guard.
        sent, guard = 0, time.monotonic() + DEADLINE
        while not select.select([pusher.sock], [], [], 0.2)[0]:
            assert time.monotonic() < guard, f"{sent} bytes trickled and the host still waits for more: not cut"
            try:
                pusher.sock.sendall(b"x")
            except OSError:  # the host closed its end after answering
                break
            sent += 1
        answer = pusher.answer()
    finally:
        pusher.close()
    assert answer["type"] == "result" and answer["rc"] != 0, answer
    assert f"bundle of {DECLARED} bytes came slower than the 1 MiB/s the host requires after {GRACE} s" \
        in answer["stderr"], answer
    assert "cut, nothing fetched" in answer["stderr"] and sent < DECLARED
    assert leftovers(host) == []  # the partial bundle's directory is gone
    assert not shared.origin_ref(project, f"refs/heads/agentbox/{box}")
    entry = [e for e in host.audit() if e["box"] == box and e.get("operation") == "git.push"][-1]
    assert entry["result"]["rc"] != 0 and entry["decision"] == "allowed", entry
    # The box's lock is free again: its own push goes through at once.
    rc, _out, err = ctl(engine, box, "git", "push")
    assert rc == 0, err
    assert shared.origin_ref(project, f"refs/heads/agentbox/{box}") == head
    assert leftovers(host) == []


def test_a_push_over_the_cap_is_refused_then_goes_through_once_a_slot_is_free(
    host: shared.Host, box: str, make_box: Callable[[], str], project: dict, engine: docker.DockerClient
) -> None:
    other = make_box()
    head = shared.commit_in_box(engine, other, "waits for a slot")
    holder = Pusher(host, box)
    try:
        assert holder.answer()["type"] == "bundle"  # the one slot (SLOTS=1) is the holder's now
        rc, _out, err = ctl(engine, other, "git", "push")
        assert rc != 0, err
        assert "receiving 1 other push(es)" in err and "run the same command again" in err, err
        assert not shared.origin_ref(project, f"refs/heads/agentbox/{other}")
        holder.sock.sendall(b'{"missing": true}\n')  # ends the holder's push, and its reception
        answer = holder.answer()
    finally:
        holder.close()
    assert answer["rc"] != 0 and "has no branch" in answer["stderr"], answer
    rc, _out, err = ctl(engine, other, "git", "push")
    assert rc == 0, err
    assert shared.origin_ref(project, f"refs/heads/agentbox/{other}") == head
    assert leftovers(host) == []
