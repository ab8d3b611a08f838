"""The emulator's model of boxd machines: ids, names, labels, states and their delays, snapshots.

Each machine is a real local container made by the Daytona emulator's Docker backend (shared, not
copied). States follow what the boxd SDK and the seed document describe:

    starting -> running -> suspended | hibernated   (a paused container: memory kept; exec wakes it)
                running -> stopping -> stopped       (a stopped container: exec is refused, start needed)
    starting is also where `start` puts a stopped machine, for `start_seconds`.

Machines are addressed by id only: a name given where an id is expected is not found, as in production.
A hibernated machine comes back with `wake`, a suspended one with `resume` (either wakes on exec).

Snapshots are versioned as on boxd (SDK `boxd.snapshots`): saving a name that exists captures a new version
of it; a capture is `pending` for `snapshot_seconds`, then `ready` (`version` is the latest ready one, 0 =
none yet), or `failed` when told so (control call FailSnapshot). An archived snapshot (ArchiveSnapshot:
`storage` archived) makes no machine and cannot be saved again.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.daytona_emulator.config import EMULATOR_LABEL
from tests.daytona_emulator.docker_backend import BackendError, DockerBackend, docker_name

from .ports import Forwards

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
CONTAINER_PREFIX = "boxd-emu-"
SNAPSHOT_REPOSITORY = "boxd-emu-snapshot"
DEFAULT_VCPU = 2
DEFAULT_MEMORY = 4 << 30
DEFAULT_DISK = 20 << 30

__all__ = ["EMULATOR_LABEL", "Fleet", "Machine", "Refused", "Snapshot"]


# What a start takes on boxd's production cluster (a stopped machine polled to running: ~12 s, as the seed
# document pins it) and a stop (not pinned there: a guess). The defaults are quicker, for the suite.
PRODUCTION_START_SECONDS = 12.0
PRODUCTION_STOP_SECONDS = 2.0


class Refused(Exception):
    """A request the service answers with a gRPC status (code is the StatusCode's name)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Machine:
    id: str
    name: str
    image: str
    labels: dict[str, str]
    env: dict[str, str]
    vcpu: int
    memory_bytes: int
    disk_bytes: int
    auto_suspend_secs: int
    source: str = "image"
    status: str = "starting"
    container: str = ""
    created_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    busy: int = 0  # execs and transfers in flight: a machine never auto-suspends under one
    egress_allow: list[str] = field(default_factory=list)
    ready_at: float = 0.0  # monotonic time a starting machine becomes running

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "status": self.status, "labels": dict(self.labels),
                "image": self.image, "container": self.container, "auto_suspend_secs": self.auto_suspend_secs,
                "env": dict(self.env), "vcpu": self.vcpu, "memory_bytes": self.memory_bytes,
                "disk_bytes": self.disk_bytes, "egress_allow": list(self.egress_allow)}


@dataclass
class Snapshot:
    id: str
    name: str
    image_ref: str  # the latest ready version's image ("" until one is ready)
    labels: dict[str, str]
    vcpu: int
    memory_bytes: int
    size_bytes: int
    egress: list[str] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    status: str = "pending"
    version: int = 0  # the latest ready version; 0: none yet
    capturing: int = 0  # the version being captured
    capture_image: str = ""
    ready_at: float = 0.0  # monotonic time the capture is ready
    storage: str = "local"
    failed_version: int = 0
    failure_reason: str = ""
    images: list[str] = field(default_factory=list)  # every version's image: machines may run on old ones


