"""Snapshot routes of the emulated control plane: a sandbox's snapshot, snapshots from an image or a
Dockerfile, get/list/delete, (de)activation, and removing the images of deleted snapshots."""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from typing import TYPE_CHECKING, Any

from . import habits
from .docker_backend import BackendError, docker_name
from .errors import ApiError
from .records import SnapshotRecord
from .request_params import optional_int, page_limit, query_int, query_str

if TYPE_CHECKING:
    from .core import Emulator

LOG = logging.getLogger("daytona_emulator")


class SnapshotApi:
    """Mixed into Emulator (core.py), whose state, lock and transition engine it uses."""

    def _reserve_snapshot_name(self: Emulator, name: Any) -> str:
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, "name must be a non-empty string")
        # Names are unique per organisation among the snapshots that exist (a unique index on name and
        # organisation); a deleted snapshot's name is free again.
        if name in self.used_snapshot_names:
            raise ApiError(409, f"Snapshot with name {name} already exists")
        self.used_snapshot_names.add(name)
        return name

    def _snapshot_tag(self: Emulator, name: str) -> tuple[str, str]:
        # A tag of its own per snapshot: a name used again must not retag an image a sandbox still runs on.
        return f"daytona-snapshot/{docker_name(name)}", f"{self.config.instance_id}-{secrets.token_hex(4)}"

    def snapshot_sandbox(self: Emulator, id_or_name: str, body: Any) -> dict[str, Any]:
        sb = self.find(id_or_name)
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        with self.lock:
            self.require_settled(sb)
            if sb.state not in ("started", "stopped"):
                raise ApiError(400, f"Sandbox must be started or stopped to create a snapshot, it is {sb.state}")
            name = self._reserve_snapshot_name(body.get("name"))
            previous_state = sb.state
            repository, tag = self._snapshot_tag(name)
            snap = SnapshotRecord(
                id=str(uuid.uuid4()), name=name, image_ref=f"{repository}:{tag}", owned=True, state="pending",
                cpu=sb.cpu, gpu=sb.gpu, mem=sb.memory, disk=sb.disk, source_sandbox_id=sb.id,
                entrypoint=sb.entrypoint, user=sb.user, sandbox_class=sb.sandbox_class, regions=[sb.target],
            )
            # As on Daytona (v0.190): the snapshot exists only once the capture has ended (the runner's commit
            # and push); until then get/list do not know it. A failed capture makes no snapshot at all.

        def work() -> None:
            assert sb.container_id
            info = self.backend.commit(sb.container_id, repository, tag, snap.id, sb.restore_changes)
            snap.size = info.size_gib

        def finish() -> None:
            sb.state = previous_state
            snap.state = "active"
            snap.created = snap.updated = time.time()
            self.snapshots[snap.id] = snap
            sb.mark_activity()

        def fail(error: Exception) -> None:
            sb.state = previous_state
            self.used_snapshot_names.discard(name)
            self.images_to_remove.add(snap.image_ref)

        return self.transition(sb, "snapshotting", sb.desired_state, work, finish, fail)

    def create_snapshot(self: Emulator, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        image_name = body.get("imageName")
        build_info = body.get("buildInfo")
        if (image_name is None) == (build_info is None):
            raise ApiError(400, "Specify exactly one of imageName and buildInfo")
        entrypoint = body.get("entrypoint")
        if entrypoint is not None and not (isinstance(entrypoint, list) and all(isinstance(e, str) for e in entrypoint)):
            raise ApiError(400, "entrypoint must be a list of strings")
        sizes = {key: optional_int(body, key, minimum=0) for key in ("cpu", "memory", "disk", "gpu")}
        sandbox_class = body.get("sandboxClass") or "container"
        if sandbox_class not in ("container", "linux-vm", "windows"):
            raise ApiError(400, "sandboxClass must be container, linux-vm or windows")
        with self.lock:
            name = self._reserve_snapshot_name(body.get("name"))
        snap = SnapshotRecord(
            id=str(uuid.uuid4()), name=name, image_ref="", owned=False, state="pending",
            cpu=sizes["cpu"] or 1, mem=sizes["memory"] or 1, disk=sizes["disk"] or 3, gpu=sizes["gpu"] or 0,
            entrypoint=entrypoint, sandbox_class=sandbox_class,
        )
        if image_name is not None:
            if not isinstance(image_name, str) or not image_name:
                raise ApiError(400, "imageName must be a non-empty string")
            snap.image_ref = image_name
            info = self.backend.image_info(image_name)
            if info is None:
                snap.state = "error"
                snap.error_reason = (f"image {image_name} is not in the local Docker engine and the emulator "
                                     "cannot pull it")
            else:
                snap.state = "active"
                snap.size = info.size_gib
        else:
            if not isinstance(build_info, dict) or not isinstance(build_info.get("dockerfileContent"), str):
                raise ApiError(400, "buildInfo.dockerfileContent must be a string")
            snap.dockerfile = build_info["dockerfileContent"]
            repository, tag = self._snapshot_tag(name)
            snap.image_ref = f"{repository}:{tag}"
            snap.owned = True
            try:
                self.backend.build_image(snap.dockerfile, snap.image_ref)
                info = self.backend.image_info(snap.image_ref)
                snap.state = "active"
                snap.size = info.size_gib if info else None
            except BackendError as exc:
                snap.state = "build_failed"
                snap.error_reason = str(exc)
        with self.lock:
            self.snapshots[snap.id] = snap
            return self.snapshot_dto(snap)

    def get_snapshot(self: Emulator, id_or_name: str) -> dict[str, Any]:
        snap = self.find_snapshot(id_or_name)
        if snap is None:
            raise ApiError(404, f"Snapshot {id_or_name} not found")
        with self.lock:
            return self.snapshot_dto(snap)

    def list_snapshots(self: Emulator, query: dict[str, list[str]]) -> dict[str, Any]:
        page = query_int(query, "page", 1, minimum=1)
        limit = page_limit(query, 100)
        name = query_str(query, "name")
        source = query_str(query, "sourceSandboxId")
        with self.lock:
            items = [snap for snap in self.snapshots.values()
                     if (not name or name in snap.name) and (not source or snap.source_sandbox_id == source)]
            items.sort(key=lambda snap: snap.created, reverse=True)
            total = len(items)
            chunk = items[(page - 1) * limit: page * limit]
            return {"items": [self.snapshot_dto(snap) for snap in chunk], "total": total, "page": page,
                    "totalPages": max(1, -(-total // limit))}

    def delete_snapshot(self: Emulator, id_or_name: str) -> None:
        snap = self.find_snapshot(id_or_name)
        if snap is None:
            raise ApiError(404, f"Snapshot {id_or_name} not found")
        if snap.general:
            raise ApiError(403, "General snapshots cannot be deleted")
        with self.lock:
            self.snapshots.pop(snap.id, None)
            self.used_snapshot_names.discard(snap.name)
            if snap.owned:
                self.images_to_remove.add(snap.image_ref)
        self.remove_released_images()

    def set_snapshot_active(self: Emulator, id_or_name: str, active: bool) -> dict[str, Any]:
        snap = self.find_snapshot(id_or_name)
        if snap is None:
            raise ApiError(404, f"Snapshot {id_or_name} not found")
        if active:
            return habits.activate_snapshot(self, snap)
        with self.lock:
            snap.state = "inactive"
            snap.updated = time.time()
            return self.snapshot_dto(snap)

    def remove_released_images(self: Emulator) -> None:
        """Deleted snapshots' images go once no container uses them any more."""
        with self.lock:
            in_use = {sb.image for sb in self.sandboxes.values() if sb.state != "destroyed"}
            pending = [ref for ref in self.images_to_remove if ref not in in_use]
        for ref in pending:
            # No sandbox uses it any more; a conflict now is the engine still finishing a container removal.
            for _attempt in range(10):
                try:
                    removed = self.backend.remove_image(ref)
                except Exception as exc:  # noqa: BLE001 - retried at the next delete and at cleanup
                    LOG.warning("could not remove image %s: %s", ref, exc)
                    break
                if removed:
                    with self.lock:
                        self.images_to_remove.discard(ref)
                    break
                time.sleep(0.3)
