# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files that reach a box only on its tmpfs: the host's untracked files named like secrets (`.env*`,
`*.pem`, private keys, a token in `.npmrc`...: _secret_files), whatever .gitignore says, and on request
ignored files (`with_env`: the `.env*` files; `carry_ignored` globs). Seeding never carries ignored
files, and leaves the secret-named ones to this.

They must never reach a checkpoint: the files live on a tmpfs in the box (what `docker commit`
and a sandbox snapshot do not capture), and /workspace/<path> is a symlink to them. A box restored
from a checkpoint therefore has at most a dangling link until it is carried again. A secret-named
file that git would see as untracked is also excluded in the box's own repository (its
info/exclude, which the host never reads): the link is not committed by `git add -A`.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from typing import Any

from . import _git
from ._box_tmpfs import TMPFS_DIR_FUNCTION
from ._provider import Provider, ProviderError

CARRIED_DIR = "/run/agentbox/carried"
ENV_GLOB = ".env*"
MAX_BYTES = 16 << 20  # they live in memory (tmpfs); a glob that matches a build tree is a mistake

# As root: make CARRIED_DIR a tmpfs (already one on Docker, where /run/agentbox is a tmpfs;
# mounted here, or /dev/shm behind a link, elsewhere), then unpack the tar from stdin into it
# as the box user and link each file into the worktree; then add each exclude line to its
# repository's info/exclude (as the box user, in the box's own repository). Arguments: worktree,
# the number of paths, the paths, then (repository directory, exclude line) pairs.
_SCRIPT = TMPFS_DIR_FUNCTION + r"""
set -eu
dir=/run/agentbox/carried worktree=$1 count=$2
shift 2
as_box() { setpriv --reuid=1000 --regid=1000 --clear-groups env HOME=/home/vscode "$@"; }
tmpfs_dir "$dir" agentbox-carried 0700
as_box tar -x -f - -C "$dir/"
while [ "$count" -gt 0 ]; do
  path=$1 target="$worktree/$1"
  shift
  count=$((count - 1))
  as_box mkdir -p "$(dirname "$target")"
  [ ! -d "$target" ] || [ -L "$target" ] || { echo "$path is a directory in the box: not replaced" >&2; continue; }
  as_box ln -sfn "$dir/$path" "$target"
done
while [ $# -gt 1 ]; do
  repo="$worktree/$1" line=$2
  shift 2
  exclude=$(as_box git -C "$repo" rev-parse --path-format=absolute --git-path info/exclude) || continue
  as_box sh -c 'mkdir -p "$(dirname "$1")" && { grep -qxF -- "$2" "$1" 2>/dev/null || printf "%s\n" "$2" >> "$1"; }' \
    exclude "$exclude" "$line" || echo "$line: not excluded in the box's repository" >&2
done
"""


def ignored_files(repo: _git.Repo, patterns: list[str]) -> list[str]:
    """The repo's ignored files (by its .gitignore rules) that match any of the glob patterns."""
    if not patterns:
        return []
    pathspecs = []
    for pattern in patterns:
        # A bare name matches at any depth (.env*), a path from the repository root.
        pathspecs.append(f":(glob){pattern}" if "/" in pattern else f":(glob)**/{pattern}")
    listed = _git.git(
        repo.root, "ls-files", "--others", "--ignored", "--exclude-standard", "-z", "--", *pathspecs
    ).stdout.decode("utf-8", "surrogateescape")
    return sorted({path for path in listed.split("\0") if path})


def secret_paths(carry: dict[str, _git.CarryOver]) -> list[str]:
    """The secret-named untracked files of every repo's carry-over, as paths from the workspace."""
    return sorted(os.path.join(sub, path) if sub else path for sub, state in carry.items() for path in state.secret)


def exclude_line(path: str) -> str | None:
    """An info/exclude line matching exactly `path` (from the repository's root), or None when none can."""
    if "\n" in path or "\r" in path:
        return None
    escaped = re.sub(r"([\\*?\[])", r"\\\1", path)
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return "/" + escaped


def carry(
    provider: Provider,
    box: str,
    workspace: str,
    with_env: bool,
    globs: list[str],
    worktree: str,
    secret: list[str] | None = None,
) -> dict[str, Any]:
    """Carry `secret` (the workspace's untracked files named like secrets, from the workspace's root:
    secret_paths), and its ignored .env* files (with_env) and `globs`, into the box's tmpfs and link
    them from `worktree`; {'files': [...], 'bytes': N, 'secret': [...]} ('files': the ignored ones).
    A workspace that is not a git repository has no ignored files: only `secret` is carried there."""
    patterns = ([ENV_GLOB] if with_env else []) + list(globs)
    secret = sorted(set(secret or []))
    repos = _git.find_repos(workspace)
    ignored = ignored_files(repos[0], patterns) if patterns and repos else []
    if not (ignored or secret):
        return {"files": [], "bytes": 0, "secret": []}
    buffer = io.BytesIO()
    total = 0
    carried: list[str] = []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(set(ignored) | set(secret)):
            info = tar.gettarinfo(os.path.join(workspace, path), arcname=path)
            if info is None or not info.isreg():  # a link could point anywhere on the host: files only
                continue
            total += info.size
            if total > MAX_BYTES:
                raise ProviderError(
                    f"the files to carry onto the box's tmpfs add up to more than {MAX_BYTES >> 20} MiB (at {path}): "
                    "they live in memory in the box; narrow carry_ignored, or move big files named like secrets "
                    "(such as *.key, *.pem) out of the workspace",
                    box=box,
                    operation="carry",
                )
            info.uid = info.gid = 1000
            info.uname = info.gname = ""
            with open(os.path.join(workspace, path), "rb") as handle:
                tar.addfile(info, handle)
            carried.append(path)
    if not carried:
        return {"files": [], "bytes": 0, "secret": []}
    excludes: list[str] = []
    subs = sorted((repo.sub for repo in repos if repo.sub), key=len, reverse=True)
    for path in carried:
        if path not in secret or not repos:
            continue  # an ignored file is ignored in the box too; a plain copy has no repository
        sub = next((s for s in subs if path.startswith(s + "/")), "")
        line = exclude_line(path[len(sub) + 1:] if sub else path)
        if line:
            excludes += [sub or ".", line]
    run = provider.exec(box, ["sh", "-c", _SCRIPT, "carry", worktree, str(len(carried)), *carried, *excludes],
                        user="root", stdin=buffer.getvalue())  # fmt: skip
    run.check("carrying files onto the box's tmpfs", box)
    return {
        "files": [path for path in carried if path not in secret],
        "bytes": total,
        "secret": [path for path in carried if path in secret],
    }
