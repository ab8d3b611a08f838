"""The emulator's one port: gRPC (HTTP/2) and the API key exchange (HTTP/1.1) side by side.

The SDK derives the key exchange URL from the base URL: for `http://127.0.0.1:PORT` (a local address) it
is `http://127.0.0.1:PORT/api/v1/auth/token`, the same host and port as the gRPC API, as boxd's combined
development server serves both (boxd._urls.console_base_url). grpcio cannot answer HTTP/1.1, so the port
is a small front: a connection that opens with the HTTP/2 preface is carried to the gRPC server on a
private port; any other is read as an HTTP/1.1 request for the exchange.

The exchange, as the SDK expects it (boxd._credentials): `POST /api/v1/auth/token` with
`{"api_key": KEY}` answers 200 `{"token": JWT, "expires_at": epoch seconds}` (an hour, as boxd's tokens
last), 401 for a key it does not know, and 429 with `Retry-After` past `exchange_limit` exchanges per
`exchange_window` seconds from one address (boxd rate-limits the exchange per source IP; its figures
are not published: the defaults here are a guess, set them with Configure).
"""

from __future__ import annotations

import json
import math
import secrets
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

PREFACE = b"PRI * HTTP/2.0\r\n"
EXCHANGE_PATH = "/api/v1/auth/token"
TOKEN_SECONDS = 3600
CHUNK = 1 << 16


class Exchange:
    """API keys the emulator knows, the tokens it issued, and the per-address rate limit of the exchange."""

    def __init__(self, api_key: str, limit: int = 10, window: float = 60.0) -> None:
        self.api_key = api_key
        self.limit = limit
        self.window = window
        self.issued: dict[str, float] = {}  # token -> expires_at
        self.hits: dict[str, list[float]] = {}  # address -> times of its exchanges in the window
        self.lock = threading.Lock()

    def configure(self, limit: int, window: float) -> None:
        """A new limit starts a new window: the exchanges counted so far are forgotten."""
        with self.lock:
            self.limit, self.window = limit, window
            self.hits.clear()

    def valid(self, token: str) -> bool:
        with self.lock:
            expires = self.issued.get(token)
        return expires is not None and time.time() < expires

    def answer(self, address: str, body: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
        """(status, headers, JSON body) of one exchange from `address`."""
        now = time.monotonic()
        with self.lock:
            recent = [t for t in self.hits.get(address, []) if now - t < self.window]
            if self.limit and len(recent) >= self.limit:
                self.hits[address] = recent
                wait = math.ceil(self.window - (now - recent[0])) or 1
                return 429, {"Retry-After": str(wait)}, {"error": "rate limit exceeded"}
            self.hits[address] = [*recent, now]
        try:
            key = json.loads(body or b"{}").get("api_key")
        except (ValueError, AttributeError):
            return 400, {}, {"error": "the body must be a JSON object with api_key"}
        if not self.api_key or key != self.api_key:
            return 401, {}, {"error": "invalid or expired API key"}
        token = "emu-jwt-" + secrets.token_hex(16)
        expires_at = time.time() + TOKEN_SECONDS
        with self.lock:
            self.issued[token] = expires_at
        return 200, {}, {"token": token, "expires_at": expires_at}


class Front:
    """Listens on 127.0.0.1:port; HTTP/2 goes to `grpc_port`, HTTP/1.1 to the exchange."""

    def __init__(self, port: int, grpc_port: int, exchange: Exchange, log: Callable[[dict[str, Any]], None]):
        self.grpc_port = grpc_port
        self.exchange = exchange
        self.log = log
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._accept, name="boxd-emu-front", daemon=True).start()

    def stop(self) -> None:
        self.closed.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, address = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, address), daemon=True).start()

    def _serve(self, conn: socket.socket, address: Any) -> None:
        try:
            head = _peek(conn, len(PREFACE))
            if PREFACE.startswith(head) and head:
                self._carry(conn)
            elif head:
                _ExchangeRequest(conn, address, self)
        except OSError:
            pass
        finally:
            conn.close()

    def _carry(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.grpc_port))
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        upstream.close()


def _peek(conn: socket.socket, size: int) -> bytes:
    """The first bytes of the connection, left in it: as many as `size`, or as many as came before a short
    pause or the end (an HTTP/1.1 request is longer than the preface's first line anyway)."""
    deadline = time.monotonic() + 5
    while True:
        head = conn.recv(size, socket.MSG_PEEK)
        if len(head) >= size or not head or not PREFACE.startswith(head) or time.monotonic() > deadline:
            return head
        time.sleep(0.001)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _ExchangeRequest(BaseHTTPRequestHandler):
    """One HTTP/1.1 request on the front's port (the handler runs in its constructor)."""

    server: Any
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.split("?", 1)[0] != EXCHANGE_PATH:
            self._reply(404, {}, {"error": f"no route {self.path}"})
            return
        status, headers, answer = self.server.exchange.answer(self.client_address[0], body)
        self.server.log({"method": "ExchangeToken", "status": status, "time": time.time()})
        self._reply(status, headers, answer)

    def do_GET(self) -> None:
        self._reply(405 if self.path.split("?", 1)[0] == EXCHANGE_PATH else 404, {}, {"error": "POST only"})

    def _reply(self, status: int, headers: dict[str, str], answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass
