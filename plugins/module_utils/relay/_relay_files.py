# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`agentbox-ctl cp`: one file between the host and the box that asks, through the relay (docs/relay.md).

The box names a path of its own and a path on the host. Host paths are confined to the box's workspace:
relative paths are relative to it; a path outside it, a file that would be replaced, a file named like a
secret or anything in the host repository's `.git` waits for the user (as a push to another branch does);
`..` is refused before this file runs (_relay_protocol), and so is a path through a symbolic link, inside
the workspace or out: the host walks the path one directory at a time from a descriptor, never following a
link. Nothing is ever written into a `.git`.

The bytes travel through the provider's archive calls (every provider has them), never the relay's channel.
What comes out of the box is hostile: one regular file of at most MAX_COPY_BYTES (its tar header is checked
before any byte is written), written to a new file beside the destination (O_EXCL, O_NOFOLLOW, mode 0644: no
execute, setuid or other bits, whatever the box said) and renamed into place only once whole; a new file is
linked in, so a file that appeared meanwhile is never replaced unless the user approved replacing it. The
host never executes, parses or trusts the content.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import posixpath
import secrets
import stat
import tarfile
import time
from collections.abc import Iterator

from ..core._provider import BoxFacts, Provider, ProviderError
from ..core._safe_extract import ArchiveRefused, first_entry
from ..core._secret_files import HEAD_BYTES, named_like_secret
from ..core._tarstream import BOX_GID, BOX_UID
from ._relay_ops import Outcome
from ._relay_protocol import MAX_COPY_BYTES, Request

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_MODE = 0o644
CHUNK = 1 << 16


class Refused(Exception):
    """The copy is refused; the message says why and what to do."""


@dataclasses.dataclass
class StagedCopy:
    """A copy checked before the policy decides: where on the host, and why the user must approve it."""

    host_path: str  # absolute, normalised
    start: str  # the directory the walk starts from: the workspace, or "/" for a path outside it
    parts: tuple[str, ...]  # the components below `start`
    exists: bool  # the host file is there now (out: replacing it asks the user)
    reasons: list[str] = dataclasses.field(default_factory=list)

    wakes_box = True  # an answer given hours later: the box runs again before the copy

    @property
    def reason(self) -> str | None:
        return "; ".join(self.reasons) or None

    def approval(self, request: Request, own_branch: str) -> str | None:
        """Why the user must approve it (None: the box may copy alone)."""
        return self.reason

    def run(self, provider: Provider, facts: BoxFacts, request: Request, bundles: object, approved: bool) -> Outcome:
        """The copy; an approved one may replace the file it named (`bundles` carries a push's commits only)."""
        del bundles
        return carry_out(provider, facts, request, self, approved and self.exists)


def _workspace(facts: BoxFacts) -> str:
    if not facts.workspace or not os.path.isabs(facts.workspace):
        raise Refused("this box has no workspace on this host to copy files to or from")
    return os.path.realpath(facts.workspace)


def stage(facts: BoxFacts, request: Request) -> StagedCopy | Outcome:
    """The host side of a copy checked (no byte moved): a StagedCopy, or an Outcome refusing it."""
    try:
        return _stage(facts, request)
    except Refused as exc:
        return Outcome(1, stderr=f"{exc}\n")


def _stage(facts: BoxFacts, request: Request) -> StagedCopy:
    workspace = _workspace(facts)
    given = request.args["host"]
    absolute = posixpath.normpath(given if given.startswith("/") else posixpath.join(workspace, given))
    inside = None
    for root in dict.fromkeys((workspace, posixpath.normpath(facts.workspace))):
        if absolute == root:
            raise Refused(f"{given} is the workspace itself: name a file in it")
        if absolute.startswith(root.rstrip("/") + "/"):
            inside = (root, tuple(absolute[len(root.rstrip("/")) + 1:].split("/")))
            break
    start, parts = (workspace, inside[1]) if inside else ("/", tuple(absolute.strip("/").split("/")))
    outgoing = request.args["direction"] == "out"
    staged = StagedCopy(host_path=absolute, start=start, parts=parts, exists=False)
    if inside is None:
        staged.reasons.append(f"{'writes' if outgoing else 'reads'} {absolute}, outside the box's workspace {workspace}")
    # Any case: on a case-insensitive host disk (macOS) .GIT is the repository's own .git.
    if any(part.casefold() == ".git" for part in parts):
        if outgoing or inside is None:
            raise Refused(f"{absolute} is in a .git directory: a box never writes a repository's own files")
        staged.reasons.append(f"reads {absolute} in the host repository's .git (its configuration may hold credentials)")
    with _parent(staged) as parent:
        try:
            found = os.lstat(parts[-1], dir_fd=parent)
        except FileNotFoundError:
            found = None
        if found is not None and stat.S_ISLNK(found.st_mode):
            raise Refused(f"{absolute} is a symbolic link on the host: it is never followed; name the file it points to")
        if found is not None and not stat.S_ISREG(found.st_mode):
            raise Refused(f"{absolute} is not a regular file on the host (a directory or a special file): name a file")
        staged.exists = found is not None
        if not outgoing:
            if found is None:
                raise Refused(f"there is no file {absolute} on the host")
            if found.st_size > MAX_COPY_BYTES:  # checked again on the descriptor that is sent
                raise Refused(f"{absolute} is {found.st_size} bytes, over the {MAX_COPY_BYTES} a copy may carry")
            if named_like_secret(parts[-1], lambda: _head(parent, parts[-1])):
                staged.reasons.append(f"reads {absolute}, named like a secret file (a box gets those only when "
                                      "created with with_env)")
        elif found is not None:
            staged.reasons.append(f"replaces the existing file {absolute} on the host")
        elif inside is not None:  # the host's working tree changes only when its user says so
            staged.reasons.append(f"writes a new file {absolute} into the host's working tree")
    return staged


