# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoints: a box's warm state saved as an image, and new boxes started from it.

Capture: the in-box cleanup runs first (as root), then either a *layered* checkpoint (one
`docker commit` layer over the box's image) or a *flattened* one (the container's filesystem
exported and imported as a single layer over scratch, with the config replayed). A box whose
image already stacks `max_layers` checkpoint layers is flattened automatically.

Where the facts live: the image labels (io.agentbox.*, io.agentbox.kind=checkpoint) carry
everything, so an engine alone tells which checkpoints exist; the host manifest
~/.agentbox/checkpoints/<project>/<name>/manifest.json carries the same facts. A manifest whose
image is gone is *broken*: listed, never used. Each checkpoint's commit is also kept alive by a
ref refs/agentbox/checkpoints/<project>/<name> in the host repositories, so deleting the source
box's branch cannot lose it.

Restore (local engine): the box starts from the checkpoint image, whose worktree directory is
baked in at the *source* box's path. A directory from a lower image layer cannot be renamed on
overlayfs (EXDEV: it would be copied whole, and every later checkpoint would carry a second
copy), so the tree stays where it is: a new worktree registration is made for the new box's
path, its gitfile is put into the baked tree, and the new path is a symlink to it. The source
box's registration is never touched. Then, in the box: branch at the checkpoint's commit →
merge of the host's HEAD (the box's side wins conflicting hunks) → the checkpoint's own
uncommitted edits re-applied (box wins) → the host's uncommitted edits overlaid file by file
(box wins) → the host's untracked files that the box does not have. Every conflict is reported.

Secrets: per-box secrets live on the /run/agentbox tmpfs, which neither `commit` nor `export`
sees; the flatten stream also drops anything under run/agentbox/, and capture refuses a box whose
environment holds the value of one of its secrets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

from . import _checkpoint_records, _ckpt_env, _git, _gitlayer, _naming, _restore_program, _seed
from ._box_data import restore_answer
from ._checkpoint_records import (
    COLLECTION_VERSION,
    SCHEMA_VERSION,
    CapturePlan,
    Checkpoint,
    CheckpointError,
    agentbox_home,
    captured,
    checkpoints_dir,
    foreign,
    guard_secrets,
    in_box_head,
    manifest_path,
    next_number,
    parse_reference,
    project_default,
    read_manifest,
    record_number,
    set_project_default,
    write_json,
)
from ._provider import BoxFacts, Provider
from ._tarstream import tar_of_paths, tar_of_tree

# The names tests/unit/test_checkpoint.py reads from here since before they moved to _checkpoint_records.
_next_number = next_number
_record_number = record_number
project_config_path = _checkpoint_records.project_config_path

# The in-box half of a restore (see _restore_program), run as `python3 -c RESTORE_SCRIPT`. From the
# loader, not open(__file__): Ansiballz runs modules from a zip, whose loader still has get_source.
RESTORE_SCRIPT = inspect.getsource(_restore_program)
DEFAULT_MAX_LAYERS = 3
CLEANUP_COMMAND = "/usr/local/bin/agentbox-checkpoint-cleanup"
# Never in a flattened checkpoint, whatever the engine's export contains (the tmpfs mount point stays).
EXCLUDED_FROM_FLATTEN = ("run/agentbox/",)
CHECKPOINT_REF_PREFIX = "refs/agentbox/checkpoints/"
TEMP_TAG_MARK = ".partial-"
IMAGE_TYPES = ("layered", "flattened")
# Where the host's HEAD waits in the staging repo shipped to a remote box during a restore.
RESTORE_HOST_BRANCH = "agentbox-restore/host-head"

# Image label keys (without the io.agentbox. prefix) a checkpoint sets; all are always written, so
# a checkpoint of a restored box never keeps a stale value inherited from its parent's image.
CKPT = "checkpoint."
LABEL_KEYS = (
    "kind",
    "checkpoint",
    CKPT + "schema",
    CKPT + "type",
    CKPT + "parents",
    CKPT + "layers",
    CKPT + "commit",
    CKPT + "worktrees",
    CKPT + "base_image",
    CKPT + "base_image_id",
    CKPT + "collection_version",
    CKPT + "engine",
    CKPT + "source_box",
    CKPT + "source_box_id",
)


# -- the engine side (Docker API) -------------------------------------------------------------------
def _snapshot_store(provider: Provider) -> Any:
    """The engine side for providers whose checkpoints are engine snapshots, not Docker images
    (Daytona: `DaytonaProvider.checkpoint_store`); None for the Docker providers."""
    make = getattr(provider, "checkpoint_store", None)
    return make() if callable(make) else None


def _docker(provider: Provider) -> Any:
    client = getattr(provider, "client", None)
    if client is None:
        raise CheckpointError(
            f"checkpoints are supported on the docker and docker_ssh providers, not on {provider.name!r}"
        )
    return client


def _image_or_none(client: Any, ref: str) -> Any:
    from docker.errors import ImageNotFound

    try:
        return client.images.get(ref)
    except ImageNotFound:
        return None


