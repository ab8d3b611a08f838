"""Debian's headless Chromium on this machine, driven over the DevTools protocol (CDP) on 127.0.0.1: open a page,
evaluate JavaScript in it, take a screenshot. The standard library only (a minimal WebSocket client), so the
suite needs no browser driver package; the browser is the one scripts/ensure-browser.sh installs."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from typing import Any

from tests.integration.support.fleet_page import chromium_binary

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--no-default-browser-check", "--disable-dev-shm-usage", "--hide-scrollbars"]  # fmt: skip


class Browser:
    """One headless Chromium with one page; `with Browser(width, height) as page: page.open(url)`."""

    def __init__(self, width: int = 1280, height: int = 800) -> None:
        self.size = (width, height)
        self.profile = ""
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.next_id = 0

    def __enter__(self) -> Browser:
        self.profile = tempfile.mkdtemp(prefix="agentbox-cdp-")
        argv = [chromium_binary(), *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0", f"--window-size={self.size[0]},{self.size[1]}", "about:blank"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        port = None
        for raw in self.proc.stderr:  # Chromium says where DevTools listen before anything else can be asked
            found = re.search(rb"DevTools listening on ws://127\.0\.0\.1:(\d+)/", raw)
            if found:
                port = int(found.group(1))
                break
        assert port, "headless Chromium did not say where its DevTools listen"
        # The rest of its log is read and dropped: a full pipe would stop Chromium in the middle of the test.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        page = next(target for target in targets if target.get("type") == "page")
        self.sock = connect_websocket(page["webSocketDebuggerUrl"])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(30)
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One CDP command on the page; its result (events that come first are read past)."""
        assert self.sock is not None
        self.next_id += 1
        send_text(self.sock, json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(read_message(self.sock))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, seconds: float = 30.0) -> Any:
        """Evaluate `expression` until it is truthy (its value), at most `seconds`: waits on the page's state."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                value = self.evaluate(expression)
            except CDPError as exc:  # a page that moves on (a redirect) has no context to evaluate in meanwhile
                if not any(words in str(exc) for words in NAVIGATING) or time.monotonic() > deadline:
                    raise
                value = None
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    def screenshot(self, path: str) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(data))


class CDPError(AssertionError):
    """A DevTools command the browser answered with an error."""


# What the browser answers an evaluation while the page navigates (the screen's page forwards to noVNC).
NAVIGATING = ("Inspected target navigated or closed", "Execution context was destroyed", "Cannot find context")


def connect_websocket(url: str) -> socket.socket:
    found = re.fullmatch(r"ws://127\.0\.0\.1:(\d+)(/.*)", url)
    assert found, f"not a DevTools URL on 127.0.0.1: {url}"
    sock = socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET {found.group(2)} HTTP/1.1\r\nHost: 127.0.0.1:{found.group(1)}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, "DevTools closed the WebSocket handshake"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head.decode(errors="replace")
    return sock


def send_text(sock: socket.socket, text: str) -> None:
    payload = text.encode()
    mask = os.urandom(4)
    size = len(payload)
    header = bytes([0x81]) + (bytes([0x80 | size]) if size < 126 else
                              bytes([0x80 | 126]) + struct.pack(">H", size) if size < 65536 else
                              bytes([0x80 | 127]) + struct.pack(">Q", size))  # fmt: skip
    sock.sendall(header + mask + bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload)))


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        assert chunk, "DevTools closed the WebSocket"
        data += chunk
    return bytes(data)


def read_message(sock: socket.socket) -> str:
    """One whole text message (its fragments joined); the server's frames are not masked."""
    parts = []
    while True:
        first, second = read_exactly(sock, 2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack(">H", read_exactly(sock, 2))[0]
        elif size == 127:
            size = struct.unpack(">Q", read_exactly(sock, 8))[0]
        payload = read_exactly(sock, size)
        if first & 0x0F in (0x9, 0xA):  # ping or pong between fragments: not part of the message
            continue
        if first & 0x0F == 0x8:
            raise ConnectionError(f"the browser closed the DevTools connection: {payload[2:].decode('utf-8', 'replace')}")
        parts.append(payload)
        if first & 0x80:
            return b"".join(parts).decode()
