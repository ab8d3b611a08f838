# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Getting an image onto a remote engine, and copying checkpoint images between engines.

ensure_image: present on the engine (and the same image as the local one) → done; else pull
from a registry when one is given and answers; else stream it from the local engine, the
equivalent of `docker save | ssh engine docker load`, over the engine's SSH connection. The
report says which path was taken, how many bytes crossed and how long it took.

copy_image: the same stream between any two Docker engines (a checkpoint made on one engine,
restored on another). Bytes go source engine → controller → destination engine; nothing is
written to disk on the controller.

Parallel runs (forks) that need one image on one engine wait for each other on a controller
lock, so an image crosses the link once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self

from ...core._host_files import transient_lock
from ...core._provider import Provider, ProviderError

# gzip level 1: box images shrink to about a third for little CPU; the engine's dockerd
# decompresses on load (it detects the gzip header).
GZIP_LEVEL = 1
LOCK_TIMEOUT = 3600


@dataclasses.dataclass
class TransferReport:
    image: str
    engine: str
    path: str  # 'present', 'pulled', 'streamed' (from the local engine) or 'copied' (engine to engine)
    seconds: float
    bytes_sent: int = 0  # what crossed the SSH link (compressed when compress=True)
    image_bytes: int = 0  # the uncompressed `docker save` stream
    image_id: str = ""
    source: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# A stream takes about a minute for the box image: every PROGRESS_SECONDS a line with the bytes so
# far goes to TRANSFER_LOG and, when the controller's action plugin set `progress`, to the screen.
PROGRESS_SECONDS = float(os.environ.get("AGENTBOX_PROGRESS_SECONDS", "5"))
TRANSFER_LOG = "~/.agentbox/logs/image-transfer.log"
progress: Callable[[str], None] | None = None


class _Progress:
    """Reports a running stream's figures every PROGRESS_SECONDS from a thread, until stopped."""

    def __init__(self, what: str, raw: _Counter, sent: _Counter) -> None:
        self.log = os.path.expanduser(TRANSFER_LOG)
        self._what, self._raw, self._sent = what, raw, sent
        self._started = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def say(self, text: str) -> None:
        try:
            os.makedirs(os.path.dirname(self.log), exist_ok=True)
            with open(self.log, "a", encoding="utf-8") as handle:
                handle.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + text + "\n")
        except OSError:
            pass
        if progress is not None:
            progress(text)

    def _run(self) -> None:
        while not self._done.wait(PROGRESS_SECONDS):
            elapsed = time.monotonic() - self._started
            self.say(f"{self._what}: {self._raw.count / 1e6:.0f} MB read, {self._sent.count / 1e6:.0f} MB sent, "
                     f"{elapsed:.0f} s (log {self.log})")  # fmt: skip

    def __enter__(self) -> Self:
        self.say(f"{self._what}: started")
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()