class _ImageSummary:
    """What a listing says of one image (id, tags, labels, size), in the shape of the SDK's Image.

    From one /images/json answer: the SDK's images.list() inspects each image again, and fails
    when any image goes away in between (other runs make and remove images all the time)."""

    def __init__(self, summary: dict[str, Any]):
        self.id = summary.get("Id", "")
        self.tags = [t for t in summary.get("RepoTags") or [] if t != "<none>:<none>"]
        self.labels = summary.get("Labels") or {}
        self.attrs = {"Size": summary.get("Size", 0)}


def _images(client: Any, filters: dict[str, Any] | None = None) -> list[_ImageSummary]:
    return [_ImageSummary(summary) for summary in client.api.images(filters=filters)]


def _checkpoint_images(client: Any, project: str | None = None) -> list[_ImageSummary]:
    filters = [_naming.label("kind") + "=checkpoint"]
    if project:
        filters.append(f"{_naming.label('project')}={project}")
    return _images(client, {"label": filters})


# -- manifests and labels ---------------------------------------------------------------------------
def _labels_to_record(labels: dict[str, str]) -> dict[str, Any]:
    """A manifest-shaped record from an image's io.agentbox.* labels (the manifest may be gone)."""
    short = _naming.strip_labels(labels)

    def loads(key: str, default: Any) -> Any:
        try:
            return json.loads(short.get(key) or "null") or default
        except ValueError:
            return default

    try:
        layers = int(short.get(CKPT + "layers") or 0)
    except ValueError:
        layers = 0
    return {
        "schema": int(short.get(CKPT + "schema") or 0) or None,
        "name": short.get("checkpoint", ""),
        "type": short.get(CKPT + "type", ""),
        "project": short.get("project", ""),
        "workspace": short.get("workspace", ""),
        "parents": loads(CKPT + "parents", []),
        "layers": layers,
        "source_box": short.get(CKPT + "source_box", "") or short.get("box", ""),
        "source_box_id": short.get(CKPT + "source_box_id", "") or short.get("id", ""),
        "branch": short.get("branch", ""),
        "commit": short.get(CKPT + "commit", ""),
        "worktrees": loads(CKPT + "worktrees", []),
        "base_image": short.get(CKPT + "base_image", ""),
        "base_image_id": short.get(CKPT + "base_image_id", ""),
        "base_fingerprint": short.get("image_fingerprint", ""),
        "collection_version": short.get(CKPT + "collection_version", ""),
        "engine": short.get(CKPT + "engine", ""),
        "created": short.get("created", ""),
    }


def _record_to_labels(record: dict[str, Any]) -> dict[str, str]:
    values = {
        "kind": "checkpoint",
        "checkpoint": record["name"],
        "project": record["project"],
        "workspace": record["workspace"],
        "box": record["source_box"],
        "id": record["source_box_id"],
        "branch": record["branch"],
        "created": record["created"],
        "image_fingerprint": record["base_fingerprint"],
        CKPT + "schema": str(SCHEMA_VERSION),
        CKPT + "type": record["type"],
        CKPT + "parents": json.dumps(record["parents"], separators=(",", ":")),
        CKPT + "layers": str(record["layers"]),
        CKPT + "commit": record["commit"],
        CKPT + "worktrees": json.dumps(record["worktrees"], separators=(",", ":")),
        CKPT + "base_image": record["base_image"],
        CKPT + "base_image_id": record["base_image_id"],
        CKPT + "collection_version": record["collection_version"],
        CKPT + "engine": record["engine"],
        CKPT + "source_box": record["source_box"],
        CKPT + "source_box_id": record["source_box_id"],
    }
    return {_naming.label(key): value for key, value in values.items()}


def find_checkpoint(provider: Provider, project: str, name: str) -> Checkpoint | None:
    if (store := _snapshot_store(provider)) is not None:
        return store.find(project, name)
    client = _docker(provider)
    image_ref = _naming.checkpoint_image(project, name)
    manifest = read_manifest(project, name)
    if foreign(provider, manifest):
        manifest = None  # that name is a checkpoint on another provider or engine
    image = _image_or_none(client, image_ref)
    if manifest is None and image is None:
        return None
    record = manifest or _labels_to_record(image.labels or {})
    return Checkpoint(
        name=name,
        project=project,
        image=image_ref,
        record=record,
        has_manifest=manifest is not None,
        image_exists=image is not None,
        image_id=image.id if image is not None else "",
        size=int(image.attrs.get("Size", 0)) if image is not None else 0,
    )


