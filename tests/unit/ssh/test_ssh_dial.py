# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""docker_ssh's HTTP over SSH channels (_ssh_dial): an exec's output that reaches the controller in
the same SSH packet as the response's headers (what a loaded machine sees: the engine runs a short
command before the controller gets to read the headers) must not be lost.

A real paramiko client and server over a socket pair, the real Docker SDK on the client side; the
server side answers as the engine does, with the whole upgraded exec stream sent in one write.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
from pathlib import Path

import docker
import paramiko
from docker.utils.socket import frames_iter

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.ssh._ssh_dial import dial_stdio_adapter  # noqa: E402

OUTPUT = b"M  staged.txt\n D deleted.txt\n?? untracked.txt\n"
ERROR = b"a warning\n"


def _frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


def _answer(path: str) -> bytes:
    """The engine's reply to one request, whole, as one write."""
    if path.endswith("/exec") and "/containers/" in path:
        body = json.dumps({"Id": "e1"}).encode()
        return b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body), body)  # fmt: skip
    if path.endswith("/start"):
        return (
            b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\nConnection: Upgrade\r\n"
            b"Upgrade: tcp\r\n\r\n" + _frame(1, OUTPUT) + _frame(2, ERROR)
        )
    body = json.dumps({"Running": False, "ExitCode": 0}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _serve_dial_stdio(channel: paramiko.Channel) -> None:
    """One channel = one HTTP connection (keep-alive); the hijacked exec stream ends the channel."""
    pending = b""
    while True:
        while b"\r\n\r\n" not in pending:
            data = channel.recv(65536)
            if not data:
                channel.close()
                return
            pending += data
        head, _sep, pending = pending.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next((int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:")), 0)
        while len(pending) < length:
            pending += channel.recv(65536)
        pending = pending[length:]
        path = lines[0].split()[1].split("?")[0]
        channel.sendall(_answer(path))
        if path.endswith("/start"):
            channel.shutdown_write()
            channel.close()
            return


class _Server(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_auth_none(self, username: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        threading.Thread(target=_serve_dial_stdio, args=(channel,), daemon=True).start()
        return True


class _Engine:
    """What _ssh.EngineConnection gives the adapter: a name, the docker command, exec channels."""

    engine = "test-engine"

    def __init__(self, transport: paramiko.Transport):
        self._transport = transport

    def docker_command(self, host: str | None = None) -> str:
        return "docker" + (f" -H {host}" if host else "")

    def open_exec_channel(self, command: str) -> paramiko.Channel:
        channel = self._transport.open_session(timeout=10)
        channel.exec_command(command)
        return channel


def test_exec_output_in_the_packet_of_the_headers_is_kept():
    client_sock, server_sock = socket.socketpair()
    server = paramiko.Transport(server_sock)
    server.add_server_key(paramiko.ECDSAKey.generate())
    negotiated = threading.Event()
    server.start_server(event=negotiated, server=_Server())  # returns at once: the client answers it
    client = paramiko.Transport(client_sock)
    try:
        client.connect()
        client.auth_none("test")
        api = docker.APIClient(base_url="unix:///var/run/agentbox-unused.sock", version="1.41", timeout=10)
        # Mounted as _ssh.docker_client_over_ssh does.
        adapter = dial_stdio_adapter(_Engine(client), 10)
        api.mount("http+docker://ssh", adapter)
        api._custom_adapter = adapter
        api.base_url = "http+docker://ssh"
        exec_id = api.exec_create("box", ["git", "status"], stdout=True, stderr=True)["Id"]
        assert exec_id == "e1"
        out, err = api.exec_start(exec_id, demux=True)
        assert (out, err) == (OUTPUT, ERROR)
        # A second exec reuses nothing of the first's channel: its output is whole too.
        out, err = api.exec_start(api.exec_create("box", ["true"])["Id"], demux=True)
        assert (out, err) == (OUTPUT, ERROR)
        # The stdin path (DockerProvider._exec_with_stdin) reads the hijacked channel itself.
        sock = api.exec_start(api.exec_create("box", ["cat"], stdin=True)["Id"], socket=True)
        frames = list(frames_iter(sock, tty=False))
        sock.close()
        assert frames == [(1, OUTPUT), (2, ERROR)]
        assert api.exec_inspect("e1")["ExitCode"] == 0
    finally:
        client.close()
        server.close()
