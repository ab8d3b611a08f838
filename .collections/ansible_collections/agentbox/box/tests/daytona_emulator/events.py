"""Sandbox events over Socket.IO (Engine.IO v4, websocket transport only), the way the SDK listens.

The SDK connects to {api_url}/socket.io/ with its API key in the Socket.IO CONNECT packet and waits
for `sandbox.state.updated` ({sandbox, oldState, newState}); with events its state waits end as soon
as the state changes instead of at the next one-second poll. Without this the SDK just polls.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import queue
import secrets
import socket
import struct
import threading
from typing import Any, BinaryIO

LOG = logging.getLogger("daytona_emulator.events")
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PING_INTERVAL_MS = 25000
PING_TIMEOUT_MS = 20000
_CLOSE = object()


class EventHub:
    """Fans events out to every connected, authenticated Socket.IO client."""

    def __init__(self) -> None:
        self._clients: set[queue.Queue] = set()
        self._lock = threading.Lock()

    def publish(self, event: str, data: Any) -> None:
        packet = "42" + json.dumps([event, data])
        with self._lock:
            for outbox in self._clients:
                outbox.put(packet)

    def attach(self, outbox: queue.Queue) -> None:
        with self._lock:
            self._clients.add(outbox)

    def detach(self, outbox: queue.Queue) -> None:
        with self._lock:
            self._clients.discard(outbox)

    def close_all(self) -> None:
        with self._lock:
            for outbox in self._clients:
                outbox.put(_CLOSE)

    @property
    def clients(self) -> int:
        with self._lock:
            return len(self._clients)


def accept_key(client_key: str) -> str:
    return base64.b64encode(hashlib.sha1((client_key + WEBSOCKET_GUID).encode()).digest()).decode()


def _read_frame(reader: BinaryIO) -> tuple[int, bytes] | None:
    head = reader.read(2)
    if len(head) < 2:
        return None
    opcode = head[0] & 0x0F
    masked = head[1] & 0x80
    length = head[1] & 0x7F
    if length == 126:
        length = struct.unpack(">H", reader.read(2))[0]
    elif length == 127:
        length = struct.unpack(">Q", reader.read(8))[0]
    mask = reader.read(4) if masked else b""
    payload = reader.read(length)
    if len(payload) < length:
        return None
    if masked:
        payload = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    return opcode, payload


def _frame(payload: bytes, opcode: int = 1) -> bytes:
    length = len(payload)
    if length < 126:
        header = struct.pack(">BB", 0x80 | opcode, length)
    elif length < 65536:
        header = struct.pack(">BBH", 0x80 | opcode, 126, length)
    else:
        header = struct.pack(">BBQ", 0x80 | opcode, 127, length)
    return header + payload


class SocketIOSession:
    """One websocket connection, after the HTTP 101 answer: Engine.IO open, Socket.IO connect, events."""

    def __init__(self, hub: EventHub, api_key: str, reader: BinaryIO, connection: socket.socket) -> None:
        self.hub = hub
        self.api_key = api_key
        self.reader = reader
        self.connection = connection
        self.write_lock = threading.Lock()
        self.outbox: queue.Queue = queue.Queue()
        self.closed = threading.Event()

    def send(self, text: str, opcode: int = 1) -> None:
        with self.write_lock:
            self.connection.sendall(_frame(text.encode(), opcode))

    def run(self) -> None:
        self.send("0" + json.dumps({"sid": secrets.token_hex(10), "upgrades": [], "pingInterval": PING_INTERVAL_MS,
                                    "pingTimeout": PING_TIMEOUT_MS, "maxPayload": 1000000}))
        reader = threading.Thread(target=self._read_loop, name="socketio-read", daemon=True)
        reader.start()
        try:
            while not self.closed.is_set():
                try:
                    packet = self.outbox.get(timeout=PING_INTERVAL_MS / 1000)
                except queue.Empty:
                    self.send("2")  # Engine.IO ping; the client answers "3"
                    continue
                if packet is _CLOSE:
                    break
                self.send(packet)
        except OSError:
            pass
        finally:
            self.closed.set()
            self.hub.detach(self.outbox)
            try:
                self.send("", opcode=8)
            except OSError:
                pass

    def _read_loop(self) -> None:
        try:
            while not self.closed.is_set():
                frame = _read_frame(self.reader)
                if frame is None:
                    break
                opcode, payload = frame
                if opcode == 8:
                    break
                if opcode == 9:
                    self.send(payload.decode(errors="replace"), opcode=10)
                    continue
                if opcode == 1:
                    self._packet(payload.decode(errors="replace"))
        except OSError:
            pass
        finally:
            self.closed.set()
            self.outbox.put(_CLOSE)

    def _packet(self, text: str) -> None:
        if text.startswith("40"):  # Socket.IO CONNECT to the default namespace, auth in the payload
            try:
                auth = json.loads(text[2:] or "{}")
            except ValueError:
                auth = {}
            if isinstance(auth, dict) and auth.get("token") == self.api_key:
                self.send("40" + json.dumps({"sid": secrets.token_hex(10)}))
                self.hub.attach(self.outbox)
            else:
                self.send("44" + json.dumps({"message": "Unauthorized"}))
        elif text.startswith("41"):  # namespace disconnect
            self.closed.set()
            self.outbox.put(_CLOSE)
        # "3" (pong) and anything else need no answer.
