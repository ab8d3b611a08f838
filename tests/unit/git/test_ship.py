"""Staging a host repo for shipping into a box: real git, no Docker. The host repo is only read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.git import _git, _ship  # noqa: E402

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=ENV).stdout


@pytest.fixture
def host_repo(tmp_path) -> Path:
    repo = tmp_path / "host"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for number in range(10):
        (repo / "file.txt").write_text(f"{number}\n")
        git(repo, "add", "file.txt")
        git(repo, "commit", "-qm", f"c{number}")
    (repo / "file.txt").write_text("dirty\n")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    return repo


def snapshot(repo: Path) -> tuple[str, str, str, bytes]:
    return (
        git(repo, "for-each-ref"),
        git(repo, "status", "--porcelain"),
        git(repo, "stash", "list"),
        (repo / ".git" / "index").read_bytes(),
    )


def test_stage_shallow_with_carry_ref_and_host_untouched(host_repo, tmp_path):
    repo = _git.find_repos(str(host_repo))[0]
    before = snapshot(host_repo)
    carry = _git.capture_carry_over(repo)
    assert carry.stash
    staged = _ship.stage_repo(repo, "agentbox/b1", carry.stash, 4, str(tmp_path / "work"))
    assert snapshot(host_repo) == before
    stage = Path(staged.path)
    assert git(stage, "rev-parse", "refs/heads/agentbox/b1").strip() == repo.head
    assert git(stage, "rev-parse", _ship.CARRY_REF).strip() == carry.stash
    assert git(stage, "symbolic-ref", "HEAD").strip() == "refs/heads/agentbox/b1"
    assert int(git(stage, "rev-list", "--count", "agentbox/b1")) == 4
    assert staged.shallow and staged.depth == 4 and staged.pack_bytes > 0
    # The stash's index commit came along: `stash apply --index` needs it.
    assert git(stage, "show", f"{_ship.CARRY_REF}^2:staged.txt") == "staged\n"
    assert sorted(os.listdir(stage)) == [".git"]  # nothing checked out: only .git is shipped


def test_full_history_with_depth_zero(host_repo, tmp_path):
    repo = _git.find_repos(str(host_repo))[0]
    staged = _ship.stage_repo(repo, "agentbox/b2", None, 0, str(tmp_path / "work"))
    assert not staged.shallow
    assert int(git(Path(staged.path), "rev-list", "--count", "agentbox/b2")) == 10
    assert git(Path(staged.path), "for-each-ref", "refs/agentbox") == ""


def test_depth_choice(monkeypatch):
    monkeypatch.delenv(_ship.DEPTH_ENV, raising=False)
    assert _ship.ship_depth() == (_ship.DEFAULT_DEPTH, True)
    assert _ship.ship_depth(0) == (0, False)
    assert _ship.ship_depth(50) == (50, False)
    monkeypatch.setenv(_ship.DEPTH_ENV, "7")
    assert _ship.ship_depth() == (7, False)
    monkeypatch.setenv(_ship.DEPTH_ENV, "lots")
    with pytest.raises(ProviderError, match="0 = full history"):
        _ship.ship_depth()
    with pytest.raises(ProviderError, match="negative"):
        _ship.ship_depth(-1)


def test_iter_reader_reads_across_chunks():
    reader = _ship._IterReader(iter([b"ab", b"", b"cde", b"f"]))
    assert reader.read(3) == b"abc"
    assert reader.read(1) == b"d"
    assert reader.read() == b"ef"
    assert reader.read(5) == b""
