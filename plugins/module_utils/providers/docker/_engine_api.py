# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Docker Engine API calls that every Ansible task makes, over the standard library only.

Ansible forks a worker per task and the inventory plugin runs in the controller before any
fork: importing the docker SDK there (requests, urllib3, its transports) costs 40-200 ms of CPU
per process, more than the calls themselves. The connection plugin and the inventory need five
calls: list, inspect, exec, copy in and copy out; this client makes them with http.client on
the engine's socket. A box's create and removal (volumes, container create and start, removal by
id), its state changes (start, stop, pause, unpause) and a checkpoint's image calls (commit, list,
tag, load, remove; export streamed into import) go the same way: importing the SDK cost a create or
a switch more than its engine calls.

Handles DOCKER_HOST unix:// (the default /var/run/docker.sock) and plain tcp://. TLS settings
and ssh:// leave the engine to the SDK (`local_engine` returns None), which _engine_sdk puts behind
the same method names, answers and errors; docs/architecture.md ("The Docker client") says where
else the SDK stays, and why.

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

from ...core._errors import ExecTimedOut
from ...core._provider import CappedOutput

CHUNK = 1 << 16
DEFAULT_SOCKET = "/var/run/docker.sock"


class EngineAPIError(Exception):
    """The engine answered with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class EngineUnanswered(Exception):
    """The engine's socket could not be reached (not started, wrong DOCKER_HOST, no permission)."""


def local_engine(timeout: float, environ: dict[str, str] | None = None) -> EngineAPI | None:
    """A client for the engine DOCKER_HOST names, or None when only the SDK can reach it."""
    env = os.environ if environ is None else environ
    if env.get("DOCKER_TLS_VERIFY") or env.get("DOCKER_CERT_PATH"):
        return None
    host = env.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    if host.startswith("unix://"):
        path = host.removeprefix("unix://") or DEFAULT_SOCKET

        def open_unix(connect_timeout: float | None) -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(connect_timeout)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                raise
            return sock

        return EngineAPI(open_unix, host, timeout)
    if host.startswith("tcp://"):
        parsed = urllib.parse.urlsplit(host)
        address = (parsed.hostname or "127.0.0.1", parsed.port or 2375)

        def open_tcp(connect_timeout: float | None) -> socket.socket:
            return socket.create_connection(address, timeout=connect_timeout)

        return EngineAPI(open_tcp, host, timeout)
    return None


class _Connection(http.client.HTTPConnection):
    """An HTTP/1.1 connection over whatever socket the opener makes."""

    def __init__(self, opener: Callable[[float | None], socket.socket], timeout: float | None):
        super().__init__("docker", timeout=timeout)
        self._opener = opener

    def connect(self) -> None:
        self.sock = self._opener(self.timeout)


