"""Sandbox lifecycle routes of the emulated control plane: create (with its image build), start, pause,
stop, archive, delete and recover, each a transition of the sandbox (Emulator.transition, core.py)."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
import uuid
from typing import TYPE_CHECKING, Any

from . import habits
from .docker_backend import BackendError
from .errors import ApiError
from .records import BuildFailed, SandboxRecord, iso
from .request_params import optional_int, str_map

if TYPE_CHECKING:
    from .core import Emulator

DEFAULT_ARCHIVE_MINUTES = 7 * 24 * 60
DEFAULT_STOP_MINUTES = 15
_HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class SandboxLifecycle:
    """Mixed into Emulator (core.py), whose state, lock and transition engine it uses."""

    def create_sandbox(self: Emulator, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ApiError(400, "name must be a non-empty string")
        labels = str_map(body.get("labels"), "labels")
        env = str_map(body.get("env"), "env")
        for key in ("autoStopInterval", "autoArchiveInterval", "autoPauseInterval", "ttlMinutes"):
            optional_int(body, key, minimum=0)
        optional_int(body, "autoDeleteInterval", minimum=-1)
        resources = {key: optional_int(body, key, minimum=0) for key in ("cpu", "memory", "disk", "gpu")}
        target = body.get("target") or self.config.target
        if target not in self.config.regions:
            raise ApiError(404, "Region not found")
        snapshot_ref = body.get("snapshot")
        build_info = body.get("buildInfo")
        dockerfile: str | None = None
        entrypoint: list[str] | None = None
        snapshot_user: str | None = None
        sandbox_class = "container"

        if snapshot_ref is not None and build_info is not None:
            raise ApiError(400, "Cannot specify both a snapshot and build info")
        if build_info is not None:
            if not isinstance(build_info, dict) or not isinstance(build_info.get("dockerfileContent"), str):
                raise ApiError(400, "buildInfo.dockerfileContent must be a string")
            dockerfile = build_info["dockerfileContent"]
            image = _from_only(dockerfile) or ""
            snapshot_name = None
            size = {"cpu": 1, "memory": 1, "disk": 3, "gpu": 0}
            size.update({key: value for key, value in resources.items() if value is not None})
        else:
            if snapshot_ref is not None and any(resources[key] for key in ("cpu", "memory", "disk")):
                raise ApiError(400, "Cannot specify Sandbox resources when using a snapshot")
            ref = snapshot_ref if snapshot_ref is not None else self.config.snapshot_name
            if not isinstance(ref, str):
                raise ApiError(400, "snapshot must be a string")
            snap = self.find_snapshot(ref)
            if snap is None:
                raise ApiError(400, f"Snapshot {ref} not found. Did you add it through the Daytona Dashboard?")
            if snap.state != "active":
                raise ApiError(400, f"Snapshot {ref} is {snap.state}")
            if snap.regions and target not in snap.regions:
                raise ApiError(400, f"Snapshot {ref} is not available in region {target}")
            if self.backend.image_info(snap.image_ref) is None:
                raise ApiError(400, f"Snapshot {ref}: image {snap.image_ref} is not in the local Docker engine and "
                                    "the emulator cannot pull; build it, or start the emulator with --image")
            image = snap.image_ref
            snapshot_name = snap.name
            snapshot_user = snap.user
            sandbox_class = snap.sandbox_class
            entrypoint = snap.entrypoint
            size = {"cpu": snap.cpu, "memory": snap.mem, "disk": snap.disk, "gpu": snap.gpu}
            with self.lock:
                snap.last_used = time.time()

        user = body.get("user")
        if user is not None and (not isinstance(user, str) or not user):
            raise ApiError(400, "user must be a non-empty string")
        if not user:
            info = self.backend.image_info(image) if image else None
            user = (snapshot_user or self.config.default_user or (info.user if info and info.user else "")
                    or "root")
        allow_list = body.get("networkAllowList")
        if allow_list is not None:
            habits.check_network_allow_list(allow_list)
        volumes = body.get("volumes") or []
        if not isinstance(volumes, list):
            raise ApiError(400, "volumes must be a list")

        sandbox_id = str(uuid.uuid4())
        now = time.time()
        record = SandboxRecord(
            id=sandbox_id, name=name or sandbox_id, user=user, env=env, labels=labels,
            public=bool(body.get("public", False)), target=target,
            cpu=size["cpu"], gpu=size.get("gpu") or 0, memory=size["memory"], disk=size["disk"],
            snapshot=snapshot_name, image=image, entrypoint=entrypoint,
            auto_stop=body.get("autoStopInterval", DEFAULT_STOP_MINUTES),
            auto_archive=body.get("autoArchiveInterval", DEFAULT_ARCHIVE_MINUTES),
            auto_delete=body.get("autoDeleteInterval", -1),
            volumes=volumes, network_block_all=bool(body.get("networkBlockAll", False)), network_allow_list=allow_list,
            sandbox_class=sandbox_class,
            build_info=None, dockerfile=dockerfile, ttl_minutes=body.get("ttlMinutes") or None,
        )
        if dockerfile is not None:
            record.build_info = {
                "dockerfileContent": dockerfile, "contextHashes": build_info.get("contextHashes") or [],
                "createdAt": iso(now), "updatedAt": iso(now),
                "snapshotRef": image or f"daytona-emulator-build/{_digest(dockerfile)}",
            }
        record.state = "unknown"  # the entity's default until the runner picks it up
        with self.lock:
            if any(sb.name == record.name for sb in self.sandboxes.values()):
                raise ApiError(409, f"Sandbox with name {record.name} already exists")
            self.sandboxes[sandbox_id] = record
            self.events.publish("sandbox.created", self.sandbox_dto(record))

        def work() -> None:
            self._provision(record)

        def finish() -> None:
            record.state = "started"
            record.mark_activity()

        def fail(error: Exception) -> None:
            record.state = "build_failed" if isinstance(error, BuildFailed) else "error"
            record.error_reason = str(error)
            record.recoverable = False

        answer = self.transition(record, "creating", "started", work, finish, fail, lifecycle=True, insert=True)
        # The list index catches up list_lag_seconds after the create answered (eventual consistency).
        record.listed_from = time.monotonic() + self.config.list_lag_seconds
        return answer

    def _provision(self: Emulator, sb: SandboxRecord) -> None:
        # Daytona caches what a Dockerfile built by the Dockerfile's hash: the same text (`FROM repo:tag`) gives
        # the first build's image again, however the tag has moved since.
        cache_key = _digest(sb.dockerfile) if sb.dockerfile is not None and self.config.build_cache else None
        cached = self.build_cache.get(cache_key) if cache_key else None
        if cached and self.backend.image_info(cached) is not None:
            sb.image = cached
        elif not sb.image:
            assert sb.dockerfile is not None
            tag = f"daytona-emulator-build/{_digest(sb.dockerfile)}:{self.config.instance_id}"
            try:
                self.backend.build_image(sb.dockerfile, tag)
            except BackendError as exc:
                raise BuildFailed(str(exc)) from exc
            sb.image = tag
        info = self.backend.image_info(sb.image)
        if info is None:
            raise BuildFailed(f"image {sb.image} is not in the local Docker engine and the emulator cannot pull it")
        if cache_key and not cached:
            with self.lock:
                self.build_cache[cache_key] = info.image_id
        sb.restore_changes = info.restore_changes()
        sb.process_user = (info.user or "root") if self.config.toolbox_as_image_user else sb.user
        hostname = sb.name if _HOSTNAME_RE.match(sb.name) else f"sandbox-{sb.id[:8]}"
        env = {**sb.env, "DAYTONA_SANDBOX_ID": sb.id, "DAYTONA_SANDBOX_USER": sb.user}
        if sb.snapshot:
            env["DAYTONA_SANDBOX_SNAPSHOT"] = sb.snapshot
        sb.container_id = self.backend.create_container(
            sb.id, hostname, sb.image, env, sb.entrypoint, sb.cpu, sb.memory, self.config.enforce_resources,
            sb.network_block_all)
        self.backend.start(sb.container_id)
        self._resolve_user(sb)

    def _resolve_user(self: Emulator, sb: SandboxRecord) -> None:
        assert sb.container_id
        user = sb.process_user or sb.user
        if user.isdigit():
            sb.uid = sb.gid = int(user)
            return
        ids = self.backend.exec_argv(sb.container_id, ["sh", "-c", 'id -u "$1" && id -g "$1"', "id", user],
                                     user="0")
        numbers = ids.output.decode(errors="replace").split()
        if ids.exit_code != 0 or len(numbers) != 2 or not all(n.isdigit() for n in numbers):
            said = ids.output.decode(errors="replace").strip()[-300:]
            raise BackendError(f"user {user!r} does not exist in image {sb.image} (id: rc {ids.exit_code}: {said})")
        sb.uid, sb.gid = int(numbers[0]), int(numbers[1])

    # ---- lifecycle ----------------------------------------------------------------------------------------
    def start_sandbox(self: Emulator, id_or_name: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            # Start may interrupt archiving (the container is stopped either way), as on Daytona.
            if not (sb.state == "archiving" and sb.desired_state == "archived"):
                self.require_settled(sb)
            if sb.state == "started":
                return self.sandbox_dto(sb)  # start is idempotent
            if sb.state in ("error", "build_failed"):
                raise ApiError(400, "Sandbox is in an errored state")
            if sb.state not in ("stopped", "archived", "archiving", "paused"):
                raise ApiError(400, "Sandbox is not in valid state")
            transitional = "restoring" if sb.state == "archived" else "starting"
            was_paused = sb.state == "paused"

        def work() -> None:
            if not sb.container_id:
                raise BackendError("the sandbox has no container")
            if was_paused:
                self.backend.unpause(sb.container_id)  # memory and processes as they were
                return
            self.toolbox.forget_sandbox(sb.id)
            self.backend.start(sb.container_id)

        def finish() -> None:
            sb.state = "started"
            sb.stopped_mono = None
            sb.preview_token = secrets.token_urlsafe(24)  # every start rotates the preview token
            sb.mark_activity()

        return self.transition(sb, transitional, "started", work, finish, lifecycle=True)

    def pause_sandbox(self: Emulator, id_or_name: str) -> dict[str, Any]:
        """POST /sandbox/{id}/pause: only linux-vm and windows sandboxes, which keep their memory (here: the
        container's processes are frozen, `docker pause`); started again by start."""
        sb = self.find(id_or_name)
        with self.lock:
            if sb.state != "started":
                raise ApiError(400, "Sandbox must be in started state to pause")
            self.require_settled(sb)
            if sb.sandbox_class not in ("linux-vm", "windows"):
                raise ApiError(422, "Pausing is not supported for this sandbox")

        def work() -> None:
            assert sb.container_id
            self.backend.pause(sb.container_id)

        def finish() -> None:
            sb.state = "paused"

        return self.transition(sb, "pausing", "paused", work, finish, lifecycle=True)

    def stop_sandbox(self: Emulator, id_or_name: str, force: bool = False) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            self.require_settled(sb)
            if sb.state in ("error", "build_failed"):
                raise ApiError(400, "Sandbox is in an errored state")
            if sb.state != "started":
                raise ApiError(400, "Sandbox is not in a stoppable state")
            ephemeral = sb.auto_delete == 0
        if ephemeral:
            return self._destroy(sb)

        def work() -> None:
            self.toolbox.forget_sandbox(sb.id)
            assert sb.container_id
            self.backend.stop(sb.container_id, force)

        def finish() -> None:
            sb.state = "stopped"
            sb.stopped_mono = time.monotonic()
            sb.mark_activity()

        return self.transition(sb, "stopping", "stopped", work, finish, lifecycle=True)

    def archive_sandbox(self: Emulator, id_or_name: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            self.require_settled(sb)
            if sb.auto_delete == 0:
                raise ApiError(400, "Ephemeral sandboxes cannot be archived")
            if sb.state in ("error", "build_failed"):
                raise ApiError(400, "Sandbox is in an errored state")
            if sb.state != "stopped":
                raise ApiError(400, "Sandbox is not stopped")

        def finish() -> None:
            sb.state = "archived"  # the container stays stopped; archived is a flag here
            sb.mark_activity()

        return self.transition(sb, "archiving", "archived", lambda: None, finish, lifecycle=True)

    def delete_sandbox(self: Emulator, id_or_name: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            self.require_settled(sb)
        return self._destroy(sb)

    def _destroy(self: Emulator, sb: SandboxRecord) -> dict[str, Any]:
        if self.config.rename_deleted:
            with self.lock:
                # As Daytona's soft delete does: the name is freed at once, the sandbox lingers as a ghost
                # (old state, desired state destroyed) until the runner has removed it.
                sb.previous_name = sb.name
                sb.name = f"DESTROYED_{sb.name}_{int(time.time() * 1000)}"

        def work() -> None:
            self.toolbox.forget_sandbox(sb.id)
            if sb.container_id:
                self.backend.remove(sb.container_id)
            self.remove_released_images()

        def finish() -> None:
            sb.state = "destroyed"
            sb.desired_state = "destroyed"
            self.sandboxes.pop(sb.id, None)
            self.tombstones.append((time.monotonic(), self.sandbox_dto(sb, full=False)))

        def fail(error: Exception) -> None:
            sb.state = "error"
            sb.error_reason = f"delete failed: {error}"

        return self.transition(sb, "destroying", "destroyed", work, finish, fail, lifecycle=True)

    def recover_sandbox(self: Emulator, id_or_name: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            self.require_settled(sb)
            if sb.state != "error" or not sb.recoverable:
                raise ApiError(400, "Sandbox is not in a recoverable state")

        def work() -> None:
            assert sb.container_id
            self.backend.start(sb.container_id)

        def finish() -> None:
            sb.state = "started"
            sb.error_reason = None
            sb.recoverable = None
            sb.preview_token = secrets.token_urlsafe(24)

        return self.transition(sb, "starting", "started", work, finish)


def _from_only(dockerfile: str) -> str | None:
    """The base image when a Dockerfile is a single FROM line (what the SDK sends for a string image)."""
    lines = [line.strip() for line in dockerfile.splitlines() if line.strip() and not line.strip().startswith("#")]
    if len(lines) == 1 and lines[0].upper().startswith("FROM "):
        parts = lines[0].split()
        if len(parts) == 2:
            return parts[1]
    return None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
