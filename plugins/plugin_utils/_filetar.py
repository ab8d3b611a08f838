# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One file into or out of a box as a tar stream, a chunk at a time.

Note that this plugin util is PRIVATE to the collection: it can change at any time.

A 50 MB file never sits in memory whole: `single_file_tar` reads it in 64 KiB chunks while the
engine consumes the stream, and `extract_single_file` writes each chunk out as it arrives (headers
the box made are read bounded, by `_safe_extract`).
"""

from __future__ import annotations

import os
import stat
import tarfile
import time
from collections.abc import Iterable, Iterator
from typing import IO

from ansible_collections.agentbox.box.plugins.module_utils.core._safe_extract import ArchiveRefused, first_entry

CHUNK = 1 << 16


def single_file_tar(local_path: str, member_name: str, uid: int, gid: int, mode: int | None = None) -> Iterator[bytes]:
    """A tar stream holding `local_path` as `member_name`, owned by uid:gid.

    Symlinks on the controller are followed (the box gets the content, as with ssh).
    """
    with open(local_path, "rb") as handle:
        info_stat = os.fstat(handle.fileno())
        if not stat.S_ISREG(info_stat.st_mode):
            raise ValueError(f"{local_path} is not a regular file")
        info = tarfile.TarInfo(member_name)
        info.size = info_stat.st_size
        info.mode = stat.S_IMODE(info_stat.st_mode) if mode is None else mode
        info.mtime = int(info_stat.st_mtime) or int(time.time())
        info.uid, info.gid = uid, gid
        info.uname = info.gname = ""
        info.type = tarfile.REGTYPE
        # PAX keeps any UTF-8 name of any length exactly.
        yield info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
        remaining = info.size
        while remaining > 0:
            chunk = handle.read(min(CHUNK, remaining))
            if not chunk:
                raise OSError(f"{local_path} shrank while being copied")
            remaining -= len(chunk)
            yield chunk
        padding = (-info.size) % tarfile.BLOCKSIZE
        if padding:
            yield b"\0" * padding
    # End of archive: two zero blocks (readers need no record padding).
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


class NotARegularFile(Exception):
    """The archive's first member is not a regular file; `link_target` is set for symlinks."""

    def __init__(self, message: str, link_target: str | None = None):
        super().__init__(message)
        self.link_target = link_target


def extract_single_file(chunks: Iterable[bytes], out: IO[bytes]) -> int:
    """Write the one regular file of a tar stream to `out`; returns its size. The box made the stream:
    it is read with `_safe_extract`'s bounded reader (tarfile would hold any header whole)."""
    try:
        member, data = first_entry(chunks)
        if member is None:
            raise NotARegularFile("the box sent an empty archive")
        if member.kind == "symlink":
            link = member.link.decode("utf-8", "surrogateescape")
            raise NotARegularFile(f"{member.shown} is a symbolic link", link_target=link)
        if member.kind != "file":
            raise NotARegularFile(f"{member.shown} is not a regular file")
        written = 0
        for chunk in data:
            out.write(chunk)
            written += len(chunk)
        return written
    except ArchiveRefused as exc:
        raise NotARegularFile(f"the box's archive was refused: {exc}") from None
