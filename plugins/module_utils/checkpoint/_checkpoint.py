# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoints: a box's warm state saved, listed, removed and pruned; new boxes started from it.

One workflow for every provider, through the provider's checkpoint store (`checkpoint_store()`):
Docker images on an engine (_image_store: a *layered* `docker commit`, or a *flattened* export and
import, _image_flatten), snapshots on a cloud (_snapshot_store). The records they share (host
manifests ~/.agentbox/checkpoints/<project>/<name>/manifest.json, project defaults, `<box>-<n>`
numbering, the plan and result shapes, the secrets guard, the in-box cleanup) are in
_checkpoint_records; restoring into a new box is _restore.

A manifest whose image or snapshot is gone is *broken*: listed, never used.

Secrets: per-box secrets live on the /run/agentbox tmpfs, which neither `commit` nor `export`
sees; the flatten stream also drops anything under run/agentbox/, and capture refuses a box whose
environment holds the value of one of its secrets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core import _naming
from ..core._provider import BoxFacts, Provider, ProviderError, worktree_records
from ..git import _gitlayer
from . import _checkpoint_records
from ._checkpoint_records import (
    DEFAULT_MAX_LAYERS,
    CapturePlan,
    Checkpoint,
    CheckpointError,
    kept_checkpoints,
    project_default,
    set_kept,
)


def find_checkpoint(provider: Provider, project: str, name: str) -> Checkpoint | None:
    return provider.checkpoint_store().find(project, name)


def list_checkpoints(provider: Provider, project: str) -> list[Checkpoint]:
    """Every checkpoint of the project on this provider and engine: manifests (broken ones too) and
    what the engine holds without one."""
    return provider.checkpoint_store().list(project)


def current_fingerprint(provider: Provider, base_image: str) -> str | None:
    """What the base image is now (its fingerprint label, else its id); None when it is gone."""
    return provider.checkpoint_store().fingerprint(base_image)


def is_stale(provider: Provider, record: dict[str, Any]) -> bool:
    """True when the base image the checkpoint was made on has been rebuilt (or removed) since."""
    recorded = record.get("base_fingerprint") or record.get("base_image_id")
    if not recorded or not record.get("base_image"):
        return False
    return current_fingerprint(provider, record["base_image"]) != recorded


def plan_capture(
    provider: Provider,
    facts: BoxFacts,
    name: str | None,
    merged: bool = False,
    replace: bool = False,
    max_layers: int = DEFAULT_MAX_LAYERS,
    made_by: str = "",
) -> CapturePlan:
    """Decide name, type and parents; validates everything before any side effect. `made_by` "box": the box
    takes it itself (the relay), so it counts against the box's quota and goes with the box (box_checkpoints)."""
    if max_layers < 1:
        raise CheckpointError(f"max_layers must be 1 or more, not {max_layers}")
    plan = provider.checkpoint_store().plan_capture(facts, name, replace, merged=merged, max_layers=max_layers)
    try:
        _naming.check_checkpoint_name_free(plan.name)
    except ValueError as exc:
        raise CheckpointError(str(exc), box=facts.name) from exc
    return dataclasses.replace(plan, made_by=made_by) if made_by else plan


def capture(provider: Provider, plan: CapturePlan, cleanup: bool = True) -> dict[str, Any]:
    """Take the checkpoint planned by plan_capture. Nothing half-made is left on failure."""
    if plan.heads is None and provider.shares_host_filesystem and _gitlayer.has_layers(plan.facts):
        # A workflow step (it imports the box's work into the host first), so done here, not in the store.
        plan = dataclasses.replace(plan, heads=_gitlayer.box_heads(provider, plan.facts, worktree_records(plan.facts)))
    return provider.checkpoint_store().capture(plan, cleanup)


def run_cleanup(provider: Provider, box: str, mounts: list[str] | None = None) -> tuple[float, str | None]:
    """The in-box cleanup a capture runs, away from the box's host mounts (found when not given)."""
    if mounts is None:
        mounts = provider.checkpoint_store().host_mounts(box)
    return _checkpoint_records.run_cleanup(provider, box, mounts)


def remove(provider: Provider, checkpoint: Checkpoint) -> dict[str, Any]:
    """Delete the checkpoint's image or snapshot, its manifest and its commit refs."""
    removed = provider.checkpoint_store().remove(checkpoint)
    if checkpoint.name in kept_checkpoints(provider, checkpoint.project):
        set_kept(checkpoint.project, checkpoint.name, False, provider=provider)  # a later one of that name is new
    return removed


def copy_to(provider: Provider, checkpoint: Checkpoint, destination: Provider, *, compress: bool = True) -> dict[str, Any]:
    """Copy `checkpoint` to the engine of `destination`; Docker engines only (a cloud's snapshots stay there)."""
    store = provider.checkpoint_store()
    if not hasattr(store, "copy_to"):
        raise CheckpointError(f"copy_to is for checkpoints on Docker engines; {provider.name} keeps its snapshots "
                              "on its own service")
    return store.copy_to(checkpoint, destination, compress=compress)


def is_kept(checkpoint: Checkpoint, kept: set[str]) -> bool:
    """Whether `checkpoint` is the user's to keep: one the user took always, one a box took itself (through the
    relay, `made_by` box) once the user kept it (`kept`: kept_checkpoints). One that is not goes when its box is
    destroyed, unless it is the project's default or another box runs on it (remove_box_checkpoints)."""
    return checkpoint.record.get("made_by") != "box" or checkpoint.name in kept


def box_checkpoints(provider: Provider, facts: BoxFacts) -> list[Checkpoint]:
    """The checkpoints box `facts` took itself that the user has not kept: what its quota counts, and what
    goes with it."""
    kept = kept_checkpoints(provider, facts.project)
    return [found for found in list_checkpoints(provider, facts.project)
            if found.record.get("source_box_id") == facts.id and not is_kept(found, kept)]


def keep(provider: Provider, project: str, name: str) -> Checkpoint:
    """Make a checkpoint the user's: one a box took stays when the box goes."""
    found = find_checkpoint(provider, project, name)
    if found is None:
        raise CheckpointError(f"no checkpoint {name!r} in this project (on engine {provider.engine}): "
                              "agentbox.box.agentbox_checkpoint_info lists them")
    set_kept(project, name, True, provider=provider)
    return found


def remove_box_checkpoints(provider: Provider, facts: BoxFacts) -> dict[str, list[str]]:
    """At the box's destroy: remove the checkpoints it took itself, but the ones the user kept (keep) and the
    project's default. {removed, kept, warnings}: a removal that fails (another box runs on it) keeps it."""
    default = project_default(provider, facts.project)
    done: dict[str, list[str]] = {"removed": [], "kept": [], "warnings": []}
    for found in box_checkpoints(provider, facts):
        if found.name == default:
            done["kept"].append(found.name)  # the user made it the project's default
            continue
        try:
            remove(provider, found)
        except ProviderError as exc:
            done["kept"].append(found.name)
            done["warnings"].append(f"checkpoint {found.name}, which the box took, was kept: {exc}")
            continue
        done["removed"].append(found.name)
    return done


def prune(provider: Provider, check_mode: bool = False, project: str | None = None) -> dict[str, Any]:
    """Remove the checkpoint images or snapshots that no box and no manifest refers to (of one
    project when given)."""
    return provider.checkpoint_store().prune(check_mode, project)
