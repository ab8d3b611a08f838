# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Undoing what a create made, and removing what a box left behind when its container went.

Everything here removes only what one box made, found by that box's id (container and volume
labels), its reserved branch and its worktree path; never by name alone. Two runs racing for one
name, or someone else's container that happens to carry the name, are left alone.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..core import _host_files
from ..core._naming import box_branch, label
from ..core._provider import Provider, ProviderError
from ..git import _git
from ..relay import _relay_state


def registrations(common_dir: str) -> list[dict[str, str]]:
    """The worktrees registered in a repository: [{worktree, HEAD, branch, locked, ...}]."""
    listing = _git.git(common_dir, f"--git-dir={common_dir}", "worktree", "list", "--porcelain", check=False)
    entries: list[dict[str, str]] = []
    entry: dict[str, str] = {}
    for line in [*listing.stdout.decode("utf-8", "replace").splitlines(), ""]:
        if not line:
            if entry:
                entries.append(entry)
            entry = {}
            continue
        key, _sep, value = line.partition(" ")
        entry[key] = value
    return entries


def remove_box_registration(common_dir: str, path: str, branch: str, box_id: str) -> str | None:
    """Remove the registration of the box's worktree at `path` when it is that box's: on its branch,
    locked with its id, or half-written (no branch yet). The path removed, or None."""
    if not os.path.isdir(common_dir):
        return None
    for entry in registrations(common_dir):
        if entry.get("worktree") != path:
            continue
        on_branch = entry.get("branch") == f"refs/heads/{branch}" if branch else False
        locked_by_box = bool(box_id) and f"id {box_id}" in entry.get("locked", "")
        half_written = "branch" not in entry and "detached" not in entry
        if (on_branch or locked_by_box or half_written) and _git.remove_worktree_registration(common_dir, path):
            return path
    return None


def remove_branch(repo_root: str, branch: str) -> bool:
    """Delete a branch; True only when it existed and is gone. Deletions at once (boxes removed in threads, or
    by other processes) wait their turn for the repository's packed-refs lock rather than fail on it."""
    if not os.path.isdir(repo_root):
        return False
    return _git.git(repo_root, "-c", "core.packedRefsTimeout=10000", "update-ref", "-d", f"refs/heads/{branch}",
                    check=False).returncode == 0  # fmt: skip


def find_registration_by_id(workspace: str, record: dict[str, str], box_id: str) -> dict[str, str] | None:
    """The repository under `workspace` (a moved workspace) holding the box's registration, found by
    the box id in its lock reason: {root, common_dir}, or None."""
    if not box_id or not os.path.isdir(workspace):
        return None
    for repo in _git.find_repos(workspace):
        if repo.sub != record.get("sub", ""):
            continue
        for entry in registrations(repo.common_dir):
            if entry.get("worktree") == record["path"] and f"id {box_id}" in entry.get("locked", ""):
                return {"root": repo.root, "common_dir": repo.common_dir}
    return None


def _branch_made_by(repo_root: str, branch: str, box_id: str) -> bool:
    """True when the branch's reflog says this box's create reserved it."""
    log = _git.git(repo_root, "reflog", "show", "--format=%gs", f"refs/heads/{branch}", "--", check=False)
    return log.returncode == 0 and f"id {box_id}" in log.stdout.decode("utf-8", "replace")


def delete_unused_branch(repo_root: str, branch: str, base: str) -> bool:
    """Delete the branch only while it still points at its base: a box's commits are never dropped."""
    if not branch or not base:
        return False
    result = _git.git(repo_root, "update-ref", "-d", f"refs/heads/{branch}", base, check=False)
    return result.returncode == 0


def roll_back(provider: Provider, record: dict[str, Any]) -> dict[str, Any]:
    """Undo a create from its journal record; what was removed, for the task's report."""
    name, box_id = record.get("box", ""), record.get("box_id", "")
    report: dict[str, Any] = {"stage": record.get("stage"), "pid": record.get("pid"), "box_id": box_id}
    # The container first: an exec still seeding in it (its client was killed) stops with it.
    report["container_removed"] = bool(name and box_id) and provider.destroy_if_id(name, box_id)
    if box_id:
        _relay_state.forget_box(box_id)  # the relay's registration of the box, made just before its container
    removed: list[str] = []
    deleted: list[str] = []
    for repo in record.get("repos", []):
        branch = record.get("branch") or ""
        if not branch:
            # Killed while reserving: the branch this create made names its id in the reflog.
            candidates = [box_branch(name, suffix) for suffix in range(1, 101)]
            existing = _git.git(repo["root"], "for-each-ref", "--format=%(refname:short)", "refs/heads/agentbox/",
                                check=False).stdout.decode("utf-8", "replace").split()
            branch = next((b for b in candidates if b in existing and _branch_made_by(repo["root"], b, box_id)), "")
        path = repo.get("path")
        # Only this create's own seeding registers worktrees, and only once its container existed:
        # before that, a registration at this path belongs to a run that won the name.
        seeded = record.get("stage") in ("seeding", "booting")
        if seeded and path and remove_box_registration(repo["common_dir"], path, branch, box_id):
            removed.append(path)
        if branch and delete_unused_branch(repo["root"], branch, repo.get("head", "")):
            deleted.append(f"{repo['root']}:{branch}")
    report["worktrees_removed"] = removed
    report["branches_deleted"] = deleted
    return report


