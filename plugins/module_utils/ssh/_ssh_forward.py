# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Local port forwards over an engine's SSH connection (provider docker_ssh).

127.0.0.1:<local_port> on the controller carries each connection over the engine's SSH
connection (`connection`: _ssh.EngineConnection, or anything with `engine` and `transport()`) to
127.0.0.1:<remote_port> on the engine, where box ports are published. _ssh.open_local_forward and
_ssh.start_forward_daemon make them.
"""

from __future__ import annotations

import select
import socket
import threading
from typing import Any, Self

from ..core._errors import EngineUnreachable, ProviderError

try:
    import paramiko
except ImportError:  # pragma: no cover - _ssh reports the missing package before a forward is made
    paramiko = None


class LocalForward:
    """127.0.0.1:<local_port> on the controller → 127.0.0.1:<remote_port> on the engine."""

    def __init__(self, connection: Any, remote_port: int, local_port: int = 0, channel_timeout: float = 10.0):
        self.connection = connection
        self.remote_port = remote_port
        self.channel_timeout = channel_timeout
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind(("127.0.0.1", local_port))
        except OSError as exc:
            self._listener.close()
            raise ProviderError(
                f"cannot listen on 127.0.0.1:{local_port} for a forward to engine {connection.engine}: {exc.strerror}; "
                "pick another local port or 0 for any free one"
            ) from exc
        self._listener.listen(16)
        self.local_port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name=f"forward-{self.local_port}")
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, peer = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client, peer), daemon=True).start()

    def _serve(self, client: socket.socket, peer: tuple) -> None:
        try:
            channel = self.connection.transport().open_channel(
                "direct-tcpip", ("127.0.0.1", self.remote_port), peer, timeout=self.channel_timeout
            )
        except (paramiko.SSHException, OSError, EngineUnreachable):
            client.close()
            return
        try:
            _pump(client, channel, self._closed)
        finally:
            channel.close()
            client.close()

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass

    def wait(self, seconds: float) -> bool:
        """Wait until closed or `seconds` passed: True when closed."""
        return self._closed.wait(seconds)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pump(client: socket.socket, channel: Any, closed: threading.Event) -> None:
    while not closed.is_set():
        readable, _writable, _failed = select.select([client, channel], [], [], 1.0)
        if client in readable:
            data = client.recv(1 << 16)
            if not data:
                channel.shutdown_write()
                break
            channel.sendall(data)
        if channel in readable:
            data = channel.recv(1 << 16)
            if not data:
                break
            client.sendall(data)
    # Drain what the engine still sends after the controller side finished writing.
    while not closed.is_set():
        readable, _writable, _failed = select.select([channel], [], [], 1.0)
        if channel in readable:
            data = channel.recv(1 << 16)
            if not data:
                return
            client.sendall(data)
        elif channel.closed or channel.eof_received:
            return
