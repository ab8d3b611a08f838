"""Best of N, the scripts a run's box runs (plugins/module_utils/tasks/_best_of.py), run here by the real bash
and git: the wait on the agent's state history ends as soon as it changes, and the one exec that commits and
reads a run's diff says the commit's exit, HEAD, the diff stat and the diff, read back by read_collected."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from plugins.module_utils.tasks import _best_of


def _wait(history: Path, seen: int, looks: int, poll: float = 0.1) -> str:
    argv = ["bash", "-c", _best_of.WAIT_HISTORY, "wait", str(history), str(seen), str(looks), f"{poll:.3f}"]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout  # a hang fails


def test_wait_history_answers_at_once_when_the_history_changes_and_after_its_looks_when_not(tmp_path: Path) -> None:
    history = tmp_path / "task.history"
    assert _wait(history, -1, 100) == "0\n"  # no history yet: its size 0, said at once
    line = '{"state": "idle"}\n'
    history.write_text(line)
    assert _wait(history, -1, 100) == f"{len(line)}\n{line}"
    assert _wait(history, len(line), 3) == f"{len(line)}\n{line}"  # unchanged: back after its 3 looks

    def agent_ends() -> None:
        time.sleep(0.5)
        with history.open("a") as handle:
            handle.write('{"state": "working"}\n')

    writer = threading.Thread(target=agent_ends)
    writer.start()
    out = _wait(history, len(line), 100_000)  # would wait hours but for the change
    writer.join()
    assert out == f"{history.stat().st_size}\n{history.read_text()}"


def _git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    return subprocess.run(["git", *identity, "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _collect(repo: Path, base: str, limit: int = 400_000) -> tuple[str, str, list[str], str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}  # fmt: skip
    argv = ["bash", "-c", _best_of.COLLECT, "collect", "best_of: run 1 (a)", base, str(limit)]
    done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, check=True)
    return _best_of.read_collected(done.stdout.decode())


def _based_repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository with one commit (a.txt), as a run's box has at the agent's start: (it, that commit)."""
    repo = tmp_path / "ws"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo, _git(repo, "rev-parse", "HEAD").strip()


def test_collect_commits_the_agents_work_and_reads_head_stat_and_diff_in_one_go(tmp_path: Path) -> None:
    repo, base = _based_repo(tmp_path)

    assert _collect(repo, base) == ("0", base, [], "")  # nothing left by the agent: no commit, no diff

    (repo / "a.txt").write_text("one\ntwo\n")
    (repo / "b c.txt").write_text("x\n")
    status, head, numstat, diff = _collect(repo, base)
    assert status == "0"
    assert head == _git(repo, "rev-parse", "HEAD").strip() != base
    assert _git(repo, "log", "-1", "--format=%s") == "best_of: run 1 (a)\n"
    assert _git(repo, "status", "--porcelain") == ""
    assert numstat == ["1\t0\ta.txt", "1\t0\tb c.txt"]
    assert diff == _git(repo, "diff", base, "HEAD")
    assert diff.startswith("diff --git a/a.txt b/a.txt") and "+two\n" in diff

    assert _collect(repo, base, limit=20)[3] == diff[:20]  # the diff cut at the limit, the rest still read


def test_collect_says_a_failed_commit_and_still_reads_the_diff(tmp_path: Path) -> None:
    repo, base = _based_repo(tmp_path)
    (repo / "a.txt").write_text("two\n")
    (repo / ".git" / "index.lock").write_text("")  # another git at work: the commit cannot happen
    status, head, numstat, diff = _collect(repo, base)
    assert status not in ("0", "") and head == base and numstat == [] and diff == ""
