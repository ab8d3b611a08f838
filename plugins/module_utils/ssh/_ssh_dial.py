# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Docker SDK's HTTP over an engine's SSH connection (provider docker_ssh).

Every Docker API request is an SSH channel running `docker system dial-stdio` on the engine: one
HTTP connection per channel, pooled per process and multiplexed on the engine's one SSH
connection (_ssh.EngineConnection, which _ssh.docker_client_over_ssh passes in as `engine`:
anything with `engine`, `docker_command(host)` and `open_exec_channel(command)`). `docker_host` is the
daemon's socket on the engine (its box engine's), None for the docker CLI's default daemon.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..core._errors import EngineUnreachable

# A dial-stdio channel carries one HTTP connection; the SDK pools up to this many per engine.
MAX_POOL_SIZE = 16

try:
    import paramiko
    import urllib3
    import urllib3.connection
    import urllib3.connectionpool
    from docker.transport.basehttpadapter import BaseHTTPAdapter

    HAS_DOCKER_SDK = True
except ImportError:  # pragma: no cover - _ssh and _docker report the missing packages
    HAS_DOCKER_SDK = False

if HAS_DOCKER_SDK:

    class _ExactLineFile(paramiko.ChannelFile):
        """The channel's file for http.client: unbuffered, and readline takes the line and not a
        byte more. The SDK reads a hijacked exec's output from the channel itself (`fp.channel`),
        past this file: output read ahead into the file's buffer with the response's headers
        (a short command's whole output, when the controller is slow to read them) was lost."""

        def __init__(self, channel: Any, mode: str = "r", bufsize: int = -1):
            super().__init__(channel, mode, 0)

        def readline(self, size: int | None = None) -> bytes:  # type: ignore[override]
            line = bytearray()
            while size is None or size < 0 or len(line) < size:
                byte = self.read(1)
                if not byte:
                    break
                line += byte
                if byte == b"\n":
                    break
            return bytes(line)

    class _DialStdioConnection(urllib3.connection.HTTPConnection):
        """One HTTP connection = one SSH channel running `docker system dial-stdio`."""

        def __init__(self, engine: Any, timeout: float, docker_host: str | None):
            super().__init__("localhost", timeout=timeout)
            self._engine = engine
            self._channel_timeout = timeout
            self._docker_host = docker_host

        def connect(self) -> None:
            try:
                channel = self._engine.open_exec_channel(f"{self._engine.docker_command(self._docker_host)} system dial-stdio")
            except paramiko.SSHException as exc:
                raise EngineUnreachable(f"engine {self._engine.engine}: opening a channel failed ({exc})") from exc
            channel.settimeout(self._channel_timeout)
            # http.client reads the response through sock.makefile(): see _ExactLineFile.
            channel.makefile = lambda *params: _ExactLineFile(channel, *params)
            self.sock = channel

    class _DialStdioPool(urllib3.connectionpool.HTTPConnectionPool):
        scheme = "ssh"

        def __init__(self, engine: Any, timeout: float, maxsize: int, docker_host: str | None):
            super().__init__("localhost", timeout=timeout, maxsize=maxsize)
            self._engine = engine
            self._timeout = timeout
            self._docker_host = docker_host

        def _new_conn(self) -> Any:
            return _DialStdioConnection(self._engine, self._timeout, self._docker_host)

        def _get_conn(self, timeout: float | None = None) -> Any:
            # Like the SDK's own SSH pool: never block waiting for a free channel, open another.
            conn = None
            try:
                conn = self.pool.get(block=False) if self.pool is not None else None
            except Exception:  # noqa: BLE001 - queue.Empty
                conn = None
            if self.pool is None:
                raise urllib3.exceptions.ClosedPoolError(self, "Pool is closed.")
            if conn is not None and not _channel_usable(conn.sock):
                conn.close()  # the engine closed it, or the SSH link dropped since: open a fresh one
                conn = None
            return conn or self._new_conn()

    def _channel_usable(channel: Any) -> bool:
        if channel is None or channel.closed or channel.eof_received:
            return False
        transport = channel.get_transport()
        return transport is not None and transport.is_active()

    class DialStdioAdapter(BaseHTTPAdapter):
        def __init__(self, engine: Any, timeout: float, docker_host: str | None = None,
                     max_pool_size: int = MAX_POOL_SIZE):
            super().__init__()
            self._engine = engine
            self._docker_host = docker_host
            self._timeout = timeout
            self._max_pool_size = max_pool_size
            self._pool: _DialStdioPool | None = None
            self._pool_pid = 0
            self._pool_lock = threading.Lock()

        def get_connection(self, url: Any, proxies: Any = None) -> Any:
            with self._pool_lock:
                # After a fork the pooled channels belong to the parent's session: start afresh.
                if self._pool is None or self._pool_pid != os.getpid():
                    self._pool = _DialStdioPool(self._engine, self._timeout, self._max_pool_size, self._docker_host)
                    self._pool_pid = os.getpid()
                return self._pool

        def close(self) -> None:
            # The SSH connection is shared by every client of this engine: only drop our channels.
            with self._pool_lock:
                if self._pool is not None and self._pool_pid == os.getpid():
                    self._pool.close()
                self._pool = None


def dial_stdio_adapter(engine: Any, timeout: float, docker_host: str | None = None) -> Any:
    """The adapter to mount on a docker.APIClient (defined only when the SDK imports, hence this call)."""
    return DialStdioAdapter(engine, timeout, docker_host)
