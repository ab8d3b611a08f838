# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A box's working tree, uncommitted work included, copied out to a host directory without
committing anything: what `playbooks/download.yml` does, on every provider (it only needs exec).

The box picks the files (tracked and untracked, not ignored: its own .gitignore rules) and sends
one tar; the host unpacks it with tarfile's `data` filter, because whatever the box writes is
untrusted: no absolute paths, no '..', no links out of the destination, no devices, no setuid.
The export lands in a temporary directory next to the destination and is renamed into place, so
an interrupted download never leaves half a tree. The host's workspace is never written.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from typing import Any

from ._provider import BoxFacts, Provider, ProviderError

MARKER = ".agentbox-export.json"

# In the box, as vscode: a tar on stdout of what git would not ignore (every file of a plain copy),
# then, on stderr's last line, git's view of what is uncommitted.
_SCRIPT = r"""
set -eu
cd /workspace/
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard |
    tar --null --no-recursion --ignore-failed-read -T - -cf - 2>/dev/null
  printf '\n%s\n' "$(git status --porcelain=v1 | base64 -w0)" >&2
else
  tar -cf - .
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
    # The tree as one tar on stdout, however large the user's tree is (not capped; see docs/architecture.md).
    run = provider.exec(facts.name, ["sh", "-c", _SCRIPT], user="vscode", limit=None)
    run.check("reading the box's working tree", facts.name)
    uncommitted: list[str] = []
    last = run.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] if run.stderr else []
    if last:
        try:
            listed = base64.b64decode(last[0], validate=True).decode("utf-8", "replace")
            uncommitted = [line.rstrip() for line in listed.splitlines() if line.strip()]
        except (ValueError, binascii.Error):
            uncommitted = []
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".agentbox-export-", dir=os.path.dirname(target))
    try:
        files = 0
        size = 0
        skipped: list[str] = []
        with tarfile.open(fileobj=io.BytesIO(run.stdout), mode="r:") as tar:
            members = []
            for member in tar.getmembers():
                if member.name in (MARKER, "./" + MARKER):
                    continue
                # The box is not trusted: the data filter refuses paths and links leaving staging,
                # devices and setuid; such an entry is left out (and reported), the rest still comes.
                try:
                    members.append(tarfile.data_filter(member, staging))
                except tarfile.FilterError as exc:
                    skipped.append(f"{member.name}: {exc}")
                    continue
                if member.isreg():
                    files += 1
                    size += member.size
            tar.extractall(staging, members=members, filter="data")
        with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as handle:
            json.dump(
                {"box": facts.name, "provider": facts.provider, "engine": facts.engine, "branch": facts.branch,
                 "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files,
                 "uncommitted": uncommitted},
                handle,
                indent=2,
            )  # fmt: skip
        os.chmod(staging, 0o755)
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "dest": target,
        "files": files,
        "bytes": size,
        "uncommitted": uncommitted,
        "skipped": skipped,
        "seconds": round(time.monotonic() - started, 2),
    }