class EngineAPI:
    """Unversioned Engine API paths: the engine answers in its own current version, so no
    /version round trip is needed before the first call."""

    def __init__(self, opener: Callable[[float | None], socket.socket], where: str, timeout: float):
        self._opener = opener
        self.where = where
        self._timeout = timeout
        # One kept-alive connection for the small JSON calls, per process (never across a fork).
        self._shared: _Connection | None = None
        self._shared_pid = 0
        self._lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------------
    def _open(self, timeout: float | None) -> socket.socket:
        try:
            return self._opener(timeout)
        except OSError as exc:
            raise EngineUnanswered(str(exc.strerror or exc)) from exc

    def _json_call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One small request on the kept-alive connection; a connection the engine closed in
        between is reopened once (safe: every call made here is a read or creates an unused exec)."""
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        with self._lock:
            for attempt in range(2):
                reused = self._shared is not None and self._shared_pid == os.getpid()
                if not reused:
                    self._shared = _Connection(self._open, self._timeout)
                    self._shared_pid = os.getpid()
                conn = self._shared
                try:
                    conn.request(method, path, body=payload, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                except EngineUnanswered:
                    self._shared = None
                    raise
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                    conn.close()
                    self._shared = None
                    if reused and attempt == 0:
                        continue
                    raise EngineUnanswered(f"the engine closed the connection ({exc})") from exc
                except (http.client.HTTPException, OSError) as exc:
                    conn.close()
                    self._shared = None
                    raise EngineUnanswered(str(exc) or type(exc).__name__) from exc
                return response.status, _decode(data)
        raise AssertionError("unreachable")  # pragma: no cover

    def _checked(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        status, data = self._json_call(method, path, body)
        if status not in ok:
            raise EngineAPIError(status, _message(data, status))
        return data

    def _write(
        self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 204), wait: float = 0
    ) -> Any:
        """A call that changes the engine, on a connection of its own: never re-sent, since a
        connection that broke after the engine acted would make a second container or volume.
        `wait`: seconds the engine may take beyond the usual timeout (a stop's grace period)."""
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn = _Connection(self._open, self._timeout + wait)
        try:
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = _decode(response.read())
        except EngineUnanswered:
            raise
        except (http.client.HTTPException, OSError) as exc:
            raise EngineUnanswered(str(exc) or type(exc).__name__) from exc
        finally:
            conn.close()
        if response.status not in ok:
            raise EngineAPIError(response.status, _message(data, response.status))
        return data

    def _found(self, path: str) -> dict[str, Any] | None:
        """GET `path`'s JSON, or None where the engine has no such object (404)."""
        status, data = self._json_call("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise EngineAPIError(status, _message(data, status))
        return data

    # -- containers -----------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """The engine's /info (its data root names a user-namespace remap)."""
        return dict(self._checked("GET", "/info") or {})

    def containers(self, label_filters: list[str]) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": label_filters})})
        return self._checked("GET", f"/containers/json?{query}") or []

    def inspect_container(self, container: str) -> dict[str, Any] | None:
        return self._found(f"/containers/{_quote(container)}/json")

    def inspect_image(self, image: str) -> dict[str, Any] | None:
        return self._found(f"/images/{_quote(image)}/json")

    def create_container(self, config: dict[str, Any], name: str) -> str:
        """POST /containers/create with a full config (see _box_container); the new container's id."""
        query = urllib.parse.urlencode({"name": name})
        return str(self._write("POST", f"/containers/create?{query}", config, ok=(201,))["Id"])

    def start_container(self, container: str) -> None:
        self._write("POST", f"/containers/{_quote(container)}/start", ok=(204, 304))

    def pause_container(self, container: str) -> None:
        self._write("POST", f"/containers/{_quote(container)}/pause", ok=(204,))

    def unpause_container(self, container: str) -> None:
        self._write("POST", f"/containers/{_quote(container)}/unpause", ok=(204,))

    def stop_container(self, container: str, timeout: int = 10) -> None:
        """Stop it, killing it after `timeout` seconds; the request waits that long beyond the usual."""
        self._write("POST", f"/containers/{_quote(container)}/stop?t={int(timeout)}", ok=(204, 304), wait=timeout)

    def wait_container(self, container: str) -> int:
        """Wait for the container to exit; its exit code."""
        return int(
            (self._write("POST", f"/containers/{_quote(container)}/wait", ok=(200,)) or {}).get("StatusCode", -1)
        )

    def remove_container(self, container: str, *, force: bool = True, volumes: bool = True) -> None:
        query = urllib.parse.urlencode({"force": int(force), "v": int(volumes)})
        self._write("DELETE", f"/containers/{_quote(container)}?{query}", ok=(204,))

    def rename_container(self, container: str, name: str) -> None:
        """Rename; the engine refuses (409) when `name` is taken and answers 404 when `container` is gone."""
        query = urllib.parse.urlencode({"name": name})
        self._write("POST", f"/containers/{_quote(container)}/rename?{query}", ok=(204,))

    # -- volumes --------------------------------------------------------------------------------
    def create_volume(
        self, name: str, labels: dict[str, str], driver: str | None = None, driver_opts: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """The volume's attributes (Name, Labels, Mountpoint...); an existing volume of that name
        is answered as it is, labels included, as `docker volume create` does."""
        body: dict[str, Any] = {"Name": name, "Labels": labels}
        if driver:
            body["Driver"] = driver
        if driver_opts:
            body["DriverOpts"] = driver_opts
        return self._write("POST", "/volumes/create", body, ok=(200, 201)) or {}

    def volumes(self, label_filters: list[str]) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"filters": json.dumps({"label": label_filters})})
        return (self._checked("GET", f"/volumes?{query}") or {}).get("Volumes") or []

    def inspect_volume(self, name: str) -> dict[str, Any] | None:
        return self._found(f"/volumes/{_quote(name)}")

    def remove_volume(self, name: str, *, force: bool = True) -> None:
        self._write("DELETE", f"/volumes/{_quote(name)}?force={int(force)}", ok=(204,))

    def inspect_network(self, name: str) -> dict[str, Any] | None:
        return self._found(f"/networks/{_quote(name)}")

    # -- exec -----------------------------------------------------------------------------------
    def exec(
        self,
        container: str,
        argv: list[str],
        *,
        user: str,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | IO[bytes] | None = None,
        max_output: int | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run argv in the container; (exit code, stdout, stderr). stdin is streamed while the
        output is read, so neither side can fill a pipe and stall the other. With `timeout` (seconds),
        the host stops waiting then (the stream is shut down) and raises ExecTimedOut. With `max_output`,
        stdout and stderr together are read up to that many bytes: one frame more and the stream
        is closed and OutputTooLarge raised (the container's output is the container's to forge)."""
        config: dict[str, Any] = {
            "AttachStdin": stdin is not None,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Cmd": argv,
            "User": user,
        }
        if workdir:
            config["WorkingDir"] = workdir
        if env:
            config["Env"] = [f"{key}={value}" for key, value in env.items()]
        exec_id = self._checked("POST", f"/containers/{_quote(container)}/exec", config, ok=(201,))["Id"]
        sock, reader = self._hijack(f"/exec/{exec_id}/start", {"Detach": False, "Tty": False})
        feeder = None
        if stdin is not None:
            feeder = threading.Thread(target=feed_stdin, args=(sock, stdin), daemon=True)
            feeder.start()
        output = CappedOutput(max_output)
        watchdog = _Watchdog(sock, timeout)
        try:
            while len(header := watchdog.read(reader, 8)) == 8:
                size = int.from_bytes(header[4:8], "big")
                if not output.room(size):  # the frame is not read; closing the stream ends the command's writes
                    raise output.refused(argv)
                output.add(watchdog.read(reader, size), stderr=header[0] != 1)  # 2: stderr, 3: the engine's own error
        finally:
            watchdog.cancel()
            if feeder is not None:
                feeder.join(timeout=5)
            reader.close()
            sock.close()
        if watchdog.fired:
            raise ExecTimedOut(f"{argv[0]} did not finish within {timeout:g} s: the host stopped waiting for it")
        code = exec_exit_code(lambda: self._checked("GET", f"/exec/{exec_id}/json"))
        done = output.result(code)
        return code, done.stdout, done.stderr

    def _hijack(self, path: str, body: dict[str, Any]) -> tuple[socket.socket, IO[bytes]]:
        """POST that upgrades the connection to the raw multiplexed stream (docker exec's attach)."""
        sock = self._open(self._timeout)
        payload = json.dumps(body).encode()
        request = (
            f"POST {path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
            f"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        reader = sock.makefile("rb")
        try:
            sock.sendall(request)
            status, headers = _read_head(reader)
            if status not in (101, 200):
                raise EngineAPIError(status, _message(_decode(_read_body(reader, headers)), status))
        except OSError as exc:
            reader.close()
            sock.close()
            raise EngineUnanswered(str(exc)) from exc
        except BaseException:
            reader.close()
            sock.close()
            raise
        # The command may run for as long as the task allows: no read timeout on its output.
        sock.settimeout(None)
        return sock, reader

    # -- images -------------------------------------------------------------------------------
    def images(self, filters: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
        """/images/json: one summary (Id, RepoTags, Labels, Size) per image, from one answer."""
        query = "?" + urllib.parse.urlencode({"filters": json.dumps(filters)}) if filters else ""
        return self._checked("GET", f"/images/json{query}") or []

    def commit_container(
        self, container: str, repository: str, tag: str, conf: dict[str, Any], *, pause: bool = True
    ) -> str:
        """docker commit, the container paused meanwhile; the new image's id."""
        query = urllib.parse.urlencode({"container": container, "repo": repository, "tag": tag, "pause": int(pause)})
        return str(self._write("POST", f"/commit?{query}", conf, ok=(201,))["Id"])

    def tag_image(self, image: str, repository: str, tag: str) -> None:
        query = urllib.parse.urlencode({"repo": repository, "tag": tag})
        self._write("POST", f"/images/{_quote(image)}/tag?{query}", ok=(201,))

    def remove_image(self, image: str, *, force: bool = False, noprune: bool = False) -> None:
        query = urllib.parse.urlencode({"force": int(force), "noprune": int(noprune)})
        self._write("DELETE", f"/images/{_quote(image)}?{query}", ok=(200,))

    def load_image(self, archive: bytes) -> list[Any]:
        """docker load of an image archive; the engine's messages ({"stream": "Loaded image: ..."})."""
        return _json_stream(self._upload("POST", "/images/load", [archive], "application/x-tar", "loading an image"))

    def import_image(self, chunks: Iterable[bytes], repository: str, tag: str, changes: list[str]) -> str:
        """docker import of a filesystem tar streamed from `chunks`, with Dockerfile `changes`; the
        engine's answer as text. No read timeout: the engine answers once it has stored it all."""
        query = urllib.parse.urlencode({"fromSrc": "-", "repo": repository, "tag": tag, "changes": changes}, doseq=True)
        data = self._upload(
            "POST", f"/images/create?{query}", chunks, "application/tar", "importing an image", no_timeout=True
        )
        return data.decode("utf-8", "replace")

    def export_container(self, container: str) -> Iterator[bytes]:
        """The container's whole filesystem as a tar, in chunks of 1 MiB as the engine sends them."""
        return self._download(f"/containers/{_quote(container)}/export", "exporting the box", 1 << 20)

    # -- archives -------------------------------------------------------------------------------
    def put_archive(self, container: str, path: str, tar_stream: Iterable[bytes] | IO[bytes]) -> None:
        """Stream a tar into the container at path (chunked upload, never held whole in memory)."""
        query = urllib.parse.urlencode({"path": path})
        body = _chunks(tar_stream) if hasattr(tar_stream, "read") else iter(tar_stream)  # type: ignore[arg-type]
        self._upload("PUT", f"/containers/{_quote(container)}/archive?{query}", body, "application/x-tar", "copying in")

    def get_archive(self, container: str, path: str) -> Iterator[bytes]:
        """The tar of path in the container, as chunks; the request is made before returning so a
        missing path or container fails here, not halfway through the caller's loop."""
        query = urllib.parse.urlencode({"path": path})
        return self._download(f"/containers/{_quote(container)}/archive?{query}", "copying out", CHUNK)

    def _upload(
        self, method: str, path: str, body: Iterable[bytes], content_type: str, what: str, *, no_timeout: bool = False
    ) -> bytes:
        """A request whose body is sent in chunks as `body` yields them; the answer's body (which
        must be 200). `no_timeout`: wait for the answer however long the engine takes."""
        conn = _Connection(self._open, None if no_timeout else self._timeout)
        try:
            conn.request(method, path, body=iter(body), headers={"Content-Type": content_type})
            response = conn.getresponse()
            data = response.read()
        except (http.client.HTTPException, OSError) as exc:
            raise EngineUnanswered(f"{what} failed ({exc})") from exc
        finally:
            conn.close()
        if response.status != 200:
            raise EngineAPIError(response.status, _message(_decode(data), response.status))
        return data

    def _download(self, path: str, what: str, chunk_size: int) -> Iterator[bytes]:
        """GET path's body as chunks; the error answer raised before returning."""
        conn = _Connection(self._open, self._timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
        except (http.client.HTTPException, OSError) as exc:
            conn.close()
            raise EngineUnanswered(f"{what} failed ({exc})") from exc
        if response.status != 200:
            data = response.read()
            conn.close()
            raise EngineAPIError(response.status, _message(_decode(data), response.status))

        def chunks() -> Iterator[bytes]:
            try:
                while chunk := response.read(chunk_size):
                    yield chunk
            finally:
                conn.close()

        return chunks()


# -- helpers ------------------------------------------------------------------------------------
def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _decode(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def _json_stream(data: bytes) -> list[Any]:
    """The JSON values of a streamed answer (one object after another, newlines or not)."""
    decoder = json.JSONDecoder()
    text = data.decode("utf-8", "replace")
    values: list[Any] = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return values
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            return [*values, text[position:]]  # not JSON: the rest as text
        values.append(value)


def _message(data: Any, status: int) -> str:
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    if isinstance(data, str) and data.strip():
        return data.strip()
    return f"the engine answered HTTP {status}"


def _read_head(reader: IO[bytes]) -> tuple[int, dict[str, str]]:
    status_line = reader.readline(65537).decode("latin-1")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise EngineAPIError(0, f"the engine sent a malformed answer: {status_line.strip()!r}")
    headers: dict[str, str] = {}
    while (line := reader.readline(65537)) not in (b"\r\n", b"\n", b""):
        key, _sep, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(parts[1]), headers


def _read_body(reader: IO[bytes], headers: dict[str, str]) -> bytes:
    """An error answer's body (Content-Length or chunked), at most 64 KiB of it."""
    if headers.get("content-length", "").isdigit():
        return reader.read(min(int(headers["content-length"]), CHUNK))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        size = int(reader.readline(1024).split(b";")[0].strip() or b"0", 16)
        return reader.read(min(size, CHUNK))
    return b""


def _chunks(source: IO[bytes]) -> Iterator[bytes]:
    while chunk := source.read(CHUNK):
        yield chunk


# Seconds to wait before each new try of a pause runc could not freeze.
FREEZE_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)


def pause_patiently(
    pause: Callable[[str], None], container: str, delays: Sequence[float] = FREEZE_RETRY_DELAYS
) -> None:
    """pause(container), tried again while the engine says it could not freeze the container.
    runc gives up freezing a cgroup whose processes are mid-fork or inside the kernel (a busy
    machine) and thaws them again, so a later try is safe. Any other error is raised at once."""
    for delay in delays:
        try:
            pause(container)
            return
        except EngineAPIError as exc:
            if "freeze" not in exc.message:
                raise
        time.sleep(delay)
    pause(container)


class _Watchdog:
    """An exec's time bound: after `timeout` seconds it shuts the exec's stream down (a read then ends, short
    or with an error), and `fired` says the time, not the command, ended it. No timeout: reads as they are."""

    def __init__(self, sock: socket.socket, timeout: float | None):
        self.fired = False
        self._sock = sock
        self._timer = None if timeout is None else threading.Timer(max(0.0, timeout), self._cut)
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def _cut(self) -> None:
        self.fired = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def read(self, reader: IO[bytes], size: int) -> bytes:
        try:
            return reader.read(size)
        except (OSError, ValueError):
            if self.fired:  # the stream was shut down under the read
                return b""
            raise

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def exec_exit_code(inspect: Callable[[], dict[str, Any]], deadline_seconds: float = 10.0) -> int:
    """The exit code of a finished exec. The engine closes the output stream before it records the
    exit, so an inspect right after can still say Running with no ExitCode (seen under load): wait for
    it, briefly. -1 when the engine never records one."""
    give_up = time.monotonic() + deadline_seconds
    while True:
        info = inspect()
        code = info.get("ExitCode")
        if not info.get("Running") and code is not None:
            return int(code)
        if time.monotonic() >= give_up:
            return -1 if code is None or info.get("Running") else int(code)
        time.sleep(0.02)


def feed_stdin(sock: Any, stdin: bytes | IO[bytes]) -> None:
    """Send stdin, then close our half so the command sees end of file. Also used by the SDK's
    exec path, whose socket may be an SSH channel (no shutdown(), shutdown_write() instead)."""
    try:
        if isinstance(stdin, (bytes, bytearray)):
            sock.sendall(stdin)
        else:
            for chunk in _chunks(stdin):
                sock.sendall(chunk)
    except OSError:
        pass  # the command exited without reading everything; its exit code tells
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)
        except (OSError, AttributeError):
            if hasattr(sock, "shutdown_write"):
                sock.shutdown_write()
