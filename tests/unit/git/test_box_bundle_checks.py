"""What a box made enters the host's object store only through git's object checks (issue 33, item 4):
a commit whose tree has a `.git` or `.GIT` entry is refused, and nothing of its bundle is kept."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.git import _git
from tests.conftest import GIT_ENV, chown_tree, git, make_repo


def plumbing(repo: Path, *args: str, text: str = "") -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], input=text, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}, check=True)  # fmt: skip
    return done.stdout.strip()


def objects_of(repo: Path) -> set[str]:
    return set(git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)").split())


def box_commit(box: Path, top: str) -> str:
    """A commit on the box's branch whose tree holds <top>/hooks/post-checkout: git's porcelain refuses
    such a path, its plumbing (as a hostile agent would use it) does not."""
    (box / "hook.sh").write_text("#!/bin/sh\necho planted > /tmp/planted\n")
    blob = plumbing(box, "hash-object", "-w", "hook.sh")
    hooks = plumbing(box, "mktree", text=f"100755 blob {blob}\tpost-checkout\n")
    dotgit = plumbing(box, "mktree", text=f"040000 tree {hooks}\thooks\n")
    listing = plumbing(box, "ls-tree", "HEAD") + f"\n040000 tree {dotgit}\t{top}\n"
    tree = plumbing(box, "mktree", text=listing)
    commit = plumbing(box, "commit-tree", tree, "-p", "HEAD", "-m", "innocent")
    plumbing(box, "update-ref", "refs/heads/agentbox/b", commit)
    return commit


@pytest.fixture
def host_and_box(tmp_path: Path) -> tuple[Path, Path, str]:
    host = make_repo(tmp_path / "host", {"README.md": "r\n"})
    box = tmp_path / "box"
    git(tmp_path, "clone", "-q", str(host), str(box))
    chown_tree(host)  # a user's repository: as root, host git runs as its owner (and writes the quarantine so)
    return host, box, git(host, "rev-parse", "HEAD").strip()


def bundle_of(box: Path, base: str, tmp_path: Path) -> str:
    path = tmp_path / "box.bundle"
    plumbing(box, "bundle", "create", "-q", str(path), "refs/heads/agentbox/b", f"^{base}")
    return str(path)


@pytest.mark.parametrize("top", [".git", ".GIT"])
def test_a_commit_with_a_dotgit_entry_is_refused_and_nothing_enters(host_and_box, tmp_path: Path, top: str) -> None:
    host, box, base = host_and_box
    evil = box_commit(box, top)
    bundle = bundle_of(box, base, tmp_path)
    before = objects_of(host)
    with pytest.raises(_git.RefusedObjects, match=r"refused the box's commits: git's object checks failed .*hasDotgit"):
        _git.fetch_box_bundle(str(host), bundle, "refs/heads/agentbox/b")
    assert objects_of(host) == before  # not the commit, not its trees, not the hook's blob

    def host_git(*args: str) -> int:
        return subprocess.run(["git", "-C", str(host), *args], capture_output=True, check=False,
                              env={**os.environ, **GIT_ENV}).returncode  # fmt: skip

    assert host_git("cat-file", "-e", evil) != 0
    assert host_git("fsck", "--strict") == 0
    assert not list((host / ".git" / "objects" / "pack").glob("tmp_*"))


def test_a_clean_commit_is_fetched_and_no_ref_moves(host_and_box, tmp_path: Path) -> None:
    host, box, base = host_and_box
    (box / "work.txt").write_text("work\n")
    plumbing(box, "add", "work.txt")
    plumbing(box, "commit", "-q", "-m", "work")
    plumbing(box, "update-ref", "refs/heads/agentbox/b", "HEAD")
    tip = plumbing(box, "rev-parse", "HEAD")
    refs = git(host, "for-each-ref")
    fetched = _git.fetch_box_bundle(str(host), bundle_of(box, base, tmp_path), "refs/heads/agentbox/b")
    assert fetched.returncode == 0, fetched.stderr
    assert git(host, "cat-file", "-t", tip).strip() == "commit"
    assert git(host, "for-each-ref") == refs


def test_what_is_not_a_bundle_is_refused(host_and_box, tmp_path: Path) -> None:
    host, _box, _base = host_and_box
    fake = tmp_path / "fake.bundle"
    fake.write_bytes(b"# v2 git bundle\n" + b"x" * (2 << 20))  # a header with no end
    with pytest.raises(_git.RefusedObjects, match="not a git bundle"):
        _git.fetch_box_bundle(str(host), str(fake), "refs/heads/agentbox/b")
