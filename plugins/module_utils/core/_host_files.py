# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files the collection keeps in the host user's home: locked, written whole, never half-made.

Everything here honours $HOME (tests run with a temporary one). A writer takes an exclusive
lock on `<file>.lock`, reads the current text, and replaces the file with a temp file in the
same directory (fsync, then rename), so a reader never sees a torn file and two writers
never lose each other's change.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator

# Where the SSH client settings for remote engines are read from, when a task names no file.
SSH_CONFIG_ENV = "AGENTBOX_SSH_CONFIG"


def ssh_config_file(config_file: str | None = None) -> str:
    """The SSH config read for remote engines: the given file, else $AGENTBOX_SSH_CONFIG, else ~/.ssh/config."""
    return os.path.expanduser(config_file or os.environ.get(SSH_CONFIG_ENV) or "~/.ssh/config")


def home() -> str:
    """The user's home as $HOME says (OpenSSH itself uses the passwd entry; see include_path)."""
    return os.path.expanduser("~")


def agentbox_dir() -> str:
    return os.path.join(home(), ".agentbox")


def passwd_home() -> str | None:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return None


def ensure_private_dir(path: str) -> str:
    """A directory only this user can read (0700), made with its parents when missing."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        os.chmod(path, 0o700)
    return path


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock for `path` (on `<path>.lock`, which stays)."""
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def transient_lock(path: str, timeout: float, busy: Exception) -> Iterator[None]:
    """Hold an exclusive flock on `path`, a file that exists only while someone holds it.

    For locks in shared places such as /tmp, where a lock file per key would pile up. The holder
    removes the file before it lets go, so a waiter may end up holding an unlinked file that a
    newer holder no longer sees: after each flock the waiter checks that the inode it locked is
    still the one at `path`, and starts again on the new file otherwise. `busy` is raised when
    `timeout` seconds pass without the lock.
    """
    deadline = time.monotonic() + timeout
    while True:
        # O_NOFOLLOW: another user's symlink in /tmp must not make us create or lock its target.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _flock_until(fd, deadline, busy)
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder we waited for removed this file: lock the one at `path` now
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # before the release, so nobody who opens `path` later finds this file
        os.close(fd)


def _flock_until(fd: int, deadline: float, busy: Exception) -> None:
    # A polling wait with a short first pause: a blocking flock cannot time out in a thread.
    pause = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise busy from None
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


def _same_file(fd: int, path: str) -> bool:
    try:
        current = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino)


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def write_atomic(path: str, text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text` in one rename; a symlink is written through to its target."""
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    fd, temp = tempfile.mkstemp(prefix="." + os.path.basename(target) + ".", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def update(path: str, change: Callable[[str | None], str | None], mode: int = 0o600) -> bool:
    """Apply change(old text or None) under the lock; write when it returns different text.

    Returns True when the file changed. change() returning None leaves the file as it is.
    """
    with locked(path):
        old = read_text(path)
        new = change(old)
        if new is None or new == old:
            return False
        write_atomic(path, new, mode)
        return True
