"""The transient lock (image transfers' lock in /tmp): real processes contend for it, none ever
shares the critical section, and no lock file stays behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._host_files import transient_lock

WORKERS = 4
ROUNDS = 40

# Each worker says "ready", waits for "go" (so all contend from the same moment), then enters the
# lock ROUNDS times. Inside it writes enter/leave markers around a read-modify-write of a counter
# and holds the lock a moment, so two holders at once would show as interleaved markers or a
# lost increment.
WORKER = """
import os, sys, time
from ansible_collections.agentbox.box.plugins.module_utils.core._host_files import transient_lock
lock, log, counter, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
me = os.getpid()
for _round in range(rounds):
    with transient_lock(lock, 120, RuntimeError("lock timeout")):
        with open(log, "a") as out:
            out.write(f"enter {me}\\n")
        with open(counter) as handle:
            value = int(handle.read())
        time.sleep(0.002)
        with open(f"{counter}.{me}", "w") as handle:
            handle.write(str(value + 1))
        os.replace(f"{counter}.{me}", counter)  # whole, so an overlap shows as a lost increment
        with open(log, "a") as out:
            out.write(f"leave {me}\\n")
"""


def _collections_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / ".collections")}


def test_processes_never_share_the_lock_and_no_lock_file_stays(tmp_path: Path) -> None:
    lock, log, counter = tmp_path / "agentbox-image-test.lock", tmp_path / "markers", tmp_path / "counter"
    counter.write_text("0")
    args = [str(lock), str(log), str(counter), str(ROUNDS)]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, *args], env=_collections_env(), **pipes)
        for _worker in range(WORKERS)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outcomes = [(worker.wait(timeout=600), worker.stderr.read() if worker.stderr else "") for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    assert all(code == 0 for code, _err in outcomes), outcomes

    lines = log.read_text().splitlines()
    assert len(lines) == 2 * WORKERS * ROUNDS
    pids = set()
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        # Strict alternation by one holder: an overlap would put two enters in a row.
        assert enter.startswith("enter ") and leave == "leave " + enter.split()[1], (enter, leave)
        pids.add(enter.split()[1])
    assert len(pids) == WORKERS  # every worker took part
    assert counter.read_text() == str(WORKERS * ROUNDS)  # no increment lost
    assert not lock.exists()


def test_a_held_lock_times_out_with_the_given_error_and_the_holder_still_cleans_up(tmp_path: Path) -> None:
    lock = tmp_path / "held.lock"
    holder = "\n".join([
        "import sys",
        "from ansible_collections.agentbox.box.plugins.module_utils.core._host_files import transient_lock",
        "with transient_lock(sys.argv[1], 60, RuntimeError('x')):",
        "    print('held', flush=True)",
        "    sys.stdin.readline()",
    ])  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-c", holder, str(lock)], env=_collections_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        with pytest.raises(LookupError, match="busy: another holder"):
            with transient_lock(str(lock), 0.2, LookupError("busy: another holder")):
                pass
        assert lock.exists()  # the waiter that gave up left the holder's file alone
        assert process.stdin is not None
        process.stdin.write("done\n")
        process.stdin.flush()
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not lock.exists()
    with transient_lock(str(lock), 5, LookupError("busy")):
        assert lock.exists()
    assert not lock.exists()


def test_a_symlink_at_the_lock_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    (tmp_path / "evil.lock").symlink_to(target)
    with pytest.raises(OSError):
        with transient_lock(str(tmp_path / "evil.lock"), 5, LookupError("busy")):
            pass
    assert not target.exists()
