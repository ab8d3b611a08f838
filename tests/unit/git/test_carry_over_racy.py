"""The carry-over reads the host index through a private copy (_git.private_index): the copy must
keep the index's mtime, or git's racy-clean check stops protecting an edit made in the same clock
tick as the last index write, and that edit is silently left out of the box."""

from __future__ import annotations

import os
from pathlib import Path

from ansible_collections.agentbox.box.plugins.module_utils.git import _git
from tests.conftest import git, make_repo


def test_same_size_edit_in_the_index_writes_tick_is_carried(tmp_path: Path) -> None:
    repo_dir = make_repo(tmp_path / "ws", {"file.txt": "aaaa\n"})
    # The same clock tick, made on demand: ctime cannot be set, so git is told not to trust it (as
    # on filesystems whose ctime is unreliable); the mtimes below are the ones of one tick.
    git(repo_dir, "config", "core.trustctime", "false")
    target = repo_dir / "file.txt"
    missed = []
    for round_number in range(20):
        target.write_text(f"{round_number:04d}\n")
        # A tick in the past: git add then writes the index in a later tick and records the entry
        # as clean (an entry as new as the index it is written to is smudged, re-read every time).
        tick = target.stat().st_mtime_ns - 10**10 + round_number
        os.utime(target, ns=(tick, tick))
        git(repo_dir, "add", "file.txt")  # the index entry records this content and stat
        target.write_text(f"{round_number + 5000:04d}\n")  # same size, same tick as the index write
        os.utime(target, ns=(tick, tick))
        # The last index write in that same tick: the entry is racily clean, so git must read the file.
        os.utime(repo_dir / ".git" / "index", ns=(tick, tick))
        carry = _git.capture_carry_over(_git.find_repos(str(repo_dir))[0])
        carried = git(repo_dir, "show", f"{carry.stash}:file.txt") if carry.stash else None
        if carried != target.read_text():
            missed.append(round_number)
    assert missed == [], f"the edit was left out of the carry-over in rounds {missed}"
