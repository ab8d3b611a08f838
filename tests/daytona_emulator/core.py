"""The emulated Daytona control plane: sandboxes, snapshots, their states and timers.

Each method serves one route and returns the JSON the SDK reads, or raises ApiError. Docker work
runs outside the state lock; a sandbox being changed is `pending`, and every other mutation of it
meanwhile answers 409, like the real API.
"""

from __future__ import annotations

import base64
import collections
import datetime
import hashlib
import json
import logging
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import habits
from .config import EmulatorConfig, validate_runtime_setting
from .docker_backend import BackendError, DockerBackend, docker_name
from .errors import ApiError
from .events import EventHub
from .faults import FaultInjector
from .lookup_cache import LookupCache

LOG = logging.getLogger("daytona_emulator")

CODE_TOOLBOX_LANGUAGE_LABEL = "code-toolbox-language"
MAX_ARCHIVE_MINUTES = 30 * 24 * 60  # autoArchiveInterval 0 means the maximum, 30 days
DEFAULT_ARCHIVE_MINUTES = 7 * 24 * 60
DEFAULT_STOP_MINUTES = 15
MAX_SIGNED_PREVIEW_SECONDS = 24 * 3600
_HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# List sort fields (SandboxListSortField) to the list item's keys.
_SORT_FIELDS = {"name": "name", "cpu": "cpu", "memoryGib": "memory", "diskGib": "disk",
                "lastActivityAt": "lastActivityAt", "createdAt": "createdAt"}
_TOKEN_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_TRANSITIONAL = {"unknown", "creating", "starting", "stopping", "archiving", "restoring", "destroying", "snapshotting",
                 "pending_build", "building_snapshot"}


def iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    moment = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class BuildFailed(Exception):
    """The sandbox's image cannot be made: the sandbox ends in build_failed."""


@dataclass
class SandboxRecord:
    id: str
    name: str
    user: str
    env: dict[str, str]
    labels: dict[str, str]
    public: bool
    target: str
    cpu: int
    gpu: int
    memory: int
    disk: int
    snapshot: str | None
    image: str
    entrypoint: list[str] | None
    auto_stop: int
    auto_archive: int
    auto_delete: int
    volumes: list[dict[str, Any]]
    network_block_all: bool
    build_info: dict[str, Any] | None
    dockerfile: str | None = None
    network_allow_list: str | None = None
    # From the snapshot: "container", or "linux-vm"/"windows", which Daytona can pause keeping memory.
    sandbox_class: str = "container"
    state: str = "creating"
    desired_state: str = "started"
    pending: bool = True
    error_reason: str | None = None
    recoverable: bool | None = None
    container_id: str | None = None
    # Who the toolbox daemon runs as, hence every exec, session and upload: the image's USER (root when it
    # has none). Daytona's runner sets no container user; `user` (os_user) only becomes DAYTONA_SANDBOX_USER.
    process_user: str = ""
    uid: int = 0
    gid: int = 0
    preview_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    created: float = field(default_factory=time.time)
    listed_from: float = field(default_factory=lambda: float("inf"))  # monotonic time list() may show it
    updated: float = field(default_factory=time.time)
    last_activity: float = field(default_factory=time.time)
    last_activity_mono: float = field(default_factory=time.monotonic)
    stopped_mono: float | None = None
    ttl_minutes: int | None = None
    restore_changes: list[str] = field(default_factory=list)
    generation: int = 0  # bumped by each transition; a superseded transition does not settle the state
    # Updates of the entity (not its insert), which clear Daytona's lookup cache keys (lookup_cache.py).
    version: int = 0
    updated_mono: float = 0.0
    previous_name: str | None = None

    def touch(self, update: bool = True) -> None:
        self.updated = time.time()
        if update:
            self.version += 1
            self.updated_mono = time.monotonic()

    def mark_activity(self) -> None:
        self.last_activity = time.time()
        self.last_activity_mono = time.monotonic()


@dataclass
class SnapshotRecord:
    id: str
    name: str
    image_ref: str
    owned: bool  # the emulator made the image (commit/build) and removes it with the snapshot
    state: str
    general: bool = False
    sandbox_class: str = "container"
    cpu: int = 1
    gpu: int = 0
    mem: int = 1
    disk: int = 3
    size: float | None = None
    entrypoint: list[str] | None = None
    error_reason: str | None = None
    source_sandbox_id: str | None = None
    dockerfile: str | None = None
    user: str | None = None  # a snapshot of a sandbox keeps that sandbox's user as the default
    regions: list[str] | None = None  # where it can be started from; None: every region
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    last_used: float | None = None


