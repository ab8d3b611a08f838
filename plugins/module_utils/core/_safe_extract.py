# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tar archives a box made, unpacked on the host without trusting one byte of them.

Python's tarfile is not used: its `data` filter checks names with os.path.realpath, which a crafted
archive defeats (CVE-2025-4517: links nested past PATH_MAX, then a link through them), and its
reader holds PAX and GNU long-name headers whole in memory at whatever size the archive declares.

Here the archive is read as a stream (headers bounded, file data moved a piece at a time, so the
memory used does not grow with the tree), and the file system is the only state: every entry is
made relative to a descriptor of the target directory, one component at a time, each directory
opened with O_NOFOLLOW | O_DIRECTORY and each file created with O_CREAT | O_EXCL | O_NOFOLLOW. A
link is never followed, a name is never resolved by path, and an entry whose path goes through a
symbolic link fails where the kernel meets the link.

Refused, so the whole archive is refused (`ArchiveRefused`, naming the entry and why): absolute
names, '..' in a name, hard links, devices, fifos and other special entries, sparse files, a name
that exists already, an entry whose path goes through a symbolic link or a file, headers that are
not tar or are larger than any real name needs, and an archive cut short. Left out and reported
(the rest still comes): symbolic links whose target could leave the tree (absolute, more '..'
than the link is deep, or '..' after a name, which another link could turn into a way out) and
names the caller reserves. Modes keep only the permission bits (no setuid, setgid, sticky, group
or other write); owners are never taken from the archive.

`extract_as` runs the same code in a forked child that runs as another user (see
docs/architecture.md, "Trees copied out of a box"), given the target's descriptor.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import stat
from collections.abc import Iterable, Iterator

BLOCK = 512
# File data is written in pieces of at most this size.
PIECE = 1 << 20
# A name or link target longer than any the kernel accepts as a path (PATH_MAX) is refused.
NAME_LIMIT = 4096
# The PAX records of one entry (a name, a link target, a size, times) fit in far less.
PAX_LIMIT = 1 << 16
# Entries left out before the archive is refused as a whole (the report stays small).
LEFT_OUT_LIMIT = 1000

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_ZERO_BLOCK = bytes(BLOCK)
_KINDS = {
    b"0": "file", b"\0": "file", b"7": "file", b"1": "hard link", b"2": "symlink", b"3": "character device",
    b"4": "block device", b"5": "directory", b"6": "fifo", b"S": "sparse file", b"D": "GNU dump directory",
    b"M": "multi-volume continuation", b"V": "volume label",
}  # fmt: skip
# Entry kinds that carry no data in the archive, whatever their size field says (as tar reads them).
_NO_DATA = ("hard link", "symlink", "character device", "block device", "fifo", "directory")
# Times outside this range (seconds either side of 1970) are taken as 0.
_TIME_LIMIT = 1 << 40


class ArchiveRefused(Exception):
    """The archive is not unpacked: `entry` (as text) and `reason` say where and why."""

    def __init__(self, entry: str, reason: str):
        super().__init__(f"{entry!r}: {reason}" if entry else reason)
        self.entry = entry
        self.reason = reason


@dataclasses.dataclass
class Entry:
    """One tar entry as read: the raw name and link target (bytes, as the archive has them)."""

    name: bytes
    kind: str
    size: int
    mode: int
    mtime: float
    link: bytes = b""

    @property
    def shown(self) -> str:
        return show(self.name)


@dataclasses.dataclass
class Extracted:
    files: int = 0
    bytes: int = 0
    # "<entry>: <why>" for each entry left out.
    left_out: list[str] = dataclasses.field(default_factory=list)


def show(name: bytes) -> str:
    """A name from an archive as text for a message (undecodable bytes as \\x escapes)."""
    return name.decode("utf-8", "backslashreplace")


# -- reading ------------------------------------------------------------------------------------
class _Source:
    """Exact reads from an iterator of byte chunks, holding no more than one chunk."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._chunk = memoryview(b"")
        self._at = 0

    def some(self, limit: int) -> bytes:
        """Up to `limit` bytes, fewer only at the end of a chunk; b"" at the end of the stream."""
        if self._at >= len(self._chunk):
            for chunk in self._chunks:
                if chunk:
                    self._chunk, self._at = memoryview(chunk), 0
                    break
            else:
                return b""
        piece = self._chunk[self._at : self._at + limit]
        self._at += len(piece)
        return piece.tobytes()

    def exact(self, size: int, entry: str) -> bytes:
        parts = []
        while size:
            piece = self.some(size)
            if not piece:
                raise ArchiveRefused(entry, "the archive ends inside this entry: it was cut short")
            parts.append(piece)
            size -= len(piece)
        return b"".join(parts)

    def skip(self, size: int, entry: str) -> None:
        while size:
            piece = self.some(min(size, PIECE))
            if not piece:
                raise ArchiveRefused(entry, "the archive ends inside this entry: it was cut short")
            size -= len(piece)


class _Data:
    """One entry's data, read from the stream as it is iterated; `left` is what was not read."""

    def __init__(self, source: _Source, size: int, shown: str):
        self.source, self.left, self.shown = source, size, shown

    def __iter__(self) -> _Data:
        return self

    def __next__(self) -> bytes:
        if not self.left:
            raise StopIteration
        piece = self.source.some(min(self.left, PIECE))
        if not piece:
            raise ArchiveRefused(self.shown, "the archive ends inside this entry: it was cut short")
        self.left -= len(piece)
        return piece


