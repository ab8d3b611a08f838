"""Exposed ports: boxd's public TCP forwards (`machines.ports.expose`), served on 127.0.0.1.

Production answers an ExposePort with a DNS name and a public port that forwards raw TCP to the machine
port (at most 3 forwards per machine; re-exposing a port keeps its public port). The emulator's DNS name
is 127.0.0.1 and its public port a listener there. Each accepted connection is carried into the machine
through `docker exec` of a small relay that connects to 127.0.0.1:<port> inside it, so nothing ever
talks to a container's IP. A connection wakes a suspended machine (as inbound traffic does on boxd); one
to a stopped machine, or to a port nothing listens on, is closed without an answer.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_FORWARDS = 3
PUBLIC_HOST = "127.0.0.1"
CHUNK = 1 << 16
# Runs in the machine: stdin -> the port, the port -> stdout, half-closes passed on both ways.
RELAY = r"""
import os, socket, sys, threading
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
except OSError as exc:
    sys.stderr.write("nothing answers on port %s: %s\n" % (sys.argv[1], exc)); sys.exit(1)
s.settimeout(None)
def up():
    while True:
        d = os.read(0, 65536)
        if not d:
            break
        s.sendall(d)
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up, daemon=True).start()
out = sys.stdout.buffer
while True:
    d = s.recv(65536)
    if not d:
        break
    out.write(d); out.flush()
"""
# python3 where the machine has it (half-closes carried); else nc (busybox images, like the test image).
LAUNCH = ('if command -v python3 >/dev/null 2>&1; then exec python3 -c "$1" "$2"; fi; '
          'if command -v nc >/dev/null 2>&1; then exec nc 127.0.0.1 "$2"; fi; '
          'echo "neither python3 nor nc in the machine" >&2; exit 127')


@dataclass
class Forward:
    machine_id: str
    machine_name: str
    vm_port: int
    protocol: str
    listener: socket.socket
    public_port: int
    stopped: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.stopped.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread; a bare close would not stop listening
        except OSError:
            pass
        self.listener.close()


class Forwards:
    """Every forward of one emulator. `connect(machine_id)` answers the container of a machine that can
    take a connection now (woken if asleep), or raises; `api` is docker-py's low-level client."""

    def __init__(self, api: Callable[[], Any], connect: Callable[[str], str], done: Callable[[str], None]) -> None:
        self._api = api
        self._connect = connect
        self._done = done
        self._lock = threading.Lock()
        self._forwards: dict[tuple[str, int], Forward] = {}

    def expose(self, machine_id: str, machine_name: str, vm_port: int, protocol: str) -> Forward:
        with self._lock:
            found = self._forwards.get((machine_id, vm_port))
            if found is not None:
                found.protocol = protocol  # re-exposing keeps the public port, updates the protocol
                return found
            if sum(1 for key in self._forwards if key[0] == machine_id) >= MAX_FORWARDS:
                raise ValueError(f"machine {machine_id} already exposes {MAX_FORWARDS} ports (the limit): "
                                 "unexpose one first")
            listener = socket.create_server((PUBLIC_HOST, 0))
            forward = Forward(machine_id, machine_name, vm_port, protocol, listener, listener.getsockname()[1])
            self._forwards[(machine_id, vm_port)] = forward
        threading.Thread(target=self._accept, args=(forward,), name=f"boxd-forward-{vm_port}", daemon=True).start()
        return forward

    def unexpose(self, machine_id: str, vm_port: int) -> Forward | None:
        with self._lock:
            forward = self._forwards.pop((machine_id, vm_port), None)
        if forward is not None:
            forward.close()
        return forward

    def listing(self, machine_id: str | None = None) -> list[Forward]:
        with self._lock:
            found = [f for f in self._forwards.values() if machine_id is None or f.machine_id == machine_id]
        return sorted(found, key=lambda f: (f.machine_name, f.vm_port))

    def drop_machine(self, machine_id: str) -> None:
        for forward in self.listing(machine_id):
            self.unexpose(machine_id, forward.vm_port)

    def close(self) -> None:
        for forward in self.listing():
            self.unexpose(forward.machine_id, forward.vm_port)

    # ---- carrying connections ------------------------------------------------------------------------
    def _accept(self, forward: Forward) -> None:
        while not forward.stopped.is_set():
            try:
                client, _addr = forward.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(forward, client), daemon=True).start()

    def _carry(self, forward: Forward, client: socket.socket) -> None:
        try:
            container = self._connect(forward.machine_id)
        except Exception as exc:  # noqa: BLE001 - a machine that cannot take it: the connection closes unanswered
            _say(forward, f"refused: {exc}")
            client.close()
            return
        sock = None
        try:
            api = self._api()
            argv = ["/bin/sh", "-c", LAUNCH, "relay", RELAY, str(forward.vm_port)]
            exec_id = api.exec_create(container, argv, stdin=True, stdout=True, stderr=True, tty=False,
                                      user="0")["Id"]
            sock = api.exec_start(exec_id, socket=True)._sock
            threading.Thread(target=_upstream, args=(client, sock), daemon=True).start()
            for is_stderr, data in demux(sock):
                if is_stderr:
                    _say(forward, data.decode("utf-8", "replace").strip())
                else:
                    client.sendall(data)
        except Exception as exc:  # noqa: BLE001 - the peer or the engine went away: close both ends
            _say(forward, f"closed: {type(exc).__name__}: {exc}")
        finally:
            self._done(forward.machine_id)
            for end in (client, sock):
                if end is not None:
                    # shutdown first: a bare close leaves the peer waiting while _upstream's recv holds the socket
                    try:
                        end.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    end.close()


def _say(forward: Forward, what: str) -> None:
    """Why a carried connection ended early, on the emulator's stderr (a test's failure shows it)."""
    sys.stderr.write(f"boxd-emulator: port {forward.vm_port} of {forward.machine_name}: {what}\n")
    sys.stderr.flush()


def _upstream(client: socket.socket, sock: socket.socket) -> None:
    """The client's bytes into the relay's stdin; the client's half-close becomes the relay's EOF."""
    try:
        while True:
            data = client.recv(CHUNK)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def demux(sock: socket.socket, chunk: int = CHUNK) -> Iterator[tuple[bool, bytes]]:
    """Docker's multiplexed exec output: 8-byte headers (stream, size) before each frame."""
    buffer = b""
    while True:
        while len(buffer) < 8:
            data = sock.recv(chunk)
            if not data:
                return
            buffer += data
        stream, size = struct.unpack(">BxxxL", buffer[:8])
        buffer = buffer[8:]
        while len(buffer) < size:
            data = sock.recv(max(chunk, size - len(buffer)))
            if not data:
                return
            buffer += data
        frame, buffer = buffer[:size], buffer[size:]
        if frame:
            yield stream == 2, frame
