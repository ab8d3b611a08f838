# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One file into or out of a box as a tar stream, a chunk at a time.

Note that this plugin util is PRIVATE to the collection: it can change at any time.

A 50 MB file never sits in memory whole: `single_file_tar` reads it in 64 KiB chunks while the
engine consumes the stream, and `extract_single_file` writes each chunk out as it arrives.
"""

from __future__ import annotations

import os
import stat
import tarfile
import time
from collections.abc import Iterable, Iterator
from typing import IO

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


class IterReader:
    """A read-only file object over an iterator of byte chunks (for tarfile's stream mode)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            parts = [self._buffer, *self._chunks]
            self._buffer = b""
            return b"".join(parts)
        while len(self._buffer) < size:
            try:
                self._buffer += next(self._chunks)
            except StopIteration:
                break
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def readable(self) -> bool:
        return True


class NotARegularFile(Exception):
    """The archive's first member is not a regular file; `link_target` is set for symlinks."""

    def __init__(self, message: str, link_target: str | None = None):
        super().__init__(message)
        self.link_target = link_target


def extract_single_file(chunks: Iterable[bytes], out: IO[bytes]) -> int:
    """Write the one regular file of a tar stream to `out`; returns its size."""
    with tarfile.open(fileobj=IterReader(chunks), mode="r|", encoding="utf-8", errors="surrogateescape") as tar:
        member = tar.next()
        if member is None:
            raise NotARegularFile("the box sent an empty archive")
        if member.issym():
            raise NotARegularFile(f"{member.name} is a symbolic link", link_target=member.linkname)
        if not member.isreg():
            raise NotARegularFile(f"{member.name} is not a regular file")
        source = tar.extractfile(member)
        if source is None:
            raise AssertionError('a regular file member always has its data')
        written = 0
        while chunk := source.read(CHUNK):
            out.write(chunk)
            written += len(chunk)
        return written