class Emulator:
    def __init__(self, config: EmulatorConfig, backend: DockerBackend | None = None) -> None:
        self.config = config
        self.backend = backend or DockerBackend(config.instance_id, config.box_capabilities)
        self.lock = threading.RLock()
        self.sandboxes: dict[str, SandboxRecord] = {}
        # Deleted sandboxes stay visible in list() for list_lag_seconds: (deleted at, list item).
        self.tombstones: list[tuple[float, dict[str, Any]]] = []
        self.snapshots: dict[str, SnapshotRecord] = {}
        # Dockerfile hash -> the image its first build gave (Daytona's build cache).
        self.build_cache: dict[str, str] = {}
        self.used_snapshot_names: set[str] = set()
        self.images_to_remove: set[str] = set()
        # token -> (sandbox id, port, expiry time, the expiresInSeconds it was asked for)
        self.signed_previews: dict[str, tuple[str, int, float, int]] = {}
        self.ssh_tokens: dict[str, tuple[str, float]] = {}
        self.lookup_cache = LookupCache()
        self.events = EventHub()
        self.faults = FaultInjector()
        self.throttler = habits.Throttler()
        for spec in config.faults:
            self.faults.add(spec)
        self.requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=config.request_log_size)
        self.request_seq = 0
        self.base_url = f"http://{config.host}:{config.port}"
        self._stop_event = threading.Event()
        self._ticker: threading.Thread | None = None
        self.ssh_gateway: Any = None  # SshGateway once start_background ran
        self._add_general_snapshot()
        from .toolbox import Toolbox  # toolbox needs the Emulator type; imported here to avoid a cycle

        self.toolbox = Toolbox(self)

    # ---- life of the emulator itself ----------------------------------------------------------------------
    def _add_general_snapshot(self) -> None:
        info = self.backend.image_info(self.config.image)
        if info is None:
            LOG.warning("image %s is not in the local Docker engine: sandboxes from the default snapshot will "
                        "fail until it is built (or pass --image)", self.config.image)
        record = SnapshotRecord(
            id=str(uuid.uuid4()), name=self.config.snapshot_name, image_ref=self.config.image, owned=False,
            state="active", general=True, size=info.size_gib if info else None,
        )
        self.snapshots[record.id] = record
        self.used_snapshot_names.add(record.name)

    def start_background(self) -> None:
        self._ticker = threading.Thread(target=self._tick_loop, name="daytona-emulator-timers", daemon=True)
        self._ticker.start()
        from .ssh_gateway import SshGateway  # paramiko only where the gateway runs

        self.ssh_gateway = SshGateway(self)
        self.ssh_gateway.start()

    def shutdown(self) -> None:
        self._stop_event.set()
        if self.ssh_gateway is not None:
            self.ssh_gateway.close()
        self.events.close_all()
        self.toolbox.close_all()
        if not self.config.keep_on_exit:
            self.backend.cleanup()
        self.backend.close()

    def reset(self) -> dict[str, Any]:
        """Forget every sandbox and snapshot, remove their containers and images, clear faults and the log."""
        self.toolbox.close_all()
        with self.lock:
            self.sandboxes.clear()
            self.tombstones.clear()
            self.snapshots.clear()
            self.build_cache.clear()
            self.used_snapshot_names.clear()
            self.images_to_remove.clear()
            self.signed_previews.clear()
            self.ssh_tokens.clear()
            self.lookup_cache.clear()
            self.requests.clear()
        self.faults.clear()
        self.throttler.reset()
        removed = self.backend.cleanup()
        with self.lock:
            self._add_general_snapshot()
        return {"removed": removed}

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api"

    @property
    def toolbox_url(self) -> str:
        return f"{self.base_url}/toolbox"

    def log_request(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.request_seq += 1
            entry["seq"] = self.request_seq
            self.requests.append(entry)

    def set_runtime_config(self, changes: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(changes, dict):
            raise ApiError(400, "expected a JSON object of settings")
        try:
            validated = {name: validate_runtime_setting(name, value) for name, value in changes.items()}
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc
        for name, value in validated.items():
            setattr(self.config, name, value)
        return self.config.public()

    # ---- lookups ------------------------------------------------------------------------------------------
    def find(self, id_or_name: str) -> SandboxRecord:
        with self.lock:
            record = self.sandboxes.get(id_or_name)
            if record is None:
                record = next((sb for sb in self.sandboxes.values() if sb.name == id_or_name), None)
            if record is None:
                raise ApiError(404, f"Sandbox with ID or name {id_or_name} not found")
            return record

    def find_snapshot(self, id_or_name: str) -> SnapshotRecord | None:
        with self.lock:
            record = self.snapshots.get(id_or_name)
            if record is None:
                record = next((snap for snap in self.snapshots.values() if snap.name == id_or_name), None)
            return record

    # ---- DTOs ---------------------------------------------------------------------------------------------
    def sandbox_dto(self, sb: SandboxRecord, full: bool = True) -> dict[str, Any]:
        dto: dict[str, Any] = {
            "id": sb.id,
            "organizationId": self.config.organization_id,
            "name": sb.name,
            "snapshot": sb.snapshot,
            "user": sb.user,
            "labels": dict(sb.labels),
            "public": sb.public,
            "networkBlockAll": sb.network_block_all,
            "networkAllowList": sb.network_allow_list,
            "target": sb.target,
            "cpu": sb.cpu,
            "gpu": sb.gpu,
            "memory": sb.memory,
            "disk": sb.disk,
            "state": sb.state,
            "desiredState": sb.desired_state,
            "errorReason": sb.error_reason,
            "recoverable": sb.recoverable,
            "autoStopInterval": sb.auto_stop,
            "autoPauseInterval": 0,
            "autoArchiveInterval": sb.auto_archive,
            "autoDeleteInterval": sb.auto_delete,
            "createdAt": iso(sb.created),
            "updatedAt": iso(sb.updated),
            "lastActivityAt": iso(sb.last_activity),
            "sandboxClass": sb.sandbox_class,
            "daemonVersion": "daytona-emulator",
            "runnerId": "emulator-runner",
            "toolboxProxyUrl": self.toolbox_url,
        }
        if sb.ttl_minutes:
            dto["autoDestroyAt"] = iso(sb.created + sb.ttl_minutes * 60)
        if full:
            dto["env"] = dict(sb.env)
            dto["kvm"] = False
            dto["volumes"] = list(sb.volumes)
            if sb.build_info is not None:
                dto["buildInfo"] = dict(sb.build_info)
        return dto

    def snapshot_dto(self, snap: SnapshotRecord) -> dict[str, Any]:
        return {
            "id": snap.id,
            "organizationId": None if snap.general else self.config.organization_id,
            "general": snap.general,
            "name": snap.name,
            "imageName": snap.image_ref,
            "state": snap.state,
            "size": snap.size,
            "entrypoint": snap.entrypoint,
            "cpu": snap.cpu,
            "gpu": snap.gpu,
            "mem": snap.mem,
            "disk": snap.disk,
            "errorReason": snap.error_reason,
            "createdAt": iso(snap.created),
            "updatedAt": iso(snap.updated),
            "lastUsedAt": iso(snap.last_used),
            "sourceSandboxId": snap.source_sandbox_id,
            "regionIds": list(snap.regions or self.config.regions),
            "ref": snap.image_ref,
            "sandboxClass": snap.sandbox_class,
        }

    # ---- the transition engine ----------------------------------------------------------------------------
    def _transition(self, sb: SandboxRecord, transitional: str, desired: str, work: Callable[[], None],
                    finish: Callable[[], None], fail: Callable[[Exception], None] | None = None,
                    lifecycle: bool = False, insert: bool = False) -> dict[str, Any]:
        """Show `transitional` while `work` runs; `finish`/`fail` run under the lock afterwards.

        With transition_seconds > 0 this answers at once and the state settles later (the SDK polls);
        otherwise the work is done before answering and the final state is returned. A `lifecycle` call
        (create, start, stop, archive) with desired_state_seconds > 0 first only sets the desired state, as
        the real API does: the state stays (a create's stays `unknown`) until the runner acts, later.
        """
        lag = self.config.desired_state_seconds if lifecycle else 0.0
        with self.lock:
            sb.generation += 1
            generation = sb.generation
            old_state = sb.state
            if not lag:
                sb.state = transitional
            sb.desired_state = desired
            sb.pending = True
            sb.touch(update=not insert)  # a create's first write is its insert
            answer = self.sandbox_dto(sb)
            self.publish_state(sb, old_state)
        hold = self.config.transition_seconds

        def run() -> None:
            if lag:
                time.sleep(lag)
                with self.lock:
                    if sb.generation != generation:
                        return
                    before = sb.state
                    sb.state = transitional
                    sb.touch()  # the runner's update
                    self.publish_state(sb, before)
            began = time.monotonic()
            error: Exception | None = None
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - any failure becomes the sandbox's error state
                error = exc
                LOG.warning("sandbox %s: %s failed: %s", sb.id, transitional, exc)
            remaining = hold - (time.monotonic() - began)
            if remaining > 0:
                time.sleep(remaining)
            with self.lock:
                if sb.generation != generation:
                    return  # a later transition (start during archiving) took over
                sb.pending = False
                sb.touch()
                before = sb.state
                if error is None:
                    finish()
                elif fail is not None:
                    fail(error)
                else:
                    sb.state = "error"
                    sb.error_reason = str(error)
                    sb.recoverable = False
                self.publish_state(sb, before)

        if hold > 0 or lag > 0:
            threading.Thread(target=run, name=f"transition-{sb.id[:8]}", daemon=True).start()
            return answer
        run()
        with self.lock:
            return self.sandbox_dto(sb) if sb.id in self.sandboxes else {**answer, "state": sb.state}

    def publish_state(self, sb: SandboxRecord, old_state: str) -> None:
        if sb.state != old_state:
            self.events.publish("sandbox.state.updated",
                                {"sandbox": self.sandbox_dto(sb), "oldState": old_state, "newState": sb.state})

    def _require_settled(self, sb: SandboxRecord) -> None:
        if sb.pending:
            raise ApiError(409, "Sandbox state change in progress")

    # ---- create -------------------------------------------------------------------------------------------
    def create_sandbox(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ApiError(400, "name must be a non-empty string")
        labels = _str_map(body.get("labels"), "labels")
        env = _str_map(body.get("env"), "env")
        for key in ("autoStopInterval", "autoArchiveInterval", "autoPauseInterval", "ttlMinutes"):
            _optional_int(body, key, minimum=0)
        _optional_int(body, "autoDeleteInterval", minimum=-1)
        resources = {key: _optional_int(body, key, minimum=0) for key in ("cpu", "memory", "disk", "gpu")}
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

        answer = self._transition(record, "creating", "started", work, finish, fail, lifecycle=True, insert=True)
        # The list index catches up list_lag_seconds after the create answered (eventual consistency).
        record.listed_from = time.monotonic() + self.config.list_lag_seconds
        return answer

    def _provision(self, sb: SandboxRecord) -> None:
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

    def _resolve_user(self, sb: SandboxRecord) -> None:
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
    def start_sandbox(self, id_or_name: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            # Start may interrupt archiving (the container is stopped either way), as on Daytona.
            if not (sb.state == "archiving" and sb.desired_state == "archived"):
                self._require_settled(sb)
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

        return self._transition(sb, transitional, "started", work, finish, lifecycle=True)

    def pause_sandbox(self, id_or_name: str) -> dict[str, Any]:
        """POST /sandbox/{id}/pause: only linux-vm and windows sandboxes, which keep their memory (here: the
        container's processes are frozen, `docker pause`); started again by start."""
        sb = self.find(id_or_name)
        with self.lock:
            if sb.state != "started":
                raise ApiError(400, "Sandbox must be in started state to pause")
            self._require_settled(sb)
            if sb.sandbox_class not in ("linux-vm", "windows"):
                raise ApiError(422, "Pausing is not supported for this sandbox")

        def work() -> None:
            assert sb.container_id
            self.backend.pause(sb.container_id)

        def finish() -> None:
            sb.state = "paused"

        return self._transition(sb, "pausing", "paused", work, finish, lifecycle=True)

    def stop_sandbox(self, id_or_name: str, force: bool = False) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            self._require_settled(sb)
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

        return self._transition(sb, "stopping", "stopped", work, finish, lifecycle=True)

    def archive_sandbox(self, id_or_name: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            self._require_settled(sb)
            if sb.auto_delete == 0:
                raise ApiError(400, "Ephemeral sandboxes cannot be archived")
            if sb.state in ("error", "build_failed"):
                raise ApiError(400, "Sandbox is in an errored state")
            if sb.state != "stopped":
                raise ApiError(400, "Sandbox is not stopped")

        def finish() -> None:
            sb.state = "archived"  # the container stays stopped; archived is a flag here
            sb.mark_activity()

        return self._transition(sb, "archiving", "archived", lambda: None, finish, lifecycle=True)

    def delete_sandbox(self, id_or_name: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            self._require_settled(sb)
        return self._destroy(sb)

    def _destroy(self, sb: SandboxRecord) -> dict[str, Any]:
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
            self._remove_released_images()

        def finish() -> None:
            sb.state = "destroyed"
            sb.desired_state = "destroyed"
            self.sandboxes.pop(sb.id, None)
            self.tombstones.append((time.monotonic(), self.sandbox_dto(sb, full=False)))

        def fail(error: Exception) -> None:
            sb.state = "error"
            sb.error_reason = f"delete failed: {error}"

        return self._transition(sb, "destroying", "destroyed", work, finish, fail, lifecycle=True)

    def recover_sandbox(self, id_or_name: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        with self.lock:
            self._require_settled(sb)
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

        return self._transition(sb, "starting", "started", work, finish)

    # ---- snapshots ----------------------------------------------------------------------------------------
    def _reserve_snapshot_name(self, name: Any) -> str:
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, "name must be a non-empty string")
        # Names are unique per organisation among the snapshots that exist (a unique index on name and
        # organisation); a deleted snapshot's name is free again.
        if name in self.used_snapshot_names:
            raise ApiError(409, f"Snapshot with name {name} already exists")
        self.used_snapshot_names.add(name)
        return name

    def _snapshot_tag(self, name: str) -> tuple[str, str]:
        # A tag of its own per snapshot: a name used again must not retag an image a sandbox still runs on.
        return f"daytona-snapshot/{docker_name(name)}", f"{self.config.instance_id}-{secrets.token_hex(4)}"

    def snapshot_sandbox(self, id_or_name: str, body: Any) -> dict[str, Any]:
        sb = self.find(id_or_name)
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        with self.lock:
            self._require_settled(sb)
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

        return self._transition(sb, "snapshotting", sb.desired_state, work, finish, fail)

    def create_snapshot(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        image_name = body.get("imageName")
        build_info = body.get("buildInfo")
        if (image_name is None) == (build_info is None):
            raise ApiError(400, "Specify exactly one of imageName and buildInfo")
        entrypoint = body.get("entrypoint")
        if entrypoint is not None and not (isinstance(entrypoint, list) and all(isinstance(e, str) for e in entrypoint)):
            raise ApiError(400, "entrypoint must be a list of strings")
        sizes = {key: _optional_int(body, key, minimum=0) for key in ("cpu", "memory", "disk", "gpu")}
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

    def get_snapshot(self, id_or_name: str) -> dict[str, Any]:
        snap = self.find_snapshot(id_or_name)
        if snap is None:
            raise ApiError(404, f"Snapshot {id_or_name} not found")
        with self.lock:
            return self.snapshot_dto(snap)

    def list_snapshots(self, query: dict[str, list[str]]) -> dict[str, Any]:
        page = _query_int(query, "page", 1, minimum=1)
        limit = _page_limit(query, 100)
        name = _query_str(query, "name")
        source = _query_str(query, "sourceSandboxId")
        with self.lock:
            items = [snap for snap in self.snapshots.values()
                     if (not name or name in snap.name) and (not source or snap.source_sandbox_id == source)]
            items.sort(key=lambda snap: snap.created, reverse=True)
            total = len(items)
            chunk = items[(page - 1) * limit: page * limit]
            return {"items": [self.snapshot_dto(snap) for snap in chunk], "total": total, "page": page,
                    "totalPages": max(1, -(-total // limit))}

    def delete_snapshot(self, id_or_name: str) -> None:
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
        self._remove_released_images()

    def set_snapshot_active(self, id_or_name: str, active: bool) -> dict[str, Any]:
        snap = self.find_snapshot(id_or_name)
        if snap is None:
            raise ApiError(404, f"Snapshot {id_or_name} not found")
        if active:
            return habits.activate_snapshot(self, snap)
        with self.lock:
            snap.state = "inactive"
            snap.updated = time.time()
            return self.snapshot_dto(snap)

    def _remove_released_images(self) -> None:
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

    # ---- list ---------------------------------------------------------------------------------------------
    def list_sandboxes(self, query: dict[str, list[str]]) -> dict[str, Any]:
        labels: dict[str, str] = {}
        raw_labels = _query_str(query, "labels")
        if raw_labels:
            try:
                labels = json.loads(raw_labels)
            except json.JSONDecodeError as exc:
                raise ApiError(400, f"labels must be a JSON object: {exc}") from exc
            if not isinstance(labels, dict):
                raise ApiError(400, "labels must be a JSON object")
        limit = _page_limit(query, self.config.list_page_size)
        # Keyset pages, as Daytona's search does: sorted by a field (default: last activity, newest first) and
        # the id, the cursor is the (value, id) of the last item sent. A sandbox whose sort value changes
        # between two pages moves: it can be missed, or come twice.
        sort_field = _query_str(query, "sort") or "lastActivityAt"
        if sort_field not in _SORT_FIELDS:
            raise ApiError(400, f"sort must be one of {', '.join(sorted(_SORT_FIELDS))}")
        descending = (_query_str(query, "order") or "desc").lower() != "asc"
        after: tuple[Any, str] | None = None
        cursor = _query_str(query, "cursor")
        if cursor:
            try:
                value, last_id = json.loads(base64.urlsafe_b64decode(cursor.encode()).decode())
                after = (value, str(last_id))
            except (ValueError, UnicodeDecodeError, TypeError) as exc:
                raise ApiError(400, "invalid cursor") from exc
        id_prefix = _query_str(query, "id")
        name_prefix = _query_str(query, "name")
        states = set(query.get("states", []))
        snapshots = set(query.get("snapshots", []))
        lag = self.config.list_lag_seconds
        now = time.monotonic()
        with self.lock:
            self.tombstones = [(when, item) for when, item in self.tombstones if now - when < lag]
            items = [self.sandbox_dto(sb, full=False) for sb in self.sandboxes.values() if now >= sb.listed_from]
            items += [item for _deleted_at, item in self.tombstones]
        selected = [
            item for item in items
            if all(item["labels"].get(key) == value for key, value in labels.items())
            and (not id_prefix or item["id"].startswith(id_prefix))
            and (not name_prefix or item["name"].startswith(name_prefix))
            and (not states or item["state"] in states)
            and (not snapshots or item["snapshot"] in snapshots)
        ]
        field_name = _SORT_FIELDS[sort_field]

        def key(item: dict[str, Any]) -> tuple[Any, str]:
            return (item.get(field_name) or 0 if field_name in ("cpu", "memory", "disk") else item.get(field_name)
                    or "", item["id"])

        selected.sort(key=key, reverse=descending)
        if after is not None:
            selected = [item for item in selected if (key(item) < after if descending else key(item) > after)]
        page = selected[:limit]
        more = len(selected) > limit
        next_cursor = None
        if more:
            next_cursor = base64.urlsafe_b64encode(json.dumps(list(key(page[-1]))).encode()).decode()
        return {"items": page, "nextCursor": next_cursor}

    # ---- small mutations ----------------------------------------------------------------------------------
    def get_sandbox(self, id_or_name: str) -> dict[str, Any]:
        with self.lock:
            return self.lookup_cache.get(self, id_or_name)  # cached as Daytona caches it

    def replace_labels(self, id_or_name: str, body: Any) -> dict[str, Any]:
        sb = self.find(id_or_name)
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        labels = _str_map(body.get("labels"), "labels")
        with self.lock:
            sb.labels = labels
            sb.touch()
            return {"labels": dict(sb.labels)}

    def set_interval(self, id_or_name: str, which: str, raw: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        try:
            value = int(raw)
        except ValueError as exc:
            raise ApiError(400, f"{which} interval must be an integer") from exc
        if value < (-1 if which == "autodelete" else 0):
            raise ApiError(400, f"{which} interval must not be negative")
        with self.lock:
            if which == "autostop":
                sb.auto_stop = value
            elif which == "autoarchive":
                sb.auto_archive = value
            elif which == "autodelete":
                sb.auto_delete = value
            elif which == "ttl":
                sb.ttl_minutes = value or None
            sb.touch()
            return self.sandbox_dto(sb)

    def set_public(self, id_or_name: str, raw: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        if raw not in ("true", "false"):
            raise ApiError(400, "isPublic must be true or false")
        with self.lock:
            sb.public = raw == "true"
            sb.touch()
            return self.sandbox_dto(sb)

    def refresh_activity(self, id_or_name: str) -> None:
        sb = self.find(id_or_name)
        with self.lock:
            sb.mark_activity()

    # ---- preview URLs and SSH access ----------------------------------------------------------------------
    def preview_url(self, id_or_name: str, raw_port: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        port = _port(raw_port)
        with self.lock:
            return {"sandboxId": sb.id, "url": f"{self.base_url}/preview/{sb.id}/{port}", "token": sb.preview_token}

    def signed_preview_url(self, id_or_name: str, raw_port: str, query: dict[str, list[str]]) -> dict[str, Any]:
        sb = self.find(id_or_name)
        port = _port(raw_port)
        seconds = _query_int(query, "expiresInSeconds", 60, minimum=1)
        if seconds > MAX_SIGNED_PREVIEW_SECONDS:
            raise ApiError(400, f"expiresInSeconds must be at most {MAX_SIGNED_PREVIEW_SECONDS}")
        token = secrets.token_urlsafe(24)
        with self.lock:
            self.signed_previews[token] = (sb.id, port, time.time() + seconds, seconds)
        return {"sandboxId": sb.id, "port": port, "token": token, "url": f"{self.base_url}/preview/s/{token}"}

    def expire_signed_preview_url(self, id_or_name: str, raw_port: str, token: str) -> None:
        sb = self.find(id_or_name)
        with self.lock:
            entry = self.signed_previews.get(token)
            if entry is None or entry[0] != sb.id or entry[1] != _port(raw_port):
                raise ApiError(404, "Signed preview URL not found")
            del self.signed_previews[token]

    def signed_preview_records(self) -> list[dict[str, Any]]:
        """Admin: every signed preview URL the API made, with the expiry it was asked for (tokens included)."""
        with self.lock:
            return [{"token": token, "sandboxId": sid, "port": port, "expiresInSeconds": seconds, "expiresAt": iso(until)}
                    for token, (sid, port, until, seconds) in self.signed_previews.items()]  # fmt: skip

    def expire_signed_preview_now(self, token: str) -> dict[str, Any]:
        """Admin: the signed URL's time is up now (what waiting out expiresInSeconds would do)."""
        with self.lock:
            entry = self.signed_previews.get(token)
            if entry is None:
                raise ApiError(404, "no such signed preview URL")
            self.signed_previews[token] = (entry[0], entry[1], time.time(), entry[3])
            return {"sandboxId": entry[0], "port": entry[1], "expired": True}

    def resolve_preview(self, sandbox_id: str, raw_port: str, token: str | None) -> tuple[SandboxRecord, int]:
        """A preview request with the sandbox's current token (a token from before a restart is refused)."""
        sb = self.find(sandbox_id)
        port = _port(raw_port)
        with self.lock:
            if not sb.public and token != sb.preview_token:
                raise ApiError(401, "Invalid or missing preview token", source="DAYTONA_PROXY")
        return sb, port

    def resolve_signed_preview(self, token: str) -> tuple[SandboxRecord, int]:
        with self.lock:
            entry = self.signed_previews.get(token)
            if entry is None or entry[2] <= time.time():  # as Daytona's proxy: past its expiresInSeconds, refused
                raise ApiError(401, "Signed preview URL is invalid or expired", source="DAYTONA_PROXY")
        return self.find(entry[0]), entry[1]

    def create_ssh_access(self, id_or_name: str, query: dict[str, list[str]]) -> dict[str, Any]:
        sb = self.find(id_or_name)
        minutes = _query_int(query, "expiresInMinutes", 60, minimum=1)
        # As Daytona: 32 characters without '_' or '-', and a new access revokes the sandbox's older ones.
        token = "".join(secrets.choice(_TOKEN_ALPHABET) for _position in range(32))
        now = time.time()
        with self.lock:
            self.ssh_tokens = {t: v for t, v in self.ssh_tokens.items() if v[0] != sb.id}
            self.ssh_tokens[token] = (sb.id, now + minutes * 60)
        gateway = self.ssh_gateway
        command = f"ssh -p {gateway.port} {token}@{self.config.host}" if gateway else f"ssh {token}@ssh.emulator.invalid"
        return {
            "id": str(uuid.uuid4()), "sandboxId": sb.id, "token": token, "expiresAt": iso(now + minutes * 60),
            "createdAt": iso(now), "updatedAt": iso(now), "sshCommand": command,
        }

    def expire_ssh_access(self, token: str) -> dict[str, Any]:
        """Admin: the token's time is up now (what waiting out expiresInMinutes would do)."""
        with self.lock:
            entry = self.ssh_tokens.get(token)
            if entry is None:
                raise ApiError(404, "no such SSH access token")
            self.ssh_tokens[token] = (entry[0], time.time())
            return {"sandboxId": entry[0], "expired": True}

    def revoke_ssh_access(self, id_or_name: str, query: dict[str, list[str]]) -> dict[str, Any]:
        sb = self.find(id_or_name)
        token = _query_str(query, "token")
        with self.lock:
            if token:
                self.ssh_tokens.pop(token, None)
            else:
                self.ssh_tokens = {t: v for t, v in self.ssh_tokens.items() if v[0] != sb.id}
            return self.sandbox_dto(sb)

    def validate_ssh_access(self, query: dict[str, list[str]]) -> dict[str, Any]:
        token = _query_str(query, "token")
        with self.lock:
            entry = self.ssh_tokens.get(token or "")
        valid = entry is not None and entry[1] > time.time() and entry[0] in self.sandboxes
        return {"valid": valid, "sandboxId": entry[0] if entry else ""}

    # ---- server-side timers -------------------------------------------------------------------------------
    def _tick_loop(self) -> None:
        while not self._stop_event.wait(0.5):
            try:
                self.tick()
            except Exception:  # a timer failure must not kill the loop
                LOG.exception("timer tick failed")

    def tick(self) -> None:
        """Auto-stop after inactivity, auto-archive and auto-delete after being stopped, like the server."""
        minute = self.config.minute_seconds
        now = time.monotonic()
        actions: list[tuple[Callable[[str], Any], str]] = []
        with self.lock:
            for sb in self.sandboxes.values():
                if sb.pending:
                    continue
                if sb.state == "started" and sb.auto_stop > 0 and now - sb.last_activity_mono > sb.auto_stop * minute:
                    actions.append((self.stop_sandbox, sb.id))
                elif sb.state == "stopped" and sb.stopped_mono is not None:
                    stopped_for = now - sb.stopped_mono
                    if sb.auto_delete >= 0 and stopped_for > sb.auto_delete * minute:
                        actions.append((self.delete_sandbox, sb.id))
                    elif stopped_for > (sb.auto_archive or MAX_ARCHIVE_MINUTES) * minute:
                        actions.append((self.archive_sandbox, sb.id))
                if sb.ttl_minutes and time.time() > sb.created + sb.ttl_minutes * 60 and sb.state != "destroying":
                    actions.append((self.delete_sandbox, sb.id))
        for action, sandbox_id in actions:
            LOG.info("timer: %s %s", action.__name__, sandbox_id)
            threading.Thread(target=_quietly, args=(action, sandbox_id), daemon=True).start()

    # ---- admin view ---------------------------------------------------------------------------------------
    def state_view(self) -> dict[str, Any]:
        with self.lock:
            sandboxes = []
            for sb in self.sandboxes.values():
                dto = self.sandbox_dto(sb)
                dto["_emulator"] = {"containerId": sb.container_id, "image": sb.image, "pending": sb.pending,
                                    "processUser": sb.process_user,
                                    "previewToken": sb.preview_token}
                sandboxes.append(dto)
            return {
                "instanceId": self.config.instance_id,
                "apiUrl": self.api_url,
                "config": self.config.public(),
                "sandboxes": sandboxes,
                "snapshots": [self.snapshot_dto(snap) for snap in self.snapshots.values()],
                "usedSnapshotNames": sorted(self.used_snapshot_names),
                "imagesPendingRemoval": sorted(self.images_to_remove),
                "faults": self.faults.to_json(),
                "sessions": self.toolbox.describe(),
            }


def _quietly(action: Callable[[str], Any], sandbox_id: str) -> None:
    try:
        action(sandbox_id)
    except ApiError as exc:  # the sandbox moved on meanwhile (a user call won the race)
        LOG.info("timer action on %s skipped: %s", sandbox_id, exc.message)


# ---- validation helpers -----------------------------------------------------------------------------------
def _str_map(value: Any, field_name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ApiError(400, f"{field_name} must be an object of string values")
    return dict(value)


def _optional_int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be an integer")
    if value < minimum:
        raise ApiError(400, f"{key} must be at least {minimum}")
    return value


def _query_str(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


def _query_int(query: dict[str, list[str]], key: str, default: int, minimum: int) -> int:
    raw = _query_str(query, key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ApiError(400, f"{key} must be an integer") from exc
    if value < minimum:
        raise ApiError(400, f"{key} must be at least {minimum}")
    return value


def _page_limit(query: dict[str, list[str]], default: int) -> int:
    """A list's `limit`, as Daytona's @PageLimit checks it (class-validator Min(1), Max(200)): 400 outside."""
    limit = _query_int(query, "limit", default, minimum=1)
    if limit > 200:
        raise ApiError(400, "limit must not be greater than 200")
    return limit


def _port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError as exc:
        raise ApiError(400, "port must be an integer") from exc
    if not 1 <= port <= 65535:
        raise ApiError(400, "port must be between 1 and 65535")
    return port


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


def is_transitional(state: str) -> bool:
    return state in _TRANSITIONAL
