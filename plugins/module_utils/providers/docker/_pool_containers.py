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
from ...core._provider import BoxFacts, BoxSpec, ProviderError
from . import _box_engine, _box_mounts, _claimed
from ._engine_api import EngineAPI, EngineAPIError, EngineUnanswered
from ._engine_sdk import SDKEngine
from ._gitlayer_volumes import make_layers, remove_layers

# Run as root in a pooled box at its claim: the mount points of what the claim attaches, and whether the
# pooled box still holds the state its boot left (a box whose dockerd was killed is damaged: not claimed).
CLAIM_SCRIPT = r"""
for p in "$@"; do mkdir -p "$p" || exit 1; done
pid=$(cat /var/run/docker.pid 2>/dev/null)
[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || { echo "its dockerd is not running" >&2; exit 1; }
"""


class PoolContainers:
    def __init__(self, calls: Callable[[], EngineAPI | SDKEngine], engine: str,
                 facts: Callable[[dict[str, Any]], BoxFacts]):
        self._calls = calls
        self.engine = engine
        self._facts = facts  # a box's facts from its inspect attributes (the provider's reading)

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
                "engine_id": str(summary.get("Id", "")),
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
        # Every container of this owner, claimed ones too: a claimed box still uses its pooled box's volumes.
        mine = engine.containers([label("kind") + "=pool", f"{label('pool_owner')}={owner}"])
        boxes = {strip_labels(c.get("Labels")).get("pool_box", "") for c in mine}
        return [str(v["Name"]) for v in engine.volumes([f"{label('pool_owner')}={owner}"])
                if (v.get("Labels") or {}).get(label("pool_box")) not in boxes]

    def remove_volume(self, name: str) -> None:
        with contextlib.suppress(EngineAPIError):
            self._engine().remove_volume(name, force=True)

    def cannot_claim(self, spec: BoxSpec) -> str:
        """Why this engine's pooled boxes cannot be the box `spec` describes ('' when they can)."""
        if spec.bind_paths or spec.mounts:
            return _box_mounts.problem()
        return ""

    def claim(self, item: dict[str, Any], spec: BoxSpec) -> BoxFacts | None:
        """Make the paused pooled box `item` the box `spec` describes: its git layers made as a create makes
        them, its claim record written (_claimed), then the take (unpause, rename: one caller wins), then the
        layers' overlays and the binds put into the running box (_box_mounts). The box's facts; None when
        another caller took it first. On any failure what the claim made goes (the
        pooled box too, once taken: never a half box) and ProviderError says why."""
        engine = self._engine()
        cname = container_name(spec.name)
        taken = recorded = False
        try:
            mounts = []
            if spec.bind_paths:
                root = _box_engine.remapped_ids(str(engine.info().get("DockerRootDir", ""))) or (0, 0)
                layers = make_layers(engine, spec.name, spec.box_id, spec.labels, spec.bind_paths, root)
                for path, dirs in layers.values():
                    mounts.append(_box_mounts.overlay(dirs["lowerdir"], dirs["upperdir"], dirs["workdir"], path))
            mounts += [_box_mounts.bind(host, inside) for host, inside in spec.mounts.items()]
            _claimed.write_record(engine, spec.name, spec.labels, item["engine_id"], item["container"], mounts)
            recorded = True
            if not self.take(item["container"], cname):
                self._undo(engine, spec, "", recorded)
                return None
            taken = True
            rc, _out, err = engine.exec(cname, ["sh", "-c", CLAIM_SCRIPT, "claim", *[m["target"] for m in mounts]],
                                        user="root", max_output=64 * 1024)
            if rc != 0:
                raise ProviderError(f"pooled box {item['container']} is damaged: "
                                    f"{err.decode('utf-8', 'replace').strip()[:300]}", box=spec.name)
            attrs = engine.inspect_container(cname) or {}
            _claimed.attach(engine, attrs, mounts)
            return self._facts(_claimed.as_box(engine, attrs))
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self._undo(engine, spec, item["container"] if taken else "", recorded)
            if isinstance(exc, EngineUnanswered):
                raise ProviderError(f"engine {self.engine} did not answer: {exc}", box=spec.name) from exc
            if isinstance(exc, EngineAPIError):
                raise ProviderError(exc.message, box=spec.name, operation="claim") from exc
            raise

    def _undo(self, engine: EngineAPI | SDKEngine, spec: BoxSpec, taken: str, recorded: bool) -> None:
        """What a claim made: the taken box (under the box's name) and its pooled volumes, the record (when this
        claim wrote it: a volume of that name may be another box's), the layers of this box's id."""
        if taken:
            with contextlib.suppress(EngineAPIError):
                engine.remove_container(container_name(spec.name), force=True, volumes=True)
            _claimed.remove_pool_volumes(engine, taken)
        if recorded:
            with contextlib.suppress(EngineAPIError):
                engine.remove_volume(docker_volume_name(spec.name), force=True)
        remove_layers(engine, spec.name, spec.box_id)
