"""What the egress tests share: the stand-in registry on 127.0.0.1 and a gateway on its own loop."""

from __future__ import annotations

import asyncio
import http.server
import inspect
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ansible_collections.agentbox.box.plugins.module_utils.egress import _egress_forwarder, _egress_gateway
from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_gateway import Gateway
from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import EgressPolicy

CHUNK = 64 * 1024


class Registry(http.server.BaseHTTPRequestHandler):
    """The stand-in upstream: /bytes/N streams N bytes, /echo answers with what it received, POST counts."""

    seen: list[dict[str, Any]] = []

    def do_GET(self) -> None:
        self.seen.append({"path": self.path, "headers": dict(self.headers.items())})
        if self.path.startswith("/bytes/"):
            size = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            block = b"x" * CHUNK
            while size:
                size -= self.wfile.write(block[: min(size, CHUNK)])
            return
        body = json.dumps(self.seen[-1]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        left, count = int(self.headers["Content-Length"]), 0
        while left:
            chunk = self.rfile.read(min(left, CHUNK))
            left -= len(chunk)
            count += len(chunk)
        self.seen.append({"path": self.path, "posted": count})
        body = str(count).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class Running:
    """A gateway on its own event loop in a thread, and the stand-in registry."""

    def __init__(self, home: Path, port: int) -> None:
        self.home = home
        self.port = port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        environ = {"AGENTBOX_GATEWAY_RESOLVE": "pypi.org=127.0.0.1,registry.npmjs.org=127.0.0.1,"
                                               "files.pythonhosted.org=127.0.0.1"}
        self.gateway = self.call(lambda: Gateway(environ, box_connections=4))

    def call(self, function: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def box(self, name: str, policy: EgressPolicy, box_connections: int | None = None) -> str:
        """A box's socket: a listener the gateway serves as box `name`."""
        path = str(self.home / f"{name}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        if box_connections:
            self.gateway.box_connections = box_connections
        self.call(lambda: self.gateway.serve(f"id-{name}", name, policy, listener))
        return path

    def stop(self) -> None:
        async def close() -> None:
            self.gateway.close()
            await asyncio.gather(*self.gateway.connections, return_exceptions=True)

        self.run(close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def wait_audit(count: int) -> list[dict[str, Any]]:
    """The audit line is written as the connection ends, just after the box has its answer."""
    for _attempt in range(500):
        lines = _egress_gateway.read_audit()
        if len(lines) >= count:
            return lines
        threading.Event().wait(0.01)
    return _egress_gateway.read_audit()


class Forwarder:
    def __init__(self, socket_path: str) -> None:
        source = inspect.getsource(_egress_forwarder)
        self.process = subprocess.Popen([sys.executable, "-c", source, "--port", "0", "--socket", socket_path],
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline() if self.process.stdout else ""
        assert line.startswith("agentbox egress forwarder on 127.0.0.1:"), line
        self.port = int(line.split(" -> ")[0].rsplit(":", 1)[1])
        self.environ = {**os.environ, **_egress_forwarder.box_environment(self.port)}

    def curl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["curl", "-sS", "--max-time", "30", *args], env=self.environ, capture_output=True,
                              text=True, check=False)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
