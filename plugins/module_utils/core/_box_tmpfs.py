# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A run-time directory of the box on a tmpfs, for what must never reach its disk or a checkpoint.

Sign-in files of agents and the carried `.env` files live under /run/agentbox. On Docker that is a
tmpfs already; where it is not (Daytona, boxd, remote images), the directory gets a tmpfs of its
own, or /dev/shm behind a link where mounts are refused. A directory that ends up on anything but a
tmpfs is refused (exit 3) before a byte is written.
"""

from __future__ import annotations

# A shell function, run as root: tmpfs_dir DIR LABEL MODE. DIR is left on a tmpfs, owned by the box
# user (1000) with MODE. What an older version left on the disk there is removed first: run-time
# files only, never kept.
TMPFS_DIR_FUNCTION = r"""
tmpfs_dir() {
  dir=$1 label=$2 mode=$3
  mkdir -p /run/agentbox
  if [ "$(stat -f -c %T /run/agentbox)" != tmpfs ] && [ "$(stat -f -c %T "$dir/" 2>/dev/null)" != tmpfs ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    if ! mount -t tmpfs -o "mode=$mode,uid=1000,gid=1000,size=64m" "$label" "$dir" 2>/dev/null; then
      rmdir "$dir"
      mkdir -p -m "$mode" "/dev/shm/$label"
      ln -sfn "/dev/shm/$label" "$dir"
    fi
  fi
  mkdir -p "$dir"
  chown 1000:1000 "$dir/" && chmod "$mode" "$dir/"
  [ "$(stat -f -c %T "$dir/")" = tmpfs ] || { echo "no tmpfs for $dir: refusing to write to disk" >&2; exit 3; }
}
"""