def list_checkpoints(provider: Provider, project: str) -> list[Checkpoint]:
    """Every checkpoint of the project: manifests (broken ones too) and labelled images."""
    if (store := _snapshot_store(provider)) is not None:
        return store.list(project)
    client = _docker(provider)
    found: dict[str, Checkpoint] = {}
    root = checkpoints_dir(project)
    for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        manifest = read_manifest(project, entry) if not entry.startswith(".") else None
        if manifest is None or foreign(provider, manifest):
            continue
        image = _image_or_none(client, _naming.checkpoint_image(project, entry))
        found[entry] = Checkpoint(
            name=entry,
            project=project,
            image=_naming.checkpoint_image(project, entry),
            record=manifest,
            has_manifest=True,
            image_exists=image is not None,
            image_id=image.id if image is not None else "",
            size=int(image.attrs.get("Size", 0)) if image is not None else 0,
        )
    repository = _naming.CHECKPOINT_IMAGE_PREFIX + project
    for image in _checkpoint_images(client, project):
        for tag in image.tags:
            repo, _sep, name = tag.rpartition(":")
            if repo != repository or name in found or TEMP_TAG_MARK in name:
                continue
            found[name] = Checkpoint(
                name=name,
                project=project,
                image=tag,
                record=_labels_to_record(image.labels or {}),
                has_manifest=False,
                image_exists=True,
                image_id=image.id,
                size=int(image.attrs.get("Size", 0)),
            )
    return [found[name] for name in sorted(found)]


def current_fingerprint(provider: Provider, base_image: str) -> str | None:
    """What the base image is now: its fingerprint label, else its id; None when it is gone."""
    if (store := _snapshot_store(provider)) is not None:
        return store.fingerprint(base_image)
    if not base_image:
        return None
    image = _image_or_none(_docker(provider), base_image)
    if image is None:
        return None
    return (image.labels or {}).get(_naming.label("image_fingerprint")) or image.id


def is_stale(provider: Provider, record: dict[str, Any]) -> bool:
    """True when the base image the checkpoint was made on has been rebuilt (or removed) since."""
    recorded = record.get("base_fingerprint") or record.get("base_image_id")
    if not recorded or not record.get("base_image"):
        return False
    return current_fingerprint(provider, record["base_image"]) != recorded


# -- capture ----------------------------------------------------------------------------------------
def _box_image_labels(provider: Provider, facts: BoxFacts) -> tuple[dict[str, str], str]:
    """(labels of the image the box runs, that image's id): how deep its checkpoint chain is."""
    client = _docker(provider)
    container = client.containers.get(facts.container)
    image_id = container.attrs.get("Image", "")
    image = _image_or_none(client, image_id) if image_id else None
    return ((image.labels or {}) if image is not None else {}), image_id


def plan_capture(
    provider: Provider,
    facts: BoxFacts,
    name: str | None,
    merged: bool = False,
    replace: bool = False,
    max_layers: int = DEFAULT_MAX_LAYERS,
) -> CapturePlan:
    """Decide name, type and parents; validates everything before any side effect."""
    if max_layers < 1:
        raise CheckpointError(f"max_layers must be 1 or more, not {max_layers}")
    if (store := _snapshot_store(provider)) is not None:
        return store.plan_capture(facts, name, replace)
    if not facts.project:
        raise CheckpointError(f"box {facts.name!r} has no io.agentbox.project label: it was not made by agentbox")
    project = facts.project
    numbered = not name
    if name:
        name = parse_reference(name, project)
        if TEMP_TAG_MARK in name:
            raise CheckpointError(f"checkpoint names may not contain {TEMP_TAG_MARK!r}")
    else:
        taken = [c.name for c in list_checkpoints(provider, project)]
        name = _naming.validate_checkpoint_name(f"{facts.name}-{next_number(project, facts.name, taken)}")
    elsewhere = read_manifest(project, name)
    if foreign(provider, elsewhere):
        raise CheckpointError(
            f"checkpoint {name!r} of this project already exists on {(elsewhere or {}).get('engine')} (manifests "
            "are shared by every provider and engine): pick another name"
        )
    existing = find_checkpoint(provider, project, name)
    if existing and not replace:
        raise CheckpointError(
            f"checkpoint {name!r} already exists in this project (image {existing.image}"
            f"{', broken: its image is gone' if existing.broken else ''}): pass replace: true (playbooks/checkpoint.yml: -e replace=true) to overwrite it, "
            "or pick another name"
        )
    labels, _image_id = _box_image_labels(provider, facts)
    parent_record = _labels_to_record(labels) if _naming.strip_labels(labels).get("kind") == "checkpoint" else None
    parents: list[str] = []
    source_layers = 0
    if parent_record:
        parents = [parent_record["name"], *parent_record.get("parents", [])]
        source_layers = int(parent_record.get("layers") or 0)
    flatten = merged or source_layers >= max_layers
    return CapturePlan(
        facts=facts,
        name=name,
        type="flattened" if flatten else "layered",
        image=_naming.checkpoint_image(project, name),
        parents=parents,
        layers=0 if flatten else source_layers + 1,
        replaces=existing,
        numbered=numbered,
    )


