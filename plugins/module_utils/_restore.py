# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restore: a new box's workspace brought back from a checkpoint, then brought up to the host's.

Local engine: the box starts from the checkpoint image, whose worktree directory is baked in at the
*source* box's path. A directory from a lower image layer cannot be renamed on overlayfs (EXDEV: it
would be copied whole, and every later checkpoint would carry a second copy), so the tree stays where
it is: a new worktree registration is made for the new box's path, its gitfile is put into the baked
tree, and the new path is a symlink to it. The source box's registration is never touched. Then, in
the box (_restore_program): branch at the checkpoint's commit → merge of the host's HEAD (the box's
side wins conflicting hunks) → the checkpoint's own uncommitted edits re-applied (box wins) → the
host's uncommitted edits overlaid file by file (box wins) → the host's untracked files that the box
does not have. Every conflict is reported.

Remote engines and clouds: each repository is a clone in the checkpoint's /workspace; the host's
state is shipped in (as _ship does) and merged the same way.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import tempfile
from typing import Any

from . import _git, _naming, _restore_program, _seed
from ._box_data import MAX_JSON_BYTES, restore_answer
from ._checkpoint_records import CheckpointError
from ._provider import Provider
from ._tarstream import tar_of_paths, tar_of_tree

# Where the host's HEAD waits in the staging repo shipped to a remote box during a restore.
RESTORE_HOST_BRANCH = "agentbox-restore/host-head"
# The in-box half of a restore (see _restore_program), run as `python3 -c RESTORE_SCRIPT`. From the
# loader, not open(__file__): Ansiballz runs modules from a zip, whose loader still has get_source.
RESTORE_SCRIPT = inspect.getsource(_restore_program)


@dataclasses.dataclass
class RestoreResult(_seed.SeedResult):
    """SeedResult plus what a restore adds: the checkpoint, the merge, and each conflict."""

    checkpoint: str = ""
    checkpoint_commit: str = ""
    merges: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    conflicts: list[dict[str, str]] = dataclasses.field(default_factory=list)


def plan_restore(provider: Provider, project: str, checkpoint_name: str) -> RestorePlan:
    """Validate a checkpoint for a new box of `project`; unknown, foreign or broken ones fail here."""
    found = provider.checkpoint_store().restorable(project, checkpoint_name)
    return RestorePlan(name=found.name, image=found.image, record=found.record)


