"""HTTP front of the emulator: routing, Bearer auth, fault injection, the toolbox proxy cut, admin routes.

Routes:
  /api/...                  the Daytona REST API (what DaytonaConfig.api_url points at)
  /toolbox/{sandboxId}/...  the toolbox, through the "proxy" (the sandboxes' toolboxProxyUrl)
  /preview/...              preview URLs (token header) and signed preview URLs (token in the path)
  /_emulator/...            admin: state, reset, faults, request log, run-time settings
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import habits
from .core import Emulator
from .errors import SOURCE_PROXY, ApiError, Reply, error_body, reason_phrase
from .events import SocketIOSession, accept_key
from .faults import HOLD_LIMIT_SECONDS, FaultRule, FaultRuleError

LOG = logging.getLogger("daytona_emulator.http")
PREVIEW_FETCH = (
    'if command -v curl >/dev/null 2>&1; then exec curl -sS -f "$1"; fi; '
    'if command -v wget >/dev/null 2>&1; then exec wget -q -O - "$1"; fi; '
    'echo "neither curl nor wget in the sandbox" >&2; exit 127'
)

Handler = Callable[..., Any]


class _Dropped(Exception):
    """Close the connection without (completing) an answer."""


class EmulatorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        super().__init__((emulator.config.host, emulator.config.port), RequestHandler)
        host, port = self.server_address[:2]
        emulator.config.port = port
        emulator.base_url = f"http://{host}:{port}"


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "daytona-emulator"
    server: EmulatorHTTPServer

    def setup(self) -> None:
        super().setup()
        # One write per answer plus no Nagle: keep-alive round trips stay at loopback speed.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s - %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # the names http.server dispatches to
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    # ---- plumbing -----------------------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _encode(self, reply: Reply) -> bytes:
        if reply.body is None:
            payload, content_type = b"", reply.content_type
        elif isinstance(reply.body, (bytes, bytearray)):
            payload, content_type = bytes(reply.body), reply.content_type or "application/octet-stream"
        else:
            payload, content_type = json.dumps(reply.body).encode(), "application/json; charset=utf-8"
        lines = [f"HTTP/1.1 {reply.status} {reason_phrase(reply.status)}", f"Server: {self.server_version}",
                 f"Date: {self.date_time_string()}", f"Content-Length: {len(payload)}"]
        if content_type:
            lines.append(f"Content-Type: {content_type}")
        lines += [f"{name}: {value}" for name, value in reply.headers.items()]
        lines.append("Connection: close" if self.close_connection else "Connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---- one request --------------------------------------------------------------------------------------
    def _handle(self) -> None:
        emulator = self.server.emulator
        began = time.monotonic()
        split = urllib.parse.urlsplit(self.path)
        path = split.path
        query = urllib.parse.parse_qs(split.query, keep_blank_values=True)
        headers = {name.lower(): value for name, value in self.headers.items()}
        if (headers.get("connection") or "").lower() == "close":
            self.close_connection = True
        entry: dict[str, Any] = {"time": time.time(), "method": self.command, "path": path, "query": split.query}
        rule: FaultRule | None = None
        if (path.startswith("/api/socket.io") and emulator.config.events
                and (headers.get("upgrade") or "").lower() == "websocket" and headers.get("sec-websocket-key")):
            entry["status"] = 101
            self._log(emulator, entry)
            self._websocket(emulator, headers["sec-websocket-key"])
            return
        try:
            body = self._read_body()
            reply = self._route(emulator, path, query, headers, body, entry)
            if isinstance(reply, tuple):  # (rule, thunk): a fault decided what happens around the work
                rule, thunk = reply
                reply = thunk()
        except _Dropped:
            entry["status"] = None
            entry["outcome"] = entry.get("outcome") or "dropped"
            self._drop()
            entry["duration"] = round(time.monotonic() - began, 4)
            self._log(emulator, entry)
            return
        except ApiError as exc:
            reply = Reply(exc.status, exc.body(self.command, path), headers=exc.headers)
        except Exception as exc:  # any bug answers 500 rather than killing the connection
            LOG.exception("%s %s failed", self.command, path)
            reply = Reply(500, error_body(500, f"emulator error: {exc}", method=self.command, path=path))
        entry["status"] = reply.status
        raw = self._encode(reply)
        action = rule.action if rule is not None else None
        if action == "drop_after":
            entry["outcome"] = "fault:drop_after"
            entry["status"] = None
        elif action == "truncate":
            entry["outcome"] = "fault:truncate"
        # Logged before the answer goes out: a client that reads the log as soon as it has its
        # answer must find its request there (logging after the write raced with such a client).
        entry["duration"] = round(time.monotonic() - began, 4)
        self._log(emulator, entry)
        if action == "drop_after":
            self._drop()
        elif action == "truncate":
            head, _blank, payload = raw.partition(b"\r\n\r\n")
            self.wfile.write(head + b"\r\n\r\n" + payload[: max(1, len(payload) // 2)])
            self._drop()
        else:
            self.wfile.write(raw)

    def _websocket(self, emulator: Emulator, client_key: str) -> None:
        """Take the connection over for Socket.IO; it ends when either side closes."""
        self.close_connection = True
        self.wfile.write((
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_key(client_key)}\r\n\r\n").encode())
        SocketIOSession(emulator.events, emulator.config.api_key, self.rfile, self.connection).run()

    @staticmethod
    def _log(emulator: Emulator, entry: dict[str, Any]) -> None:
        # Admin calls stay out of the log so tests can count exactly what the SDK sent.
        if not entry["path"].startswith("/_emulator"):
            emulator.log_request(entry)

    def _route(self, emulator: Emulator, path: str, query: dict[str, list[str]], headers: dict[str, str],
               body: bytes, entry: dict[str, Any]) -> Any:
        method = self.command
        if path.startswith("/api/socket.io"):
            # No Socket.IO here: the SDK falls back to polling, as the contract documents.
            raise ApiError(404, "Socket.IO is not served by the emulator")
        if path.startswith("/preview/"):
            return self._preview(emulator, path, query, headers)
        self._authenticate(emulator, headers)
        if path.startswith("/_emulator"):
            return admin(emulator, method, path, query, body)
        if not path.startswith(("/api/", "/toolbox/")):
            raise ApiError(404, f"Cannot {method} {path}")

        limited = emulator.throttler.check(emulator.config.throttle_limits, emulator.config.throttle_window_seconds,
                                           method, path)
        if limited is not None:
            entry["outcome"] = "throttled"
            raise limited
        rule = emulator.faults.pick(method, path)
        if rule is not None:
            entry["outcome"] = f"fault:{rule.action}"
            entry["fault"] = rule.rule_id
            if rule.delay:
                time.sleep(rule.delay)
            if rule.action == "status":
                fault_body = rule.body if rule.body is not None else error_body(
                    rule.status, f"injected fault: {rule.status} {reason_phrase(rule.status)}", method=method,
                    path=path)
                return Reply(rule.status, fault_body, headers=rule.headers)
            if rule.action == "drop":
                raise _Dropped()
            if rule.action == "hold":
                rule.released.wait(HOLD_LIMIT_SECONDS)

        def work() -> Reply:
            if path.startswith("/api/"):
                return api(emulator, method, path[len("/api"):], query, body)
            return self._toolbox(emulator, method, path, query, headers, body, entry)

        if rule is not None and rule.action in ("drop_after", "truncate"):
            return rule, work
        return work()

    def _authenticate(self, emulator: Emulator, headers: dict[str, str]) -> None:
        expected = f"Bearer {emulator.config.api_key}"
        if headers.get("authorization") != expected:
            raise ApiError(401, "Unauthorized")

    def _toolbox(self, emulator: Emulator, method: str, path: str, query: dict[str, list[str]],
                 headers: dict[str, str], body: bytes, entry: dict[str, Any]) -> Reply:
        match = re.fullmatch(r"/toolbox/([^/]+)(/.*)?", path)
        if not match or not match.group(2):
            raise ApiError(404, f"Cannot {method} {path}", source=SOURCE_PROXY)
        sandbox_id = urllib.parse.unquote(match.group(1))
        route = match.group(2)
        # The proxy cuts long calls (~5 minutes on Daytona); the work itself goes on in the sandbox.
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["reply"] = emulator.toolbox.handle(method, sandbox_id, route, query, body, headers)
            except BaseException as exc:  # noqa: BLE001 - handed back to the request thread
                box["error"] = exc

        worker = threading.Thread(target=run, name="toolbox-call", daemon=True)
        worker.start()
        limit = emulator.config.proxy_timeout_seconds
        worker.join(limit)
        if worker.is_alive():
            entry["outcome"] = "proxy_cut"
            if emulator.config.proxy_cut_mode == "drop":
                raise _Dropped()
            raise ApiError(504, f"Gateway Timeout: the proxy cut the request after {limit:g} s",
                           source=SOURCE_PROXY)
        if "error" in box:
            raise box["error"]
        return box["reply"]

    def _preview(self, emulator: Emulator, path: str, query: dict[str, list[str]],
                 headers: dict[str, str]) -> Reply:
        signed = re.fullmatch(r"/preview/s/([^/]+)(/.*)?", path)
        if signed:
            sb, port = emulator.resolve_signed_preview(signed.group(1))
            rest = signed.group(2) or "/"
        else:
            plain = re.fullmatch(r"/preview/([^/]+)/(\d+)(/.*)?", path)
            if not plain:
                raise ApiError(404, f"Cannot {self.command} {path}", source=SOURCE_PROXY)
            sb, port = emulator.resolve_preview(plain.group(1), plain.group(2),
                                                headers.get("x-daytona-preview-token"))
            rest = plain.group(3) or "/"
        if self.command != "GET":
            raise ApiError(405, "the emulator's preview proxy only forwards GET", source=SOURCE_PROXY)
        with emulator.lock:
            if sb.state != "started" or not sb.container_id:
                raise ApiError(502, f"Sandbox {sb.id} is {sb.state}", source=SOURCE_PROXY)
            sb.mark_activity()  # preview traffic resets the auto-stop timer, as on Daytona
            container_id = sb.container_id
        target = f"http://127.0.0.1:{port}{rest}"
        if query:
            target += "?" + urllib.parse.urlencode(query, doseq=True)
        # Fetched from inside the sandbox through docker exec: never via the container's IP.
        result = emulator.backend.exec_argv(container_id, ["/bin/sh", "-c", PREVIEW_FETCH, "preview", target])
        if result.exit_code != 0:
            raise ApiError(502, f"nothing answered on port {port} in the sandbox", source=SOURCE_PROXY)
        return Reply(200, result.output, "application/octet-stream")


# ---- the REST API -----------------------------------------------------------------------------------------
def _body(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"invalid JSON body: {exc}") from exc


def api(emulator: Emulator, method: str, path: str, query: dict[str, list[str]], raw: bytes) -> Reply:
    segments = [urllib.parse.unquote(part) for part in path.split("/") if part]
    e = emulator
    q = query
    if segments == ["sandbox"]:
        if method == "POST":
            return Reply(200, e.create_sandbox(_body(raw)))
        if method == "GET":
            return Reply(200, e.list_sandboxes(q))
    if segments == ["sandbox", "ssh-access", "validate"] and method == "GET":
        return Reply(200, e.validate_ssh_access(q))
    if len(segments) == 2 and segments[0] == "sandbox":
        target = segments[1]
        if method == "GET":
            return Reply(200, e.get_sandbox(target))
        if method == "DELETE":
            return Reply(200, e.delete_sandbox(target))
    if len(segments) >= 3 and segments[0] == "sandbox":
        target, action, rest = segments[1], segments[2], segments[3:]
        if method == "POST" and not rest:
            simple: dict[str, Callable[[], Any]] = {
                "start": lambda: e.start_sandbox(target),
                "stop": lambda: e.stop_sandbox(target, (q.get("force") or ["false"])[-1] == "true"),
                "archive": lambda: e.archive_sandbox(target),
                "pause": lambda: e.pause_sandbox(target),
                "recover": lambda: e.recover_sandbox(target),
                "snapshot": lambda: e.snapshot_sandbox(target, _body(raw)),
                "ssh-access": lambda: e.create_ssh_access(target, q),
            }
            if action in simple:
                return Reply(200, simple[action]())
            if action == "last-activity":
                e.refresh_activity(target)
                return Reply(201)
            if action == "fork":
                e.find(target)
                raise ApiError(422, "Forking is not supported for this sandbox")
        if method == "POST" and len(rest) == 1 and action in ("autostop", "autoarchive", "autodelete", "ttl"):
            return Reply(200, e.set_interval(target, action, rest[0]))
        if method == "POST" and len(rest) == 1 and action == "public":
            return Reply(200, e.set_public(target, rest[0]))
        if method == "PUT" and action == "labels" and not rest:
            return Reply(200, e.replace_labels(target, _body(raw)))
        if method == "DELETE" and action == "ssh-access" and not rest:
            return Reply(200, e.revoke_ssh_access(target, q))
        if method == "GET" and action == "toolbox-proxy-url" and not rest:
            e.find(target)
            return Reply(200, {"url": e.toolbox_url})
        if action == "ports" and len(rest) >= 2:
            port, kind = rest[0], rest[1]
            if method == "GET" and kind == "preview-url" and len(rest) == 2:
                return Reply(200, e.preview_url(target, port))
            if method == "GET" and kind == "signed-preview-url" and len(rest) == 2:
                return Reply(200, e.signed_preview_url(target, port, q))
            if method == "POST" and kind == "signed-preview-url" and len(rest) == 4 and rest[3] == "expire":
                e.expire_signed_preview_url(target, port, rest[2])
                return Reply(200)
    if segments == ["snapshots"]:
        if method == "POST":
            return Reply(200, e.create_snapshot(_body(raw)))
        if method == "GET":
            return Reply(200, e.list_snapshots(q))
    if len(segments) == 2 and segments[0] == "snapshots":
        if method == "GET":
            return Reply(200, e.get_snapshot(segments[1]))
        if method == "DELETE":
            e.delete_snapshot(segments[1])
            return Reply(200)
    if len(segments) == 3 and segments[0] == "snapshots" and method == "POST":
        if segments[2] == "activate":
            return Reply(200, e.set_snapshot_active(segments[1], True))
        if segments[2] == "deactivate":
            e.set_snapshot_active(segments[1], False)
            return Reply(204)
    if segments == ["config"] and method == "GET":
        return Reply(200, config_dto(e))
    if segments == ["health"] and method == "GET":
        return Reply(200, {"status": "ok"})
    if segments == ["health", "ready"] and method == "GET":
        return Reply(200, {"status": "ok", "info": {}, "error": {}, "details": {}})
    raise ApiError(404, f"Cannot {method} /api{path}")


def config_dto(emulator: Emulator) -> dict[str, Any]:
    return {
        "version": "daytona-emulator",
        "oidc": {"issuer": "http://emulator.invalid", "clientId": "emulator", "audience": "emulator",
                 "provider": "none"},
        "linkedAccountsEnabled": False,
        "announcements": {},
        "proxyTemplateUrl": f"{emulator.base_url}/preview/{{{{sandboxId}}}}/{{{{PORT}}}}",
        "proxyToolboxUrl": emulator.toolbox_url,
        "defaultSnapshot": emulator.config.snapshot_name,
        "dashboardUrl": emulator.base_url,
        "maxAutoArchiveInterval": 43200,
        "maintananceMode": False,
        "environment": "emulator",
    }


# ---- admin ------------------------------------------------------------------------------------------------
def admin(emulator: Emulator, method: str, path: str, query: dict[str, list[str]], raw: bytes) -> Reply:
    route = path[len("/_emulator"):].rstrip("/") or "/"
    if route == "/health" and method == "GET":
        return Reply(200, {"status": "ok", "instanceId": emulator.config.instance_id, "apiUrl": emulator.api_url})
    if route == "/state" and method == "GET":
        return Reply(200, emulator.state_view())
    if route == "/reset" and method == "POST":
        return Reply(200, emulator.reset())
    if route == "/config":
        if method == "GET":
            return Reply(200, emulator.config.public())
        if method == "POST":
            return Reply(200, emulator.set_runtime_config(_body(raw)))
    if route == "/faults":
        if method == "GET":
            return Reply(200, emulator.faults.to_json())
        if method == "POST":
            specs = _body(raw)
            try:
                rules = [emulator.faults.add(spec) for spec in (specs if isinstance(specs, list) else [specs])]
            except FaultRuleError as exc:
                raise ApiError(400, str(exc)) from exc
            return Reply(200, [rule.to_json() for rule in rules])
        if method == "DELETE":
            emulator.faults.clear()
            return Reply(204)
    match = re.fullmatch(r"/faults/(\d+)/release", route)
    if match and method == "POST":
        if not emulator.faults.release(int(match.group(1))):
            raise ApiError(404, f"no fault rule {match.group(1)}")
        return Reply(204)
    match = re.fullmatch(r"/faults/(\d+)", route)
    if match and method == "DELETE":
        if not emulator.faults.remove(int(match.group(1))):
            raise ApiError(404, f"no fault rule {match.group(1)}")
        return Reply(204)
    if route == "/requests":
        if method == "GET":
            since = int((query.get("since") or ["0"])[-1] or 0)
            with emulator.lock:
                return Reply(200, [entry for entry in emulator.requests if entry["seq"] > since])
        if method == "DELETE":
            with emulator.lock:
                emulator.requests.clear()
            return Reply(204)
    if route == "/tick" and method == "POST":
        emulator.tick()
        return Reply(200, {"ticked": True})
    match = re.fullmatch(r"/snapshots/([^/]+)/deactivate-unused", route)
    if match and method == "POST":
        name = urllib.parse.unquote(match.group(1))
        return Reply(200, habits.deactivate_unused_snapshot(emulator, name, _body(raw)))
    if route == "/signed-previews" and method == "GET":
        return Reply(200, emulator.signed_preview_records())
    match = re.fullmatch(r"/signed-previews/([A-Za-z0-9_-]+)/expire", route)
    if match and method == "POST":
        return Reply(200, emulator.expire_signed_preview_now(match.group(1)))
    match = re.fullmatch(r"/ssh-access/([A-Za-z0-9]+)/expire", route)
    if match and method == "POST":
        return Reply(200, emulator.expire_ssh_access(match.group(1)))
    match = re.fullmatch(r"/sandboxes/([^/]+)/fail", route)
    if match and method == "POST":
        return Reply(200, habits.fail_sandbox(emulator, urllib.parse.unquote(match.group(1)), _body(raw)))
    raise ApiError(404, f"Cannot {method} {path}")
