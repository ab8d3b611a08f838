# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoints on boxd: boxd snapshots, through the shared snapshot store (_snapshot_store).

A boxd snapshot is taken of the running machine (no stop, the box's processes keep running) and a new box
is made from it with `machines.create(from_snapshot=...)`. Snapshots, not `machines.checkpoints`: those
restore in place and die with their machine, and a checkpoint here restores into a new box. The SDK
documents a snapshot as memory + disk (not checked against production); the emulator keeps the disk
only, and a restored box runs its start sequence like any new box either way (docs/providers/boxd.md).
"""

from __future__ import annotations

import re
from typing import Any

from ._boxd_api import call
from ._provider import BoxFacts, BoxNotFound, Provider
from ._snapshot_store import SnapshotCheckpoints, snapshot_name

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
        return snapshot is not None and (snapshot.status or "ready").lower() not in ("failed", "deleting")

    def size_bytes(self, snapshot: Any | None) -> int:
        return int(getattr(snapshot, "size_bytes", 0) or 0)

    def snapshot_name(self, project: str, name: str) -> str:
        clean = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:CHECKPOINT_PART].strip("-") or "ckpt"
        return snapshot_name(project, clean)

    def prepare_capture(self, facts: BoxFacts) -> tuple[list[str], list[str], dict[str, Any]]:
        # A live snapshot: the box keeps running; its env holds no secrets (they live on a tmpfs).
        return [], [], {}
