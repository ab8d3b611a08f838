"""The emulator's records of sandboxes and snapshots, and the states and timestamps they are shown with."""

from __future__ import annotations

import datetime
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

CODE_TOOLBOX_LANGUAGE_LABEL = "code-toolbox-language"
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


def is_transitional(state: str) -> bool:
    return state in _TRANSITIONAL
