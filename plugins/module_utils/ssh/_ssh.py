# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SSH transport for remote Docker engines (provider docker_ssh).

One paramiko connection per engine per process. Every Docker API request is an SSH channel
running `docker system dial-stdio` on the engine, multiplexed on that one connection, so the
docker SDK works unchanged (exec, archives, image save/load) and no socket file exists on the
controller (no 104-byte sun_path limit to overflow).

An engine is an SSH destination: an ~/.ssh/config alias or user@host[:port] (ssh:// accepted).
The config's HostName, Port, User, IdentityFile, IdentitiesOnly, UserKnownHostsFile,
HostKeyAlias, StrictHostKeyChecking, ProxyCommand and ProxyJump (one hop) are honoured.
AGENTBOX_SSH_CONFIG names another config file to read instead of ~/.ssh/config.

Every failure to reach an engine raises EngineUnreachable (or a subclass) with a message that
names the engine and says what to do; connecting never takes longer than CONNECT_TIMEOUT.

This file is the connection and what it offers; the dial-stdio HTTP adapter the Docker SDK rides
is _ssh_dial, a local port forward's listener and byte pump is _ssh_forward.
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import hashlib
import os
import re
import select
import shlex
import socket
import threading
from collections.abc import Iterable
from typing import Any

from ..core._errors import EngineUnreachable, ProviderError

# Re-exported: _access and tests use them by these names.
from ..core._host_files import SSH_CONFIG_ENV  # noqa: F401  # pylint: disable=unused-import
from ..core._host_files import ssh_config_file as config_path
from ._ssh_dial import HAS_DOCKER_SDK, dial_stdio_adapter
from ._ssh_forward import LocalForward

try:
    import paramiko

    HAS_PARAMIKO = True
    PARAMIKO_IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # pragma: no cover - reported when a remote engine is used
    HAS_PARAMIKO = False
    PARAMIKO_IMPORT_ERROR = exc

CONNECT_TIMEOUT = 10.0
KEEPALIVE_SECONDS = 30
DEFAULT_KEY_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")


class HostKeyUnknown(EngineUnreachable):
    """The engine's host key is in no known_hosts file."""


class HostKeyMismatch(EngineUnreachable):
    """The engine's host key differs from the one recorded in known_hosts."""


class AuthenticationRefused(EngineUnreachable):
    """The engine refused every key offered."""


class DockerMissing(EngineUnreachable):
    """SSH works but the engine has no usable Docker (no CLI, daemon down, no permission)."""


# --------------------------------------------------------------------------------------------
# Destinations


@dataclasses.dataclass(frozen=True)
class Destination:
    """Where and how to connect, after ~/.ssh/config has been applied."""

    engine: str  # what the user wrote
    host: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    known_hosts_files: tuple[str, ...]
    host_key_alias: str | None
    strict: bool
    proxy_command: str | None
    proxy_jump: str | None

    @property
    def known_hosts_name(self) -> str:
        """The name the host key is recorded under, as OpenSSH writes it."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


_DESTINATION = re.compile(
    r"^(?:ssh://)?(?:(?P<user>[^@/\s]+)@)?(?P<host>\[[^\]]+\]|[^:@/\s\[\]]+)(?::(?P<port>\d+))?/?$"
)


def split_destination(engine: str) -> tuple[str | None, str, int | None]:
    """(user, host, port) of `user@host[:port]`, `ssh://user@host:port`, `[v6]:port` or an alias."""
    match = _DESTINATION.match(engine.strip()) if isinstance(engine, str) else None
    if not match:
        raise ProviderError(
            f"engine {engine!r} is not an SSH destination: use an ~/.ssh/config alias or user@host[:port], "
            "for example root@192.0.2.10:22"
        )
    port = match.group("port")
    if port is not None and not 0 < int(port) < 65536:
        raise ProviderError(f"engine {engine!r}: port {port} is out of range 1-65535")
    return match.group("user"), match.group("host").strip("[]"), int(port) if port else None


def _load_config(path: str) -> Any:
    if not os.path.exists(path):
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(path)
    except Exception as exc:  # paramiko raises several types for bad configs
        raise ProviderError(f"cannot read the SSH config {path}: {exc}") from exc


def resolve_destination(
    engine: str,
    *,
    private_key_file: str | None = None,
    strict_host_key_checking: bool = True,
    config_file: str | None = None,
    known_hosts_file: str | None = None,
) -> Destination:
    """Apply the SSH config to an engine destination; explicit values win over the config."""
    if not HAS_PARAMIKO:
        raise ProviderError(f"the Python 'paramiko' package is required on the controller: {PARAMIKO_IMPORT_ERROR}")
    user, host, port = split_destination(engine)
    config = _load_config(config_path(config_file))
    entry = config.lookup(host)
    hostname = entry.get("hostname", host)
    identity_files = [os.path.expanduser(path) for path in entry.get("identityfile", [])]
    if private_key_file:
        identity_files.insert(0, os.path.expanduser(private_key_file))
    known_hosts = []
    if known_hosts_file:
        known_hosts.append(known_hosts_file)
    else:
        known_hosts.extend(entry.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2").split())
    known_hosts.extend(entry.get("globalknownhostsfile", "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2").split())
    config_strict = entry.get("stricthostkeychecking", "yes").lower() not in ("no", "off")
    proxy_jump = entry.get("proxyjump")
    return Destination(
        engine=engine,
        host=hostname,
        port=int(port or entry.get("port", 22)),
        user=user or entry.get("user") or _local_user(),
        identity_files=tuple(dict.fromkeys(identity_files)),
        identities_only=entry.get("identitiesonly", "no").lower() == "yes",
        known_hosts_files=tuple(os.path.expanduser(path) for path in known_hosts if path.lower() != "none"),
        host_key_alias=entry.get("hostkeyalias"),
        strict=bool(strict_host_key_checking) and config_strict,
        proxy_command=entry.get("proxycommand") if entry.get("proxycommand", "none").lower() != "none" else None,
        proxy_jump=proxy_jump if proxy_jump and proxy_jump.lower() != "none" else None,
    )


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def fingerprint(key: Any) -> str:
    """OpenSSH's SHA256 fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# --------------------------------------------------------------------------------------------
# The connection


class EngineConnection:
    """One authenticated SSH connection to one engine, re-made when it drops or after a fork."""

    def __init__(self, destination: Destination, connect_timeout: float = CONNECT_TIMEOUT):
        self.destination = destination
        self.connect_timeout = connect_timeout
        self._lock = threading.RLock()
        self._transport: Any = None
        self._pid = 0
        self._docker_path: str | None = None
        self._answering: set[str | None] = set()  # the daemons (None: the default one) seen answering
        self._jump: EngineConnection | None = None

    @property
    def engine(self) -> str:
        return self.destination.engine

    # -- connecting ---------------------------------------------------------------------------
    def transport(self) -> Any:
        with self._lock:
            if self._transport is not None and self._pid == os.getpid() and self._transport.is_active():
                return self._transport
            if self._transport is not None and self._pid != os.getpid():
                # A forked child must not touch the parent's session (its reader thread is not here).
                _ORPHANED.append(self._transport)
            elif self._transport is not None:
                self._transport.close()
            self._transport = None
            self._transport = self._connect()
            self._pid = os.getpid()
            return self._transport

    def _open_socket(self) -> Any:
        dest = self.destination
        if dest.proxy_jump:
            jump_engine = dest.proxy_jump.split(",")[0]
            jump = connection_for(jump_engine, strict_host_key_checking=dest.strict)
            self._jump = jump
            try:
                return jump.transport().open_channel(
                    "direct-tcpip", (dest.host, dest.port), ("127.0.0.1", 0), timeout=self.connect_timeout
                )
            except (paramiko.SSHException, OSError) as exc:
                raise EngineUnreachable(
                    f"engine {dest.engine}: the jump host {jump_engine} cannot reach {dest.host}:{dest.port} ({exc})"
                ) from exc
        if dest.proxy_command:
            command = dest.proxy_command.replace("%h", dest.host).replace("%p", str(dest.port))
            command = command.replace("%r", dest.user).replace("%%", "%")
            return paramiko.ProxyCommand(command)
        try:
            return socket.create_connection((dest.host, dest.port), timeout=self.connect_timeout)
        except socket.gaierror as exc:
            raise EngineUnreachable(
                f"engine {dest.engine}: the host name {dest.host!r} does not resolve ({exc.strerror}); "
                "check the destination or the HostName in your SSH config"
            ) from exc
        except TimeoutError as exc:
            raise EngineUnreachable(
                f"engine {dest.engine} ({dest.host}:{dest.port}) did not answer within {self.connect_timeout:g} s: "
                "is the machine up and reachable from here?"
            ) from exc
        except ConnectionRefusedError as exc:
            raise EngineUnreachable(
                f"engine {dest.engine} ({dest.host}:{dest.port}) refused the connection: the machine is down or "
                "its SSH server is not running on that port"
            ) from exc
        except OSError as exc:
            raise EngineUnreachable(
                f"engine {dest.engine} ({dest.host}:{dest.port}) cannot be reached: {exc.strerror or exc}"
            ) from exc

    def _connect(self) -> Any:
        dest = self.destination
        sock = self._open_socket()
        transport = paramiko.Transport(sock)
        transport.banner_timeout = self.connect_timeout
        transport.handshake_timeout = self.connect_timeout
        transport.auth_timeout = self.connect_timeout
        known = self._known_keys()
        if known:
            # Ask for a key type we have on record, as OpenSSH does, so a server with several
            # host keys is checked against the one we know.
            options = transport.get_security_options()
            preferred = [t for t in options.key_types if t in known]
            options.key_types = tuple(preferred + [t for t in options.key_types if t not in known])
        try:
            transport.start_client(timeout=self.connect_timeout)
            if not transport.is_active() or transport.host_key is None:
                raise paramiko.SSHException("no key exchange within the timeout")
        except (paramiko.SSHException, EOFError, OSError) as exc:
            transport.close()
            raise EngineUnreachable(
                f"engine {dest.engine} ({dest.host}:{dest.port}) accepted the TCP connection but no SSH session "
                f"started within {self.connect_timeout:g} s ({exc or type(exc).__name__}): is an SSH server "
                "listening on that port?"
            ) from exc
        try:
            self._check_host_key(transport, known)
            self._authenticate(transport)
        except BaseException:
            transport.close()
            raise
        transport.set_keepalive(KEEPALIVE_SECONDS)
        return transport

    def _known_keys(self) -> dict[str, Any]:
        keys = paramiko.HostKeys()
        for path in self.destination.known_hosts_files:
            if os.path.exists(path):
                try:
                    keys.load(path)
                except (OSError, paramiko.SSHException, ValueError):
                    continue  # an unreadable or odd line must not hide the other files
        return dict(keys.lookup(self.destination.known_hosts_name) or {})

    def _check_host_key(self, transport: Any, known: dict[str, Any]) -> None:
        dest = self.destination
        server_key = transport.get_remote_server_key()
        if not dest.strict:
            return
        files = ", ".join(dest.known_hosts_files[:1]) or "~/.ssh/known_hosts"
        recorded = known.get(server_key.get_name())
        if recorded is None:
            scan_port = f"-p {dest.port} " if dest.port != 22 else ""
            raise HostKeyUnknown(
                f"engine {dest.engine}: the host key of {dest.known_hosts_name} ({server_key.get_name()} "
                f"{fingerprint(server_key)}) is not in {files}. Check that fingerprint on the engine "
                f"(ssh-keygen -lf /etc/ssh/ssh_host_{_key_file_stem(server_key)}_key.pub), then record it: "
                f"ssh-keyscan {scan_port}{dest.host} >> {files} (or connect once with ssh). To skip the check for a "
                "trusted engine, set ssh_strict_host_key_checking: false"
            )
        if recorded.asbytes() != server_key.asbytes():
            raise HostKeyMismatch(
                f"engine {dest.engine}: the host key of {dest.known_hosts_name} CHANGED: it is now "
                f"{fingerprint(server_key)}, {files} records {fingerprint(recorded)}. Someone may be intercepting "
                f"the connection, or the machine was reinstalled. If you know it was reinstalled, remove the old "
                f"key (ssh-keygen -R '{dest.known_hosts_name}') and record the new one."
            )

    def _candidate_keys(self) -> list[tuple[str, Any]]:
        """(description, key) pairs in the order OpenSSH would offer them."""
        dest = self.destination
        candidates: list[tuple[str, Any]] = []
        problems: list[str] = []
        paths = list(dest.identity_files)
        if not dest.identities_only or not paths:
            paths += [os.path.expanduser(f"~/.ssh/{name}") for name in DEFAULT_KEY_NAMES]
        for path in dict.fromkeys(paths):
            if not os.path.exists(path):
                if path in dest.identity_files:
                    problems.append(f"{path} does not exist")
                continue
            try:
                candidates.append((path, paramiko.PKey.from_path(path)))
            except paramiko.PasswordRequiredException:
                problems.append(f"{path} is protected by a passphrase (load it into ssh-agent)")
            except (paramiko.SSHException, OSError, ValueError) as exc:
                problems.append(f"{path} is not a usable private key ({exc})")
        if not dest.identities_only or not dest.identity_files:
            try:
                for agent_key in paramiko.Agent().get_keys():
                    candidates.append((f"ssh-agent key {fingerprint(agent_key)}", agent_key))
            except paramiko.SSHException:
                pass
        self._key_problems = problems
        return candidates

    def _authenticate(self, transport: Any) -> None:
        dest = self.destination
        tried: list[str] = []
        for description, key in self._candidate_keys():
            try:
                transport.auth_publickey(dest.user, key)
            except paramiko.AuthenticationException:
                tried.append(description)
                continue
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise EngineUnreachable(f"engine {dest.engine}: the SSH session broke during login ({exc})") from exc
            if transport.is_authenticated():
                return
        notes = "; ".join(self._key_problems)
        offered = ", ".join(tried) if tried else "no key at all"
        raise AuthenticationRefused(
            f"engine {dest.engine} refused the login of {dest.user!r} with {offered}"
            + (f" ({notes})" if notes else "")
            + f". Add your public key to ~{dest.user}/.ssh/authorized_keys on the engine, or point "
            "ssh_private_key_file (or IdentityFile in your SSH config) at a key it accepts."
        )

    # -- running commands on the engine ------------------------------------------------------
    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = 60.0
    ) -> tuple[int, bytes, bytes]:
        """Run a shell command on the engine (not in a box) and wait: (exit code, stdout, stderr)."""
        channel = self.transport().open_session(timeout=self.connect_timeout)
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = _collect(channel)
            return channel.recv_exit_status(), out, err
        except TimeoutError as exc:
            raise ProviderError(
                f"engine {self.engine}: {command.split()[0]} did not finish within {timeout} s"
            ) from exc
        finally:
            channel.close()

    def docker_path(self, host: str | None = None) -> str:
        """The engine's docker CLI, checked once per daemon: present, the daemon at `host` (a socket
        on the engine, e.g. its box engine's; None: the CLI's default daemon) up, usable by this user."""
        with self._lock:
            if self._docker_path and host in self._answering:
                return self._docker_path
            dest = self.destination
            path = self._docker_path or self._find_docker()
            host_option = f" -H {shlex.quote(host)}" if host else ""
            rc, out, err = self.run(
                f"{shlex.quote(path)}{host_option} version --format '{{{{.Server.APIVersion}}}}'", timeout=30
            )
            text = (err or out).decode("utf-8", "replace").strip()
            if rc != 0 or not out.strip():
                where = f"the Docker daemon at {host}" if host else "the Docker daemon"
                if "permission denied" in text.lower():
                    raise DockerMissing(
                        f"engine {dest.engine}: {dest.user!r} may not use {where} there ({text[-300:]}). "
                        f"Add the user to the 'docker' group on the engine (usermod -aG docker {dest.user}) or connect "
                        "as a user that may."
                    )
                raise DockerMissing(
                    f"engine {dest.engine}: the docker CLI is at {path} but {where} does not answer "
                    f"({text[-300:] or 'no output'}). Start it on the engine (systemctl start docker) and try again."
                )
            self._docker_path = path
            self._answering.add(host)
            return path

    def _find_docker(self) -> str:
        dest = self.destination
        rc, out, _err = self.run("command -v docker", timeout=self.connect_timeout)
        if rc == 0 and out.strip().startswith(b"/"):
            return out.decode().strip().splitlines()[-1]
        # Docker Desktop and OrbStack put docker on the PATH of login shells only.
        rc, out, _err = self.run("exec \"${SHELL:-/bin/sh}\" -lc 'command -v docker'", timeout=self.connect_timeout)
        lines = [line for line in out.decode("utf-8", "replace").splitlines() if line.startswith("/")]
        if rc == 0 and lines:
            return lines[-1].strip()
        raise DockerMissing(
            f"engine {dest.engine}: SSH works but there is no 'docker' command for {dest.user!r} on "
            f"{dest.host}. Install Docker Engine there (Debian/Ubuntu: apt-get install docker.io) or use "
            "another engine."
        )

    def docker_command(self, host: str | None = None) -> str:
        """`docker [-H host]` for a shell command on the engine, the daemon at `host` checked to answer."""
        path = shlex.quote(self.docker_path(host))
        return f"{path} -H {shlex.quote(host)}" if host else path

    def answers(self, host: str | None) -> bool:
        """Whether a Docker daemon answers this user at `host` on the engine (its box engine's socket;
        None: the default daemon)."""
        try:
            self.docker_path(host)
        except DockerMissing:
            return False
        return True

    def open_exec_channel(self, command: str) -> Any:
        channel = self.transport().open_session(timeout=self.connect_timeout)
        channel.exec_command(command)
        return channel

    def close(self) -> None:
        with self._lock:
            if self._transport is not None and self._pid == os.getpid():
                self._transport.close()
            self._transport = None
            self._docker_path = None
            self._answering.clear()


