# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The relay's channel to a box on a remote engine (docker_ssh), over the engine's SSH connection.

The relay runs `docker exec -i -u root agentbox-<box> python3 -c FORWARDER` on the engine, over
the SSH connection the collection already uses. The forwarder listens on the box's
/run/agentbox/relay/relay.sock (the same path as on the local engine, so the in-box client is the
same) and carries each connection's request line out on its stdout and the relay's answers back
from its stdin. Nothing listens on any network address, on the engine or on the host. The
channel is opened by the host into that one container: what arrives on it is that box's request,
as the socket is on the local engine. A box that stops ends the channel; the relay opens it
again when the box runs (every few seconds, backing off to RETRY_MAX while it does not).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import threading
from typing import Any

from ..core._naming import container_name
from ._relay_channel import LOG, BoxChannel, Handler
from ._relay_protocol import MAX_REQUEST_BYTES

RETRY_MIN = 1.0
RETRY_MAX = 10.0

# In the box, as root (standard library only). One thread per client connection; stdout writes
# under a lock; the relay's answers come on stdin as {"c": connection, "msg": {...}}.
FORWARDER = r"""
import json, os, socket, sys, threading
MAX = @MAX@
directory = "/run/agentbox/relay"
os.makedirs(directory, exist_ok=True)
os.chmod(directory, 0o755)
path = directory + "/relay.sock"
try:
    os.unlink(path)
except FileNotFoundError:
    pass
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
os.chmod(path, 0o666)
mine = os.stat(path).st_ino
server.listen(16)
lock = threading.Lock()
clients = {}

def emit(message):
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

def client(number, conn):
    try:
        line = conn.makefile("rb").readline(MAX + 2)
        emit({"c": number, "hex": line.hex()})
        conn.recv(1)
    except OSError:
        pass
    emit({"c": number, "hangup": True})

def answers():
    for raw in sys.stdin:
        message = json.loads(raw)
        conn = clients.get(message["c"])
        if conn is None:
            continue
        try:
            conn.sendall((json.dumps(message["msg"]) + "\n").encode())
        except OSError:
            pass
        if message["msg"].get("type") != "waiting":
            clients.pop(message["c"], None)
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    try:
        if os.stat(path).st_ino == mine:  # a newer forwarder may have replaced it: leave that one
            os.unlink(path)
    finally:
        os._exit(0)

threading.Thread(target=answers, daemon=True).start()
number = 0
while True:
    conn, _ = server.accept()
    number += 1
    clients[number] = conn
    threading.Thread(target=client, args=(number, conn), daemon=True).start()
""".replace("@MAX@", str(MAX_REQUEST_BYTES))


class Tunnel(BoxChannel):
    """One docker_ssh box's channel, kept open by a thread; requests are handled on the relay's loop."""

    kind = "tunnel"
    first_wait = RETRY_MIN
    longest_wait = RETRY_MAX

    def __init__(self, registration: dict[str, Any], handle: Handler, loop: asyncio.AbstractEventLoop):
        super().__init__(registration, handle, loop)
        self.channel: Any = None
        self.write_lock = threading.Lock()
        self.hangups: dict[int, asyncio.Future] = {}

    def stop(self) -> None:
        super().stop()
        channel = self.channel
        if channel is not None:
            channel.close()

    def attempt(self) -> bool:
        return self._serve_once()

    def _serve_once(self) -> bool:
        """Open the channel and serve it until it ends; True when it carried at least one line."""
        from ..ssh._ssh import connection_for

        options = self.registration.get("options", {}).get("ssh_options", {})
        connection = connection_for(self.registration["engine"], **options)
        # A box on the engine's box engine was registered with that daemon's socket (reopen_options).
        docker = connection.docker_command(self.registration.get("options", {}).get("remote_socket"))
        container = container_name(self.registration["name"])
        command = f"{docker} exec -i -u root {shlex.quote(container)} python3 -c {shlex.quote(FORWARDER)}"
        self.channel = channel = connection.open_exec_channel(command)
        LOG.info("channel to box %s opened on engine %s", self.registration["name"], self.registration["engine"])
        carried = False
        try:
            reader = channel.makefile("rb")
            while not self.stopping.is_set():
                raw = reader.readline(4 * MAX_REQUEST_BYTES)
                if not raw:
                    break
                carried = True
                message = json.loads(raw)
                number = int(message["c"])
                if message.get("hangup"):
                    self.loop.call_soon_threadsafe(self._hung_up, number)
                else:
                    line = bytes.fromhex(message.get("hex", ""))
                    asyncio.run_coroutine_threadsafe(self._request(number, line), self.loop)
        finally:
            channel.close()
            self.channel = None
            self.loop.call_soon_threadsafe(self._hang_up_all)
        return carried

    async def _request(self, number: int, line: bytes) -> None:
        left = self.loop.create_future()
        self.hangups[number] = left

        async def send(message: dict[str, Any]) -> None:
            await asyncio.to_thread(self._write, {"c": number, "msg": message})

        async def hangup() -> Any:
            return await asyncio.shield(left)

        try:
            await self.handle(self.registration, line, send, hangup)
        except Exception:
            LOG.exception("request from box %s failed", self.registration["name"])
            await send({"type": "error", "rc": 1, "message": "the relay failed on this request; see relay.log"})
        finally:
            self.hangups.pop(number, None)

    def _write(self, message: dict[str, Any]) -> None:
        channel = self.channel
        if channel is None:
            return
        with self.write_lock:
            channel.sendall((json.dumps(message) + "\n").encode("utf-8"))

    def _hung_up(self, number: int) -> None:
        left = self.hangups.get(number)
        if left is not None and not left.done():
            left.set_result(True)

    def _hang_up_all(self) -> None:
        for number in list(self.hangups):
            self._hung_up(number)