def _worktree_heads(provider: Provider, facts: BoxFacts) -> list[dict[str, str]]:
    """[{sub, git_dir, path, branch, commit}] of the box's worktrees, read on the host."""
    from ._box import worktree_records

    records = worktree_records(facts)
    if _gitlayer.has_layers(facts):
        # The box's worktrees are registered in its git layer, not in the host's .git.
        return _gitlayer.box_heads(provider, facts, records)
    heads = []
    for record in records:
        listing = _git.git(record["git_dir"], f"--git-dir={record['git_dir']}", "worktree", "list", "--porcelain")
        entry: dict[str, str] = {}
        match: dict[str, str] | None = None
        for line in [*listing.stdout.decode("utf-8", "replace").splitlines(), ""]:
            if not line:
                if entry.get("worktree") == record["path"]:
                    match = entry
                entry = {}
                continue
            key, _sep, value = line.partition(" ")
            entry[key] = value
        if match is None or "HEAD" not in match:
            raise CheckpointError(
                f"the box's worktree {record['path']} is not registered in {record['git_dir']} any more: "
                "the box cannot be checkpointed with its git state; recreate it",
                box=facts.name,
            )
        heads.append(
            {
                "sub": record.get("sub", ""),
                "git_dir": record["git_dir"],
                "path": record["path"],
                "branch": match.get("branch", "").removeprefix("refs/heads/"),
                "commit": match["HEAD"],
            }
        )
    return heads


# The cleanup empties /tmp, /var/tmp, apt caches and /var/log with `rm -rf`, which follows into
# whatever is mounted there: a workspace under /tmp has its .git (the box's git layer) mounted at that same
# path, and a plain run deletes the box's view of it. So the cleanup runs in a private mount namespace
# (the box has CAP_SYS_ADMIN) where every host mount is covered by an empty placeholder (a tiny
# tmpfs, or /dev/null for a file): `rm` sees nothing to delete, and cannot remove the mount points
# themselves (busy), so the box's own namespace keeps its mounts reachable too.
_CLEANUP_SCRIPT = r"""
[ -x "$1" ] || exit 127
command -v unshare >/dev/null 2>&1 || exit 90
exec unshare --mount --propagation private sh -c '
  cleanup=$1; shift
  for mount_point in "$@"; do
    # Under a parent covered already (a volume inside a volume): out of reach, nothing to cover.
    [ -e "$mount_point" ] || continue
    if [ -d "$mount_point" ]; then
      mount -t tmpfs -o size=64k,mode=0755 agentbox-shield "$mount_point" || exit 90
    else
      mount --bind /dev/null "$mount_point" || exit 90
    fi
  done
  exec "$cleanup"' cleanup "$@"
"""


def run_cleanup(provider: Provider, box: str, mounts: list[str] | None = None) -> tuple[float, str | None]:
    """The in-box cleanup as root, away from host mounts: (seconds, warning or None). Best effort."""
    if mounts is None:
        container = _docker(provider).containers.get(_naming.container_name(box))
        mounts = [m["Destination"] for m in container.attrs.get("Mounts") or [] if m.get("Destination")]
    # Shallowest first: a mount inside another one is then covered by its parent's placeholder.
    ordered = sorted(set(mounts), key=lambda path: path.count("/"))
    started = time.monotonic()
    run = provider.exec(box, ["sh", "-c", _CLEANUP_SCRIPT, "cleanup", CLEANUP_COMMAND, *ordered], user="root")
    elapsed = time.monotonic() - started
    if run.rc == 127:
        return elapsed, f"{CLEANUP_COMMAND} is not in the box's image: captured without cleanup"
    if run.rc == 90:
        return elapsed, (
            "the in-box cleanup was skipped: the host mounts could not be covered in its private mount "
            "namespace (it would otherwise delete host files mounted under /tmp)"
        )
    if run.rc != 0:
        detail = (run.stderr or run.stdout).decode("utf-8", "replace").strip()[-500:]
        return elapsed, f"the checkpoint cleanup exited {run.rc}: {detail}"
    return elapsed, None


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


def _flatten(provider: Provider, facts: BoxFacts, target: str, labels: dict[str, str]) -> dict[str, Any]:
    """Export the box's filesystem (paused) straight into an import with the config replayed."""
    client = _docker(provider)
    container = client.containers.get(facts.container)
    config = container.attrs.get("Config") or {}
    merged_labels = {**(config.get("Labels") or {}), **labels}
    # The image's own environment only: the box's `env` (keys, tokens) stays out of the checkpoint.
    own = _own_env(client, container)
    changes = config_changes({**config, "Env": _ckpt_env.image_env(config.get("Env") or [], own, blank_added=False)},
                             merged_labels)
    repository, _sep, tag = target.rpartition(":")
    was_running = container.attrs.get("State", {}).get("Status") == "running"
    if was_running:
        container.pause()
    try:
        stream = client.api.export(container.id, chunk_size=1 << 20)
        answer = client.api.import_image(
            src=filter_tar(stream), repository=repository, tag=tag, changes=changes, stream_src=True
        )
    finally:
        if was_running:
            container.unpause()
    image = _image_or_none(client, target)
    if image is None:
        raise CheckpointError(f"the engine did not make the flattened image: {str(answer)[-500:]}", box=facts.name)
    return {"id": image.id, "size": int(image.attrs.get("Size", 0))}