def _key_file_stem(key: Any) -> str:
    name = key.get_name()
    if "ed25519" in name:
        return "ed25519"
    if "ecdsa" in name:
        return "ecdsa"
    return "rsa"


_CONNECTIONS: dict[tuple, EngineConnection] = {}
_CONNECTIONS_LOCK = threading.Lock()
# Transports inherited over a fork: kept referenced so garbage collection never closes the
# socket the parent still uses.
_ORPHANED: list[Any] = []


def connection_for(
    engine: str,
    *,
    strict_host_key_checking: bool = True,
    private_key_file: str | None = None,
    config_file: str | None = None,
    known_hosts_file: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> EngineConnection:
    """The process's connection to `engine` with these options (made and checked on first use)."""
    destination = resolve_destination(
        engine,
        private_key_file=private_key_file,
        strict_host_key_checking=strict_host_key_checking,
        config_file=config_file,
        known_hosts_file=known_hosts_file,
    )
    key = (destination, connect_timeout)
    with _CONNECTIONS_LOCK:
        connection = _CONNECTIONS.get(key)
        if connection is None:
            connection = EngineConnection(destination, connect_timeout)
            _CONNECTIONS[key] = connection
    connection.transport()
    return connection


def close_all() -> None:
    with _CONNECTIONS_LOCK:
        connections = list(_CONNECTIONS.values())
        _CONNECTIONS.clear()
    for connection in connections:
        connection.close()


atexit.register(close_all)


# --------------------------------------------------------------------------------------------
# The docker SDK over the connection (the channel adapter is _ssh_dial)


def docker_client_over_ssh(
    engine: str,
    *,
    docker_host: str | None = None,
    timeout: float = 120,
    strict_host_key_checking: bool = True,
    private_key_file: str | None = None,
    config_file: str | None = None,
    known_hosts_file: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> Any:
    """A docker.DockerClient for the engine at an SSH destination, over this process's connection.

    Cheap to call again: the SSH connection and the engine check are made once per process.
    docker_host: the daemon's socket on the engine (its box engine's), None for the CLI's default.
    """
    if not HAS_DOCKER_SDK:
        raise ProviderError("the Python 'docker' and 'paramiko' packages are required on the controller for docker_ssh")
    import docker

    connection = connection_for(
        engine,
        strict_host_key_checking=strict_host_key_checking,
        private_key_file=private_key_file,
        config_file=config_file,
        known_hosts_file=known_hosts_file,
        connect_timeout=connect_timeout,
    )
    connection.docker_path(docker_host)
    # The SDK picks its transport from base_url; build it on a unix URL (no connection is made)
    # and mount the SSH adapter over it.
    client = docker.DockerClient(base_url="unix:///var/run/agentbox-unused.sock", version="1.41", timeout=timeout)
    api = client.api
    adapter = dial_stdio_adapter(connection, timeout, docker_host)
    api.mount("http+docker://ssh", adapter)
    api._custom_adapter = adapter
    api.base_url = "http+docker://ssh"
    try:
        server = api.version(api_version=False)
    except Exception as exc:  # any failure here means the engine cannot serve the API
        raise DockerMissing(f"engine {engine}: the Docker API does not answer over SSH ({exc})") from exc
    server_api = str(server.get("ApiVersion", "1.41"))
    api._version = min(server_api, docker.constants.DEFAULT_DOCKER_API_VERSION, key=_version_tuple)
    return client


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


# --------------------------------------------------------------------------------------------
# Local port forwards (the forward itself is _ssh_forward)


def open_local_forward(
    engine: str,
    remote_port: int,
    local_port: int = 0,
    **ssh_options: Any,
) -> LocalForward:
    """Listen on the controller's 127.0.0.1:local_port (0 = any free) and carry each connection
    over the engine's SSH connection to 127.0.0.1:remote_port on the engine (where box ports are
    published). The forward lives until close() or the end of the process."""
    connection = connection_for(engine, **ssh_options)
    return LocalForward(connection, int(remote_port), int(local_port), channel_timeout=CONNECT_TIMEOUT)


def start_forward_daemon(
    engine: str,
    remote_port: int,
    local_port: int = 0,
    **ssh_options: Any,
) -> tuple[int, int]:
    """A local forward that outlives the calling process (a module run): (pid, local port).

    A detached child (double fork, new session) makes its own SSH connection, listens on the
    controller's 127.0.0.1:local_port and forwards to the engine's 127.0.0.1:remote_port until
    it is killed (`kill <pid>`) or the engine goes away. Errors before it listens are raised here.
    """
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        code = 0
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            try:
                # EngineConnection sees the new pid and connects afresh, leaving the parent's alone.
                forward = open_local_forward(engine, remote_port, local_port, **ssh_options)
            except Exception as exc:  # noqa: BLE001 - reported to the caller through the pipe
                os.write(write_end, f"error {exc}".encode()[:4000])
                os._exit(1)
            os.write(write_end, f"ok {os.getpid()} {forward.local_port}".encode())
            os.close(write_end)
            while forward.connection.transport().is_active():
                forward.wait(5)
        except Exception:  # noqa: BLE001 - a daemon has nobody to tell; it just ends
            code = 1
        os._exit(code)
    os.close(write_end)
    os.waitpid(first, 0)
    answer = b""
    while chunk := os.read(read_end, 4096):
        answer += chunk
    os.close(read_end)
    text = answer.decode("utf-8", "replace")
    if not text.startswith("ok "):
        raise EngineUnreachable(text.removeprefix("error ") or f"the forward to engine {engine} did not start")
    _label, pid, port = text.split()
    return int(pid), int(port)


def stream_to_command(
    connection: EngineConnection, command: str, chunks: Iterable[bytes], timeout: float = 3600
) -> bytes:
    """Feed chunks to a command's stdin on the engine; its output, or ProviderError on failure."""
    channel = connection.open_exec_channel(command)
    try:
        channel.settimeout(timeout)
        for chunk in chunks:
            channel.sendall(chunk)
        channel.shutdown_write()
        out, err = _collect(channel)
        rc = channel.recv_exit_status()
    finally:
        channel.close()
    if rc != 0:
        raise ProviderError(
            f"engine {connection.engine}: {command.split()[0]} exited {rc}: "
            f"{bytes(err or out).decode('utf-8', 'replace').strip()[-1000:]}"
        )
    return bytes(out)


def _collect(channel: Any) -> tuple[bytes, bytes]:
    """Read a command's stdout and stderr until it exited and closed both."""
    out, err = bytearray(), bytearray()
    while True:
        progressed = False
        if channel.recv_ready():
            out += channel.recv(1 << 16)
            progressed = True
        if channel.recv_stderr_ready():
            err += channel.recv_stderr(1 << 16)
            progressed = True
        if progressed:
            continue
        finished = channel.exit_status_ready() and (channel.eof_received or channel.closed)
        if finished and not channel.recv_ready() and not channel.recv_stderr_ready():
            return bytes(out), bytes(err)
        select.select([channel], [], [], 0.2)
