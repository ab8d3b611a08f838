# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daytona sandbox states as the real service reports them, read into box states (pure, unit-tested).

What the service does that this module accounts for (daytonaio/daytona v0.190, `sandbox.service.ts` and
`sandbox.entity.ts`):
  * a sandbox's `state` is where it is and `desiredState` where it was told to go. A lifecycle call (and
    auto-stop) only sets the desired state; the runner moves the state later. A sandbox in `started` with
    desired `stopped` is about to stop: it has not "reached started";
  * a new sandbox starts in `unknown` and may be read back so mid-create;
  * a deleted sandbox lingers, renamed `DESTROYED_<name>_<ms>`, first in its old state with desired state
    `destroyed`, then `destroyed`, for a day. It is a ghost: never a box.
"""

from __future__ import annotations

from typing import Any

STATE_MAP = {
    "started": "running",
    "starting": "running",
    "creating": "running",
    "restoring": "running",
    "pending_build": "running",
    "building_snapshot": "running",
    "pulling_snapshot": "running",
    "resuming": "running",
    "snapshotting": "running",
    "resizing": "running",
    "forking": "running",
    "stopped": "stopped",
    "stopping": "stopped",
    "error": "stopped",
    "build_failed": "stopped",
    "archived": "paused",
    "archiving": "paused",
    "paused": "paused",
    "pausing": "paused",
    "destroying": "missing",
    "destroyed": "missing",
}
# Where a sandbox is heading, as a box state (for `unknown` and other in-between readings).
DESIRED_MAP = {
    "started": "running",
    "resized": "running",
    "stopped": "stopped",
    "archived": "paused",
    "paused": "paused",
    "destroyed": "missing",
}
TRANSITIONAL = frozenset(
    {
        "unknown",
        "creating",
        "restoring",
        "starting",
        "stopping",
        "pending_build",
        "building_snapshot",
        "pulling_snapshot",
        "snapshotting",
        "resizing",
        "forking",
        "pausing",
        "resuming",
        "destroying",
    }
)
FAILED_STATES = frozenset({"error", "build_failed"})
GHOST_PREFIX = "DESTROYED_"


def state_name(state: Any) -> str:
    """The lower-case value of an SDK state enum (or string); '' for none. Values the SDK does not know
    arrive as its UNKNOWN_DEFAULT_OPEN_API member, read here as 'unknown'."""
    value = getattr(state, "value", state)
    text = str(value or "").lower()
    return "unknown" if text == "unknown_default_open_api" else text


def box_state(daytona_state: str | None) -> str:
    return STATE_MAP.get((daytona_state or "").lower(), "stopped")


def desired_name(sandbox: Any) -> str:
    return state_name(getattr(sandbox, "desired_state", None))


def settled(state: str, desired: str) -> bool:
    """True when the sandbox is where it was last told to go (or nobody told it anything we can read).
    An archive shows `archiving` until it is done; the SDK does not wait for it either."""
    return not desired or desired == state or (desired == "archived" and state == "archiving")


def changing(state: str, desired: str) -> bool:
    """A change the service will make by itself is under way: wait for it rather than act (acting now
    answers 409). A start is still allowed on a stopped sandbox that is only heading for the archive."""
    if settled(state, desired):
        return False
    return not (desired == "archived" and state == "stopped")


def is_ghost(sandbox: Any) -> bool:
    """A deleted sandbox that is still listed (or found): renamed DESTROYED_*, or heading for destroyed."""
    name = str(getattr(sandbox, "name", "") or "")
    state = state_name(getattr(sandbox, "state", None))
    return name.startswith(GHOST_PREFIX) or desired_name(sandbox) == "destroyed" or state in ("destroyed", "destroying")


def box_state_of(sandbox: Any) -> str:
    """The box state of a sandbox: `unknown` (mid-create) reads as where it is heading."""
    if is_ghost(sandbox):
        return "missing"
    state = state_name(getattr(sandbox, "state", None))
    if state == "unknown" or not state:
        return DESIRED_MAP.get(desired_name(sandbox), "running")
    return box_state(state)


# Snapshot states (SnapshotState): `inactive` is a snapshot nobody used for 14 days; it still exists and is
# made `active` again by an activation (through `pending`). Only these two failures mean it is gone for good.
SNAPSHOT_FAILED = frozenset({"error", "build_failed", "removing"})


def snapshot_usable(snapshot: Any) -> bool:
    """The snapshot exists and can be started from, at once (active) or after an activation (inactive)."""
    return snapshot is not None and state_name(getattr(snapshot, "state", None)) not in SNAPSHOT_FAILED


def live_sandboxes(items: Any) -> list[Any]:
    """The sandboxes of a listing that are boxes: ghosts dropped, each id once. Daytona's list is eventually
    consistent and paged by a keyset cursor; a sandbox whose sort value moved while the pages were fetched can
    come twice (the provider lists by creation time, which does not move; this is the guard); the later
    reading is kept."""
    by_id: dict[str, Any] = {}
    for item in items:
        if is_ghost(item):
            by_id.pop(str(getattr(item, "id", "")), None)  # seen deleted: an earlier live reading is stale
            continue
        by_id[str(getattr(item, "id", ""))] = item
    return list(by_id.values())


def network_settings(value: str | None) -> dict[str, Any]:
    """The create parameters for AGENTBOX_DAYTONA_NETWORK: '' (open), 'block_all', or up to 10 IPv4 CIDRs
    separated by commas (checked as Daytona checks them, so a bad list fails before anything is made)."""
    text = (value or "").strip()
    if not text:
        return {}
    if text == "block_all":
        return {"network_block_all": True}
    networks = [part.strip() for part in text.split(",") if part.strip()]
    if len(networks) > 10:
        raise ValueError("Daytona allows at most 10 networks in an allow list")
    for network in networks:
        address, slash, prefix = network.partition("/")
        octets = address.split(".")
        if len(octets) != 4 or not all(o.isdigit() and 0 <= int(o) <= 255 and str(int(o)) == o for o in octets):
            raise ValueError(f"{network!r} is not an IPv4 network (Daytona's allow lists are IPv4 CIDRs)")
        if not slash or not prefix.isdigit() or not 0 <= int(prefix) <= 32:
            raise ValueError(f"{network!r} needs a CIDR prefix length between 0 and 32 (e.g. /24)")
    return {"network_allow_list": ",".join(networks)}


def keeps_memory(sandbox: Any) -> bool:
    """A linux-vm (or windows) sandbox: Daytona pauses it keeping its memory, so its processes live on."""
    return str(getattr(sandbox, "sandbox_class", "") or "").lower() in ("linux-vm", "windows")
