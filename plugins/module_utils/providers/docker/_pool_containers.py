# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine side of the warm pool (box/_pool): the pooled containers of a Docker engine, found by their
io.agentbox.pool label (never io.agentbox.box, so no listing of users' boxes sees them), taken by an unpause
that only one caller can win (then renamed), and removed with their volumes.

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ...core._naming import container_name, docker_volume_name, label, strip_labels
from ...core._provider import ProviderError
from ._engine_api import EngineAPI, EngineAPIError, EngineUnanswered
from ._engine_sdk import SDKEngine


class PoolContainers:
    def __init__(self, calls: Callable[[], EngineAPI | SDKEngine], engine: str):
        self._calls = calls
        self.engine = engine

    def _engine(self) -> EngineAPI | SDKEngine:
        return self._calls()

    def pooled(self, key: str | None = None, owner: str | None = None) -> list[dict[str, Any]]:
        """Every pooled container (of `key`, of `owner`) still under its pool name: {container, key, id, state,
        created, labels}, oldest first."""
        wanted = [label("kind") + "=pool"] + ([f"{label('pool')}={key}"] if key else [])
        wanted += [f"{label('pool_owner')}={owner}"] if owner else []
        try:
            summaries = self._engine().containers(wanted)
        except (EngineAPIError, EngineUnanswered) as exc:
            raise ProviderError(f"the pooled boxes of engine {self.engine} could not be listed: {exc}") from exc
        found = []
        for summary in summaries:
            labels = strip_labels(summary.get("Labels"))
            name = str((summary.get("Names") or ["/"])[0]).lstrip("/")
            if name != container_name(labels.get("pool_box", "")):
                continue  # claimed (renamed): no longer the pool's, whatever its labels say
            found.append({
                "container": name,
                "key": labels.get("pool", ""),
                "id": labels.get("id", ""),
                "state": summary.get("State", ""),
                "created": labels.get("created", ""),
                "labels": labels,
            })
        return sorted(found, key=lambda item: item["created"])

    def take(self, container: str, new_name: str) -> bool:
        """Claim the paused `container`: unpause it, then rename it to `new_name`; False when another caller
        took it first. The unpause is the claim: the engine checks and clears the paused state under the
        container's own lock, so of two racing unpauses one gets 409 (a rename is no such lock: the engine
        looks the old name up before it locks, and two renames of one container both succeed, one after the
        other). A claimer killed between the two leaves a pooled box that is not paused: the next refill
        removes it."""
        engine = self._engine()
        try:
            engine.unpause_container(container)
        except EngineAPIError as exc:
            if exc.status in (404, 409) or "is not paused" in exc.message:  # older engines answer 500
                return False
            raise ProviderError(f"pooled box {container} could not be taken: {exc.message}") from exc
        except EngineUnanswered as exc:
            raise ProviderError(f"engine {self.engine} did not answer: {exc}") from exc
        try:
            engine.rename_container(container, new_name)
        except EngineAPIError as exc:
            if exc.status == 404:  # a refill removed it between the two (it saw a pooled box not paused)
                return False
            raise ProviderError(f"pooled box {container} could not be renamed {new_name}: {exc.message}") from exc
        except EngineUnanswered as exc:
            raise ProviderError(f"engine {self.engine} did not answer: {exc}") from exc
        return True

    def remove(self, container: str, box: str) -> None:
        """The pooled container and its volumes (made under its box name `box`); what is gone already is fine."""
        engine = self._engine()
        with contextlib.suppress(EngineAPIError):
            engine.remove_container(container, force=True, volumes=True)
        for volume in engine.volumes([f"{label('pool_box')}={box}"]):
            with contextlib.suppress(EngineAPIError):
                engine.remove_volume(str(volume["Name"]), force=True)
        with contextlib.suppress(EngineAPIError):
            engine.remove_volume(docker_volume_name(box), force=True)

    def volumes_left(self, owner: str) -> list[str]:
        """`owner`'s pool volumes whose container is gone (a fill killed mid-create): the next refill removes them."""
        engine = self._engine()
        boxes = {item["labels"].get("pool_box", "") for item in self.pooled(owner=owner)}
        return [str(v["Name"]) for v in engine.volumes([f"{label('pool_owner')}={owner}"])
                if (v.get("Labels") or {}).get(label("pool_box")) not in boxes]

    def remove_volume(self, name: str) -> None:
        with contextlib.suppress(EngineAPIError):
            self._engine().remove_volume(name, force=True)