def _number(field: bytes, what: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256, for values octal cannot hold
        if field[0] == 0xFF:
            raise ArchiveRefused("", f"a header holds a negative {what}")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ArchiveRefused("", f"a header's {what} is not a number: not a tar archive") from None


def _pax_records(data: bytes, entry: str) -> dict[bytes, bytes]:
    """'<length> <key>=<value>\\n' records; values kept as bytes (names need not be UTF-8)."""
    records: dict[bytes, bytes] = {}
    at = 0
    while at < len(data) and data[at : at + 1] != b"\0":
        space = data.find(b" ", at)
        digits = data[at:space] if space > at else b""
        length = int(digits) if digits.isdigit() else 0
        record = data[at : at + length]
        key, sep, value = record[space - at + 1 : -1].partition(b"=")
        if length <= space - at + 1 or len(record) < length or not record.endswith(b"\n") or not sep:
            raise ArchiveRefused(entry, "a PAX header is malformed")
        records[key] = value
        at += length
    return records


def entries(chunks: Iterable[bytes]) -> Iterator[tuple[Entry, Iterator[bytes]]]:
    """Each entry of a tar stream with an iterator of its data; data not read is skipped. Ends at the
    end-of-archive block; an archive without one is refused (cut short)."""
    source = _Source(chunks)
    long_name = long_link = None
    pax: dict[bytes, bytes] = {}
    while True:
        block = source.some(BLOCK)
        if len(block) < BLOCK:
            if not block:
                raise ArchiveRefused("", "the archive ends without its end-of-archive blocks: it was cut short")
            block += source.exact(BLOCK - len(block), "")
        if block == _ZERO_BLOCK:
            return
        unsigned = sum(block[:148]) + 256 + sum(block[156:])  # the checksum field counts as 8 spaces
        signed = unsigned - 256 * sum(1 for byte in block[:148] + block[156:] if byte > 127)  # old tars
        if _number(block[148:156], "checksum") not in (unsigned, signed):
            raise ArchiveRefused("", "a header's checksum does not match: not a tar archive, or a damaged one")
        flag = block[156:157]
        size = _number(block[124:136], "size")
        name = block[:100].split(b"\0", 1)[0]
        if block[257:263] == b"ustar\0" and block[345:346] != b"\0":
            name = block[345:500].split(b"\0", 1)[0] + b"/" + name
        shown = show(name)
        if flag in (b"L", b"K", b"x", b"g"):  # metadata for the entry that follows
            limit = NAME_LIMIT + 1 if flag in (b"L", b"K") else PAX_LIMIT
            if size > limit:
                raise ArchiveRefused(shown, f"a header of {size} bytes (at most {limit} are read)")
            payload = source.exact(size, shown)
            source.skip(-size % BLOCK, shown)
            if flag == b"L":
                long_name = payload.split(b"\0", 1)[0]
            elif flag == b"K":
                long_link = payload.split(b"\0", 1)[0]
            elif flag == b"x":
                pax.update(_pax_records(payload, shown))
            continue  # global PAX records ('g') carry nothing this reader uses
        link = block[157:257].split(b"\0", 1)[0]
        name = pax.get(b"path", long_name if long_name is not None else name)
        link = pax.get(b"linkpath", long_link if long_link is not None else link)
        shown = show(name)
        if b"size" in pax:
            if not pax[b"size"].isdigit():
                raise ArchiveRefused(shown, "its PAX size is not a number")
            size = int(pax[b"size"])
        if any(key.startswith(b"GNU.sparse.") for key in pax):
            flag = b"S"
        try:
            mtime = float(pax.get(b"mtime", b"") or _number(block[136:148], "time"))
        except ValueError:
            mtime = 0.0
        if not -_TIME_LIMIT < mtime < _TIME_LIMIT:  # also NaN
            mtime = 0.0
        kind = _KINDS.get(flag, f"special entry of type {show(flag)!r}")
        if kind == "file" and name.endswith(b"/"):
            kind = "directory"  # old archives mark directories by the slash alone
        if kind in _NO_DATA:
            size = 0
        if len(name) > NAME_LIMIT or len(link) > NAME_LIMIT:
            raise ArchiveRefused(shown[:200] + "...", f"a name or link target over {NAME_LIMIT} bytes")
        entry = Entry(name, kind, size, _number(block[100:108], "mode"), mtime, link)
        long_name = long_link = None
        pax = {}
        data = _Data(source, size, shown)
        yield entry, data
        source.skip(data.left, shown)
        source.skip(-size % BLOCK, shown)


def first_entry(chunks: Iterable[bytes]) -> tuple[Entry | None, Iterator[bytes]]:
    """The first entry of a tar stream and its data (an archive of one file copied out of a box):
    (None, empty) for an archive without entries. The rest of the stream is not read."""
    found = entries(chunks)
    for entry, data in found:
        return entry, data
    return None, iter(())


# -- writing ------------------------------------------------------------------------------------
def _parts(entry: Entry) -> tuple[bytes, ...]:
    """The entry's name as components below the target; refused when it could leave it."""
    if entry.name.startswith(b"/"):
        raise ArchiveRefused(entry.shown, "an absolute name")
    parts = tuple(part for part in entry.name.split(b"/") if part not in (b"", b"."))
    if b".." in parts:
        raise ArchiveRefused(entry.shown, "'..' in the name")
    if any(b"\0" in part for part in parts):
        raise ArchiveRefused(entry.shown, "a NUL byte in the name")
    return parts


def link_leaves_tree(parts: tuple[bytes, ...], target: bytes) -> str | None:
    """Why a symbolic link at `parts` with `target` could point outside the tree, or None.

    Only leading '..' are allowed (each one leaves a real directory this extraction made, since no
    entry goes through a link), at most as many as the link is deep; after them the target only
    descends. Any link it descends through obeys the same rule, so no chain of links leaves."""
    if not target:
        return "an empty link target"
    if target.startswith(b"/"):
        return "its target is an absolute path"
    if b"\0" in target:
        return "a NUL byte in its target"
    steps = [step for step in target.split(b"/") if step not in (b"", b".")]
    ups = 0
    while ups < len(steps) and steps[ups] == b"..":
        ups += 1
    if b".." in steps[ups:]:
        return "its target has '..' after a name (another link there could lead out)"
    if ups > len(parts) - 1:
        return "its target is above the tree"
    return None


def file_mode(mode: int) -> int:
    """Permission bits only; the owner can read and write; execute only where the owner may."""
    mode = (mode & 0o755) | 0o600
    return mode if mode & 0o100 else mode & ~0o111


class _Tree:
    """Directories below the target's descriptor, walked (and made) one component at a time."""

    def __init__(self, root: int):
        self.root = root
        self._open: tuple[tuple[bytes, ...], int] | None = None  # the last directory walked to

    def directory(self, parts: tuple[bytes, ...], entry: Entry) -> int:
        """A descriptor of the directory at `parts` (made where missing); owned by the tree."""
        if not parts:
            return self.root
        if self._open is not None and self._open[0] == parts:
            return self._open[1]
        self.close()
        fd = self.root
        try:
            for depth, part in enumerate(parts):
                try:
                    try:
                        inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except FileNotFoundError:
                        os.mkdir(part, 0o777, dir_fd=fd)  # the umask applies, as for any new directory
                        inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise ArchiveRefused(entry.shown, self._why(fd, part, parts[: depth + 1], exc)) from None
                if fd != self.root:
                    os.close(fd)
                fd = inner
        except BaseException:
            if fd != self.root:
                os.close(fd)
            raise
        self._open = (parts, fd)
        return fd

    @staticmethod
    def _why(fd: int, part: bytes, path: tuple[bytes, ...], exc: OSError) -> str:
        try:
            found = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
        except OSError:
            found = 0
        where = show(b"/".join(path))
        if stat.S_ISLNK(found):
            return f"its path goes through the symbolic link {where!r}"
        if found and not stat.S_ISDIR(found):
            return f"its path goes through {where!r}, which is not a directory"
        return f"{where!r} could not be made: {exc.strerror}"

    def close(self) -> None:
        if self._open is not None:
            os.close(self._open[1])
            self._open = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def extract(chunks: Iterable[bytes], root: int, reserved: frozenset[bytes] = frozenset()) -> Extracted:
    """Unpack a tar stream below the directory open as `root` (best empty and made for this: on a
    refusal what was made so far stays, for the caller to remove). `reserved`: top-level names that
    are left out. Raises ArchiveRefused."""
    result = Extracted()
    left_out: set[bytes] = set()  # links not made: an entry through one, or of the same name, is refused
    tree = _Tree(root)
    try:
        for entry, data in entries(chunks):
            parts = _parts(entry)
            if not parts:
                if entry.kind == "directory":
                    continue  # the target itself ('./')
                raise ArchiveRefused(entry.shown, "an empty name")
            for depth in range(1, len(parts) + 1) if left_out else ():
                if b"/".join(parts[:depth]) in left_out:
                    raise ArchiveRefused(entry.shown, f"its path goes through the symbolic link "
                                                      f"{show(b'/'.join(parts[:depth]))!r}, which was left out")  # fmt: skip
            why = None
            if len(parts) == 1 and parts[0] in reserved:
                why = "the name is reserved for the export's own record"
            elif entry.kind == "symlink":
                why = link_leaves_tree(parts, entry.link)
            if why is not None:
                result.left_out.append(f"{entry.shown}: {why}")
                left_out.add(b"/".join(parts))
                if len(result.left_out) > LEFT_OUT_LIMIT:
                    raise ArchiveRefused(entry.shown, f"more than {LEFT_OUT_LIMIT} entries would be left out")
                continue
            if entry.kind == "directory":
                tree.directory(parts, entry)
                continue
            if entry.kind not in ("file", "symlink"):
                refusal = f"a {entry.kind}" + (f" (to {show(entry.link)!r})" if entry.kind == "hard link" else "")
                raise ArchiveRefused(entry.shown, f"{refusal}: only files, directories and symbolic links are taken")
            parent = tree.directory(parts[:-1], entry)
            try:
                if entry.kind == "symlink":
                    os.symlink(entry.link, parts[-1], dir_fd=parent)
                    continue
                fd = os.open(parts[-1], _FILE_FLAGS, 0o600, dir_fd=parent)
                try:
                    for piece in data:
                        _write_all(fd, piece)
                    os.fchmod(fd, file_mode(entry.mode))
                    os.utime(fd, (entry.mtime, entry.mtime))
                finally:
                    os.close(fd)
            except FileExistsError:
                raise ArchiveRefused(entry.shown, "the name is already taken (the archive has it twice)") from None
            except OSError as exc:
                raise ArchiveRefused(entry.shown, f"it could not be written: {exc.strerror}") from None
            result.files += 1
            result.bytes += entry.size
    finally:
        tree.close()
    return result


# -- as another user ----------------------------------------------------------------------------
def extract_as(
    chunks: Iterable[bytes], root: int, owner: tuple[int, int] | None, reserved: frozenset[bytes] = frozenset()
) -> Extracted:
    """`extract`, in a forked child that runs as `owner` (uid, gid; no supplementary groups) when one
    is given: the stream reaches it through a pipe, the target through the descriptor `root`. A fork,
    not a new interpreter: the controller's Python may be one the owner cannot run."""
    if owner is None:
        return extract(chunks, root, reserved)
    data_read, data_write = os.pipe()
    answer_read, answer_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(owner, data_read, answer_write, root, reserved)
    os.close(data_read)
    os.close(answer_write)
    try:
        try:
            for chunk in chunks:
                _write_all(data_write, chunk)
        except BrokenPipeError:
            pass  # the child stopped reading: it refused the archive, and says so below
        finally:
            os.close(data_write)
        answer = bytearray()
        while piece := os.read(answer_read, PIECE):
            answer += piece
        _pid, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        os.close(answer_read)
        if pid:  # the stream failed on the host's side: the child's work is void
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    try:
        told = json.loads(answer)
    except ValueError:
        told = None
    if not isinstance(told, dict) or os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the unpacking process (uid {owner[0]}) failed: {told}")
    if "reason" in told:
        raise ArchiveRefused(str(told.get("entry", "")), str(told["reason"]))
    return Extracted(int(told["files"]), int(told["bytes"]), [str(line) for line in told["left_out"]])


def _child(owner: tuple[int, int], data: int, answer: int, root: int, reserved: frozenset[bytes]) -> None:
    """extract_as's child: drops to `owner` for good, unpacks, writes its answer as JSON, exits."""
    gc.disable()  # no finalizer of the parent's objects (a connection's close) runs here
    code = 1
    try:
        os.setgroups([])
        os.setresgid(owner[1], owner[1], owner[1])
        os.setresuid(owner[0], owner[0], owner[0])

        def stream() -> Iterator[bytes]:
            while piece := os.read(data, PIECE):
                yield piece

        try:
            done = extract(stream(), root, reserved)
            told: dict = {"files": done.files, "bytes": done.bytes, "left_out": done.left_out}
        except ArchiveRefused as exc:
            told = {"entry": exc.entry, "reason": exc.reason}
        _write_all(answer, json.dumps(told).encode())
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        try:
            _write_all(answer, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        except BaseException:  # noqa: BLE001 - nothing more to be done in a dying child
            pass
    finally:
        os._exit(code)
