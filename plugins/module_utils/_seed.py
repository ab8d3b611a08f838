# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Seeding a box's /workspace from the host workspace: the one place that does it.

Local engine (`provider.shares_host_filesystem`): each repo's .git reaches the box at its host
path as an overlay whose writes stay in the box's own layer (_gitlayer), so the box registers its
own `git worktree` on the branch reserved for it; its commits reach the host repo by fetch. The
host's uncommitted state is then carried over byte for byte: tracked changes as a `git stash
create` commit (already in the object store the box reads), untracked files as a tar stream.
Submodules are nested repos like any other. A workspace that is not a git repo is copied as it is.

Layout in the box: the worktree lives at /home/vscode/.agentbox-worktrees/<box> (a path unique
to the box, so boxes of one repo never collide in the host's worktree list) and /workspace is a
symlink to it. A symlink, unlike a bind mount, survives `docker stop`/`start` and `docker commit`.
Nested repos get their worktree inside it, at <root worktree>/<sub>.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from typing import Any

from ._box_data import MAX_JSON_BYTES, WORKSPACE, seed_record
from ._git import CarryOver, Repo, capture_carry_over, secret_file
from ._journal import pause_point, pausing_stream
from ._provider import Provider, read_box_file
from ._tarstream import Final, tar_ending_with, tar_of_tree

WORKTREES_HOME = "/home/vscode/.agentbox-worktrees"
SEED_RECORD = "/etc/agentbox/seed.json"
BOX_UID = 1000


def worktree_path(box: str, sub: str = "") -> str:
    root = f"{WORKTREES_HOME}/{box}"
    return f"{root}/{sub}" if sub else root


@dataclasses.dataclass
class WorktreePlan:
    """One repo's worktree in a box: decided on the host before the box exists."""

    sub: str
    common_dir: str
    path: str
    branch: str
    base: str
    host_root: str
    owner_uid: int  # the uid git runs as in the box: the .git's owner, or the box user once granted access

    @classmethod
    def for_repo(cls, repo: Repo, box: str, branch: str) -> WorktreePlan:
        return cls(
            sub=repo.sub,
            common_dir=repo.common_dir,
            path=worktree_path(box, repo.sub),
            branch=branch,
            base=repo.head,
            host_root=repo.root,
            owner_uid=repo.owner_uid,
        )


@dataclasses.dataclass
class SeedResult:
    mode: str  # 'worktree' or 'copy'
    branch: str | None
    base_commit: str | None
    modified: int = 0
    deleted: int = 0
    renamed: int = 0
    untracked: int = 0
    worktrees: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# One exec for every repo of the box (each exec costs a round trip): runs as root, does the git
# work as the owner of each host .git, then points /workspace at the root worktree and leaves the
# seed record. Arguments: box, record JSON, then five per repo: user, .git, path, branch, stash.
# `before` (see seed_worktrees) runs first, in a subshell of its own: its `set --`, its
# failures and its stderr stay its own, as they did when it was an exec of its own.
_WORKTREE_SCRIPT = r"""
set -eu
box=$1 record=$2 link=
shift 2
while [ $# -gt 0 ]; do
  user=$1 common_dir=$2 path=$3 branch=$4 stash=$5
  shift 5
  as_owner() { if [ "$user" = root ]; then "$@"; else setpriv --reuid="$user" --regid="$user" --init-groups env HOME=/home/vscode "$@"; fi; }
  [ -n "$link" ] || link=$path
  as_owner mkdir -p "$(dirname "$path")"
  as_owner git --git-dir="$common_dir" worktree add -q --lock --reason "agentbox box $box" "$path" "$branch"
  if [ -n "$stash" ] && ! as_owner git -C "$path" stash apply -q --index "$stash" 2>/dev/null; then
    # The index part did not apply: take the changes without it rather than nothing.
    as_owner git -C "$path" reset -q --hard HEAD
    as_owner git -C "$path" stash apply -q "$stash"
    echo "$path: staged state could not be restored; changes carried as unstaged" >&2
  fi
  [ "$user" != root ] || chown -R 1000:1000 "$path"
done
rmdir /workspace 2>/dev/null || rm -f /workspace
ln -sfn "$link" /workspace
[ -n "$record" ] || exit 0  # untracked files follow: the record is written after them
install -d -o vscode -g vscode /etc/agentbox
printf '%s\n' "$record" > /etc/agentbox/seed.json
"""


def _worktree_user(plan: WorktreePlan) -> str:
    # git writes the worktree's admin files into the host .git: only its owner may do that.
    return "vscode" if plan.owner_uid == BOX_UID else "root"


def seed_worktrees(
    provider: Provider,
    box: str,
    plans: list[WorktreePlan],
    carry: dict[str, CarryOver],
    box_id: str = "",
    before: str = "",
    report: str = "",
) -> tuple[SeedResult, str]:
    """Register each worktree in the box, apply the carried stash, stream untracked files; the
    seed record last (the worktree script writes it when no file follows, else the stream ends
    with it), so a box without one is known to be half-made. Returns the result and the exec's stdout.

    `before`: root shell commands the create needs run before git uses the .git (the git layer's
    preparation, the early boot), folded into the same exec: each exec is ~3 engine requests.
    `report`: root shell lines run first that never fail and say how they went on stdout (a create's
    SSH access when no boot follows, see _access.folded_setup); nothing else there writes to stdout."""
    root = plans[0]
    result = SeedResult(mode="worktree", branch=root.branch, base_commit=root.base)
    arguments: list[str] = []
    for plan in plans:
        user = _worktree_user(plan)
        if user == "root":
            result.warnings.append(
                f"{plan.host_root}: its .git is owned by uid {plan.owner_uid}, not the box user (uid {BOX_UID}); "
                "the worktree was made as root, and commits made in the box as vscode cannot write to it "
                f"until the repository is owned by uid {BOX_UID}"
            )
        state = carry[plan.sub]
        arguments += [user, plan.common_dir, plan.path, plan.branch, state.stash or ""]
        result.modified += state.modified
        result.deleted += state.deleted
        result.renamed += state.renamed
        result.untracked += len(state.untracked)
        result.worktrees.append(dataclasses.asdict(plan))
    streams = any(carry[plan.sub].untracked for plan in plans)
    # One record text, whichever way it travels: what the host decided (the exec's warnings go to the task).
    record = json.dumps(result.to_dict(), sort_keys=True)
    # The lock reason names the box's id: destroy finds the registration by it.
    owner = f"{box} id {box_id}" if box_id else box
    script = "\n".join(part for part in (report, _guarded(before) if before else "", _WORKTREE_SCRIPT) if part)
    run = provider.exec(box, ["sh", "-c", script, "seed", owner, "" if streams else record, *arguments], user="root")
    run.check(f"git worktree add for {root.host_root}", box)
    result.warnings += [line for line in run.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    pause_point("seeding")
    if streams:
        # Every repo's untracked files in one stream extracted at /, the seed record its last member:
        # the engine writes members in order, and a stream cut short ends before the record (see
        # tar_ending_with). One upload, and no exec for the record.
        parts = [(plan.host_root, carry[plan.sub].untracked, plan.path) for plan in plans if carry[plan.sub].untracked]
        stream = tar_ending_with(parts, Final(SEED_RECORD, f"{record}\n".encode()))
        provider.put_archive(box, "/", pausing_stream(stream, "streaming"))
    return result, run.stdout.decode("utf-8", "replace")


def _guarded(before: str) -> str:
    """`before` (root shell commands) as lines to fold into the seed's exec: their stderr stays out of
    the seed's warnings and, when they fail, the exec exits 1 saying so with that stderr."""
    return (f"before_err=$( (\n{before}\n) 2>&1 >/dev/null ) || {{ printf '%s\\n' "
            f"\"preparing the box failed: $before_err\" >&2; exit 1; }}")  # fmt: skip


def run_before(provider: Provider, box: str, before: str) -> None:
    """`before` in an exec of its own, for a create whose seed cannot fold it (see seed_worktrees)."""
    if before:
        provider.exec(box, ["sh", "-c", before], user="root").check("preparing the box", box)


def seed_copy(provider: Provider, box: str, workspace: str, secret: list[str] | None = None) -> SeedResult:
    """A workspace that is not a git repository: copy it as it is, but for `secret` (secret_files_in_tree:
    they go to the box's tmpfs only, see _carry_env)."""
    result = SeedResult(mode="copy", branch=None, base_commit=None)
    provider.put_archive(box, WORKSPACE, tar_of_tree(workspace, exclude=secret or ()))
    # Not a git workspace: every file is untracked, and every one but the secret-named was copied.
    result.untracked = sum(len(files) for _root, _dirs, files in os.walk(workspace)) - len(secret or [])
    finish(provider, box, None, result)
    return result


def secret_files_in_tree(workspace: str) -> list[str]:
    """The regular files named like secrets (_secret_files) anywhere under a plain workspace, relative to it."""
    return sorted(
        path
        for root, _dirs, files in os.walk(workspace)
        for path in (os.path.relpath(os.path.join(root, name), workspace) for name in files)
        if secret_file(workspace, path)
    )


def finish(provider: Provider, box: str, target: str | None, result: SeedResult) -> None:
    """Point /workspace at `target` (when given) and leave the seed record, in one exec."""
    link = ""
    if target:
        link = f"rmdir {WORKSPACE} 2>/dev/null || rm -f {WORKSPACE}; ln -sfn {shlex.quote(target)} {WORKSPACE}; "
    script = f'{link}install -d -o vscode -g vscode /etc/agentbox && printf "%s\\n" "$1" > {SEED_RECORD}'
    record = json.dumps(result.to_dict(), sort_keys=True)
    provider.exec(box, ["sh", "-c", script, "finish", record], user="root").check("recording the seed", box)


def read_seed_record(provider: Provider, box: str) -> dict[str, Any] | None:
    """The box's seed record, checked on the host (the box can rewrite it); None when it has none."""
    data = read_box_file(provider, box, SEED_RECORD, f"seed record ({SEED_RECORD})", MAX_JSON_BYTES)
    return None if data is None else seed_record(data, box)


def capture_all(repos: list[Repo]) -> dict[str, CarryOver]:
    nested = [repo.sub for repo in repos if repo.sub]
    return {repo.sub: capture_carry_over(repo, skip_dirs=nested if not repo.sub else None) for repo in repos}