def destroy_leftovers(provider: Provider, name: str, delete_branch: bool) -> dict[str, Any] | None:
    """What a box whose container was removed by hand left: its volume (found by its labels), its
    worktree registrations and its branch. None when there was nothing of that box at all."""
    volumes = provider.remove_leftover_volumes(name)
    if not volumes:
        return None
    report: dict[str, Any] = {"volumes_removed": [v["name"] for v in volumes], "worktrees_removed": [],
                              "worktrees_not_found": [], "branches_deleted": [], "branches_kept": []}
    for volume in volumes:
        labels = volume["labels"]
        box_id = labels.get(label("id"), "")
        if box_id:
            _relay_state.forget_box(box_id)
        branch = labels.get(label("branch"), "")
        workspace = labels.get(label("workspace"), "")
        base = labels.get(label("base_commit"), "")
        try:
            records = json.loads(labels.get(label("worktrees"), "[]"))
        except ValueError:
            records = []
        for record in records:
            if labels.get(label("git_layers")) == "1":
                pass  # registered in the box's git layer only: nothing on the host
            elif remove_box_registration(record["git_dir"], record["path"], branch, box_id):
                report["worktrees_removed"].append(record["path"])
            else:
                report["worktrees_not_found"].append(f"{record['git_dir']}:{record['path']}")
            repo_root = workspace if not record.get("sub") else f"{workspace}/{record['sub']}"
            if not branch or not os.path.isdir(repo_root):
                continue
            if (delete_branch and remove_branch(repo_root, branch)) or (
                not delete_branch and record.get("sub") == "" and delete_unused_branch(repo_root, branch, base)
            ):
                report["branches_deleted"].append(f"{repo_root}:{branch}")
            elif _git.branch_exists(repo_root, branch):
                report["branches_kept"].append(f"{repo_root}:{branch}")
                if record.get("sub") == "":
                    remember_kept_branch(provider.name, provider.engine, name, workspace, branch)
    return report


# Where a destroyed box's branch was kept: the box's labels (workspace, branch) outlive its container
# here, so a later `destroy_box.yml -e delete_branch=true`, run from anywhere, finds that branch.
KEPT_BRANCHES = "kept_branches.json"


def _kept_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), KEPT_BRANCHES)


def _kept_key(provider_name: str, engine: str, box: str) -> str:
    return f"{provider_name} {engine} {box}"


def remember_kept_branch(provider_name: str, engine: str, box: str, workspace: str, branch: str) -> None:
    """Record where the branch of a box destroyed without delete_branch stays (see KEPT_BRANCHES)."""
    if not (workspace and branch):
        return

    def change(text: str | None) -> str:
        kept = _kept_records(text)
        kept[_kept_key(provider_name, engine, box)] = {"workspace": workspace, "branch": branch}
        return json.dumps(kept, indent=1, sort_keys=True) + "\n"

    _host_files.ensure_private_dir(_host_files.agentbox_dir())
    _host_files.update(_kept_path(), change)


def kept_branch(provider_name: str, engine: str, box: str) -> dict[str, str] | None:
    """{workspace, branch} of a box destroyed earlier with its branch kept, or None."""
    found = _kept_records(_host_files.read_text(_kept_path())).get(_kept_key(provider_name, engine, box))
    return found if isinstance(found, dict) and isinstance(found.get("workspace"), str) else None


def forget_kept_branch(provider_name: str, engine: str, box: str) -> None:
    if not os.path.exists(_kept_path()):
        return

    def change(text: str | None) -> str:
        kept = _kept_records(text)
        kept.pop(_kept_key(provider_name, engine, box), None)
        return json.dumps(kept, indent=1, sort_keys=True) + "\n"

    _host_files.update(_kept_path(), change)


def _kept_records(text: str | None) -> dict[str, Any]:
    try:
        kept = json.loads(text or "{}")
    except ValueError:
        return {}  # a damaged file: it only ever helps find a branch
    return kept if isinstance(kept, dict) else {}


def half_made_error(name: str) -> ProviderError:
    return ProviderError(
        "the box exists but its create never finished (it has no seed record): destroy it "
        f"(ansible-playbook playbooks/destroy_box.yml -e box={name}) and create it again",
        box=name,
        operation="create",
    )