def _own_env(client: Any, container: Any) -> list[str]:
    """The Env of the image the container runs (not the container's: that has the box's `env`)."""
    image = _image_or_none(client, container.attrs.get("Image", ""))
    return ((image.attrs.get("Config") or {}).get("Env") or []) if image is not None else []


def capture(provider: Provider, plan: CapturePlan, cleanup: bool = True) -> dict[str, Any]:
    """Take the checkpoint planned by plan_capture. Nothing half-made is left on failure."""
    if (store := _snapshot_store(provider)) is not None:
        return store.capture(plan, cleanup)
    facts = plan.facts
    client = _docker(provider)
    container = client.containers.get(facts.container)
    config = container.attrs.get("Config") or {}
    running = facts.state == "running"
    warnings: list[str] = []
    timings: dict[str, float] = {}
    if running:
        guard_secrets(provider, facts, config.get("Env") or [])
    else:
        warnings.append(f"the box is {facts.state}: captured without the in-box cleanup (start it to have it run)")
    heads = _worktree_heads(provider, facts) if provider.shares_host_filesystem else []
    if not heads and running and facts.branch:
        heads = in_box_head(provider, facts)
    box_labels, box_image_id = _box_image_labels(provider, facts)
    parent = _naming.strip_labels(box_labels)
    is_checkpoint_image = parent.get("kind") == "checkpoint"
    base_image = parent.get(CKPT + "base_image", "") if is_checkpoint_image else facts.image
    base_image_id = parent.get(CKPT + "base_image_id", "") if is_checkpoint_image else box_image_id
    record = {
        "schema": SCHEMA_VERSION,
        "name": plan.name,
        "type": plan.type,
        "image": plan.image,
        "project": facts.project,
        "workspace": facts.workspace,
        "parents": plan.parents,
        "layers": plan.layers,
        "source_box": facts.name,
        "source_box_id": facts.id,
        "branch": heads[0]["branch"] if heads else facts.branch,
        "commit": heads[0]["commit"] if heads else "",
        "worktrees": heads,
        "base_image": base_image,
        "base_image_id": base_image_id,
        "base_fingerprint": facts.labels.get("image_fingerprint") or base_image_id,
        "collection_version": COLLECTION_VERSION,
        "engine": f"{provider.name}:{provider.engine}",
        "created": _naming.now_iso(),
    }
    labels = _record_to_labels(record)
    if cleanup and running:
        timings["cleanup_seconds"], warning = run_cleanup(provider, facts.name)
        if warning:
            warnings.append(warning)
    # The engine tags an image only once it is complete, so a new name is written directly. A
    # replacement is built under a temporary tag and renamed at the end: a failure never loses the
    # checkpoint that was there.
    old_id = plan.replaces.image_id if plan.replaces else ""
    target = f"{plan.image}{TEMP_TAG_MARK}{os.getpid()}-{int(time.time())}" if plan.replaces else plan.image
    started = time.monotonic()
    try:
        if plan.type == "layered":
            own = _own_env(client, container)
            raw = f"{target}{TEMP_TAG_MARK}raw"
            env = _ckpt_env.image_env(config.get("Env") or [], own, blank_added=True)
            committed = provider.commit(facts.name, raw, labels, env=env)
            try:
                # The box's env out of the image's config for good (see _ckpt_env); layers are shared.
                image_id = _ckpt_env.without_container_config(client.api, committed["id"], target, own)
            finally:
                with contextlib.suppress(Exception):
                    client.images.remove(raw)
            made = {"id": image_id, "size": committed["size"]}
        else:
            made = _flatten(provider, facts, target, labels)
        timings["capture_seconds"] = time.monotonic() - started
        if target != plan.image:
            repository, _sep, tag = plan.image.rpartition(":")
            client.images.get(made["id"]).tag(repository, tag)
    finally:
        if target != plan.image:
            with contextlib.suppress(Exception):
                client.images.remove(target, noprune=False)
    if old_id and old_id != made["id"]:
        # Kept when a box still runs on it (the engine refuses); prune reaps it later.
        with contextlib.suppress(Exception):
            client.images.remove(old_id)
    record["image_id"] = made["id"]
    write_json(manifest_path(facts.project, plan.name), record)
    if plan.numbered:
        record_number(facts.project, facts.name, plan.name)
    if provider.shares_host_filesystem:
        for head in heads:
            if head["commit"]:
                _git.git(
                    head["git_dir"],
                    f"--git-dir={head['git_dir']}",
                    "update-ref",
                    _ref(facts.project, plan.name),
                    head["commit"],
                )
    return captured(plan, facts, record, made, timings, warnings)


def _ref(project: str, name: str) -> str:
    return f"{CHECKPOINT_REF_PREFIX}{project}/{name}"