def _head(parent: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
    try:
        return os.read(fd, HEAD_BYTES)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _parent(staged: StagedCopy) -> Iterator[int]:
    """A descriptor of the host file's directory, reached from `start` one component at a time, never through a
    symbolic link (O_NOFOLLOW on each): a link anywhere on the way refuses the copy."""
    fd = os.open(staged.start, DIR_FLAGS)
    try:
        walked = staged.start.rstrip("/")
        for part in staged.parts[:-1]:
            walked += "/" + part
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise Refused(f"the host directory {walked} does not exist: copy into a directory that does") from exc
                kind = "a symbolic link" if exc.errno == errno.ELOOP else "not a directory"
                if exc.errno == errno.ENOTDIR and _is_link(fd, part):
                    kind = "a symbolic link"
                raise Refused(f"{staged.host_path} goes through {walked}, which is {kind} on the host: links are never "
                              "followed; give the path without it") from exc
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
    except OSError:
        return False


def carry_out(provider: Provider, facts: BoxFacts, request: Request, staged: StagedCopy, replace: bool) -> Outcome:
    """The copy, checked again on the way (the host's files may have changed since `stage`). `replace`: the user
    approved replacing an existing host file."""
    try:
        if request.args["direction"] == "out":
            size = receive(provider.get_archive(facts.name, request.args["box"]), staged, replace)
            return Outcome(0, stdout=f"copied {request.args['box']} to {staged.host_path} on the host ({size} bytes)\n",
                           data={"host": staged.host_path, "bytes": size})
        size = send(provider, facts.name, request.args["box"], staged)
        return Outcome(0, stdout=f"copied {staged.host_path} from the host to {request.args['box']} ({size} bytes)\n",
                       data={"host": staged.host_path, "bytes": size})
    except (Refused, ArchiveRefused, ProviderError) as exc:
        return Outcome(1, stderr=f"{exc}\n")


def receive(chunks: Iterator[bytes] | list[bytes], staged: StagedCopy, replace: bool) -> int:
    """The box's tar of one file written to the host file `staged` names; its size. The archive must hold one
    regular file of at most MAX_COPY_BYTES (checked on its header, before any byte is written)."""
    entry, data = first_entry(chunks)
    if entry is None:
        raise Refused("the box sent an empty archive: no such file in the box?")
    if entry.kind != "file":
        raise Refused(f"{entry.shown} in the box is a {entry.kind}, not a regular file: copy a file (links are not "
                      "followed)")
    if entry.size > MAX_COPY_BYTES:
        raise Refused(f"{entry.shown} is {entry.size} bytes, over the {MAX_COPY_BYTES} a copy may carry")
    with _parent(staged) as parent:
        name = staged.parts[-1]
        temporary = f".{name[:200]}.agentbox-{secrets.token_hex(4)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     NEW_FILE_MODE, dir_fd=parent)
        try:
            try:
                written = 0
                for piece in data:
                    written += len(piece)
                    if written > entry.size:  # the reader never gives more; a bound all the same
                        raise Refused("the box's archive holds more than its header says")
                    view = memoryview(piece)
                    while view:
                        view = view[os.write(fd, view):]
                os.fchmod(fd, NEW_FILE_MODE)  # whatever the umask made of it: rw for the owner, read for others
                _own_like_directory(fd, parent)
                os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
            else:
                try:
                    os.link(temporary, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
                except FileExistsError as exc:
                    raise Refused(f"{staged.host_path} appeared on the host meanwhile: it is not replaced") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=parent)
    return written


def _own_like_directory(fd: int, parent: int) -> None:
    """A relay run as root writes the file as the directory's owner, as that user would have."""
    if os.geteuid() == 0:
        owner = os.fstat(parent)
        os.fchown(fd, owner.st_uid, owner.st_gid)


def send(provider: Provider, box: str, box_path: str, staged: StagedCopy) -> int:
    """The host file `staged` names into the box at `box_path` (owned by the box user, mode 0644); its size."""
    with _parent(staged) as parent:
        try:
            fd = os.open(staged.parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        except OSError as exc:
            reason = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
            raise Refused(f"{staged.host_path} {reason} on the host") from exc
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise Refused(f"{staged.host_path} is not a regular file on the host")
        if found.st_size > MAX_COPY_BYTES:
            raise Refused(f"{staged.host_path} is {found.st_size} bytes, over the {MAX_COPY_BYTES} a copy may carry")
        directory, name = posixpath.split(box_path)
        provider.put_archive(box, directory or "/", _tar_of_descriptor(fd, name, found.st_size))
        return found.st_size
    finally:
        os.close(fd)


def _tar_of_descriptor(fd: int, name: str, size: int) -> Iterator[bytes]:
    """A tar of `size` bytes read from `fd` as one file `name`, owned by the box user, mode 0644."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, NEW_FILE_MODE, int(time.time())
    info.uid, info.gid, info.uname, info.gname = BOX_UID, BOX_GID, "", ""
    yield info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
    left = size
    while left:
        piece = os.read(fd, min(CHUNK, left))
        if not piece:
            raise Refused("the host file shrank while it was copied: nothing complete reached the box")
        left -= len(piece)
        yield piece
    yield b"\0" * (-size % tarfile.BLOCKSIZE) + b"\0" * (2 * tarfile.BLOCKSIZE)
