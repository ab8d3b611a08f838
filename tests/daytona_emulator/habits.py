"""Habits of the real Daytona service that the emulator reproduces beyond plain request/answer.

Kept apart from core.py (the control plane): each function acts on an Emulator the way the real
service's background machinery does (daytonaio/daytona v0.190): a runner reporting a broken sandbox,
snapshots deactivated after 14 days unused and activated again through `pending`, named rate limiters.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from .errors import ApiError

if TYPE_CHECKING:
    from .core import Emulator
    from .records import SnapshotRecord

LOG = logging.getLogger("daytona_emulator.habits")


def fail_sandbox(emu: Emulator, id_or_name: str, body: Any) -> dict[str, Any]:
    """The runner reports the sandbox broken (its container is stopped): state `error`, with the reason and
    whether `recover()` can repair it (on Daytona, e.g. a full disk is recoverable). The desired state is
    left as it was and the sandbox is not pending, as the real entity's invariants make it."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    reason = body.get("reason") or "the runner lost the sandbox"
    recoverable = bool(body.get("recoverable", True))
    sb = emu.find(id_or_name)
    if sb.container_id:
        try:
            emu.backend.stop(sb.container_id, force=True)
        except Exception as exc:  # noqa: BLE001 - the sandbox is broken either way
            LOG.info("stopping %s for the injected error: %s", sb.id, exc)
    emu.toolbox.forget_sandbox(sb.id)
    with emu.lock:
        before = sb.state
        sb.generation += 1  # a transition in flight does not settle it any more
        sb.state = "error"
        sb.error_reason = str(reason)
        sb.recoverable = recoverable
        sb.pending = False
        sb.touch()
        emu.publish_state(sb, before)
        return emu.sandbox_dto(sb)


# Daytona refuses to activate a snapshot within 10 minutes of its deactivation (snapshot.service.ts).
ACTIVATION_COOLDOWN_MINUTES = 10


def activate_snapshot(emu: Emulator, snap: SnapshotRecord) -> dict[str, Any]:
    """POST /snapshots/{id}/activate: an inactive snapshot goes `pending`, and `active` once the runners have
    it again (snapshot_activation_seconds later); any other state is refused, as on Daytona."""
    with emu.lock:
        if snap.state == "active":
            raise ApiError(400, f"Snapshot {snap.id} is already active")
        if snap.state != "inactive":
            raise ApiError(400, f"Snapshot {snap.id} cannot be activated - it is in {snap.state} state")
        if time.time() - snap.updated < ACTIVATION_COOLDOWN_MINUTES * emu.config.minute_seconds:
            raise ApiError(400, "Snapshot deactivation is still in progress. Please try again in a few minutes.")
        snap.state = "pending"
        snap.updated = time.time()
        answer = emu.snapshot_dto(snap)
    hold = emu.config.snapshot_activation_seconds

    def settle() -> None:
        time.sleep(hold)
        with emu.lock:
            if snap.state == "pending":
                snap.state = "active"
                snap.updated = time.time()

    threading.Thread(target=settle, name=f"activate-{snap.id[:8]}", daemon=True).start()
    return answer


def deactivate_unused_snapshot(emu: Emulator, id_or_name: str, body: Any) -> dict[str, Any]:
    """What Daytona's snapshot manager does to a snapshot nobody used for 14 days: `inactive`. `ago_minutes`
    (emulated minutes, default 60) dates the deactivation, so the 10 minute activation cooldown has passed."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    ago = body.get("ago_minutes", 60)
    if isinstance(ago, bool) or not isinstance(ago, (int, float)) or ago < 0:
        raise ApiError(400, "ago_minutes must be a non-negative number")
    snap = emu.find_snapshot(id_or_name)
    if snap is None:
        raise ApiError(404, f"Snapshot {id_or_name} not found")
    if snap.general:
        raise ApiError(400, "general snapshots are never deactivated")
    with emu.lock:
        snap.state = "inactive"
        snap.updated = time.time() - ago * emu.config.minute_seconds
        return emu.snapshot_dto(snap)


# Daytona's rate limits (app.module.ts, the @nestjs/throttler guards): named throttlers with a window each,
# counted per organisation across all the routes they cover. `authenticated` covers every API call;
# `sandbox-create` and `sandbox-lifecycle` only the routes marked with their scope.
_LIFECYCLE_ROUTE = re.compile(r"^/api/sandbox/[^/]+/(start|stop|recover|archive|pause|resize|fork)$")


def throttlers_for(method: str, path: str) -> list[str]:
    if not path.startswith("/api/"):
        return []  # the toolbox goes through the proxy, which has limits of its own (not emulated)
    names = ["authenticated"]
    if method == "POST" and path == "/api/sandbox":
        names.append("sandbox-create")
    elif (method == "POST" and _LIFECYCLE_ROUTE.match(path)) or (
        method == "DELETE" and re.fullmatch(r"/api/sandbox/[^/]+", path)
    ):
        names.append("sandbox-lifecycle")
    return names


class Throttler:
    """Fixed windows of `throttle_window_seconds` per throttler; over the limit, a 429 carrying
    `Retry-After-<throttler>` (seconds until the window ends), as @nestjs/throttler sends it for a named
    throttler, and no plain Retry-After."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int]] = {}  # throttler -> (window start, hits)

    def check(self, limits: dict[str, int], window: float, method: str, path: str) -> ApiError | None:
        if not limits:
            return None
        now = time.monotonic()
        headers: dict[str, str] = {}
        blocked: str | None = None
        with self._lock:
            for name in throttlers_for(method, path):
                limit = limits.get(name)
                if limit is None:
                    continue
                start, hits = self._windows.get(name, (now, 0))
                if now - start >= window:
                    start, hits = now, 0
                hits += 1
                self._windows[name] = (start, hits)
                reset = max(1, math.ceil(window - (now - start)))
                headers[f"X-RateLimit-Limit-{name}"] = str(limit)
                headers[f"X-RateLimit-Remaining-{name}"] = str(max(0, limit - hits))
                headers[f"X-RateLimit-Reset-{name}"] = str(reset)
                if hits > limit and blocked is None:
                    blocked = name
                    headers[f"Retry-After-{name}"] = str(reset)
        if blocked is None:
            return None
        return ApiError(429, "ThrottlerException: Too Many Requests", headers=headers)

    def reset(self) -> None:
        with self._lock:
            self._windows.clear()


def check_network_allow_list(value: Any) -> None:
    """Daytona's check of `networkAllowList` (network-validation.util.ts): IPv4 CIDRs, at most 10."""
    if not isinstance(value, str):
        raise ApiError(400, "networkAllowList must be a string")
    networks = [part.strip() for part in value.split(",")]
    for network in networks:
        if not network:
            continue
        address, _slash, prefix = network.partition("/")
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            raise ApiError(400, f'Invalid IP address: "{address}" in network "{network}". Must be a valid IPv4 '
                                "address") from None
        if not prefix:
            raise ApiError(400, f'Invalid network format: "{network}". Missing CIDR prefix length (e.g., /24)')
        if not prefix.isdigit() or not 0 <= int(prefix) <= 32:
            raise ApiError(400, f"Invalid CIDR prefix length: {network}. Prefix must be between 0 and 32")
    if len(networks) > 10:
        raise ApiError(400, "Network allow list cannot contain more than 10 networks")
