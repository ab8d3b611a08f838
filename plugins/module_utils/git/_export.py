# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A box's working tree, uncommitted work included, copied out to a host directory without
committing anything: what `playbooks/download.yml` does, on every provider (it needs exec and
get_archive).

The box picks the files (tracked and untracked, not ignored: its own .gitignore rules) and writes one
tar to a file in the box; the host streams it out (get_archive) and unpacks it with `_safe_extract`,
because whatever the box writes is untrusted: the archive is never held whole, every entry is made
below a descriptor of a fresh staging directory with O_NOFOLLOW at each step, and an entry that could
reach outside (an absolute or '..' name, a hard link, a device, a path through a symbolic link)
refuses the whole archive. When the controller runs as root and the destination's parent belongs to
another user, the unpacking runs as that user. The staging directory is renamed into place only when
every entry passed, so a refused or interrupted download leaves nothing; the host's workspace is
never written.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from typing import Any

from ..core._naming import BOX_USER
from ..core._provider import BoxFacts, Provider, ProviderError
from ..core._safe_extract import ArchiveRefused, Extracted, extract_as, first_entry

MARKER = ".agentbox-export.json"
# What the host reads of the box's `git status` (the box's script cuts it there; more is refused).
STATUS_LIMIT = 1 << 20

# In the box, as vscode: a tar of what git would not ignore (every file of a plain copy) written to $1,
# hard links stored as files; on stdout, git's view of what is uncommitted (at most $2 bytes).
_SCRIPT = r"""
set -eu
umask 077
cd /workspace/
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard |
    tar --null --no-recursion --ignore-failed-read --hard-dereference -T - -cf - 2>/dev/null >"$1"
  git status --porcelain=v1 | head -c "$2"
else
  tar --hard-dereference -cf - . >"$1"
fi
"""


def default_dest(box: str) -> str:
    return os.path.expanduser(f"~/.agentbox/export/{box}")


def _check_dest(dest: str, workspace: str | None) -> None:
    if workspace:
        real_ws = os.path.realpath(workspace)
        real_dest = os.path.realpath(dest)
        if real_dest == real_ws or real_dest.startswith(real_ws.rstrip("/") + "/") or real_ws.startswith(real_dest + "/"):
            raise ProviderError(
                f"dest {dest} overlaps the box's host workspace {workspace}, which is never written: pick another dest"
            )
    if os.path.lexists(dest):
        if not os.path.isdir(dest) or os.path.islink(dest):
            raise ProviderError(f"dest {dest} exists and is not a directory: pick another dest")
        if os.listdir(dest) and not os.path.isfile(os.path.join(dest, MARKER)):
            raise ProviderError(
                f"dest {dest} is not empty and holds no earlier export ({MARKER}): pick an empty or new directory"
            )


def download(provider: Provider, facts: BoxFacts, dest: str | None, check_mode: bool = False) -> dict[str, Any]:
    """Copy the box's tree to dest (default ~/.agentbox/export/<box>/); what was copied."""
    target = os.path.abspath(os.path.expanduser(dest or default_dest(facts.name)))
    _check_dest(target, facts.workspace)
    if check_mode:
        return {"dest": target, "files": None, "bytes": None, "uncommitted": [], "skipped": []}
    started = time.monotonic()
    archive = f"/tmp/agentbox-export-{secrets.token_hex(8)}.tar"
    try:
        argv = ["sh", "-c", _SCRIPT, "export", archive, str(STATUS_LIMIT)]
        run = provider.exec(facts.name, argv, user=BOX_USER, limit=2 * STATUS_LIMIT,  # stderr's room too
                            what="git status of its working tree")
        run.check("reading the box's working tree", facts.name)
        uncommitted = [line.rstrip() for line in run.text.splitlines() if line.strip()]
        os.makedirs(os.path.dirname(target), exist_ok=True)
        done = _unpack(provider, facts, archive, target, uncommitted)
    finally:
        try:
            provider.exec(facts.name, ["rm", "-f", "--", archive])
        except ProviderError:
            pass  # the box's /tmp; what failed first is the error worth raising
    return {
        "dest": target,
        "files": done.files,
        "bytes": done.bytes,
        "uncommitted": uncommitted,
        "skipped": done.left_out,
        "seconds": round(time.monotonic() - started, 2),
    }


def _unpack(provider: Provider, facts: BoxFacts, archive: str, target: str, uncommitted: list[str]) -> Extracted:
    """The box's archive unpacked into a new directory next to target, renamed onto it when whole."""
    parent = os.path.dirname(target)
    # Run as the owner of where the export lands (not as root for a user's directory).
    owner = None
    if os.geteuid() == 0:
        found = os.stat(parent)
        owner = (found.st_uid, found.st_gid) if found.st_uid != 0 else None
    staging = tempfile.mkdtemp(prefix=".agentbox-export-", dir=parent)
    root = -1
    chunks = None
    try:
        root = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        if owner is not None:
            os.fchown(root, *owner)
        # get_archive wraps the box's file in a tar of its own: its one entry is the box's tar.
        chunks = provider.get_archive(facts.name, archive)
        outer, inner = first_entry(chunks)
        if outer is None or outer.kind != "file":
            raise ArchiveRefused(archive, "the box's archive is not a regular file")
        done = extract_as(inner, root, owner, frozenset({MARKER.encode()}))
        record = json.dumps(
            {"box": facts.name, "provider": facts.provider, "engine": facts.engine, "branch": facts.branch,
             "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": done.files,
             "uncommitted": uncommitted},
            indent=2,
        )  # fmt: skip
        fd = os.open(MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=root)
        with os.fdopen(fd, "wb") as handle:
            if owner is not None:
                os.fchown(fd, *owner)
            handle.write(record.encode())
        os.fchmod(root, 0o755)
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.replace(staging, target)
        return done
    except ArchiveRefused as exc:
        shutil.rmtree(staging, ignore_errors=True)
        kept = "an earlier export there is unchanged" if os.path.isdir(target) else "nothing was made there"
        where = f" at entry {exc.entry!r}" if exc.entry else ""
        raise ProviderError(
            f"the box's tree was not downloaded to {target} ({kept}): its archive was refused{where}: {exc.reason}",
            box=facts.name,
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if root >= 0:
            os.close(root)
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
