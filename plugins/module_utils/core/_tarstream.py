# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tar streams built on the fly: files go from the host into a box with no temp file and
without holding a whole file in memory. Modes, symlinks, empty files and any file name
survive; ownership is set to the box user so the agent owns what it gets."""

from __future__ import annotations

import dataclasses
import os
import queue
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator

BOX_UID = 1000
BOX_GID = 1000
_CHUNK = 1 << 16
_QUEUE_DEPTH = 64  # at most ~4 MiB of tar in flight between the reader thread and the engine


class _QueueWriter:
    """A write-only file object that hands each write to a bounded queue."""

    def __init__(self, chunks: queue.Queue):
        self._chunks = chunks

    def write(self, data: bytes) -> int:
        if data:
            self._chunks.put(bytes(data))
        return len(data)

    def flush(self) -> None:  # tarfile calls it
        pass


def _stream(build, open_ended: bool = False) -> Iterator[bytes]:
    """The tar `build` writes, as chunks. `open_ended`: without the end-of-archive blocks, so that
    more members can follow (the members' end is the tar's offset once `build` returned; what
    tarfile writes after that, at close, is only the end-of-archive zeros and padding)."""
    chunks: queue.Queue = queue.Queue(maxsize=_QUEUE_DEPTH)
    failure: list[BaseException] = []
    end: list[int] = []
    done = object()

    def run() -> None:
        try:
            with tarfile.open(fileobj=_QueueWriter(chunks), mode="w|", format=tarfile.PAX_FORMAT) as tar:
                build(tar)
                end.append(tar.offset)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            failure.append(exc)
        finally:
            chunks.put(done)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    sent = 0
    while True:
        item = chunks.get()
        if item is done:
            break
        if open_ended and end:  # set before close() wrote anything past it (the queue orders the two)
            item = item[: max(0, end[0] - sent)]
        sent += len(item)
        if item:
            yield item
    worker.join()
    if failure:
        raise failure[0]


def _owned(info: tarfile.TarInfo, uid: int, gid: int) -> tarfile.TarInfo:
    info.uid, info.gid = uid, gid
    info.uname, info.gname = "", ""
    return info


def _add_paths(
    tar: tarfile.TarFile, root: str, relative_paths: Iterable[str], uid: int, gid: int, prefix: str = ""
) -> None:
    """Add the given paths under root, each named `prefix` + its relative path (see tar_of_paths)."""
    emitted_dirs: set[str] = set()
    for rel in relative_paths:
        # Parent directories first, owned by the box user: the engine would make them root's.
        parent = os.path.dirname(rel)
        missing: list[str] = []
        while parent and parent not in emitted_dirs:
            missing.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(missing):
            emitted_dirs.add(directory)
            try:
                tar.addfile(_owned(tar.gettarinfo(os.path.join(root, directory), arcname=prefix + directory), uid, gid))
            except FileNotFoundError:
                pass
        full = os.path.join(root, rel)
        try:
            info = tar.gettarinfo(full, arcname=prefix + rel)
        except FileNotFoundError:
            continue
        if info is None:  # sockets, fifos: nothing to carry
            continue
        _owned(info, uid, gid)
        if info.isdir():
            emitted_dirs.add(rel)
        if info.isreg():
            with open(full, "rb") as handle:
                tar.addfile(info, handle)
        else:
            tar.addfile(info)


def tar_of_paths(root: str, relative_paths: Iterable[str], uid: int = BOX_UID, gid: int = BOX_GID) -> Iterator[bytes]:
    """A tar of the given paths under root (no recursion: directories are entries only).

    Paths that vanished since they were listed are skipped: the host keeps working meanwhile.
    """
    return _stream(lambda tar: _add_paths(tar, root, relative_paths, uid, gid))


@dataclasses.dataclass
class Final:
    """A small file to end a tar with (see tar_ending_with): its name in the archive, content, owner, mode."""

    name: str
    content: bytes
    uid: int = 0
    gid: int = 0
    mode: int = 0o644
    dir_uid: int = BOX_UID  # its directory's entry, made or set by the extraction
    dir_gid: int = BOX_GID
    dir_mode: int = 0o755


def tar_ending_with(
    parts: Iterable[tuple[str, Iterable[str], str]], final: Final, uid: int = BOX_UID, gid: int = BOX_GID
) -> Iterator[bytes]:
    """One tar, to be extracted at `/`: the paths of each (root, relative paths, target) part
    named under its absolute `target`, then `final` (its directory's entry and the file) last.

    An engine extracts a tar member by member, in order, so `final` exists only once every file
    before it was written whole. And it comes as one chunk of its own, with the end of the archive:
    a stream cut short (the sender killed) ends before it or after it, never inside its content.
    """

    def build(tar: tarfile.TarFile) -> None:
        for root, relative_paths, target in parts:
            _add_paths(tar, root, relative_paths, uid, gid, prefix=target.strip("/") + "/")

    yield from _stream(build, open_ended=True)
    now = int(time.time())
    directory = tarfile.TarInfo(os.path.dirname(final.name.strip("/")))
    directory.type, directory.mode, directory.mtime = tarfile.DIRTYPE, final.dir_mode, now
    member = tarfile.TarInfo(final.name.strip("/"))
    member.size, member.mode, member.mtime = len(final.content), final.mode, now
    tail = _owned(directory, final.dir_uid, final.dir_gid).tobuf(tarfile.PAX_FORMAT)
    tail += _owned(member, final.uid, final.gid).tobuf(tarfile.PAX_FORMAT)
    tail += final.content + b"\0" * (-len(final.content) % tarfile.BLOCKSIZE)
    yield tail + b"\0" * (2 * tarfile.BLOCKSIZE)  # the end of the archive


def tar_of_tree(root: str, uid: int = BOX_UID, gid: int = BOX_GID, exclude: Iterable[str] = ()) -> Iterator[bytes]:
    """A tar of everything under root (a plain copy for workspaces that are not git repos)."""
    skipped = set(exclude)

    def walk() -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames if os.path.normpath(os.path.join(rel_dir, d)) not in skipped)
            for entry in dirnames + sorted(filenames):
                rel = os.path.normpath(os.path.join(rel_dir, entry))
                if rel not in skipped:
                    yield rel

    return tar_of_paths(root, walk(), uid, gid)


def tar_of_files(files: dict[str, tuple[bytes, int]], uid: int = BOX_UID, gid: int = BOX_GID) -> Iterator[bytes]:
    """A tar of small in-memory files: {name: (content, mode)}."""
    import io

    def build(tar: tarfile.TarFile) -> None:
        for name, (content, mode) in files.items():
            info = _owned(tarfile.TarInfo(name), uid, gid)
            info.size = len(content)
            info.mode = mode
            tar.addfile(info, io.BytesIO(content))

    return _stream(build)
