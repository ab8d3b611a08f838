"""agentbox_forward's forwarder (_port_relay) and the in-box relay, without an engine: the relay argv is the
in-box relay run by this machine's python3 against a server on 127.0.0.1, so both halves run for real."""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.access import _forwards
from ansible_collections.agentbox.box.plugins.module_utils.access._port_relay import BOX_RELAY


class Echo(socketserver.BaseRequestHandler):
    """Answers each connection with b'<n>:' + what it read until the client's end of sending."""

    def handle(self) -> None:
        data = b""
        while chunk := self.request.recv(65536):
            data += chunk
        self.request.sendall(f"{len(data)}:".encode() + data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def forwarder(echo_port: int) -> Iterator[int]:
    pid, port = _forwards.start_forwarder("unit", ["python3", "-c", BOX_RELAY, str(echo_port)], 0)
    yield port
    os.kill(pid, signal.SIGTERM)


def exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)  # the half-close reaches the server through the relay
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_the_forwarder_carries_concurrent_connections_both_ways(forwarder: int) -> None:
    payloads = [os.urandom(size) for size in (1, 70_000, 300_000, 5, 123_456, 64 * 1024)]
    answers: dict[int, bytes] = {}

    def one(index: int) -> None:
        answers[index] = exchange(forwarder, payloads[index])

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(payloads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert {index: answers.get(index) for index in range(len(payloads))} == {
        index: f"{len(payload)}:".encode() + payload for index, payload in enumerate(payloads)
    }


def test_a_connection_to_a_port_where_nothing_listens_is_closed_unanswered() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    pid, port = _forwards.start_forwarder("unit", ["python3", "-c", BOX_RELAY, str(free)], 0)
    try:
        assert exchange(port, b"GET / HTTP/1.0\r\n\r\n") == b""
    finally:
        os.kill(pid, signal.SIGTERM)


def test_a_local_port_in_use_is_refused_with_the_reason() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(Exception, match=r"127\.0\.0\.1:\d+ cannot be listened on: Address already in use"):
            _forwards.start_forwarder("unit", ["true"], taken.getsockname()[1])


def test_a_forward_whose_relay_program_is_missing_is_refused_before_it_starts() -> None:
    with pytest.raises(Exception, match=r"no-such-docker-cli is not on this machine: .* install it"):
        _forwards.start_forwarder("unit", ["no-such-docker-cli", "exec"], 0)


def test_the_forwarders_pid_is_recognised_until_it_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record whose pid ended (or whose pid another process has now) is not a live forward."""
    monkeypatch.setenv("HOME", str(tmp_path))
    pid, _port = _forwards.start_forwarder("unit", ["true"], 0)
    record = {"provider": "docker", "engine": "local", "box": "b", "port": 9, "local_port": 1, "pid": pid,
              "started": _forwards.process_start_time(pid), "url": "x"}  # fmt: skip
    os.makedirs(tmp_path / ".agentbox")
    (tmp_path / ".agentbox" / "forwards.json").write_text(
        json.dumps([record, {**record, "port": 10, "pid": os.getpid(), "started": "1"}])
    )
    assert [item["port"] for item in _forwards.forwards_of("docker", "local", "b")] == [9]
    ended = _forwards.remove("docker", "local", "b")
    assert [item["pid"] for item in ended] == [pid]
    deadline = time.monotonic() + 10
    while _forwards.process_start_time(pid):
        assert time.monotonic() < deadline, "the forwarder did not end"
        time.sleep(0.05)
    assert _forwards.forwards_of("docker", "local") == []
