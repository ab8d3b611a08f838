# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Engine API calls of a box's create, removal, state changes and checkpoint images over a Docker
SDK client, for the engines the standard-library client (_engine_api) cannot reach: TLS and ssh://
(docker_ssh).

Same method names, arguments, answers and errors as _engine_api.EngineAPI, so the provider has one
code path for every engine; the body of a container is the same JSON either way (_box_container).

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ...core._provider import BoxNotFound, CappedOutput, EngineUnreachable, ProviderError
from . import _box_engine
from ._engine_api import EngineAPIError, EngineUnanswered, exec_exit_code, feed_stdin


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """The SDK's errors as _engine_api's: an answer with a status, or no answer."""
    from docker import errors  # the client exists, so the SDK is already loaded

    try:
        yield
    except errors.APIError as exc:
        raise EngineAPIError(exc.status_code or 0, str(exc.explanation or exc)) from exc
    except errors.DockerException as exc:
        raise EngineAPIError(0, str(getattr(exc, "explanation", None) or exc)) from exc
    except OSError as exc:
        raise EngineUnanswered(str(exc)) from exc


def _unless_missing(call: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """call()'s answer, or None where the engine has no such object (404), as _engine_api answers."""
    try:
        with _errors():
            return call()
    except EngineAPIError as exc:
        if exc.status == 404:
            return None
        raise


def _typed(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A stream whose failures come as _engine_api's errors (the SDK checks the answer at the first read)."""
    with _errors():
        yield from chunks


class SDKEngine:
    """_engine_api.EngineAPI's calls, made by a docker.APIClient."""

    def __init__(self, api: Any, where: str):
        self._api = api
        self.where = where

    def create_container(self, config: dict[str, Any], name: str) -> str:
        with _errors():
            return str(self._api.create_container_from_config(config, name)["Id"])

    def start_container(self, container: str) -> None:
        with _errors():
            self._api.start(container)

    def pause_container(self, container: str) -> None:
        with _errors():
            self._api.pause(container)

    def unpause_container(self, container: str) -> None:
        with _errors():
            self._api.unpause(container)

    def stop_container(self, container: str, timeout: int = 10) -> None:
        with _errors():
            self._api.stop(container, timeout=timeout)

    def wait_container(self, container: str) -> int:
        with _errors():
            return int(self._api.wait(container).get("StatusCode", -1))

    def remove_container(self, container: str, *, force: bool = True, volumes: bool = True) -> None:
        with _errors():
            self._api.remove_container(container, force=force, v=volumes)

    def rename_container(self, container: str, name: str) -> None:
        with _errors():
            self._api.rename(container, name)

    def inspect_container(self, container: str) -> dict[str, Any] | None:
        return _unless_missing(lambda: self._api.inspect_container(container))

    def inspect_image(self, image: str) -> dict[str, Any] | None:
        return _unless_missing(lambda: self._api.inspect_image(image))

    def create_volume(
        self, name: str, labels: dict[str, str], driver: str | None = None, driver_opts: dict[str, str] | None = None
    ) -> dict[str, Any]:
        with _errors():
            return self._api.create_volume(name=name, driver=driver, driver_opts=driver_opts, labels=labels) or {}

    def volumes(self, label_filters: list[str]) -> list[dict[str, Any]]:
        with _errors():
            return (self._api.volumes(filters={"label": label_filters}) or {}).get("Volumes") or []

    def inspect_volume(self, name: str) -> dict[str, Any] | None:
        return _unless_missing(lambda: self._api.inspect_volume(name))

    def remove_volume(self, name: str, *, force: bool = True) -> None:
        with _errors():
            self._api.remove_volume(name, force=force)

    def inspect_network(self, name: str) -> dict[str, Any] | None:
        return _unless_missing(lambda: self._api.inspect_network(name))

    def info(self) -> dict[str, Any]:
        with _errors():
            return dict(self._api.info())

    def containers(self, label_filters: list[str]) -> list[dict[str, Any]]:
        with _errors():
            return self._api.containers(all=True, filters={"label": label_filters}) or []

    # -- images -------------------------------------------------------------------------------
    def images(self, filters: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
        with _errors():
            return self._api.images(filters=filters) or []

    def commit_container(
        self, container: str, repository: str, tag: str, conf: dict[str, Any], *, pause: bool = True
    ) -> str:
        with _errors():
            return str(self._api.commit(container, repository=repository, tag=tag, conf=conf, pause=pause)["Id"])

    def tag_image(self, image: str, repository: str, tag: str) -> None:
        with _errors():
            self._api.tag(image, repository, tag=tag)

    def remove_image(self, image: str, *, force: bool = False, noprune: bool = False) -> None:
        with _errors():
            self._api.remove_image(image, force=force, noprune=noprune)

    def load_image(self, archive: bytes) -> list[Any]:
        with _errors():
            return list(self._api.load_image(archive))

    def import_image(self, chunks: Iterable[bytes], repository: str, tag: str, changes: list[str]) -> str:
        with _errors():
            return str(self._api.import_image(src=chunks, repository=repository, tag=tag, changes=changes, stream_src=True))

    def export_container(self, container: str) -> Iterator[bytes]:
        with _errors():
            return _typed(self._api.export(container, chunk_size=1 << 20))

    # -- inside a container -------------------------------------------------------------------
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
    ) -> tuple[int, bytes, bytes]:
        """Run argv in the container; (exit code, stdout, stderr), stdin fed while the output is read.
        `max_output` as in EngineAPI.exec: the frames are read up to it, then the stream is closed."""
        with _errors():
            exec_id = self._api.exec_create(
                container, argv, stdout=True, stderr=True, stdin=stdin is not None, user=user, workdir=workdir,
                environment=env,
            )["Id"]  # fmt: skip
            output = self._exec_output(exec_id, stdin, CappedOutput(max_output), argv)
            code = exec_exit_code(lambda: self._api.exec_inspect(exec_id))
            done = output.result(code)
            return code, done.stdout, done.stderr

    def _exec_output(
        self, exec_id: str, stdin: bytes | IO[bytes] | None, output: CappedOutput, argv: list[str]
    ) -> CappedOutput:
        """Read the multiplexed output frame by frame into `output` (stdin fed from a thread, so neither
        side stalls the other); past its cap the stream is closed and the command refused."""
        from docker.utils.socket import frames_iter  # the client exists, so the SDK is already loaded

        sock = self._api.exec_start(exec_id, socket=True)
        feeder = None
        if stdin is not None:
            feeder = threading.Thread(target=feed_stdin, args=(getattr(sock, "_sock", sock), stdin), daemon=True)
            feeder.start()
        try:
            for stream, data in frames_iter(sock, tty=False):
                if not output.add(data, stderr=stream != 1):
                    raise output.refused(argv)
        finally:
            if feeder is not None:
                feeder.join(timeout=5)
            with contextlib.suppress(OSError):
                sock.close()
        return output

    def put_archive(self, container: str, path: str, tar_stream: Iterable[bytes] | IO[bytes]) -> None:
        with _errors():
            if not self._api.put_archive(container, path, tar_stream):
                raise EngineAPIError(0, "the engine refused the archive")

    def get_archive(self, container: str, path: str) -> Iterator[bytes]:
        with _errors():
            stream, _stat = self._api.get_archive(container, path, chunk_size=1 << 16)
        return _typed(stream)


# The SDK client itself: one per engine per process, and the messages for an engine that does not answer
# or answers with an error (the Docker provider, _docker.py, reaches every engine through these).
API_TIMEOUT = 120


# The docker SDK is imported on first use: the per-task calls (list, find, exec, archives), a box's
# create, removal and state changes, and checkpoints go through _engine_api on engines it reaches,
# and must not pay for it. Until sdk() rebinds it, the SDK's exception name below is a stand-in
# that nothing raises: no SDK exception can exist before the SDK is loaded, so an `except` clause
# naming it never catches anything.
class _DockerExceptionStandIn(Exception):
    """Caught before the SDK is loaded: nothing raises it."""


docker: Any = None
DockerException: Any = _DockerExceptionStandIn


def sdk() -> Any:
    global docker, DockerException
    if docker is None:
        try:
            import docker as package
            from docker import errors
        except ImportError as exc:
            raise ProviderError(f"the Python 'docker' package is required on the controller: {exc}") from exc
        DockerException = errors.DockerException
        docker = package
    return docker


# One client per engine per process: Ansible builds a new connection object for every task,
# and the inventory lists many engines; reconnecting each time is the slow part.
_CLIENTS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()
# Engine API versions seen answering; unlike clients, safe to inherit across a fork.
_API_VERSIONS: dict[str, str] = {}


def engine_unreachable(engine: str, exc: Exception, docker_host: str | None = None) -> EngineUnreachable:
    """The one message for an engine that does not answer: where it was looked for, and what to do."""
    if engine == "local" and docker_host and docker_host == _box_engine.box_engine_host():
        return EngineUnreachable(f"the box engine at {docker_host} does not answer ({exc}): {_box_engine.START_HINT}")
    where = (docker_host or _box_engine.user_engine_host()) if engine == "local" else engine
    return EngineUnreachable(
        f"the Docker engine at {where} does not answer ({exc}). Start it (scripts/ensure-docker.sh "
        "starts a local one) or point DOCKER_HOST at a running engine."
    )


def engine_error(
    status: int | None, text: str, name: str, operation: str, engine: str, missing: str | None = None
) -> ProviderError:
    """One ProviderError for an engine's error answer, whichever client got it. `missing` is the
    message for a 404 about something other than the container (a path in it)."""
    if "is paused" in text:
        return ProviderError(
            "the box is paused: resume it (playbooks/box_state.yml -e state=started) and try again",
            box=name,
            operation=operation,
        )
    if "is not running" in text:
        return ProviderError(
            "the box is stopped: start it (playbooks/box_state.yml -e state=started) and try again",
            box=name,
            operation=operation,
        )
    if status == 404 and "no such container" in text.lower():
        return BoxNotFound(f"no box called {name!r} on engine {engine}", box=name, operation=operation)
    if status == 404 and missing:
        return ProviderError(missing, box=name, operation=operation)
    return ProviderError(text, box=name, operation=operation)


def client_for(engine: str, ssh_options: dict[str, Any] | None = None, docker_host: str | None = None) -> Any:
    sdk()
    # Keyed by pid too: a forked Ansible worker must not share its parent's connection.
    key = f"{os.getpid()}:{engine}:{docker_host or ''}"
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is not None:
            return client
        try:
            if engine == "local":
                # A worker forked from a process that already reached this engine knows its API
                # version: skip the /version and /_ping round trips every new client would make.
                known = _API_VERSIONS.get(key.split(":", 1)[1])
                environment = {**os.environ, "DOCKER_HOST": docker_host} if docker_host else None
                client = docker.from_env(timeout=API_TIMEOUT, version=known or "auto", environment=environment)
                if not known:
                    client.api.ping()
                    _API_VERSIONS[key.split(":", 1)[1]] = client.api.api_version
            else:
                from ...ssh._ssh import docker_client_over_ssh

                client = docker_client_over_ssh(engine, timeout=API_TIMEOUT, **(ssh_options or {}))
                client.api.ping()
        except DockerException as exc:
            raise engine_unreachable(engine, exc, docker_host) from exc
        _CLIENTS[key] = client
        return client


def forget_client(engine: str, docker_host: str | None = None) -> None:
    with _CLIENTS_LOCK:
        client = _CLIENTS.pop(f"{os.getpid()}:{engine}:{docker_host or ''}", None)
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing a dead client must not mask the real error
            pass


def forget_all_clients() -> None:
    """Drop every cached client of this process without closing it (their connections may be gone already):
    the next call to each engine connects anew."""
    with _CLIENTS_LOCK:
        _CLIENTS.clear()
