# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A flattened checkpoint on a Docker engine: the box's filesystem exported, filtered, and imported
as one layer over scratch, with the image config replayed as Dockerfile instructions.

The export stream is filtered on the fly (filter_tar): nothing under run/agentbox/ (the secrets
tmpfs) ever reaches the image, and nothing is buffered whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from ...checkpoint._checkpoint_records import CheckpointError
from ...core._provider import BoxFacts
from . import _ckpt_env

# Never in a flattened checkpoint, whatever the engine's export contains (the tmpfs mount point stays).
EXCLUDED_FROM_FLATTEN = ("run/agentbox/",)


class Image:
    """What checkpoints read of an image, from its inspect answer (the SDK's Image names)."""

    def __init__(self, attrs: dict[str, Any]):
        self.attrs = attrs
        self.id = str(attrs.get("Id", ""))
        self.labels: dict[str, str] = (attrs.get("Config") or {}).get("Labels") or {}


def image_or_none(engine: Any, ref: str) -> Image | None:
    """The image `ref` on the engine (an _engine_api or _engine_sdk client); None when there is none."""
    attrs = engine.inspect_image(ref)
    return Image(attrs) if attrs is not None else None


def _dockerfile_quote(value: str) -> str:
    """A double-quoted Dockerfile word: only \\, \" and $ are special inside the quotes."""
    if "\n" in value or "\r" in value:
        raise CheckpointError("a value with a line break cannot be replayed into a flattened image")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def config_changes(config: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """Dockerfile instructions replaying an image config on an imported (config-less) filesystem."""
    changes: list[str] = []
    for entry in config.get("Env") or []:
        key, _sep, value = entry.partition("=")
        if "\n" in value or "\r" in value:
            raise CheckpointError(
                f"environment variable {key} holds a line break, which a flattened image cannot replay: "
                "take a layered checkpoint (merged: false) or drop the variable"
            )
        changes.append(f"ENV {key}={_dockerfile_quote(value)}")
    if config.get("WorkingDir"):
        changes.append(f"WORKDIR {config['WorkingDir']}")
    if config.get("User"):
        changes.append(f"USER {config['User']}")
    for port in sorted(config.get("ExposedPorts") or {}):
        changes.append(f"EXPOSE {port}")
    # ENTRYPOINT before CMD: an ENTRYPOINT given after CMD would reset it.
    if config.get("Entrypoint"):
        changes.append("ENTRYPOINT " + json.dumps(config["Entrypoint"]))
    if config.get("Cmd"):
        changes.append("CMD " + json.dumps(config["Cmd"]))
    for key in sorted(labels):
        changes.append(f"LABEL {_dockerfile_quote(key)}={_dockerfile_quote(labels[key])}")
    return changes


class _Blocks:
    """Exact-size reads over a stream of chunks, passing data through without copying it twice."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._buffer = memoryview(b"")

    def _fill(self) -> bool:
        for chunk in self._chunks:
            if chunk:
                self._buffer = memoryview(bytes(self._buffer) + chunk) if self._buffer else memoryview(chunk)
                return True
        return False

    def read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not self._fill():
                break
        data, self._buffer = bytes(self._buffer[:size]), self._buffer[size:]
        return data

    def copy(self, size: int) -> Iterator[bytes]:
        while size > 0:
            if not self._buffer and not self._fill():
                raise CheckpointError("the exported filesystem stream ended in the middle of a file")
            piece = self._buffer[:size]
            self._buffer = self._buffer[len(piece) :]
            size -= len(piece)
            yield piece

    def rest(self) -> Iterator[bytes]:
        if self._buffer:
            yield self._buffer
        self._buffer = memoryview(b"")
        yield from self._chunks


def _tar_number(field: bytes) -> int:
    if field and field[0] & 0x80:  # base-256, for sizes above 8 GiB
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax_records(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    position = 0
    while position < len(data):
        space = data.find(b" ", position)
        if space < 0:
            break
        try:
            length = int(data[position:space])
        except ValueError:
            break
        if length <= 0:
            break
        key, _sep, value = data[space + 1 : position + length - 1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def filter_tar(chunks: Iterable[bytes], excluded: tuple[str, ...] = EXCLUDED_FROM_FLATTEN) -> Iterator[bytes]:
    """The tar stream minus every entry under the excluded prefixes; all other bytes unchanged.

    Output comes in ~1 MiB pieces: one per file would mean one HTTP chunk (and syscall) per file.
    """
    pending = bytearray()
    for piece in _filter_entries(chunks, excluded):
        pending += piece
        if len(pending) >= _OUT_CHUNK:
            yield bytes(pending)
            pending.clear()
    if pending:
        yield bytes(pending)


_OUT_CHUNK = 1 << 20


def _filter_entries(chunks: Iterable[bytes], excluded: tuple[str, ...]) -> Iterator[bytes]:
    blocks = _Blocks(chunks)
    pending: list[bytes] = []
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        header = blocks.read(512)
        if len(header) < 512:
            yield from pending
            if header:
                yield header
            return
        if header == b"\0" * 512:
            yield from pending
            yield header
            yield from blocks.rest()
            return
        kind = header[156:157]
        size = _tar_number(header[124:136])
        if kind in (b"x", b"L", b"K"):
            data = blocks.read(-(-size // 512) * 512)
            pending.append(header + data)
            if kind == b"x":
                pax.update(_pax_records(data[:size]))
            elif kind == b"L":
                long_name = data[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if kind == b"g":
            yield header
            yield from blocks.copy(-(-size // 512) * 512)
            continue
        if "size" in pax:
            size = int(pax["size"])
        name = pax.get("path") or long_name
        if name is None:
            prefix = header[345:500].split(b"\0", 1)[0] if header[257:262] == b"ustar" else b""
            base = header[0:100].split(b"\0", 1)[0]
            name = (prefix + b"/" + base if prefix else base).decode("utf-8", "surrogateescape")
        name = name.lstrip("/").removeprefix("./")
        padded = -(-size // 512) * 512 if kind not in (b"1", b"2", b"3", b"4", b"5", b"6") else 0
        meta, pending, long_name, pax = pending, [], None, {}
        if any(name.startswith(prefix) and name != prefix for prefix in excluded):
            for _skipped in blocks.copy(padded):
                pass
            continue
        yield from meta
        yield header
        yield from blocks.copy(padded)


def flatten(engine: Any, facts: BoxFacts, target: str, labels: dict[str, str]) -> dict[str, Any]:
    """Export the box's filesystem (paused) straight into an import with the config replayed.
    `engine`: an _engine_api or _engine_sdk client; the export streams into the import."""
    container = engine.inspect_container(facts.container)
    if container is None:
        raise CheckpointError(f"the box's container {facts.container} is gone", box=facts.name)
    config = container.get("Config") or {}
    merged_labels = {**(config.get("Labels") or {}), **labels}
    # The image's own environment only: the box's `env` (keys, tokens) stays out of the checkpoint.
    own = own_env(engine, container)
    changes = config_changes({**config, "Env": _ckpt_env.image_env(config.get("Env") or [], own, blank_added=False)},
                             merged_labels)
    repository, _sep, tag = target.rpartition(":")
    was_running = container.get("State", {}).get("Status") == "running"
    if was_running:
        engine.pause_container(container["Id"])
    try:
        stream = engine.export_container(container["Id"])
        answer = engine.import_image(filter_tar(stream), repository, tag, changes)
    finally:
        if was_running:
            engine.unpause_container(container["Id"])
    image = image_or_none(engine, target)
    if image is None:
        raise CheckpointError(f"the engine did not make the flattened image: {str(answer)[-500:]}", box=facts.name)
    return {"id": image.id, "size": int(image.attrs.get("Size", 0))}


def own_env(engine: Any, container: dict[str, Any]) -> list[str]:
    """The Env of the image the container (its inspect answer) runs, not the container's: that has
    the box's `env`."""
    image = image_or_none(engine, container.get("Image", ""))
    return ((image.attrs.get("Config") or {}).get("Env") or []) if image is not None else []
