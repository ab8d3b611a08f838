# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The create journal: what an in-progress create has made, on the host, so that a create killed
at any point (Ctrl-C and SIGTERM end Ansible's worker with os._exit, SIGKILL ends anything) is
found and rolled back by the next create or destroy of that name.

One journal per box name and engine: ~/.agentbox/creating/<provider>-<engine>/<box>.json, written
atomically at each stage, and <box>.lock, an flock held by the creating process for the whole
create. The kernel releases the flock when that process dies, however it dies, so:

- lock held: another run is creating this box right now; this run stops with a clear message.
- lock free and a journal present: the create that wrote it died; the journal lists what it made
  (branch, worktree registrations, container and volume by the box id) and is rolled back.

Labels cannot be the marker: Docker labels are fixed at create, before seeding starts. The
in-box seed record (/etc/agentbox/seed.json), written after the last untracked file, is the
second marker: a box whose labels say it was seeded but that has no record is half-made.

AGENTBOX_TEST_PAUSE_AT (test-only): when it names a stage, the create writes "<stage> <pid>" to
AGENTBOX_TEST_PAUSE_FILE and waits there until that file is removed (or the process is killed), so a
test can SIGKILL the worker exactly there, or hold several racing creates at one point. It is only a
wait point: the code around it is the real code. Stages: reserved, index-copied, created, seeding,
streaming (64 MiB into the untracked files' stream), seeded.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ._errors import ProviderError

PAUSE_AT_ENV = "AGENTBOX_TEST_PAUSE_AT"
PAUSE_FILE_ENV = "AGENTBOX_TEST_PAUSE_FILE"


class CreateInProgress(ProviderError):
    """Another run holds the box's create lock."""


def journal_dir(provider_name: str, engine: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", engine)[:40]
    digest = hashlib.sha1(engine.encode("utf-8")).hexdigest()[:8]
    return os.path.join(os.path.expanduser("~"), ".agentbox", "creating", f"{provider_name}-{safe}-{digest}")


def pause_point(stage: str) -> None:
    """Test-only wait point (see the module docstring); a no-op unless the environment names `stage`.

    Waits until the test kills this process, or removes the report file to let it go on.
    """
    if os.environ.get(PAUSE_AT_ENV) != stage:
        return
    report = os.environ.get(PAUSE_FILE_ENV)
    if not report:
        threading.Event().wait()
        return
    with open(report + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(f"{stage} {os.getpid()}\n")
    os.replace(report + ".tmp", report)
    released = threading.Event()
    while os.path.exists(report):
        released.wait(0.05)


def pausing_stream(chunks: Iterable[bytes], stage: str, after_bytes: int = 64 << 20) -> Iterator[bytes]:
    """`chunks`, passed through; the test-only wait point `stage` once `after_bytes` went out."""
    if os.environ.get(PAUSE_AT_ENV) != stage:
        yield from chunks
        return
    sent = 0
    for chunk in chunks:
        yield chunk
        sent += len(chunk)
        if sent >= after_bytes:
            pause_point(stage)


class Journal:
    """The lock and the record of one create (or destroy) of one box name on one engine."""

    def __init__(self, provider_name: str, engine: str, box: str):
        self.box = box
        directory = journal_dir(provider_name, engine)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.path = os.path.join(directory, f"{box}.json")
        self._lock_path = os.path.join(directory, f"{box}.lock")
        self._lock: Any = None
        self.record: dict[str, Any] = {}

    def claim(self, operation: str = "create") -> dict[str, Any] | None:
        """Take the box's lock without waiting; the record a dead create left, or None.

        Raises CreateInProgress when a live run holds the lock, naming `operation` (this run's: a
        destroy that meets a create says the destroy failed).
        """
        handle = open(self._lock_path, "a+", encoding="utf-8")  # held until release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = (self.read() or {}).get("pid", "unknown")
            then = "destroy it again" if operation == "destroy" else "use or destroy that box, or pick another name"
            raise CreateInProgress(
                f"box {self.box!r} is being created by another run right now (pid {holder}): wait for it to "
                f"finish, then {then}",
                box=self.box,
                operation=operation,
            ) from None
        self._lock = handle
        return self.read()

    def read(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"box": self.box, "stage": "unreadable"}
        return data if isinstance(data, dict) else None

    def write(self, **changes: Any) -> None:
        """Record progress: atomic, so a kill leaves the previous record or this one."""
        self.record.update(changes)
        self.record.setdefault("pid", os.getpid())
        fd, scratch = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(self.path))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(self.record, handle, sort_keys=True)
            os.replace(scratch, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(scratch)
            raise

    def forget(self) -> None:
        """The create finished or was rolled back: nothing is left to recover."""
        self.record = {}
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None
