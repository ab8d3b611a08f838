# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ignored files carried into a box on request: the host's `.env*` files (`with_env`) and any
`carry_ignored` globs. Seeding never carries ignored files; these are the exception a project
needs to run (local settings, API keys for the app under development).

They must never reach a checkpoint: the files live on a tmpfs in the box (what `docker commit`
and a sandbox snapshot do not capture), and /workspace/<path> is a symlink to them. A box restored
from a checkpoint therefore has at most a dangling link until it is carried again.
"""

from __future__ import annotations

import io
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
# as the box user and link each file into the worktree. Arguments: worktree, then the paths.
_SCRIPT = TMPFS_DIR_FUNCTION + r"""
set -eu
dir=/run/agentbox/carried worktree=$1
shift
tmpfs_dir "$dir" agentbox-carried 0700
setpriv --reuid=1000 --regid=1000 --clear-groups tar -x -f - -C "$dir/"
for path in "$@"; do
  target="$worktree/$path"
  setpriv --reuid=1000 --regid=1000 --clear-groups mkdir -p "$(dirname "$target")"
  [ ! -d "$target" ] || [ -L "$target" ] || { echo "$path is a directory in the box: not replaced" >&2; continue; }
  setpriv --reuid=1000 --regid=1000 --clear-groups ln -sfn "$dir/$path" "$target"
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


def carry(provider: Provider, box: str, workspace: str, with_env: bool, globs: list[str], worktree: str) -> dict[str, Any]:
    """Carry the workspace's ignored .env* files (with_env) and `globs` into the box's tmpfs and link
    them from `worktree`; {'files': [...], 'bytes': N}. Nothing happens for a non-git workspace:
    its plain copy took every file already."""
    patterns = ([ENV_GLOB] if with_env else []) + list(globs)
    repos = _git.find_repos(workspace)
    if not patterns or not repos:
        return {"files": [], "bytes": 0}
    root = repos[0]
    paths = ignored_files(root, patterns)
    if not paths:
        return {"files": [], "bytes": 0}
    buffer = io.BytesIO()
    total = 0
    carried: list[str] = []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            info = tar.gettarinfo(f"{root.root}/{path}", arcname=path)
            if info is None or not info.isreg():  # a link could point anywhere on the host: files only
                continue
            total += info.size
            if total > MAX_BYTES:
                raise ProviderError(
                    f"the ignored files to carry add up to more than {MAX_BYTES >> 20} MiB (at {path}): they live in "
                    "memory in the box; narrow carry_ignored",
                    box=box,
                    operation="carry",
                )
            info.uid = info.gid = 1000
            info.uname = info.gname = ""
            with open(f"{root.root}/{path}", "rb") as handle:
                tar.addfile(info, handle)
            carried.append(path)
    if not carried:
        return {"files": [], "bytes": 0}
    run = provider.exec(box, ["sh", "-c", _SCRIPT, "carry", worktree, *carried], user="root", stdin=buffer.getvalue())
    run.check("carrying the ignored files", box)
    return {"files": carried, "bytes": total}
