# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoints as a cloud's snapshots (Daytona, boxd): the engine side _checkpoint calls through a
provider's `checkpoint_store()`, written once. A subclass says how its cloud names, finds, lists and
deletes snapshots and what to check before a capture; the manifests, numbering, listing, restore plan,
capture record, removal and prune are the same for both.

Manifests are per provider, not per engine: one of another engine (another Daytona API, another
boxd org) is not a checkpoint here, and its name is taken (as on the Docker engines, _image_store).

Snapshot names carry the project and a nonce, `agentbox-ckpt-<project>-<checkpoint>-<8 hex>`, and the host
manifest maps the checkpoint name to it: a checkpoint taken again under its name (replace) is captured next
to the old snapshot, which goes only once the new one is made, and boxd would save a new version over a
name that exists, not make a new snapshot.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import time
from typing import Any

from ..checkpoint._checkpoint_records import (
    CapturePlan,
    Checkpoint,
    CheckpointError,
    agentbox_home,
    captured,
    foreign,
    free_name,
    guard_secrets,
    in_box_head,
    next_number,
    parse_reference,
    project_default,
    read_json,
    record_number,
    run_cleanup,
    set_project_default,
    write_json,
)
from ..core import _naming
from ..core._naming import CHECKPOINT_IMAGE_PREFIX
from ..core._provider import BoxFacts, Provider, ProviderError

SNAPSHOT_NAME_PATTERN = re.compile(rf"^{re.escape(CHECKPOINT_IMAGE_PREFIX)}([0-9a-f]{{16}})-(.+)-([0-9a-f]{{8}})$")


def snapshot_name(project: str, checkpoint: str, nonce: str | None = None) -> str:
    """Cloud-side name of a checkpoint: a fresh one each capture, so it carries a nonce."""
    return f"{CHECKPOINT_IMAGE_PREFIX}{project}-{checkpoint}-{nonce or secrets.token_hex(4)}"


def parse_snapshot_name(name: str) -> tuple[str, str] | None:
    """(project, checkpoint) of a checkpoint snapshot name, or None."""
    match = SNAPSHOT_NAME_PATTERN.match(name or "")
    return (match.group(1), match.group(2)) if match else None