class _Counter:
    """Counts bytes passing through an iterator of chunks."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = chunks
        self.count = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.count += len(chunk)
            yield chunk


def _gzip(chunks: Iterable[bytes]) -> Iterator[bytes]:
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    for chunk in chunks:
        out = compressor.compress(chunk)
        if out:
            yield out
    yield compressor.flush()


def _sdk_errors() -> Any:
    """docker.errors, loaded when an image moves, never at import: every create imports this module,
    and on the local engine no create moves an image (the SDK's import is ~0.1 s). Only called after
    _client, whose SDK client means the SDK is there."""
    from docker import errors

    return errors


def _client(provider: Provider) -> Any:
    client = getattr(provider, "client", None)
    if client is None or not hasattr(client, "api"):
        raise ProviderError(f"provider {provider.name!r} is not a Docker engine: images cannot be streamed to it")
    return client


def _image_id(provider: Provider, image: str) -> str | None:
    client = _client(provider)
    try:
        return client.images.get(image).id
    except _sdk_errors().ImageNotFound:
        return None


def _local_provider(provider: Provider) -> Provider:
    """The local engine, through the destination's own provider class (a DockerProvider): no import of
    _docker here, which calls this module for its remote engines."""
    return type(provider)(engine="local")  # type: ignore[call-arg]


@contextlib.contextmanager
def _engine_lock(engine: str, image: str) -> Iterator[None]:
    """A controller-side lock per (engine, image): one transfer at a time, others then find it there.

    The lock file lives in the shared temp directory only while held, so none piles up there.
    """
    digest = hashlib.sha1(f"{engine}\0{image}".encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"agentbox-image-{digest}.lock")
    busy = ProviderError(f"waited {LOCK_TIMEOUT} s for another transfer of this image (lock {path})")
    with transient_lock(path, LOCK_TIMEOUT, busy):
        yield


def ensure_image(
    provider: Provider,
    image: str,
    *,
    registry: str | None = None,
    source: Provider | None = None,
    compress: bool = True,
) -> TransferReport:
    """Make sure `image` is on the provider's engine, the same image as on the local engine.

    registry: a reference to pull instead of streaming (e.g. ghcr.io/org/agentbox/box:sha-...),
    tagged as `image` once pulled; tried first, skipped with a note when it fails.
    source: the engine to stream from (default the local engine, DOCKER_HOST honoured).
    """
    started = time.monotonic()
    source = source or _local_provider(provider)
    source_id = _image_id(source, image) if source.engine != provider.engine else None
    with _engine_lock(provider.engine, image):
        present_id = _image_id(provider, image)
        notes: list[str] = []
        if present_id and (source_id is None or source_id == present_id):
            return TransferReport(image, provider.engine, "present", time.monotonic() - started, image_id=present_id)
        if present_id:
            notes.append(f"the engine's {image} ({present_id[:19]}) differs from the local one: replaced")
        if registry:
            pulled = _try_pull(provider, image, registry, notes)
            if pulled:
                return TransferReport(
                    image, provider.engine, "pulled", time.monotonic() - started, image_id=pulled, source=registry,
                    notes=notes,
                )  # fmt: skip
        if source_id is None:
            raise ProviderError(
                f"image {image!r} is not on engine {provider.engine} and not on the local engine to send it from"
                + (f" ({'; '.join(notes)})" if notes else "")
                + ": build it locally first (ansible-playbook playbooks/create_box.yml builds it with the box_image "
                "role) or give a registry reference the engine can pull"
            )
        report = _stream(source, provider, image, compress, path="streamed")
        report.notes = notes + report.notes
        report.seconds = time.monotonic() - started
        return report


def _try_pull(provider: Provider, image: str, registry: str, notes: list[str]) -> str | None:
    api = _client(provider).api
    repository, _sep, tag = registry.rpartition(":") if ":" in registry.rsplit("/", 1)[-1] else (registry, "", "latest")
    try:
        for message in api.pull(repository, tag=tag, stream=True, decode=True):
            if isinstance(message, dict) and message.get("error"):
                raise ProviderError(str(message["error"]))
        target_repo, _sep, target_tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
        api.tag(f"{repository}:{tag}", target_repo, target_tag)
        return _image_id(provider, image)
    except (_sdk_errors().DockerException, ProviderError) as exc:
        notes.append(f"pull of {registry} on the engine failed ({str(exc).strip()[:300]}): streamed instead")
        return None


def copy_image(source: Provider, destination: Provider, image: str, *, compress: bool = True) -> TransferReport:
    """Copy `image` (a checkpoint, say) from one engine to another: save | load through the controller."""
    started = time.monotonic()
    source_id = _image_id(source, image)
    if source_id is None:
        raise ProviderError(f"image {image!r} is not on engine {source.engine}: nothing to copy")
    with _engine_lock(destination.engine, image):
        if _image_id(destination, image) == source_id:
            return TransferReport(
                image, destination.engine, "present", time.monotonic() - started, image_id=source_id,
                source=source.engine,
            )  # fmt: skip
        report = _stream(source, destination, image, compress, path="copied")
    report.seconds = time.monotonic() - started
    return report


def _stream(source: Provider, destination: Provider, image: str, compress: bool, path: str) -> TransferReport:
    started = time.monotonic()
    raw = _Counter(_client(source).api.get_image(image, chunk_size=1 << 20))
    sent = _Counter(_gzip(raw) if compress else raw)
    failure = ""
    with _Progress(f"streaming {image} to engine {destination.engine}", raw, sent) as reporter:
        try:
            for message in _client(destination).api.load_image(sent, quiet=True):
                if isinstance(message, dict) and (message.get("error") or message.get("errorDetail")):
                    failure = str(message.get("error") or message.get("errorDetail"))
        except (_sdk_errors().DockerException, OSError) as exc:
            failure = str(getattr(exc, "explanation", None) or exc)
        reporter.say(
            f"streaming {image} to engine {destination.engine}: {'failed: ' + failure[:200] if failure else 'done'}, "
            f"{raw.count / 1e6:.0f} MB image, {sent.count / 1e6:.0f} MB sent in {time.monotonic() - started:.1f} s"
        )
    loaded_id = _image_id(destination, image)
    expected_id = _image_id(source, image)
    if failure or loaded_id != expected_id:
        hint = ""
        if "no space" in failure.lower():
            hint = " The engine's disk is full: free space there (docker system prune) and try again."
        raise ProviderError(
            f"loading {image} on engine {destination.engine} failed after {raw.count / 1e6:.1f} MB "
            f"({failure or f'the engine has image {loaded_id}, expected {expected_id}'}).{hint}"
        )
    seconds = time.monotonic() - started
    return TransferReport(
        image=image,
        engine=destination.engine,
        path=path,
        seconds=seconds,
        bytes_sent=sent.count,
        image_bytes=raw.count,
        image_id=loaded_id or "",
        source=source.engine,
        notes=[f"{raw.count / 1e6:.0f} MB image, {sent.count / 1e6:.0f} MB sent in {seconds:.1f} s"],
    )
