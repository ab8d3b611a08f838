# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daytona snapshots for the daytona provider: the images boxes start from, and checkpoints."""

from __future__ import annotations

import re
import time
from typing import Any

from ...core._naming import CHECKPOINT_IMAGE_PREFIX, label
from ...core._provider import BoxNotFound, ProviderError
from .._snapshot_store import parse_snapshot_name
from ._daytona_api import API_TIMEOUT, POLL_SECONDS, DaytonaCallError, bounded
from ._daytona_exec import DaytonaExec
from ._daytona_state import SNAPSHOT_FAILED, snapshot_usable, state_name

SNAPSHOT_TIMEOUT = 600.0
# How long a finished capture's snapshot may take to be found before the capture counts as failed.
SNAPSHOT_APPEAR_SECONDS = 60.0
# Daytona's 400s to an activation (apps/api snapshot.service): another client activated it meanwhile (it is
# active, or pending on its way there), or it was deactivated moments ago and the runners are still letting
# go of it ("Snapshot deactivation is still in progress. Please try again in a few minutes": up to 10 min).
ACTIVATED_ELSEWHERE = re.compile(r"already active|it is in pending state", re.I)
DEACTIVATING = re.compile(r"deactivation (is )?still in progress", re.I)
ACTIVATION_BACKOFF = (2.0, 5.0, 10.0, 15.0)


def is_registry_reference(image: str) -> bool:
    """True for an image a registry can serve by name (its first part names a host: ghcr.io/x, host:5000/x)."""
    first, sep, _rest = image.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


class DaytonaSnapshots(DaytonaExec):
    """Snapshots looked up, activated, waited for, listed and deleted."""

    def find_snapshot(self, image: str) -> Any | None:
        try:
            return self.api_call(
                lambda: bounded(lambda: self.sdk.snapshot.get(image), API_TIMEOUT, "snapshot lookup"),
                box=None,
                operation=f"snapshot lookup of {image!r}",
            )
        except BoxNotFound:
            return None

    def _snapshot_exists(self, image: str) -> bool:
        return snapshot_usable(self.find_snapshot(image))

    def image_exists(self, image: str) -> bool:
        """A Daytona snapshot of that name (an inactive one too: it is activated on use), or a registry image
        Daytona can build from (host/path:tag)."""
        return self._snapshot_exists(image) or is_registry_reference(image)

    def ready_snapshot(self, image: str, box: str) -> Any | None:
        """The snapshot `image` ready to start from, or None when there is no such snapshot. Daytona
        deactivates snapshots unused for 14 days (a create from one is refused): activate it and wait."""
        snapshot = self.find_snapshot(image)
        if snapshot is None:
            return None
        state = state_name(snapshot.state)
        if state == "inactive":
            self._activate(snapshot, image, box)
        elif state in SNAPSHOT_FAILED:
            raise ProviderError(
                f"snapshot {image!r} is {state} ({getattr(snapshot, 'error_reason', None) or 'no reason given'}): "
                "it cannot be started from",
                box=box,
                operation="create",
            )
        return self.wait_snapshot_active(box, image, operation="create")

    def _activate(self, snapshot: Any, image: str, box: str) -> None:
        """Activate an inactive snapshot; one another client activated meanwhile is waited for, and one still
        being deactivated is asked again, with a growing pause, until SNAPSHOT_TIMEOUT."""
        deadline = time.monotonic() + SNAPSHOT_TIMEOUT
        attempt = 0
        while True:
            try:
                self.api_call(
                    lambda: bounded(lambda: self.sdk.snapshot.activate(snapshot), API_TIMEOUT, "snapshot activate"),
                    box=box,
                    operation=f"activating snapshot {image!r}",
                )
                return
            except DaytonaCallError as exc:
                if exc.status == 400 and ACTIVATED_ELSEWHERE.search(str(exc)):
                    return  # on its way to active, or there: the caller waits for it
                if exc.status != 400 or not DEACTIVATING.search(str(exc)):
                    raise
                pause = ACTIVATION_BACKOFF[min(attempt, len(ACTIVATION_BACKOFF) - 1)]
                if time.monotonic() + pause > deadline:
                    # pylint cannot follow `...core._provider` from here to the exception class of `exc`.
                    raise ProviderError(  # pylint: disable=bad-exception-cause
                        f"snapshot {image!r} is still being deactivated by Daytona after {SNAPSHOT_TIMEOUT:.0f} s "
                        f"of asking ({exc}); try again in a few minutes",
                        box=box,
                        operation="create",
                    ) from exc
                time.sleep(pause)
                attempt += 1

    def image_labels(self, image: str) -> dict[str, str]:
        """Snapshots carry no labels: a checkpoint snapshot's name tells its project and checkpoint."""
        parsed = parse_snapshot_name(image)
        if parsed is None:
            return {}
        return {label("kind"): "checkpoint", label("project"): parsed[0], label("checkpoint"): parsed[1]}

    def delete_snapshot(self, image: str) -> bool:
        snapshot = self.find_snapshot(image)
        if snapshot is None:
            return False
        self.api_call(
            lambda: bounded(lambda: self.sdk.snapshot.delete(snapshot), API_TIMEOUT, "snapshot delete"),
            box=None,
            operation=f"delete of snapshot {image!r}",
        )
        return True

    def list_snapshots(self, prefix: str = CHECKPOINT_IMAGE_PREFIX) -> list[Any]:
        found: list[Any] = []
        page = 1
        while True:
            result = self.api_call(
                lambda page=page: bounded(lambda: self.sdk.snapshot.list(page=page, limit=100), API_TIMEOUT, "list"),
                box=None,
                operation="list snapshots",
            )
            found += [item for item in result.items if (item.name or "").startswith(prefix)]
            if page >= (result.total_pages or 1):
                return found
            page += 1

    def wait_snapshot_active(
        self, name: str, image: str, *, lost: ProviderError | None = None, operation: str = "checkpoint"
    ) -> Any:
        """The snapshot once `active`. A capture's snapshot appears only when the capture has ended, and may
        take a moment more to be listed, so a missing one is waited for (SNAPSHOT_APPEAR_SECONDS) before the
        capture counts as failed (a failed capture on Daytona leaves no snapshot and no error state)."""
        now = time.monotonic()
        deadline, appear_by = now + SNAPSHOT_TIMEOUT, now + SNAPSHOT_APPEAR_SECONDS
        while True:
            snapshot = self.find_snapshot(image)
            state = state_name(snapshot.state) if snapshot is not None else "missing"
            if state == "active":
                return snapshot
            if state in SNAPSHOT_FAILED:
                reason = getattr(snapshot, "error_reason", None) or "no reason given"
                raise ProviderError(f"snapshot {image!r} is {state} ({reason})", box=name, operation=operation)
            if state == "missing" and time.monotonic() > appear_by:
                why = f" (the capture request failed: {lost})" if lost is not None else ""
                raise ProviderError(
                    f"Daytona made no snapshot {image!r}: the capture failed on its side{why}; try again",
                    box=name,
                    operation=operation,
                )
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"snapshot {image!r} is still {state} after {SNAPSHOT_TIMEOUT:.0f} s", box=name, operation=operation
                )
            time.sleep(POLL_SECONDS)