@dataclasses.dataclass
class RestorePlan:
    name: str
    image: str
    record: dict[str, Any]

    def restore_workspace(
        self,
        provider: Provider,
        box: str,
        repos: list[_git.Repo],
        plans: list[_seed.WorktreePlan],
        carry: dict[str, _git.CarryOver],
    ) -> RestoreResult:
        """The new box's workspace from this checkpoint, then brought up to the host's (see the module's docstring)."""
        record = self.record
        worktrees = {w.get("sub", ""): w for w in record.get("worktrees") or []}
        result = RestoreResult(
            mode="checkpoint",
            branch=plans[0].branch if plans else None,
            base_commit=plans[0].base if plans else None,
            checkpoint=self.name,
            checkpoint_commit=record.get("commit", ""),
        )
        if not repos:
            result.warnings.append(
                "the workspace is not a git repository: /workspace is the checkpoint's, as captured "
                "(host files were not copied over it)"
            )
            _seed.finish(provider, box, None, result)
            return result
        restore = _Restore(self, provider, box, repos, carry, result)
        if not plans:
            return restore.clones()
        if "" not in worktrees:
            raise CheckpointError(
                f"checkpoint {self.name!r} has no git worktree (it was taken of a box that was not a git checkout), "
                "but this workspace is a git repository: create the box without it (checkpoint: none)",
                box=box,
            )
        jobs = []
        for wt_plan in plans:
            source = worktrees.get(wt_plan.sub)
            if source is None:
                raise CheckpointError(
                    f"the checkpoint has no worktree for nested repository {wt_plan.sub!r} that the workspace has now: "
                    "create the box without the checkpoint (checkpoint: none) and take a new checkpoint",
                    box=box,
                )
            if source.get("git_dir") and os.path.realpath(source["git_dir"]) != os.path.realpath(wt_plan.common_dir):
                raise CheckpointError(
                    f"the checkpoint's repository {source['git_dir']} is not this workspace's {wt_plan.common_dir}",
                    box=box,
                )
            commit = source.get("commit", "")
            if not commit or _git.git(wt_plan.host_root, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode:
                raise CheckpointError(
                    f"the checkpoint's commit {commit or '(none)'} is not in {wt_plan.host_root} any more: "
                    "the checkpoint cannot be restored; remove it and take a new one",
                    box=box,
                )
            state = carry[wt_plan.sub]
            jobs.append(
                {
                    "sub": wt_plan.sub,
                    "common_dir": wt_plan.common_dir,
                    "old_path": source["path"],
                    "new_path": wt_plan.path,
                    "branch": wt_plan.branch,
                    "commit": commit,
                    "host_head": wt_plan.base,
                    "host_stash": state.stash or "",
                    "untracked": state.untracked,
                    "owner_uid": wt_plan.owner_uid,
                }
            )
        owned_by_box = all(p.owner_uid == _seed.BOX_UID for p in plans)
        restore.run(jobs, {p.sub: p.host_root for p in plans}, owned_by_box)
        for wt_plan in plans:
            result.worktrees.append(dataclasses.asdict(wt_plan))
        if not owned_by_box:
            for wt_plan in plans:
                provider.exec(box, ["chown", "-R", f"{_seed.BOX_UID}:{_seed.BOX_UID}", wt_plan.path + "/"], user="root")
        _seed.finish(provider, box, plans[0].path, result)
        return result


def _identity(repo: _git.Repo) -> dict[str, str]:
    """Who the restore's merge commit is by: the host repository's user, else 'agentbox'."""

    def value(key: str, fallback: str) -> str:
        return _git.git(repo.root, "config", key, check=False).stdout.decode("utf-8", "replace").strip() or fallback

    name = value("user.name", "agentbox")
    email = value("user.email", "agentbox@localhost")
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


# The function form, as _checkpoint exports it.
restore_workspace = RestorePlan.restore_workspace


@dataclasses.dataclass
class _Restore:
    """One restore under way: what both of its ways (worktrees, clones) and the in-box run read, and
    the result they fill in."""

    plan: RestorePlan
    provider: Provider
    box: str
    repos: list[_git.Repo]
    carry: dict[str, _git.CarryOver]
    result: RestoreResult

    def clones(self) -> RestoreResult:
        """Remote engines: each repo is a clone inside the checkpoint's /workspace. The host's HEAD and
        uncommitted state are staged on the controller (as for shipped seeding), streamed into the box,
        fetched into the clone, and then merged and overlaid exactly as on the local engine."""
        return _restore_clones(self)

    def run(self, jobs: list[dict[str, Any]], host_roots: dict[str, str], owned_by_box: bool) -> None:
        """Run the in-box restore for every repo, then bring in the host's untracked files it lacks."""
        _run_restore(self, jobs, host_roots, owned_by_box)


def _restore_clones(restore: _Restore) -> RestoreResult:
    from . import _ship

    provider, box, repos, carry, result = restore.provider, restore.box, restore.repos, restore.carry, restore.result

    branch = _naming.box_branch(box)
    result.branch = branch
    depth, _adaptive = _ship.ship_depth()
    workdir = tempfile.mkdtemp(prefix="agentbox-restore-")
    jobs = []
    try:
        for number, repo in enumerate(repos):
            state = carry[repo.sub]
            staged = _ship.stage_repo(repo, RESTORE_HOST_BRANCH, state.stash, depth, workdir)
            source = f"/tmp/.agentbox-restore-{number}"
            provider.exec(box, ["mkdir", "-p", source], user="vscode").check(f"making {source}", box)
            _ship.upload(provider, box, source, tar_of_tree(staged.path), f"the host state of {repo.root}")
            jobs.append(
                {
                    "mode": "clone",
                    "sub": repo.sub,
                    "path": _ship.box_path(repo.sub),
                    "source": source,
                    "branch": branch,
                    "with_stash": bool(state.stash),
                    "untracked": state.untracked,
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    restore.run(jobs, {r.sub: r.root for r in repos}, True)
    _seed.finish(provider, box, None, result)
    return result


def _run_restore(restore: _Restore, jobs: list[dict[str, Any]], host_roots: dict[str, str], owned_by_box: bool) -> None:
    provider, plan, box, repos, carry, result = (
        restore.provider, restore.plan, restore.box, restore.repos, restore.carry, restore.result
    )
    request = {"box": box, "checkpoint": plan.name, "worktrees_home": _seed.WORKTREES_HOME, "jobs": jobs}
    user = "vscode" if owned_by_box else "root"
    if not owned_by_box:
        result.warnings.append(
            f"a repository is not owned by uid {_seed.BOX_UID}: the restore ran as root, and commits made in the "
            f"box as vscode cannot write to it until it is owned by uid {_seed.BOX_UID}"
        )
    run = provider.exec(
        box,
        ["python3", "-c", RESTORE_SCRIPT],
        user=user,
        env=_identity(repos[0]),
        stdin=json.dumps(request).encode(),
        limit=MAX_JSON_BYTES + (1 << 20),  # the answer, and the restore's messages
        what="answer of the in-box restore",
    )
    if run.rc != 0:
        detail = (run.stderr or run.stdout).decode("utf-8", "replace").strip()[-2000:]
        raise CheckpointError(f"restoring the workspace from checkpoint {plan.name!r} failed: {detail}", box=box)
    asked = {job["sub"]: carry[job["sub"]].untracked for job in jobs}
    for outcome in restore_answer(run.stdout, asked, box):
        sub = outcome["sub"]
        host_root = host_roots[sub]
        state = carry[sub]
        label = sub or "."
        for conflict in outcome["conflicts"]:
            result.conflicts.append({"repo": label, **conflict})
        existing = outcome["untracked_existing"]
        blocked = set(outcome["untracked_blocked"])
        missing = [p for p in state.untracked if p not in existing and p not in blocked]
        identical = 0
        if missing:
            provider.put_archive(box, outcome["physical"], tar_of_paths(host_root, missing))
        if existing:
            paths = sorted(existing)
            hash_name = _git.git(host_root, "config", "--get", "extensions.objectFormat", check=False)
            hashed = _restore_program.blob_ids(  # the box's report hashes the same way
                host_root, paths, hash_name.stdout.decode().strip().lower() or "sha1")
            for path, host_hash in zip(paths, hashed, strict=False):
                if host_hash == existing[path]:
                    identical += 1  # the box already has the host's file: carried, with nothing to copy
                if host_hash != existing[path]:
                    result.conflicts.append(
                        {
                            "repo": label,
                            "path": path,
                            "kind": "host-untracked",
                            "kept": "box",
                            "detail": "untracked on the host and different in the box",
                        }
                    )
        for path in sorted(blocked):
            result.conflicts.append(
                {
                    "repo": label,
                    "path": path,
                    "kind": "host-untracked",
                    "kept": "box",
                    "detail": "a parent of this path is a file in the box",
                }
            )
        result.merges.append({k: outcome[k] for k in ("sub", "merge", "merge_commit", "head", "seconds")})
        result.modified += state.modified
        result.deleted += state.deleted
        result.renamed += state.renamed
        result.untracked += len(missing) + identical
    for conflict in result.conflicts:
        if conflict["kind"] != "host-untracked":
            result.warnings.append(
                f"restore conflict in {conflict['repo']}/{conflict['path']} ({conflict['kind']}): the box's version was kept"
            )
    skipped = [(host_roots.get(_sub_of(c["repo"]), ""), c) for c in result.conflicts if c["kind"] == "host-untracked"]
    if skipped:
        result.warnings.append(_untracked_not_copied(skipped, plan, box))


def _sub_of(repo_label: str) -> str:
    return "" if repo_label == "." else repo_label


def _untracked_not_copied(skipped: list[tuple[str, dict[str, str]]], plan: RestorePlan, box: str) -> str:
    """One warning for every host untracked file the restore left out (the box has its own there): which,
    and which the host changed after the checkpoint was taken (an edit of the user's the box does not have)."""
    created = _naming.parse_iso(plan.record.get("created", ""))
    listed = []
    for host_root, conflict in skipped:
        path = conflict["path"] if conflict["repo"] == "." else f"{conflict['repo']}/{conflict['path']}"
        if conflict["detail"].startswith("a parent"):
            path += " (a parent of it is a file in the box)"
        else:
            try:
                # Past the checkpoint's second (its time has no fraction): edited after it, surely.
                if created and os.lstat(os.path.join(host_root, conflict["path"])).st_mtime >= created + 1:
                    path += " (changed on the host after the checkpoint)"
            except OSError:
                pass
        listed.append(path)
    shown = ", ".join(listed[:10]) + (f" and {len(listed) - 10} more" if len(listed) > 10 else "")
    return (
        f"the host's version of {len(listed)} untracked file(s) was NOT copied into the box, which kept its own from "
        f"checkpoint {plan.name!r}: {shown}. Copy a file in if the host's is the one you want "
        f"(scp FILE agentbox-{box}:/workspace/FILE); seed.conflicts lists them"
    )