# -- removal and prune ------------------------------------------------------------------------------
def remove(provider: Provider, checkpoint: Checkpoint) -> dict[str, Any]:
    """Delete the checkpoint's image tag, its manifest and its commit refs."""
    if (store := _snapshot_store(provider)) is not None:
        return store.remove(checkpoint)
    client = _docker(provider)
    removed: dict[str, Any] = {"image": None, "manifest": None, "refs": []}
    if checkpoint.image_exists:
        from docker.errors import APIError

        try:
            client.images.remove(checkpoint.image)
        except APIError as exc:
            raise CheckpointError(
                f"could not remove image {checkpoint.image}: {exc.explanation or exc}. "
                "Destroy the boxes that run on it first (agentbox_box_info lists them)"
            ) from exc
        removed["image"] = checkpoint.image
    for worktree in checkpoint.record.get("worktrees") or []:
        git_dir = worktree.get("git_dir")
        if git_dir and os.path.isdir(git_dir):
            ref = _ref(checkpoint.project, checkpoint.name)
            if _git.git(git_dir, f"--git-dir={git_dir}", "update-ref", "-d", ref, check=False).returncode == 0:
                removed["refs"].append(f"{git_dir}:{ref}")
    directory = os.path.dirname(manifest_path(checkpoint.project, checkpoint.name))
    if os.path.isdir(directory):
        shutil.rmtree(directory)
        removed["manifest"] = os.path.join(directory, "manifest.json")
    if project_default(provider, checkpoint.project) == checkpoint.name:
        set_project_default(checkpoint.project, None, provider=provider)
        removed["default_cleared"] = True
    return removed


def _all_manifest_images() -> set[str]:
    root = os.path.join(agentbox_home(), "checkpoints")
    images: set[str] = set()
    for project in os.listdir(root) if os.path.isdir(root) else []:
        for name in os.listdir(os.path.join(root, project)) if os.path.isdir(os.path.join(root, project)) else []:
            if os.path.isfile(manifest_path(project, name)):
                images.add(_naming.checkpoint_image(project, name))
    return images


def prune(provider: Provider, check_mode: bool = False, project: str | None = None) -> dict[str, Any]:
    """Remove agentbox-ckpt-* images (and dangling checkpoint images) no box and no manifest refers to.

    With `project`, only that project's images are considered.
    """
    if (store := _snapshot_store(provider)) is not None:
        return store.prune(check_mode, project)
    client = _docker(provider)
    containers = client.containers.list(all=True)
    # A box refers to its checkpoint by tag (its Config.Image); an untagged image only by id.
    used_ids = {c.attrs.get("Image") for c in containers}
    used_refs = {(c.attrs.get("Config") or {}).get("Image") for c in containers}
    kept_by_manifest = _all_manifest_images()
    candidates: list[tuple[str, str]] = []  # (reference to remove, image id)
    seen: set[str] = set()
    for image in _images(client) + _checkpoint_images(client):
        if image.id in seen:
            continue
        seen.add(image.id)
        prefix = _naming.CHECKPOINT_IMAGE_PREFIX + (f"{project}:" if project else "")
        tags = [t for t in image.tags if t.startswith(prefix)]
        short = _naming.strip_labels(image.labels)
        is_checkpoint = short.get("kind") == "checkpoint" and (not project or short.get("project") == project)
        if not image.tags and is_checkpoint and image.id not in used_ids:
            candidates.append((image.id, image.id))
        for tag in tags:
            if tag in used_refs or (tag in kept_by_manifest and TEMP_TAG_MARK not in tag):
                continue
            candidates.append((tag, image.id))
    removed: list[dict[str, str]] = []
    failed: list[dict[str, str]] = []
    for reference, image_id in candidates:
        if not check_mode:
            from docker.errors import APIError

            try:
                client.images.remove(reference)
            except APIError as exc:
                failed.append({"image": reference, "id": image_id, "error": str(exc.explanation or exc)})
                continue
        removed.append({"image": reference, "id": image_id})
    return {"removed": removed, "failed": failed}


# -- restore ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class RestoreResult(_seed.SeedResult):
    """SeedResult plus what a restore adds: the checkpoint, the merge, and each conflict."""

    checkpoint: str = ""
    checkpoint_commit: str = ""
    merges: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    conflicts: list[dict[str, str]] = dataclasses.field(default_factory=list)


