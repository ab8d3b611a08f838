# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint records every checkpoint store shares: where manifests and project defaults live
on the host (atomic JSON under a lock), `<box>-<n>` numbering, the plan and result shapes, and the
in-box reads a capture needs (the secrets guard, a remote box's own HEAD).

Below `_checkpoint` (the workflow) and the stores (Docker images, cloud snapshots), which all use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..core import _naming
from ..core._box_data import WORKSPACE, head_line
from ..core._naming import SECRETS_DIR
from ..core._provider import BoxFacts, Provider, ProviderError, too_large

SCHEMA_VERSION = 1
# Kept in step with galaxy.yml by hand: modules run from a zip, where galaxy.yml is not readable.
COLLECTION_VERSION = "0.1.0"
ANSWER_LIMIT = 64 * 1024  # a line or two of git's answer, and its stderr
SECRET_LIMIT = 1 << 20  # what of one secret file the host reads back (the host wrote it: a key, a token)
DEFAULT_MAX_LAYERS = 3
CLEANUP_COMMAND = "/usr/local/bin/agentbox-checkpoint-cleanup"


class CheckpointError(ProviderError):
    """Bad input or a failed capture, restore or removal; the message says what to do."""


# -- where things live on the host ------------------------------------------------------------------
def agentbox_home() -> str:
    return os.path.join(os.path.expanduser("~"), ".agentbox")


def checkpoints_dir(project: str) -> str:
    return os.path.join(agentbox_home(), "checkpoints", project)


def manifest_path(project: str, name: str) -> str:
    return os.path.join(checkpoints_dir(project), name, "manifest.json")


def project_config_path(project: str) -> str:
    """The project's own settings; this module keeps `default_checkpoint` there."""
    return os.path.join(agentbox_home(), "projects", project, "config.json")


def counters_path(project: str) -> str:
    return os.path.join(checkpoints_dir(project), ".counters.json")


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive lock next to `path`: two playbooks writing one file never lose a write."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not readable JSON ({exc}): fix or delete it") from exc
    return data if isinstance(data, dict) else None


def write_json(path: str, data: dict[str, Any]) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        raise


# -- project defaults and name counters -------------------------------------------------------------
def engine_scope(provider: Provider) -> str:
    """`<provider>:<engine>`: where a checkpoint lives, as manifests record it under `engine`."""
    return f"{provider.name}:{provider.engine}"


def project_default(provider: Provider, project: str) -> str | None:
    """The project's default checkpoint on this provider and engine (set with set_default), or None.

    Defaults are kept per provider and engine: a Docker checkpoint is no default for Daytona. A
    default written before they were (`default_checkpoint`) belongs to the local engine.
    """
    config = read_json(project_config_path(project)) or {}
    scoped = config.get("default_checkpoints")
    value = scoped.get(engine_scope(provider)) if isinstance(scoped, dict) else None
    if value is None and engine_scope(provider) == "docker:local":
        value = config.get("default_checkpoint")
    return value if isinstance(value, str) and value else None


def set_project_default(project: str, name: str | None, workspace: str | None = None, *, provider: Provider) -> None:
    """Set (or with None clear) the project's default checkpoint on this provider and engine only."""
    path = project_config_path(project)
    with locked(path):
        config = read_json(path) or {}
        scoped = config.get("default_checkpoints")
        scoped = dict(scoped) if isinstance(scoped, dict) else {}
        if engine_scope(provider) == "docker:local" and "default_checkpoint" in config:
            legacy = config.pop("default_checkpoint")
            scoped.setdefault("docker:local", legacy)
        if name:
            scoped[engine_scope(provider)] = name
        else:
            scoped.pop(engine_scope(provider), None)
        config["default_checkpoints"] = scoped
        if workspace:
            config.setdefault("workspace", workspace)
        write_json(path, config)