class SnapshotCheckpoints:
    """The engine side of checkpoints on a cloud whose checkpoints are its own snapshots."""

    #: the provider's name: manifests live under ~/.agentbox/<kind>/checkpoints, records say it
    kind = ""
    #: how messages name the cloud
    cloud = ""

    def __init__(self, provider: Provider):
        self.provider = provider

    # -- what a subclass says about its cloud ---------------------------------------------------------
    def snapshot(self, image: str) -> Any | None:
        """The snapshot called `image` (with .name and .id), or None."""
        raise NotImplementedError

    def snapshots(self, prefix: str) -> list[Any]:
        raise NotImplementedError

    def delete_snapshot(self, image: str) -> bool:
        raise NotImplementedError

    def usable(self, snapshot: Any | None) -> bool:
        return snapshot is not None

    def unusable_reason(self, snapshot: Any | None) -> str | None:
        """Why a snapshot that exists cannot be restored from (None: it can, or it does not exist)."""
        return None

    def size_bytes(self, snapshot: Any | None) -> int:
        return 0

    def snapshot_name(self, project: str, name: str) -> str:
        return snapshot_name(project, name)

    def host_mounts(self, box: str) -> list[str]:
        """Nothing of the host is mounted in a cloud box."""
        return []

    def prepare_capture(self, facts: BoxFacts) -> tuple[list[str], list[str], dict[str, Any]]:
        """(warnings, the box's env as KEY=VALUE for the secrets guard, extra record fields), or a refusal."""
        return [], [], {}

    # -- manifests ------------------------------------------------------------------------------------
    def manifests_dir(self, project: str) -> str:
        """Apart from the Docker checkpoints' manifests, whose names they may share."""
        return os.path.join(agentbox_home(), self.kind, "checkpoints", project)

    def manifest_path(self, project: str, name: str) -> str:
        return os.path.join(self.manifests_dir(project), name, "manifest.json")

    def _checkpoint(self, project: str, name: str, record: dict[str, Any] | None, snapshot: Any | None) -> Any:
        image = (record or {}).get("image") or (snapshot.name if snapshot is not None else "")
        return Checkpoint(
            name=name,
            project=project,
            image=image,
            record=record or self._minimal_record(project, name, image),
            has_manifest=record is not None,
            image_exists=self.usable(snapshot),
            image_id=snapshot.id if snapshot is not None else "",
            size=self.size_bytes(snapshot) if snapshot is not None else 0,
        )

    def find(self, project: str, name: str) -> Any:
        record = read_json(self.manifest_path(project, name))
        if foreign(self.provider, record):
            return None  # that name is a checkpoint on another engine of this provider
        if record is not None:
            snapshot = self.snapshot(record.get("image", "")) if record.get("image") else None
            return self._checkpoint(project, name, record, snapshot)
        for snapshot in self.snapshots(f"{CHECKPOINT_IMAGE_PREFIX}{project}-"):
            if parse_snapshot_name(snapshot.name) == (project, name):
                return self._checkpoint(project, name, None, snapshot)
        return None

    def list(self, project: str) -> list[Any]:
        found: dict[str, Any] = {}
        snapshots = {s.name: s for s in self.snapshots(f"{CHECKPOINT_IMAGE_PREFIX}{project}-")}
        root = self.manifests_dir(project)
        for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            record = read_json(self.manifest_path(project, entry)) if not entry.startswith(".") else None
            if record is not None and not foreign(self.provider, record):
                found[entry] = self._checkpoint(project, entry, record, snapshots.get(record.get("image", "")))
        referenced = {c.image for c in found.values()}
        for snapshot in snapshots.values():
            parsed = parse_snapshot_name(snapshot.name)
            if parsed and parsed[1] not in found and snapshot.name not in referenced:
                found[parsed[1]] = self._checkpoint(project, parsed[1], None, snapshot)
        return [found[name] for name in sorted(found)]

    def restorable(self, project: str, checkpoint_name: str) -> Checkpoint:
        """The checkpoint a new box of `project` may start from; unknown or broken ones fail here."""
        name = parse_reference(checkpoint_name, project)
        found = self.find(project, name)
        if found is None:
            raise CheckpointError(
                f"no checkpoint {name!r} in this project on {self.cloud} ({self.provider.engine}): list them with "
                f"agentbox.box.agentbox_checkpoint_info (provider: {self.kind}), or pass checkpoint: none to start "
                "fresh"
            )
        if found.broken:
            reason = self.unusable_reason(self.snapshot(found.image)) if found.image else None
            if reason:
                raise CheckpointError(f"checkpoint {name!r} cannot be restored: {reason}")
            raise CheckpointError(
                f"checkpoint {name!r} is broken: its manifest exists but snapshot {found.image} is gone from "
                f"{self.cloud}. Remove it (agentbox_checkpoint state=absent) and take a new one"
            )
        return found

    def fingerprint(self, base_image: str) -> str | None:
        snapshot = self.snapshot(base_image) if base_image else None
        return snapshot.id if snapshot is not None else None

    def plan_capture(
        self, facts: BoxFacts, name: str | None, replace: bool, merged: bool = False, max_layers: int = 0
    ) -> CapturePlan:
        """Name and parents of a snapshot (`merged` and `max_layers` are for image layers: none here)."""
        if not facts.project:
            raise CheckpointError(
                f"box {facts.name!r} has no io.agentbox.project label: it was not made by agentbox"
            )
        project = facts.project
        numbered = not name
        if name:
            name = parse_reference(name, project)
        else:
            root = self.manifests_dir(project)
            # Names on this provider's other engines are taken too: their manifests live here.
            taken = [c.name for c in self.list(project)] + (os.listdir(root) if os.path.isdir(root) else [])
            name = _naming.validate_checkpoint_name(
                f"{facts.name}-{next_number(project, facts.name, taken)}"
            )
        elsewhere = read_json(self.manifest_path(project, name))
        existing = free_name(self.provider, name, elsewhere, lambda: self.find(project, name), replace,
                             shared_by=f"every engine of {self.cloud}", kind="snapshot")  # fmt: skip
        parent = facts.checkpoint
        parent_record = read_json(self.manifest_path(project, parent)) if parent else None
        parents = [parent, *((parent_record or {}).get("parents") or [])] if parent else []
        return CapturePlan(
            facts=facts,
            name=name,
            type="snapshot",
            image=self.snapshot_name(project, name),
            parents=parents,
            layers=0,
            replaces=existing,
            numbered=numbered,
        )

    def capture(self, plan: Any, cleanup: bool = True) -> dict[str, Any]:
        provider = self.provider
        facts = plan.facts
        running = facts.state == "running"
        warnings, env, extra = self.prepare_capture(facts)
        if not running:
            warnings = [f"the box is {facts.state}: captured without the in-box cleanup"]
        timings: dict[str, float] = {}
        heads: list[dict[str, str]] = []
        if running:
            guard_secrets(provider, facts, env)
            if facts.branch:
                heads = in_box_head(provider, facts)
            if cleanup:
                timings["cleanup_seconds"], warning = run_cleanup(provider, facts.name, [])
                if warning:
                    warnings.append(warning)
        base_image = facts.labels.get("image") or facts.image
        parent_record = None
        if facts.checkpoint:
            parent_record = read_json(self.manifest_path(facts.project, facts.checkpoint))
        if parent_record:
            base_image = parent_record.get("base_image") or base_image
        # A snapshot plan is of type "snapshot" with 0 layers (plan_capture).
        base = (base_image, "", self.fingerprint(base_image) or "")
        record = plan.record(provider, heads, base, {"provider": self.kind, **extra})
        started = time.monotonic()
        made = provider.commit(facts.name, plan.image, {})
        timings["capture_seconds"] = time.monotonic() - started
        record["image_id"] = made["id"]
        write_json(self.manifest_path(facts.project, plan.name), record)
        if plan.replaces and plan.replaces.image and plan.replaces.image != plan.image:
            try:
                self.delete_snapshot(plan.replaces.image)
            except ProviderError as exc:
                warnings.append(f"the replaced snapshot {plan.replaces.image} could not be deleted: {exc}")
        if plan.numbered:
            record_number(facts.project, facts.name, plan.name)
        return captured(plan, facts, record, made, timings, warnings)

    def remove(self, checkpoint: Any) -> dict[str, Any]:
        removed: dict[str, Any] = {"image": None, "manifest": None, "refs": []}
        if checkpoint.image:
            try:
                if self.delete_snapshot(checkpoint.image):
                    removed["image"] = checkpoint.image
            except ProviderError as exc:
                raise CheckpointError(
                    f"could not delete snapshot {checkpoint.image}: {exc}. Destroy the boxes that run on it first"
                ) from exc
        directory = os.path.dirname(self.manifest_path(checkpoint.project, checkpoint.name))
        if os.path.isdir(directory):
            shutil.rmtree(directory)
            removed["manifest"] = os.path.join(directory, "manifest.json")
        if project_default(self.provider, checkpoint.project) == checkpoint.name:
            set_project_default(checkpoint.project, None, provider=self.provider)
            removed["default_cleared"] = True
        return removed

    def prune(self, check_mode: bool = False, project: str | None = None) -> dict[str, Any]:
        """Checkpoint snapshots that no manifest refers to (of one project when given)."""
        prefix = f"{CHECKPOINT_IMAGE_PREFIX}{project}-" if project else CHECKPOINT_IMAGE_PREFIX
        kept: set[str] = set()
        root = os.path.dirname(self.manifests_dir("x"))
        for owner in os.listdir(root) if os.path.isdir(root) else []:
            for entry in os.listdir(os.path.join(root, owner)):
                record = read_json(self.manifest_path(owner, entry)) if not entry.startswith(".") else None
                if record and record.get("image"):
                    kept.add(record["image"])
        removed: list[dict[str, str]] = []
        failed: list[dict[str, str]] = []
        for snapshot in self.snapshots(prefix):
            if snapshot.name in kept or parse_snapshot_name(snapshot.name) is None:
                continue
            if not check_mode:
                try:
                    self.delete_snapshot(snapshot.name)
                except ProviderError as exc:
                    failed.append({"image": snapshot.name, "id": snapshot.id, "error": str(exc)})
                    continue
            removed.append({"image": snapshot.name, "id": snapshot.id})
        return {"removed": removed, "failed": failed}

    def _minimal_record(self, project: str, name: str, image: str) -> dict[str, Any]:
        """What a snapshot alone tells (its manifest is gone): enough to list, restore or remove it."""
        return {
            "schema": None, "name": name, "type": "snapshot", "image": image, "provider": self.kind,
            "project": project, "workspace": "", "parents": [], "layers": 0, "source_box": "", "source_box_id": "",
            "branch": "", "commit": "", "worktrees": [], "base_image": "", "base_image_id": "",
            "base_fingerprint": "", "collection_version": "", "engine": self.kind, "created": "",
        }