class Fleet:
    """Every machine and snapshot of one emulator instance, and the timers that move their states."""

    def __init__(self, instance_id: str, image: str, start_seconds: float = 0.3, stop_seconds: float = 0.2,
                 box_capabilities: bool = True, snapshot_seconds: float = 0.3) -> None:
        self.instance_id = instance_id
        self.image = image
        self.start_seconds = start_seconds
        self.stop_seconds = stop_seconds
        self.snapshot_seconds = snapshot_seconds
        self.backend = DockerBackend(instance_id, box_capabilities=box_capabilities, name_prefix=CONTAINER_PREFIX)
        self.machines: dict[str, Machine] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.lock = threading.RLock()
        self.forwards = Forwards(lambda: self.backend.long_client.api, self._inbound, self._inbound_done)
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_forever, name="boxd-emulator-ticker", daemon=True)

    # ---- lookup ----------------------------------------------------------------------------------------
    def get(self, machine_id: str) -> Machine:
        with self.lock:
            machine = self.machines.get(machine_id)
        if machine is None:
            # Names are not ids: production answers not_found for a name, and so do we.
            raise Refused("NOT_FOUND", f"machine {machine_id!r} not found")
        return machine

    def listing(self, selector: list[str]) -> list[Machine]:
        with self.lock:
            machines = list(self.machines.values())
        return [m for m in machines if _labels_match(selector, m.labels)]

    # ---- lifecycle -------------------------------------------------------------------------------------
    def create(self, *, name: str, image: str, labels: dict[str, str], env: dict[str, str], vcpu: int,
               memory_bytes: int, disk_bytes: int, auto_suspend_secs: int, source: str = "image",
               egress: list[str] | None = None) -> Machine:
        name = name or f"machine-{secrets.token_hex(3)}"
        if not NAME_RE.fullmatch(name):
            raise Refused("INVALID_ARGUMENT", f"invalid machine name {name!r}: lowercase letters, digits and '-'")
        if self.backend.image_info(image) is None:
            raise Refused("INVALID_ARGUMENT", f"image {image!r} not found")
        with self.lock:
            if any(m.name == name for m in self.machines.values()):
                raise Refused("ALREADY_EXISTS", f"a machine named {name!r} already exists")
            machine = Machine(id="vm-" + secrets.token_hex(8), name=name, image=image, labels=dict(labels),
                              env=dict(env), vcpu=vcpu or DEFAULT_VCPU, memory_bytes=memory_bytes or DEFAULT_MEMORY,
                              disk_bytes=disk_bytes or DEFAULT_DISK, auto_suspend_secs=auto_suspend_secs,
                              source=source, egress_allow=list(egress or []))
            self.machines[machine.id] = machine
        try:
            machine.container = self.backend.create_container(
                machine.id, name, image, machine.env, entrypoint=None, cpu=machine.vcpu, memory_gib=1,
                enforce_resources=False)
            self.backend.start(machine.container)
        except (BackendError, OSError) as exc:
            with self.lock:
                self.machines.pop(machine.id, None)
            if machine.container:
                self.backend.remove(machine.container)
            raise Refused("INTERNAL", f"machine could not be created: {exc}") from exc
        self._starting(machine)
        return machine

    def _starting(self, machine: Machine) -> None:
        machine.status = "starting"
        machine.ready_at = time.monotonic() + self.start_seconds
        machine.last_active = time.monotonic()

    def start(self, machine_id: str) -> None:
        machine = self.get(machine_id)
        with self.lock:
            if machine.status in ("running", "starting"):
                return
            if machine.status in ("suspended", "hibernated"):
                raise Refused("FAILED_PRECONDITION", f"machine {machine.id} is {machine.status}: resume or wake it")
            machine.status = "starting"
        self.backend.start(machine.container)
        self._starting(machine)

    def stop(self, machine_id: str) -> None:
        machine = self.get(machine_id)
        with self.lock:
            if machine.status == "stopped":
                return
            was = machine.status
            machine.status = "stopping"
        if was in ("suspended", "hibernated"):
            self.backend.unpause(machine.container)
        self.backend.stop(machine.container)
        time.sleep(self.stop_seconds)
        machine.status = "stopped"

    def suspend(self, machine_id: str, state: str = "suspended") -> None:
        machine = self.get(machine_id)
        self.settle(machine)
        with self.lock:
            if machine.status == state:
                return
            if machine.status not in ("running", "suspended", "hibernated"):
                raise Refused("FAILED_PRECONDITION", f"machine {machine.id} is {machine.status}, not running")
            if machine.status == "running":
                self.backend.pause(machine.container)
            machine.status = state

    def wake(self, machine_id: str, only: tuple[str, ...] = ("suspended", "hibernated")) -> Machine:
        """Bring back a machine asleep in one of the `only` states: `resume` takes a suspended machine, `wake`
        either, an exec or a file call either. A hibernated machine is on disk: `resume` refuses it."""
        machine = self.get(machine_id)
        self.settle(machine)
        with self.lock:
            if machine.status in ("suspended", "hibernated") and machine.status not in only:
                raise Refused("FAILED_PRECONDITION", f"machine {machine.id} is {machine.status}: wake it")
            if machine.status in ("suspended", "hibernated"):
                self.backend.unpause(machine.container)
                machine.status = "running"
            machine.last_active = time.monotonic()
        return machine

    def destroy(self, machine_id: str) -> None:
        machine = self.get(machine_id)
        with self.lock:
            self.machines.pop(machine.id, None)
        machine.status = "destroyed"
        self.forwards.drop_machine(machine.id)
        self.backend.remove(machine.container)

    def settle(self, machine: Machine) -> None:
        """A starting machine whose delay has passed is running."""
        if machine.status == "starting" and time.monotonic() >= machine.ready_at:
            machine.status = "running"
            machine.last_active = time.monotonic()

    def usable(self, machine_id: str) -> Machine:
        """The machine, woken, for an exec or a file call; refused while stopped (a conflict, as in production)."""
        machine = self.wake(machine_id)
        if machine.status == "starting":
            while machine.status == "starting" and time.monotonic() < machine.ready_at:
                time.sleep(0.02)
            self.settle(machine)
        if machine.status != "running":
            raise Refused("FAILED_PRECONDITION", f"machine {machine.id} is {machine.status}: start it first")
        return machine

    def _inbound(self, machine_id: str) -> str:
        """A connection to an exposed port: it wakes the machine and keeps it from auto-suspending."""
        machine = self.usable(machine_id)
        with self.lock:
            machine.busy += 1
        return machine.container

    def _inbound_done(self, machine_id: str) -> None:
        with self.lock:
            machine = self.machines.get(machine_id)
            if machine is not None:
                machine.busy -= 1
                machine.last_active = time.monotonic()

    # ---- snapshots -------------------------------------------------------------------------------------
    def snapshot(self, machine_id: str, name: str) -> Snapshot:
        """Capture the machine as snapshot `name`: a new snapshot, or a new version of the one of that name."""
        machine = self.get(machine_id)
        if not name or not NAME_RE.fullmatch(name):
            raise Refused("INVALID_ARGUMENT", f"invalid snapshot name {name!r}")
        with self.lock:
            snap = self.snapshots.get(name)
        if snap is not None:
            self.settle_snapshot(snap)
            if snap.storage != "local":
                raise Refused("FAILED_PRECONDITION", f"snapshot {name!r} is archived: it cannot be saved again "
                              "until an operator unarchives it")
        self.settle(machine)
        info = self.backend.image_info(machine.image)
        changes = info.restore_changes() if info else []
        version = max(snap.version, snap.capturing) + 1 if snap is not None else 1
        tag = docker_name(f"{self.instance_id}-{name}-v{version}")
        committed = self.backend.commit(machine.container, SNAPSHOT_REPOSITORY, tag, name, changes)
        with self.lock:
            if snap is None:
                snap = Snapshot(id="snap-" + secrets.token_hex(6), name=name, image_ref="", labels={}, vcpu=0,
                                memory_bytes=0, size_bytes=0)
                self.snapshots[name] = snap
            snap.labels, snap.vcpu, snap.memory_bytes = dict(machine.labels), machine.vcpu, machine.memory_bytes
            snap.egress, snap.size_bytes = list(machine.egress_allow), int(committed.size_gib * (1 << 30))
            snap.status, snap.capturing = "pending", version
            snap.capture_image = f"{SNAPSHOT_REPOSITORY}:{tag}"
            snap.images.append(snap.capture_image)
            snap.ready_at = time.monotonic() + self.snapshot_seconds
        return snap

    def settle_snapshot(self, snap: Snapshot) -> None:
        """A capture whose time has passed is ready: its version is the snapshot's latest."""
        with self.lock:
            if snap.status == "pending" and time.monotonic() >= snap.ready_at:
                snap.status, snap.version, snap.image_ref = "ready", snap.capturing, snap.capture_image
                snap.updated_at = time.time()

    def fail_snapshot(self, name: str, reason: str) -> Snapshot:
        """The capture in progress failed (as a worker would report it); older versions stay restorable."""
        snap = self.get_snapshot(name)
        with self.lock:
            if snap.status != "pending":
                raise Refused("FAILED_PRECONDITION", f"snapshot {name!r} is {snap.status}, no capture to fail")
            snap.status, snap.failed_version, snap.failure_reason = "failed", snap.capturing, reason
        return snap

    def archive_snapshot(self, name: str) -> Snapshot:
        """What boxd does to a snapshot it moves to object storage: `storage` archived."""
        snap = self.get_snapshot(name)
        with self.lock:
            snap.storage = "archived"
        return snap

    def get_snapshot(self, name: str) -> Snapshot:
        with self.lock:
            snap = self.snapshots.get(name) or next((s for s in self.snapshots.values() if s.id == name), None)
        if snap is None:
            raise Refused("NOT_FOUND", f"snapshot {name!r} not found")
        self.settle_snapshot(snap)
        return snap

    def restorable(self, name: str) -> Snapshot:
        """The snapshot a machine is made from: refused while archived, or before a version is ready."""
        snap = self.get_snapshot(name)
        if snap.storage != "local":
            raise Refused("FAILED_PRECONDITION", f"snapshot {name!r} is archived (storage {snap.storage}): no "
                          "machine can be created from it until an operator unarchives it")
        if not snap.version:
            raise Refused("FAILED_PRECONDITION", f"snapshot {name!r} has no ready version yet ({snap.status})")
        return snap

    def delete_snapshot(self, name: str) -> None:
        snap = self.get_snapshot(name)
        with self.lock:
            if any(m.image in snap.images for m in self.machines.values()):
                raise Refused("FAILED_PRECONDITION", f"snapshot {name!r} is in use by a machine")
            self.snapshots.pop(snap.name, None)
        for image in snap.images:
            self.backend.remove_image(image)

    # ---- timers ----------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Settle starting machines and auto-suspend idle ones (every 0.2 s, or now through the control call)."""
        now = time.monotonic()
        with self.lock:
            machines = list(self.machines.values())
        for machine in machines:
            self.settle(machine)
            with self.lock:
                idle = (machine.status == "running" and machine.auto_suspend_secs > 0 and machine.busy == 0
                        and now - machine.last_active >= machine.auto_suspend_secs)
            if idle:
                try:
                    self.suspend(machine.id)
                except (Refused, BackendError):
                    pass

    def _tick_forever(self) -> None:
        while not self._stop.wait(0.2):
            self.tick()

    def start_background(self) -> None:
        self._ticker.start()

    def shutdown(self) -> None:
        self._stop.set()
        self.forwards.close()
        self.backend.cleanup()
        self.backend.close()


def _labels_match(selector: list[str], labels: dict[str, str]) -> bool:
    for term in selector:
        key, sep, value = term.partition("=")
        if (sep and labels.get(key) != value) or (not sep and key not in labels):
            return False
    return True