def kept_checkpoints(provider: Provider, project: str) -> set[str]:
    """The box-made checkpoints of the project (on this provider and engine) the user kept (set_kept): they
    stay when their box goes."""
    scoped = (read_json(project_config_path(project)) or {}).get("kept_checkpoints")
    names = scoped.get(engine_scope(provider)) if isinstance(scoped, dict) else None
    return {name for name in names if isinstance(name, str)} if isinstance(names, list) else set()


def set_kept(project: str, name: str, kept: bool, *, provider: Provider) -> None:
    """Keep (or forget keeping) the checkpoint `name` of the project on this provider and engine."""
    path = project_config_path(project)
    with locked(path):
        config = read_json(path) or {}
        scoped = config.get("kept_checkpoints")
        scoped = dict(scoped) if isinstance(scoped, dict) else {}
        names = set(kept_checkpoints(provider, project))
        names = names | {name} if kept else names - {name}
        if names:
            scoped[engine_scope(provider)] = sorted(names)
        else:
            scoped.pop(engine_scope(provider), None)
        config["kept_checkpoints"] = scoped
        write_json(path, config)


def foreign(provider: Provider, manifest: dict[str, Any] | None) -> bool:
    """A manifest of a checkpoint on another provider or engine (its name is taken there)."""
    engine = (manifest or {}).get("engine")
    return bool(engine) and engine != engine_scope(provider)


def free_name(
    provider: Provider,
    name: str,
    elsewhere: dict[str, Any] | None,
    find: Callable[[], Any],
    replace: bool,
    *,
    shared_by: str,
    kind: str,
) -> Any:
    """The checkpoint a capture called `name` replaces (None, or the one `find` finds when `replace`), once
    the name is free: no manifest of it on another engine (`elsewhere`: manifests are shared by
    `shared_by`), no checkpoint of it here (an image or snapshot: `kind`) unless `replace`."""
    if foreign(provider, elsewhere):
        raise CheckpointError(
            f"checkpoint {name!r} of this project already exists on {(elsewhere or {}).get('engine')} (manifests "
            f"are shared by {shared_by}): pick another name"
        )
    existing = find()
    if existing and not replace:
        raise CheckpointError(
            f"checkpoint {name!r} already exists in this project ({kind} {existing.image}"
            f"{f', broken: its {kind} is gone' if existing.broken else ''}): pass replace: true "
            "(playbooks/checkpoint.yml: -e replace=true) to overwrite it, or pick another name"
        )
    return existing


def next_number(project: str, box: str, taken: Iterable[str]) -> int:
    """Next n for <box>-<n>: above every number ever handed out, and above every name seen."""
    pattern = re.compile(rf"^{re.escape(box)}-(\d+)$")
    counters = read_json(counters_path(project)) or {}
    highest = int(counters.get(box, 0) or 0)
    for name in taken:
        match = pattern.match(name)
        if match:
            highest = max(highest, int(match.group(1)))
    return highest + 1


def record_number(project: str, box: str, name: str) -> None:
    match = re.match(rf"^{re.escape(box)}-(\d+)$", name)
    if not match:
        return
    path = counters_path(project)
    with locked(path):
        counters = read_json(path) or {}
        counters[box] = max(int(counters.get(box, 0) or 0), int(match.group(1)))
        write_json(path, counters)


# -- manifests, references and the shapes of plans and results -------------------------------------


def read_manifest(project: str, name: str) -> dict[str, Any] | None:
    return read_json(manifest_path(project, name))


def parse_reference(ref: str, project: str) -> str:
    """A checkpoint name from `name` or `agentbox-ckpt-<project>:<name>`; another project's → error."""
    if ":" in ref and ref.startswith(_naming.CHECKPOINT_IMAGE_PREFIX):
        repo, _sep, name = ref.rpartition(":")
        owner = repo[len(_naming.CHECKPOINT_IMAGE_PREFIX) :]
        if owner != project:
            raise CheckpointError(
                f"checkpoint {ref!r} belongs to project {owner}, not to this workspace's project {project}: "
                "restore it from its own workspace, or take a checkpoint of a box of this workspace"
            )
        return _naming.validate_checkpoint_name(name)
    return _naming.validate_checkpoint_name(ref)


