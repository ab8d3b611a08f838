# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoints on boxd: boxd snapshots, through the shared snapshot store (_snapshot_store).

A boxd snapshot is taken of the running machine (no stop, the box's processes keep running) and a new box
is made from it with `machines.create(from_snapshot=...)`. A snapshot is versioned: saving an existing name
captures a new version of it (so a capture never reuses a name, _snapshot_store), `version` is the latest
ready one, and `status` is pending, ready or failed; boxd may archive a snapshot to object storage, and
makes no machine from it until an operator unarchives it. Snapshots, not `machines.checkpoints`: those
restore in place and die with their machine, and a checkpoint here restores into a new box. The SDK
documents a snapshot as memory + disk (not checked against production); the emulator keeps the disk
only, and a restored box runs its start sequence like any new box either way (docs/providers/boxd.md).
"""

from __future__ import annotations

import re
from typing import Any

from ...core._provider import BoxFacts, BoxNotFound, Provider
from .._snapshot_store import SnapshotCheckpoints, snapshot_name
from ._boxd_api import call

# boxd names: lowercase letters, digits and '-', at most 63: the checkpoint part is cleaned and cut.
CHECKPOINT_PART = 23


class BoxdCheckpoints(SnapshotCheckpoints):
    kind = "boxd"
    cloud = "boxd"

    def __init__(self, provider: Provider):
        super().__init__(provider)
        self.settings = provider.settings  # type: ignore[attr-defined]

    def _call(self, fn: Any, operation: str) -> Any:
        return call(fn, self.settings.base_url, box=None, operation=operation, read=True)

    def snapshot(self, image: str) -> Any | None:
        try:
            return self._call(lambda: self.provider.sdk.snapshots.get(image, org=self.settings.org),  # type: ignore[attr-defined]
                              f"snapshot lookup of {image!r}")
        except BoxNotFound:
            return None

    def snapshots(self, prefix: str) -> list[Any]:
        found = self._call(lambda: self.provider.sdk.snapshots.list(org=self.settings.org), "list snapshots")  # type: ignore[attr-defined]
        return [s for s in found if (s.name or "").startswith(prefix)]

    def delete_snapshot(self, image: str) -> bool:
        try:
            call(lambda: self.provider.sdk.snapshots.delete(image, org=self.settings.org),  # type: ignore[attr-defined]
                 self.settings.base_url, box=None, operation=f"delete of snapshot {image!r}")
        except BoxNotFound:
            return False
        return True

    def usable(self, snapshot: Any | None) -> bool:
        """A machine can be made from it: a version was captured (`version` is the latest ready one; a new
        version being captured or failed leaves it), and it is on a worker's disk (boxd makes no machine from
        an archived snapshot until an operator unarchives it)."""
        return snapshot is not None and not getattr(snapshot, "archived", False) and snapshot.version is not None

    def unusable_reason(self, snapshot: Any | None) -> str | None:
        if snapshot is None or self.usable(snapshot):
            return None
        if getattr(snapshot, "archived", False):
            return (f"boxd has archived snapshot {snapshot.name} (storage: {snapshot.storage}), and makes no machine "
                    "from an archived snapshot until an operator unarchives it: ask boxd to unarchive it, or "
                    "remove the checkpoint and take a new one")
        if (snapshot.status or "").lower() == "failed":
            return f"snapshot {snapshot.name} failed on boxd and holds no captured version: remove the checkpoint"
        return f"snapshot {snapshot.name} holds no captured version yet ({snapshot.status}): try again once it is ready"

    def size_bytes(self, snapshot: Any | None) -> int:
        return int(getattr(snapshot, "size_bytes", 0) or 0)

    def snapshot_name(self, project: str, name: str) -> str:
        clean = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:CHECKPOINT_PART].strip("-") or "ckpt"
        return snapshot_name(project, clean)

    def prepare_capture(self, facts: BoxFacts) -> tuple[list[str], list[str], dict[str, Any]]:
        # A live snapshot: the box keeps running; its env holds no secrets (they live on a tmpfs).
        return [], [], {}