def plan_restore(provider: Provider, project: str, checkpoint_name: str) -> RestorePlan:
    """Validate a checkpoint for a new box of `project`; unknown, foreign or broken ones fail here."""
    if (store := _snapshot_store(provider)) is not None:
        return store.plan_restore(project, checkpoint_name)
    name = parse_reference(checkpoint_name, project)
    found = find_checkpoint(provider, project, name)
    if found is None:
        elsewhere = []
        for image in _checkpoint_images(_docker(provider)):
            record = _labels_to_record(image.labels or {})
            if record["name"] == name and record["project"] != project:
                elsewhere.append(f"{record['project']} (workspace {record['workspace']})")
        if elsewhere:
            raise CheckpointError(
                f"checkpoint {name!r} belongs to another project: {', '.join(sorted(set(elsewhere)))}. "
                "A box can only start from a checkpoint of its own workspace"
            )
        raise CheckpointError(
            f"no checkpoint {name!r} in this project (on engine {provider.engine}): list them with "
            "agentbox.box.agentbox_checkpoint_info, or pass checkpoint: none to start fresh"
        )
    if found.broken:
        raise CheckpointError(
            f"checkpoint {name!r} is broken: its manifest exists but image {found.image} is gone from engine "
            f"{provider.engine}. Remove it (agentbox_checkpoint state=absent) and take a new one; if it is the "
            "project default, pass checkpoint: none meanwhile"
        )
    labels = provider.image_labels(found.image)
    owner = _naming.strip_labels(labels).get("project")
    if owner and owner != project:
        raise CheckpointError(f"image {found.image} is labelled for project {owner}, not {project}: it cannot be used")
    if found.record.get("type") not in IMAGE_TYPES:
        raise CheckpointError(f"checkpoint {name!r} has no valid type in its manifest/labels: remove and recreate it")
    return RestorePlan(name=name, image=found.image, record=found.record)


@dataclasses.dataclass
class RestorePlan:
    name: str
    image: str
    record: dict[str, Any]

    def restore_workspace(
        self,
        provider: Provider,
        box_name: str,
        repos: list[_git.Repo],
        plans: list[_seed.WorktreePlan],
        carry: dict[str, _git.CarryOver],
    ) -> RestoreResult:
        return restore_workspace(self, provider, box_name, repos, plans, carry)


def _identity(repo: _git.Repo) -> dict[str, str]:
    """Who the restore's merge commit is by: the host repository's user, else 'agentbox'."""

    def value(key: str, fallback: str) -> str:
        return _git.git(repo.root, "config", key, check=False).stdout.decode("utf-8", "replace").strip() or fallback

    name = value("user.name", "agentbox")
    email = value("user.email", "agentbox@localhost")
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