@dataclasses.dataclass
class Checkpoint:
    """One checkpoint as seen from the host (manifest) and the engine (image)."""

    name: str
    project: str
    image: str
    record: dict[str, Any]
    has_manifest: bool
    image_exists: bool
    image_id: str = ""
    size: int = 0

    @property
    def broken(self) -> bool:
        return not self.image_exists

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.record)
        data.update(
            name=self.name,
            project=self.project,
            image=self.image,
            image_id=self.image_id,
            image_exists=self.image_exists,
            manifest=self.has_manifest,
            broken=self.broken,
            size=self.size,
        )
        return data


@dataclasses.dataclass
class CapturePlan:
    facts: BoxFacts
    name: str
    type: str
    image: str
    parents: list[str]
    layers: int
    replaces: Checkpoint | None
    numbered: bool
    # The box's worktree heads when the workflow read them (a box with git layers, whose heads are in
    # its layer and are brought into the host first: _gitlayer.box_heads); None: the store reads them.
    heads: list[dict[str, str]] | None = None
    # "box": the box took it itself (agentbox-ctl checkpoint, through the relay): counted against its quota and
    # removed with it unless the user keeps it; "": the user's.
    made_by: str = ""

    def record(
        self,
        provider: Provider,
        heads: list[dict[str, str]],
        base: tuple[str, str, str],
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The manifest record of this capture, as every store writes it. `base`: the image the box was
        made from, its id and its fingerprint; `extra`: the store's own fields."""
        facts = self.facts
        base_image, base_image_id, base_fingerprint = base
        return {
            "schema": SCHEMA_VERSION,
            "name": self.name,
            "type": self.type,
            "image": self.image,
            "project": facts.project,
            "workspace": facts.workspace,
            "parents": self.parents,
            "layers": self.layers,
            "source_box": facts.name,
            "source_box_id": facts.id,
            "made_by": self.made_by,
            **(extra or {}),
            "branch": heads[0]["branch"] if heads else facts.branch,
            "commit": heads[0]["commit"] if heads else "",
            "worktrees": heads,
            "base_image": base_image,
            "base_image_id": base_image_id,
            "base_fingerprint": base_fingerprint,
            "collection_version": COLLECTION_VERSION,
            "engine": engine_scope(provider),
            "created": _naming.now_iso(),
        }


def guard_secrets(provider: Provider, facts: BoxFacts, container_env: list[str]) -> None:
    """Refuse to capture a box whose environment holds the value of one of its own secrets."""
    script = (f'for f in {SECRETS_DIR}/*; do [ -f "$f" ] && {{ printf "%s\\0" "$(head -c {SECRET_LIMIT + 1} "$f")"; }}; '
              "done; exit 0")
    run = provider.exec(facts.name, ["sh", "-c", script], user="root", what=f"secret files ({SECRETS_DIR})")
    values = [v for v in run.stdout.split(b"\0") if len(v) >= 4]
    if any(len(value) > SECRET_LIMIT for value in values):
        raise too_large(facts.name, f"secret file in {SECRETS_DIR}", SECRET_LIMIT)
    for entry in container_env:
        key, _sep, value = entry.partition("=")
        raw = value.encode("utf-8", "replace")
        if any(secret in raw for secret in values):
            raise CheckpointError(
                f"the box's environment variable {key} holds one of its secrets, and a checkpoint would keep it: "
                "recreate the box passing that value under 'secrets' (a tmpfs file) instead of 'env'",
                box=facts.name,
            )


def captured(
    plan: CapturePlan,
    facts: BoxFacts,
    record: dict[str, Any],
    made: dict[str, Any],
    timings: dict[str, float],
    warnings: list[str],
) -> dict[str, Any]:
    """What a capture returns, whichever store made the image or snapshot."""
    result = Checkpoint(
        name=plan.name,
        project=facts.project,
        image=plan.image,
        record=record,
        has_manifest=True,
        image_exists=True,
        image_id=made["id"],
        size=int(made.get("size") or 0),
    ).to_dict()
    result["timings"] = {key: round(value, 3) for key, value in timings.items()}
    result["warnings"] = warnings
    return result


def in_box_head(provider: Provider, facts: BoxFacts) -> list[dict[str, str]]:
    """A box with its own clone (remote engines): its branch and commit, read in the box."""
    run = provider.exec(
        facts.name, ["sh", "-c", "cd /workspace && git rev-parse HEAD && git symbolic-ref -q --short HEAD"],
        limit=ANSWER_LIMIT, what="branch and commit of /workspace",
    )
    lines = run.text.split()
    if run.rc not in (0, 1) or not lines:
        return []
    commit, branch = head_line(lines[0], lines[1] if len(lines) > 1 else "", "the box's /workspace", facts.name)
    return [{"sub": "", "git_dir": "", "path": WORKSPACE, "branch": branch, "commit": commit}]


# The cleanup empties /tmp, /var/tmp, apt caches and /var/log with `rm -rf`, which follows into
# whatever is mounted there: a workspace under /tmp has its .git (the box's git layer) mounted at that same
# path, and a plain run deletes the box's view of it. So the cleanup runs in a private mount namespace
# (the box has CAP_SYS_ADMIN) where every host mount is covered by an empty placeholder (a tiny
# tmpfs, or /dev/null for a file): `rm` sees nothing to delete, and cannot remove the mount points
# themselves (busy), so the box's own namespace keeps its mounts reachable too.
# Live sockets under /tmp and /var/tmp are covered the same way (best effort): they belong to servers
# running in the box (the agent's tmux session, an X server), which a checkpoint of a running box must
# not cut off. The top entry holding each is covered, so its socket stays in the box's namespace.
_CLEANUP_SCRIPT = r"""
[ -x "$1" ] || exit 127
command -v unshare >/dev/null 2>&1 || exit 90
exec unshare --mount --propagation private sh -c '
  cleanup=$1; shift
  for mount_point in "$@"; do
    # Under a parent covered already (a volume inside a volume): out of reach, nothing to cover.
    [ -e "$mount_point" ] || continue
    if [ -d "$mount_point" ]; then
      mount -t tmpfs -o size=64k,mode=0755 agentbox-shield "$mount_point" || exit 90
    else
      mount --bind /dev/null "$mount_point" || exit 90
    fi
  done
  find /tmp /var/tmp -xdev -type s 2>/dev/null | while IFS= read -r socket; do
    case $socket in /var/tmp/*) base=/var/tmp ;; *) base=/tmp ;; esac
    rest=${socket#"$base"/}
    top=$base/${rest%%/*}
    if mountpoint -q "$top"; then continue; fi
    if [ -d "$top" ]; then
      mount -t tmpfs -o size=64k,mode=0755 agentbox-shield "$top" || true
    else
      mount --bind /dev/null "$top" || true
    fi
  done
  exec "$cleanup"' cleanup "$@"
"""


def run_cleanup(provider: Provider, box: str, mounts: list[str]) -> tuple[float, str | None]:
    """The in-box cleanup as root, away from the host mounts at `mounts`: (seconds, warning or None).
    Best effort."""
    # Shallowest first: a mount inside another one is then covered by its parent's placeholder.
    ordered = sorted(set(mounts), key=lambda path: path.count("/"))
    started = time.monotonic()
    run = provider.exec(box, ["sh", "-c", _CLEANUP_SCRIPT, "cleanup", CLEANUP_COMMAND, *ordered], user="root")
    elapsed = time.monotonic() - started
    if run.rc == 127:
        return elapsed, f"{CLEANUP_COMMAND} is not in the box's image: captured without cleanup"
    if run.rc == 90:
        return elapsed, (
            "the in-box cleanup was skipped: the host mounts could not be covered in its private mount "
            "namespace (it would otherwise delete host files mounted under /tmp)"
        )
    if run.rc != 0:
        detail = (run.stderr or run.stdout).decode("utf-8", "replace").strip()[-500:]
        return elapsed, f"the checkpoint cleanup exited {run.rc}: {detail}"
    return elapsed, None
