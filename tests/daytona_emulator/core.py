"""The emulated Daytona control plane: sandboxes, snapshots, their states and timers.

Each method serves one route and returns the JSON the SDK reads, or raises ApiError. Docker work
runs outside the state lock; a sandbox being changed is `pending`, and every other mutation of it
meanwhile answers 409, like the real API.

Emulator holds the state, the lookups, the DTOs, the transition engine, listing, small mutations, timers and
the admin view; its API areas are mixins: sandbox_lifecycle.py, snapshots.py, preview_and_ssh.py.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from . import habits
from .config import EmulatorConfig, validate_runtime_setting
from .docker_backend import DockerBackend
from .errors import ApiError
from .events import EventHub
from .faults import FaultInjector
from .lookup_cache import LookupCache
from .preview_and_ssh import PreviewAndSshAccess
from .records import SandboxRecord, SnapshotRecord, iso
from .request_params import page_limit, query_str, str_map
from .sandbox_lifecycle import SandboxLifecycle
from .snapshots import SnapshotApi

LOG = logging.getLogger("daytona_emulator")

MAX_ARCHIVE_MINUTES = 30 * 24 * 60  # autoArchiveInterval 0 means the maximum, 30 days
# List sort fields (SandboxListSortField) to the list item's keys.
_SORT_FIELDS = {"name": "name", "cpu": "cpu", "memoryGib": "memory", "diskGib": "disk",
                "lastActivityAt": "lastActivityAt", "createdAt": "createdAt"}


class Emulator(SandboxLifecycle, SnapshotApi, PreviewAndSshAccess):
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
    def transition(
        self, sb: SandboxRecord, transitional: str, desired: str, work: Callable[[], None],
        finish: Callable[[], None], fail: Callable[[Exception], None] | None = None,
        lifecycle: bool = False, insert: bool = False,
    ) -> dict[str, Any]:
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

    def require_settled(self, sb: SandboxRecord) -> None:
        if sb.pending:
            raise ApiError(409, "Sandbox state change in progress")

    # ---- list ---------------------------------------------------------------------------------------------
    def list_sandboxes(self, query: dict[str, list[str]]) -> dict[str, Any]:
        labels: dict[str, str] = {}
        raw_labels = query_str(query, "labels")
        if raw_labels:
            try:
                labels = json.loads(raw_labels)
            except json.JSONDecodeError as exc:
                raise ApiError(400, f"labels must be a JSON object: {exc}") from exc
            if not isinstance(labels, dict):
                raise ApiError(400, "labels must be a JSON object")
        limit = page_limit(query, self.config.list_page_size)
        # Keyset pages, as Daytona's search does: sorted by a field (default: last activity, newest first) and
        # the id, the cursor is the (value, id) of the last item sent. A sandbox whose sort value changes
        # between two pages moves: it can be missed, or come twice.
        sort_field = query_str(query, "sort") or "lastActivityAt"
        if sort_field not in _SORT_FIELDS:
            raise ApiError(400, f"sort must be one of {', '.join(sorted(_SORT_FIELDS))}")
        descending = (query_str(query, "order") or "desc").lower() != "asc"
        after: tuple[Any, str] | None = None
        cursor = query_str(query, "cursor")
        if cursor:
            try:
                value, last_id = json.loads(base64.urlsafe_b64decode(cursor.encode()).decode())
                after = (value, str(last_id))
            except (ValueError, UnicodeDecodeError, TypeError) as exc:
                raise ApiError(400, "invalid cursor") from exc
        id_prefix = query_str(query, "id")
        name_prefix = query_str(query, "name")
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
        labels = str_map(body.get("labels"), "labels")
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