def restore_workspace(
    plan: RestorePlan,
    provider: Provider,
    box: str,
    repos: list[_git.Repo],
    plans: list[_seed.WorktreePlan],
    carry: dict[str, _git.CarryOver],
) -> RestoreResult:
    record = plan.record
    worktrees = {w.get("sub", ""): w for w in record.get("worktrees") or []}
    result = RestoreResult(
        mode="checkpoint",
        branch=plans[0].branch if plans else None,
        base_commit=plans[0].base if plans else None,
        checkpoint=plan.name,
        checkpoint_commit=record.get("commit", ""),
    )
    if not repos:
        result.warnings.append(
            "the workspace is not a git repository: /workspace is the checkpoint's, as captured "
            "(host files were not copied over it)"
        )
        _seed._finish(provider, box, None, result)
        return result
    if not plans:
        return _restore_clones(plan, provider, box, repos, carry, result)
    if "" not in worktrees:
        raise CheckpointError(
            f"checkpoint {plan.name!r} has no git worktree (it was taken of a box that was not a git checkout), "
            "but this workspace is a git repository: create the box without it (checkpoint: none)",
            box=box,
        )
    jobs = []
    for wt_plan in plans:
        source = worktrees.get(wt_plan.sub)
        if source is None:
            raise CheckpointError(
                f"the checkpoint has no worktree for nested repository {wt_plan.sub!r} that the workspace has now: "
                "create the box without the checkpoint (checkpoint: none) and take a new checkpoint",
                box=box,
            )
        if source.get("git_dir") and os.path.realpath(source["git_dir"]) != os.path.realpath(wt_plan.common_dir):
            raise CheckpointError(
                f"the checkpoint's repository {source['git_dir']} is not this workspace's {wt_plan.common_dir}",
                box=box,
            )
        commit = source.get("commit", "")
        if not commit or _git.git(wt_plan.host_root, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode:
            raise CheckpointError(
                f"the checkpoint's commit {commit or '(none)'} is not in {wt_plan.host_root} any more: "
                "the checkpoint cannot be restored; remove it and take a new one",
                box=box,
            )
        state = carry[wt_plan.sub]
        jobs.append(
            {
                "sub": wt_plan.sub,
                "common_dir": wt_plan.common_dir,
                "old_path": source["path"],
                "new_path": wt_plan.path,
                "branch": wt_plan.branch,
                "commit": commit,
                "host_head": wt_plan.base,
                "host_stash": state.stash or "",
                "untracked": state.untracked,
                "owner_uid": wt_plan.owner_uid,
            }
        )
    owned_by_box = all(p.owner_uid == _seed.BOX_UID for p in plans)
    _run_restore(provider, plan, box, repos, jobs, carry, result, {p.sub: p.host_root for p in plans}, owned_by_box)
    for wt_plan in plans:
        result.worktrees.append(dataclasses.asdict(wt_plan))
    if not owned_by_box:
        for wt_plan in plans:
            provider.exec(box, ["chown", "-R", f"{_seed.BOX_UID}:{_seed.BOX_UID}", wt_plan.path + "/"], user="root")
    _seed._finish(provider, box, plans[0].path, result)
    return result


def _restore_clones(
    plan: RestorePlan,
    provider: Provider,
    box: str,
    repos: list[_git.Repo],
    carry: dict[str, _git.CarryOver],
    result: RestoreResult,
) -> RestoreResult:
    """Remote engines: each repo is a clone inside the checkpoint's /workspace. The host's HEAD and
    uncommitted state are staged on the controller (as for shipped seeding), streamed into the box,
    fetched into the clone, and then merged and overlaid exactly as on the local engine."""
    from . import _ship

    branch = _naming.box_branch(box)
    result.branch = branch
    depth, _adaptive = _ship.ship_depth()
    workdir = tempfile.mkdtemp(prefix="agentbox-restore-")
    jobs = []
    try:
        for number, repo in enumerate(repos):
            state = carry[repo.sub]
            staged = _ship.stage_repo(repo, RESTORE_HOST_BRANCH, state.stash, depth, workdir)
            source = f"/tmp/.agentbox-restore-{number}"
            provider.exec(box, ["mkdir", "-p", source], user="vscode").check(f"making {source}", box)
            _ship._upload(provider, box, source, tar_of_tree(staged.path), f"the host state of {repo.root}")
            jobs.append(
                {
                    "mode": "clone",
                    "sub": repo.sub,
                    "path": _ship.box_path(repo.sub),
                    "source": source,
                    "branch": branch,
                    "with_stash": bool(state.stash),
                    "untracked": state.untracked,
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _run_restore(provider, plan, box, repos, jobs, carry, result, {r.sub: r.root for r in repos}, True)
    _seed._finish(provider, box, None, result)
    return result


def _run_restore(
    provider: Provider,
    plan: RestorePlan,
    box: str,
    repos: list[_git.Repo],
    jobs: list[dict[str, Any]],
    carry: dict[str, _git.CarryOver],
    result: RestoreResult,
    host_roots: dict[str, str],
    owned_by_box: bool,
) -> None:
    """Run the in-box restore for every repo, then bring in the host's untracked files it lacks."""
    request = {"box": box, "checkpoint": plan.name, "worktrees_home": _seed.WORKTREES_HOME, "jobs": jobs}
    user = "vscode" if owned_by_box else "root"
    if not owned_by_box:
        result.warnings.append(
            f"a repository is not owned by uid {_seed.BOX_UID}: the restore ran as root, and commits made in the "
            f"box as vscode cannot write to it until it is owned by uid {_seed.BOX_UID}"
        )
    run = provider.exec(
        box,
        ["python3", "-c", RESTORE_SCRIPT],
        user=user,
        env=_identity(repos[0]),
        stdin=json.dumps(request).encode(),
    )
    if run.rc != 0:
        detail = (run.stderr or run.stdout).decode("utf-8", "replace").strip()[-2000:]
        raise CheckpointError(f"restoring the workspace from checkpoint {plan.name!r} failed: {detail}", box=box)
    asked = {job["sub"]: carry[job["sub"]].untracked for job in jobs}
    for outcome in restore_answer(run.stdout, asked, box):
        sub = outcome["sub"]
        host_root = host_roots[sub]
        state = carry[sub]
        label = sub or "."
        for conflict in outcome["conflicts"]:
            result.conflicts.append({"repo": label, **conflict})
        existing = outcome["untracked_existing"]
        blocked = set(outcome["untracked_blocked"])
        missing = [p for p in state.untracked if p not in existing and p not in blocked]
        identical = 0
        if missing:
            provider.put_archive(box, outcome["physical"], tar_of_paths(host_root, missing))
        if existing:
            paths = sorted(existing)
            hashed = (
                _git.git(
                    host_root,
                    "hash-object",
                    "--no-filters",
                    "--stdin-paths",
                    input_bytes="\n".join(paths).encode(),
                )
                .stdout.decode()
                .split()
            )
            for path, host_hash in zip(paths, hashed, strict=False):
                if host_hash == existing[path]:
                    identical += 1  # the box already has the host's file: carried, with nothing to copy
                if host_hash != existing[path]:
                    result.conflicts.append(
                        {
                            "repo": label,
                            "path": path,
                            "kind": "host-untracked",
                            "kept": "box",
                            "detail": "untracked on the host and different in the box",
                        }
                    )
        for path in sorted(blocked):
            result.conflicts.append(
                {
                    "repo": label,
                    "path": path,
                    "kind": "host-untracked",
                    "kept": "box",
                    "detail": "a parent of this path is a file in the box",
                }
            )
        result.merges.append({k: outcome[k] for k in ("sub", "merge", "merge_commit", "head", "seconds")})
        result.modified += state.modified
        result.deleted += state.deleted
        result.renamed += state.renamed
        result.untracked += len(missing) + identical
    for conflict in result.conflicts:
        result.warnings.append(
            f"restore conflict in {conflict['repo']}/{conflict['path']} ({conflict['kind']}): the box's version was kept"
        )
