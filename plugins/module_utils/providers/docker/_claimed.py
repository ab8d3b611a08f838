# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A claimed pooled box on a Docker engine, read as the box it now is (docs/pool.md, "The claim").

A container's labels are fixed at `docker create`: a pooled box keeps its pool labels (io.agentbox.kind=pool)
when a create claims it and renames it to the box's container name. The box's own labels live on its
**claim record**: the box's volume (`agentbox-<box>-docker`, the name a normal box's /var/lib/docker volume
has, which destroy and the create's undo already remove), made by the claim with the box's full label set,
`io.agentbox.claimed=<the container's engine id>`, `io.agentbox.pooled_as=<the pooled box>` and the mounts
the claim put into the box (`io.agentbox.claim_mounts`, attached again after a restart). The provider reads a
container labelled kind=pool under a name other than its pool name through that record, and only when the
record names that container's id: a box cannot make or label volumes on its engine, so what the labels say
is still what the host wrote.

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ...core._errors import ProviderError
from ...core._naming import CONTAINER_PREFIX, container_name, docker_volume_name, label
from . import _box_mounts
from ._engine_api import EngineAPIError, EngineUnanswered

CLAIMED = label("claimed")
POOLED_AS = label("pooled_as")
MOUNTS = label("claim_mounts")
_RECORD_ONLY = (CLAIMED, MOUNTS)
_POOL_ONLY = (label("pool"), label("pool_box"), label("pool_owner"))


def _candidate(labels: dict[str, str], name: str) -> bool:
    """A pooled container that is no longer under its pool name: claimed, or being claimed."""
    return labels.get(label("kind")) == "pool" and name != container_name(labels.get(label("pool_box"), ""))


def merged(container_labels: dict[str, str], record_labels: dict[str, str]) -> dict[str, str]:
    """A claimed box's labels: the record's (the box's own), over what the container keeps of its own
    (isolation, editor volumes), without the pool's."""
    kept = {k: v for k, v in container_labels.items() if k not in _POOL_ONLY}
    return {**kept, **{k: v for k, v in record_labels.items() if k not in _RECORD_ONLY}, label("kind"): "box"}


def _record(engine: Any, name: str, container_id: str) -> dict[str, str] | None:
    """The claim record's labels of container `name` (engine id `container_id`); None when it has none."""
    box = name.removeprefix(CONTAINER_PREFIX)
    volume = engine.inspect_volume(docker_volume_name(box))
    labels = (volume or {}).get("Labels") or {}
    if not container_id or labels.get(CLAIMED) != container_id or labels.get(label("box")) != box:
        return None
    return labels


def as_box(engine: Any, attrs: dict[str, Any]) -> dict[str, Any]:
    """A container's inspect attributes, with a claimed pooled box's labels read from its record (any other
    container as it is): every reader of a box's labels goes through this."""
    config = attrs.get("Config") or {}
    labels = config.get("Labels") or {}
    name = str(attrs.get("Name", "")).lstrip("/")
    if not _candidate(labels, name):
        return attrs
    record = _record(engine, name, str(attrs.get("Id", "")))
    if record is None:
        return attrs
    return {**attrs, "Config": {**config, "Labels": merged(labels, record)}}


def listed_as_boxes(engine: Any, summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The claimed pooled containers among listing entries, with their boxes' labels (one volume listing, made
    only when there is such a container)."""
    candidates = [s for s in summaries
                  if _candidate(s.get("Labels") or {}, str((s.get("Names") or ["/"])[0]).lstrip("/"))]
    if not candidates:
        return []
    records = {(v.get("Labels") or {}).get(CLAIMED): v.get("Labels") or {} for v in engine.volumes([CLAIMED])}
    found = []
    for summary in candidates:
        record = records.get(summary.get("Id"))
        name = str((summary.get("Names") or ["/"])[0]).lstrip("/")
        if record and container_name(record.get(label("box"), "")) == name:
            found.append({**summary, "Labels": merged(summary.get("Labels") or {}, record)})
    return found


def write_record(engine: Any, box: str, labels: dict[str, str], container_id: str, pooled_as: str,
                 mounts: list[dict[str, Any]]) -> None:  # fmt: skip
    """The claim record of box `box` (labels: the box's own), naming the pooled container it claims."""
    record = {**labels, label("kind"): "volume", CLAIMED: container_id, POOLED_AS: pooled_as,
              MOUNTS: json.dumps(mounts, separators=(",", ":"))}
    made = engine.create_volume(docker_volume_name(box), record)
    if (made.get("Labels") or {}).get(CLAIMED) != container_id:
        raise ProviderError(f"a volume called {docker_volume_name(box)!r} already exists on the engine: "
                            "pick another box name", box=box, operation="create")


def pooled_as(engine: Any, box: str) -> str:
    """The pooled box that box `box` was claimed from ('' for a box a normal create made)."""
    volume = engine.inspect_volume(docker_volume_name(box))
    labels = (volume or {}).get("Labels") or {}
    return labels.get(POOLED_AS, "") if labels.get(CLAIMED) else ""


def remove_pool_volumes(engine: Any, pool_box: str) -> None:
    """The volumes the pooled box `pool_box` (its box or container name) was made with (its /var/lib/docker, editor
    servers)."""
    if not pool_box:
        return
    pool_box = pool_box.removeprefix(CONTAINER_PREFIX)  # the record names its container
    names = [str(v["Name"]) for v in engine.volumes([f"{label('pool_box')}={pool_box}"])]
    for name in [*names, docker_volume_name(pool_box)]:
        with contextlib.suppress(EngineAPIError, EngineUnanswered):
            engine.remove_volume(name, force=True)


def attach(engine: Any, attrs: dict[str, Any], mounts: list[dict[str, Any]]) -> None:
    """Put `mounts` into the running box `attrs` describes (see _box_mounts)."""
    pid = int((attrs.get("State") or {}).get("Pid") or 0)
    if not mounts:
        return
    name = str(attrs.get("Name", "")).lstrip("/").removeprefix(CONTAINER_PREFIX)
    if not pid:
        raise ProviderError("the box is not running: its workspace cannot be attached", box=name)
    try:
        _box_mounts.attach(pid, mounts)
    except _box_mounts.MountError as exc:
        raise ProviderError(f"the box's workspace could not be attached: {exc}", box=name) from exc


def reattach(engine: Any, attrs: dict[str, Any]) -> None:
    """A claimed box just started again has a new mount namespace: its claim's mounts go in again (a
    normal box's engine mounts its volumes at each start; this is the claimed box's same step)."""
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    name = str(attrs.get("Name", "")).lstrip("/")
    if not (labels.get(POOLED_AS) or _candidate(labels, name)):  # read as a box already, or not yet
        return
    record = _record(engine, name, str(attrs.get("Id", "")))
    mounts = json.loads(record.get(MOUNTS) or "[]") if record is not None else []
    if mounts:
        # Mount points on the box's tmpfs (/run/agentbox: the relay's directory) are gone with the restart.
        rc, _out, err = engine.exec(name, ["mkdir", "-p", *[m["target"] for m in mounts]], user="root",
                                    max_output=64 * 1024)
        if rc != 0:
            raise ProviderError(f"the box's mount points could not be made: {err.decode('utf-8', 'replace')[:300]}",
                                box=name.removeprefix(CONTAINER_PREFIX))
        attach(engine, attrs, mounts)
