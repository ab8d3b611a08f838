# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoints on a Docker engine: images (the engine side of checkpoints for DockerProvider).

A *layered* checkpoint is one `docker commit` layer over the box's image; a *flattened* one is the
box's filesystem exported and imported as a single layer (_image_flatten). The image labels
(io.agentbox.*, io.agentbox.kind=checkpoint) carry everything, so an engine alone tells which
checkpoints exist; the host manifest carries the same facts (_checkpoint_records). Each checkpoint's
commit is also kept alive by a ref refs/agentbox/checkpoints/<project>/<name> in the host
repositories (local engine), so deleting the source box's branch cannot lose it.

Same methods as the cloud snapshot store (_snapshot_store); _checkpoint calls either through
`provider.checkpoint_store()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from ...checkpoint._checkpoint_records import (
    DEFAULT_MAX_LAYERS,
    SCHEMA_VERSION,
    CapturePlan,
    Checkpoint,
    CheckpointError,
    agentbox_home,
    captured,
    checkpoints_dir,
    foreign,
    free_name,
    guard_secrets,
    in_box_head,
    manifest_path,
    next_number,
    parse_reference,
    project_default,
    read_manifest,
    record_number,
    run_cleanup,
    set_project_default,
    write_json,
)
from ...core import _naming
from ...core._provider import BoxFacts, BoxNotFound, Provider, worktree_records
from ...git import _git
from . import _ckpt_env
from ._engine_api import EngineAPIError
from ._image_flatten import flatten, image_or_none, own_env

CHECKPOINT_REF_PREFIX = "refs/agentbox/checkpoints/"
TEMP_TAG_MARK = ".partial-"
IMAGE_TYPES = ("layered", "flattened")

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
    CKPT + "made_by",
)


class _ImageSummary:
    """What a listing says of one image (id, tags, labels, size), in the shape of the SDK's Image.

    From one /images/json answer: the SDK's images.list() inspects each image again, and fails
    when any image goes away in between (other runs make and remove images all the time)."""

    def __init__(self, summary: dict[str, Any]):
        self.id = summary.get("Id", "")
        self.tags = [t for t in summary.get("RepoTags") or [] if t != "<none>:<none>"]
        self.labels = summary.get("Labels") or {}
        self.attrs = {"Size": summary.get("Size", 0)}


def _images(engine: Any, filters: dict[str, Any] | None = None) -> list[_ImageSummary]:
    return [_ImageSummary(summary) for summary in engine.images(filters)]


def _checkpoint_images(engine: Any, project: str | None = None) -> list[_ImageSummary]:
    filters = [_naming.label("kind") + "=checkpoint"]
    if project:
        filters.append(f"{_naming.label('project')}={project}")
    return _images(engine, {"label": filters})


# -- labels and records ----------------------------------------------------------------------------
def labels_to_record(labels: dict[str, str]) -> dict[str, Any]:
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
        "made_by": short.get(CKPT + "made_by", ""),
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


def record_to_labels(record: dict[str, Any]) -> dict[str, str]:
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
        CKPT + "made_by": record.get("made_by", ""),
    }
    return {_naming.label(key): value for key, value in values.items()}


def checkpoint_ref(project: str, name: str) -> str:
    return f"{CHECKPOINT_REF_PREFIX}{project}/{name}"


def _all_manifest_images() -> set[str]:
    root = os.path.join(agentbox_home(), "checkpoints")
    images: set[str] = set()
    for project in os.listdir(root) if os.path.isdir(root) else []:
        for name in os.listdir(os.path.join(root, project)) if os.path.isdir(os.path.join(root, project)) else []:
            if os.path.isfile(manifest_path(project, name)):
                images.add(_naming.checkpoint_image(project, name))
    return images


def worktree_heads(provider: Provider, facts: BoxFacts) -> list[dict[str, str]]:
    """[{sub, git_dir, path, branch, commit}] of the box's worktrees, read on the host (a box without
    git layers: its worktrees are registered in the host's .git)."""
    records = worktree_records(facts)
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


class ImageStore:
    """The checkpoints of one Docker engine, as images (see the module's docstring)."""

    def __init__(self, provider: Provider, engine: Callable[[], Any]):
        self.provider = provider
        self._engine = engine

    @property
    def engine(self) -> Any:
        """The provider's engine client: _engine_api's, or the SDK's behind the same methods (_engine_sdk)."""
        return self._engine()

    def _container(self, container: str) -> dict[str, Any]:
        """The container's inspect answer; BoxNotFound when it is gone."""
        attrs = self.engine.inspect_container(container)
        if attrs is None:
            raise BoxNotFound(f"no container {container} on engine {self.provider.engine}", operation="checkpoint")
        return attrs

    def host_mounts(self, box: str) -> list[str]:
        """Where host paths and volumes are mounted in the box: the cleanup must not reach them."""
        container = self._container(_naming.container_name(box))
        return [m["Destination"] for m in container.get("Mounts") or [] if m.get("Destination")]

    def find(self, project: str, name: str) -> Checkpoint | None:
        provider, engine = self.provider, self.engine
        image_ref = _naming.checkpoint_image(project, name)
        manifest = read_manifest(project, name)
        if foreign(provider, manifest):
            manifest = None  # that name is a checkpoint on another provider or engine
        image = image_or_none(engine, image_ref)
        if manifest is None and image is None:
            return None
        record = manifest or labels_to_record(image.labels or {})
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

    def list(self, project: str) -> list[Checkpoint]:
        """Every checkpoint of the project: manifests (broken ones too) and labelled images."""
        provider, engine = self.provider, self.engine
        found: dict[str, Checkpoint] = {}
        root = checkpoints_dir(project)
        for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            manifest = read_manifest(project, entry) if not entry.startswith(".") else None
            if manifest is None or foreign(provider, manifest):
                continue
            image = image_or_none(engine, _naming.checkpoint_image(project, entry))
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
        for image in _checkpoint_images(engine, project):
            for tag in image.tags:
                repo, _sep, name = tag.rpartition(":")
                if repo != repository or name in found or TEMP_TAG_MARK in name:
                    continue
                found[name] = Checkpoint(
                    name=name,
                    project=project,
                    image=tag,
                    record=labels_to_record(image.labels or {}),
                    has_manifest=False,
                    image_exists=True,
                    image_id=image.id,
                    size=int(image.attrs.get("Size", 0)),
                )
        return [found[name] for name in sorted(found)]

    def fingerprint(self, base_image: str) -> str | None:
        """What the base image is now: its fingerprint label, else its id; None when it is gone."""
        if not base_image:
            return None
        image = image_or_none(self.engine, base_image)
        if image is None:
            return None
        return (image.labels or {}).get(_naming.label("image_fingerprint")) or image.id

    # -- capture ----------------------------------------------------------------------------------------
    def box_image_labels(self, facts: BoxFacts) -> tuple[dict[str, str], str]:
        """(labels of the image the box runs, that image's id): how deep its checkpoint chain is."""
        image_id = self._container(facts.container).get("Image", "")
        image = image_or_none(self.engine, image_id) if image_id else None
        return ((image.labels or {}) if image is not None else {}), image_id

    def plan_capture(
        self, facts: BoxFacts, name: str | None, replace: bool, merged: bool = False, max_layers: int = DEFAULT_MAX_LAYERS
    ) -> CapturePlan:
        """Decide name, type and parents; validates everything before any side effect."""
        provider = self.provider
        if not facts.project:
            raise CheckpointError(f"box {facts.name!r} has no io.agentbox.project label: it was not made by agentbox")
        project = facts.project
        numbered = not name
        if name:
            name = parse_reference(name, project)
            if TEMP_TAG_MARK in name:
                raise CheckpointError(f"checkpoint names may not contain {TEMP_TAG_MARK!r}")
        else:
            taken = [c.name for c in self.list(project)]
            name = _naming.validate_checkpoint_name(f"{facts.name}-{next_number(project, facts.name, taken)}")
        existing = free_name(provider, name, read_manifest(project, name), lambda: self.find(project, name), replace,
                             shared_by="every provider and engine", kind="image")  # fmt: skip
        labels, _image_id = self.box_image_labels(facts)
        parent_record = labels_to_record(labels) if _naming.strip_labels(labels).get("kind") == "checkpoint" else None
        parents: list[str] = []
        source_layers = 0
        if parent_record:
            parents = [parent_record["name"], *parent_record.get("parents", [])]
            source_layers = int(parent_record.get("layers") or 0)
        flat = merged or source_layers >= max_layers
        return CapturePlan(
            facts=facts,
            name=name,
            type="flattened" if flat else "layered",
            image=_naming.checkpoint_image(project, name),
            parents=parents,
            layers=0 if flat else source_layers + 1,
            replaces=existing,
            numbered=numbered,
        )

    def capture(self, plan: CapturePlan, cleanup: bool = True) -> dict[str, Any]:
        """Take the checkpoint planned by plan_capture. Nothing half-made is left on failure."""
        provider, engine = self.provider, self.engine
        facts = plan.facts
        container = self._container(facts.container)
        config = container.get("Config") or {}
        running = facts.state == "running"
        warnings: list[str] = []
        timings: dict[str, float] = {}
        if running:
            guard_secrets(provider, facts, config.get("Env") or [])
        else:
            warnings.append(f"the box is {facts.state}: captured without the in-box cleanup (start it to have it run)")
        if plan.heads is not None:
            heads = plan.heads  # a box with git layers: its worktrees are in its layer, read by _checkpoint
        else:
            heads = worktree_heads(provider, facts) if provider.shares_host_filesystem else []
        if not heads and running and facts.branch:
            heads = in_box_head(provider, facts)
        box_labels, box_image_id = self.box_image_labels(facts)
        parent = _naming.strip_labels(box_labels)
        is_checkpoint_image = parent.get("kind") == "checkpoint"
        base_image = parent.get(CKPT + "base_image", "") if is_checkpoint_image else facts.image
        base_image_id = parent.get(CKPT + "base_image_id", "") if is_checkpoint_image else box_image_id
        fingerprint = facts.labels.get("image_fingerprint") or base_image_id
        record = plan.record(provider, heads, (base_image, base_image_id, fingerprint))
        labels = record_to_labels(record)
        if cleanup and running:
            mounts = [m["Destination"] for m in container.get("Mounts") or [] if m.get("Destination")]
            timings["cleanup_seconds"], warning = run_cleanup(provider, facts.name, mounts)
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
                own = own_env(engine, container)
                raw = f"{target}{TEMP_TAG_MARK}raw"
                env = _ckpt_env.image_env(config.get("Env") or [], own, blank_added=True)
                committed = provider.commit(facts.name, raw, labels, env=env)
                try:
                    # The box's env out of the image's config for good (see _ckpt_env); layers are shared.
                    image_id = _ckpt_env.without_container_config(engine, committed["id"], target, own)
                finally:
                    with contextlib.suppress(Exception):
                        engine.remove_image(raw)
                made = {"id": image_id, "size": committed["size"]}
            else:
                made = flatten(engine, facts, target, labels)
            timings["capture_seconds"] = time.monotonic() - started
            if target != plan.image:
                repository, _sep, tag = plan.image.rpartition(":")
                engine.tag_image(made["id"], repository, tag)
        finally:
            if target != plan.image:
                with contextlib.suppress(Exception):
                    engine.remove_image(target, noprune=False)
        if old_id and old_id != made["id"]:
            # Kept when a box still runs on it (the engine refuses); prune reaps it later.
            with contextlib.suppress(Exception):
                engine.remove_image(old_id)
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
                        checkpoint_ref(facts.project, plan.name),
                        head["commit"],
                    )
        return captured(plan, facts, record, made, timings, warnings)

    # -- removal, prune, restore ---------------------------------------------------------------------
    def remove(self, checkpoint: Checkpoint) -> dict[str, Any]:
        """Delete the checkpoint's image tag, its manifest and its commit refs."""
        provider = self.provider
        removed: dict[str, Any] = {"image": None, "manifest": None, "refs": []}
        if checkpoint.image_exists:
            try:
                self.engine.remove_image(checkpoint.image)
            except EngineAPIError as exc:
                raise CheckpointError(
                    f"could not remove image {checkpoint.image}: {exc.message}. "
                    "Destroy the boxes that run on it first (agentbox_box_info lists them)"
                ) from exc
            removed["image"] = checkpoint.image
        if foreign(provider, read_manifest(checkpoint.project, checkpoint.name)):
            # A copy of another engine's checkpoint (copy_to): its manifest and refs are that engine's.
            return removed
        for worktree in checkpoint.record.get("worktrees") or []:
            git_dir = worktree.get("git_dir")
            if git_dir and os.path.isdir(git_dir):
                ref = checkpoint_ref(checkpoint.project, checkpoint.name)
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

    def copy_to(self, checkpoint: Checkpoint, destination: Provider, *, compress: bool = True) -> dict[str, Any]:
        """Copy the checkpoint's image to another remote engine, where boxes can start from it (the image's
        labels carry its record; the manifest stays this engine's). What copy_image reports."""
        if checkpoint.broken:
            raise CheckpointError(f"checkpoint {checkpoint.name!r} is broken (its image is gone from engine "
                                  f"{self.provider.engine}): nothing to copy")
        if not (self.provider.transfers_images and destination.transfers_images):
            # A local engine's checkpoint holds a worktree of this machine's repository, a remote one a clone.
            raise CheckpointError(
                "copy_to copies a checkpoint between remote engines (provider docker_ssh on both sides): a "
                "checkpoint of the local engine cannot start boxes elsewhere; take one on the remote engine")
        if destination.engine == self.provider.engine:
            raise CheckpointError(f"copy_to names the checkpoint's own engine {destination.engine}: name another")
        from . import _image_transfer  # only copies need it

        return _image_transfer.copy_image(self.provider, destination, checkpoint.image, compress=compress).to_dict()

    def prune(self, check_mode: bool = False, project: str | None = None) -> dict[str, Any]:
        """Remove agentbox-ckpt-* images (and dangling checkpoint images) no box and no manifest refers to.

        With `project`, only that project's images are considered.
        """
        engine = self.engine
        # Each container inspected, as the SDK's containers.list did: the listing's Image is not its
        # Config.Image once that tag has moved. One gone in between is no longer there to keep anything.
        containers = [c for c in (engine.inspect_container(s["Id"]) for s in engine.containers([])) if c is not None]
        # A box refers to its checkpoint by tag (its Config.Image); an untagged image only by id.
        used_ids = {c.get("Image") for c in containers}
        used_refs = {(c.get("Config") or {}).get("Image") for c in containers}
        kept_by_manifest = _all_manifest_images()
        candidates: list[tuple[str, str]] = []  # (reference to remove, image id)
        seen: set[str] = set()
        for image in _images(engine) + _checkpoint_images(engine):
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
                try:
                    engine.remove_image(reference)
                except EngineAPIError as exc:
                    failed.append({"image": reference, "id": image_id, "error": exc.message})
                    continue
            removed.append({"image": reference, "id": image_id})
        return {"removed": removed, "failed": failed}

    def restorable(self, project: str, checkpoint_name: str) -> Checkpoint:
        """Validate a checkpoint for a new box of `project`; unknown, foreign or broken ones fail here."""
        provider = self.provider
        name = parse_reference(checkpoint_name, project)
        found = self.find(project, name)
        if found is None:
            elsewhere = []
            for image in _checkpoint_images(self.engine):
                record = labels_to_record(image.labels or {})
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
        return found
