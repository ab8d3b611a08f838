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
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ...core._provider import CappedOutput
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
