"""The emulator's SSH gateway: `ssh -p PORT <token>@127.0.0.1`, as Daytona's (apps/ssh-gateway, v0.190).

Daytona's gateway accepts the SSH access token as the user name with no other authentication ("none"),
validates it against the API, refuses a sandbox that is not `started`, and hands the session to the
sandbox's daemon, whose SSH server runs commands as the daemon's user (the image's USER: root for the
box image). This one does the same on 127.0.0.1 with paramiko: it validates the token against the
emulator's own records and runs each `exec` request in the sandbox's container as that user through
`docker exec -i`, streaming stdin, stdout, stderr and the exit status. Interactive shells and ptys are
refused (the provider's alias runs one command, the box's own `sshd -i`, and the real SSH session
happens inside that).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

import paramiko

if TYPE_CHECKING:
    from .core import Emulator

LOG = logging.getLogger("daytona_emulator.ssh")


class _Server(paramiko.ServerInterface):
    """One client connection: the token is the user name; only `exec` sessions."""

    def __init__(self, gateway: SshGateway) -> None:
        self.gateway = gateway
        self.sandbox_id: str | None = None

    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_auth_none(self, username: str) -> int:
        sandbox_id = self.gateway.validate(username)
        if sandbox_id is None:
            return paramiko.AUTH_FAILED
        self.sandbox_id = sandbox_id
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        if self.sandbox_id is None:
            return False
        threading.Thread(
            target=self.gateway.run, args=(channel, self.sandbox_id, command.decode("utf-8", "replace")),
            name="daytona-ssh-exec", daemon=True,
        ).start()
        return True


class SshGateway:
    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.host_key = paramiko.ECDSAKey.generate()
        self.sock = socket.create_server((emulator.config.host, 0))
        self.port: int = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._docker = shutil.which("docker") or "docker"

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="daytona-ssh-gateway", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="daytona-ssh-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        channels: list[paramiko.Channel] = []  # held: paramiko closes a channel nobody references
        try:
            transport.start_server(server=_Server(self))
            while transport.is_active() and not self._stop.is_set():
                channel = transport.accept(timeout=1)  # served by its exec request
                if channel is not None:
                    channels.append(channel)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            LOG.info("ssh gateway connection ended: %s", exc)
        finally:
            transport.close()

    def validate(self, token: str) -> str | None:
        """The sandbox a valid token opens, when that sandbox is started (as the real gateway checks)."""
        emu = self.emulator
        with emu.lock:
            entry = emu.ssh_tokens.get(token)
            if entry is None or entry[1] <= time.time():
                return None
            sandbox = emu.sandboxes.get(entry[0])
            if sandbox is None or sandbox.state != "started" or not sandbox.container_id:
                return None
            return sandbox.id

    def run(self, channel: paramiko.Channel, sandbox_id: str, command: str) -> None:
        """`docker exec -i` the command in the sandbox as the daemon's user, wired to the channel."""
        try:
            self._run(channel, sandbox_id, command)
        except Exception:  # a broken session must not take the gateway down
            LOG.exception("ssh gateway exec failed")
            channel.close()

    def _run(self, channel: paramiko.Channel, sandbox_id: str, command: str) -> None:
        with self.emulator.lock:
            sandbox = self.emulator.sandboxes.get(sandbox_id)
            container = sandbox.container_id if sandbox else None
            user = (sandbox.process_user if sandbox else "") or "root"
        if container is None:
            channel.send_exit_status(255)
            channel.close()
            return
        argv = [self._docker, "exec", "-i", "-u", user, container, "sh", "-c", command]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        pumps = [
            threading.Thread(target=_copy_out, args=(proc.stdout, channel.sendall), daemon=True),
            threading.Thread(target=_copy_out, args=(proc.stderr, channel.sendall_stderr), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        threading.Thread(target=_copy_in, args=(channel, proc), daemon=True).start()
        code = proc.wait()
        for pump in pumps:
            pump.join()
        try:
            channel.send_exit_status(code)
            channel.shutdown_write()
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass


def _copy_out(stream: Any, send: Any) -> None:
    try:
        while True:
            data = os.read(stream.fileno(), 65536)
            if not data:
                return
            send(data)
    except (OSError, EOFError, paramiko.SSHException):
        return
    finally:
        stream.close()


def _copy_in(channel: paramiko.Channel, proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    try:
        while True:
            data = channel.recv(65536)
            if not data:
                break
            proc.stdin.write(data)
            proc.stdin.flush()
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
