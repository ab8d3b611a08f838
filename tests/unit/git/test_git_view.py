"""A box's view of a host .git, made on the host: owned by the box user, scrubbed, files shared by link."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.git import _git_view
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _box_engine
from tests.conftest import git, make_repo

OWNER = (101000, 101000)  # the box user's host ids under the box engine's remap


def repo_with_secrets(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    git(repo, "config", "remote.origin.url", "https://user:token123@example.invalid/r.git")
    git(repo, "config", "credential.helper", "store")
    git(repo, "config", "include.path", "/etc/elsewhere")
    git(repo, "config", "core.hooksPath", "/tmp/hooks")
    git(repo, "config", "core.sshCommand", "ssh -i key")
    git(repo, "config", "core.ignorecase", "false")
    git(repo, "branch", "agentbox/b1")
    git(repo, "branch", "agentbox/other-box")
    git(repo, "branch", "feature")
    git(repo, "tag", "v1")
    (repo / ".git/hooks/pre-commit").write_text("#!/bin/sh\nexit 0\n")
    return repo


def test_a_view_holds_what_git_in_the_box_needs_and_nothing_else(tmp_path: Path) -> None:
    repo = repo_with_secrets(tmp_path)
    view = tmp_path / "view"
    _git_view.build(str(repo / ".git"), str(view), OWNER, "agentbox/b1")
    config = (view / "config").read_text()
    for gone in ("token123", "example.invalid", "credential", "include", "hooksPath", "sshCommand", "remote"):
        assert gone not in config, config
    assert "ignorecase = false" in config and "repositoryformatversion = 0" in config
    assert not (view / "hooks").exists() and not (view / "logs").exists() and not (view / "index").exists()
    refs = subprocess.run(["git", f"--git-dir={view}", "for-each-ref", "--format=%(refname)"], capture_output=True,
                          text=True, check=True, env={**os.environ, "GIT_CONFIG_COUNT": "1",
                                                      "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"})
    assert sorted(refs.stdout.split()) == ["refs/heads/agentbox/b1", "refs/heads/main"]
    assert _git_view.checked_out_branch(str(view)) == "main"
    # Every directory is the box user's; objects are the host's own files, linked.
    for root, dirs, _files in os.walk(view):
        for name in dirs:
            assert (os.stat(os.path.join(root, name)).st_uid, os.stat(os.path.join(root, name)).st_gid) == OWNER
    loose = next(path for path in (repo / ".git/objects").rglob("*") if path.is_file() and len(path.parent.name) == 2)
    linked = view / loose.relative_to(repo / ".git")
    assert os.stat(linked).st_ino == os.stat(loose).st_ino
    fsck = subprocess.run(["git", f"--git-dir={view}", "-c", "safe.directory=*", "fsck", "--no-dangling"],
                          capture_output=True, text=True, check=False)
    assert fsck.returncode == 0, fsck.stderr


def test_a_file_others_cannot_read_is_copied_for_the_box_user(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    private = next(path for path in (repo / ".git/objects").rglob("*") if path.is_file())
    private.chmod(0o400)
    view = tmp_path / "view"
    _git_view.build(str(repo / ".git"), str(view), OWNER, "")
    copied = view / private.relative_to(repo / ".git")
    assert os.stat(copied).st_ino != os.stat(private).st_ino
    assert os.stat(copied).st_uid == OWNER[0] and copied.read_bytes() == private.read_bytes()


def test_a_failed_view_leaves_nothing(tmp_path: Path) -> None:
    view = tmp_path / "view"
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    with pytest.raises(OverflowError):  # the view's directory was made, then its owner could not be set
        _git_view.build(str(repo / ".git"), str(view), (-5, -5), "")
    assert not view.exists()


def test_isolation_words_and_the_remapped_ids() -> None:
    assert _box_engine.check_isolation(None) == "userns" and _box_engine.check_isolation("none") == "none"
    with pytest.raises(ValueError, match="use userns"):
        _box_engine.check_isolation("strict")
    assert _box_engine.remapped_ids("/var/lib/agentbox-engine/100000.100000") == (100000, 100000)
    assert _box_engine.remapped_ids("/var/lib/docker") is None
    assert _box_engine.box_engine_host({"AGENTBOX_ENGINE": "unix:///x.sock"}) == "unix:///x.sock"
    assert _box_engine.engine_host("none", {"DOCKER_HOST": "tcp://127.0.0.1:2375"}) == "tcp://127.0.0.1:2375"


def test_the_box_owns_its_copy_of_info_so_its_git_can_write_exclude_lines(tmp_path: Path) -> None:
    """info/exclude is written in place by git users in the box (and by the tmpfs carry's exclude lines):
    a link would keep the host's owner, which root in a user-namespaced box cannot write through."""
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    (repo / ".git/info/exclude").write_text("*.log\n")
    view = tmp_path / "view"
    _git_view.build(str(repo / ".git"), str(view), OWNER, "")
    exclude = view / "info/exclude"
    assert os.stat(exclude).st_ino != os.stat(repo / ".git/info/exclude").st_ino
    assert (os.stat(exclude).st_uid, os.stat(exclude).st_gid) == OWNER
    assert exclude.read_text() == "*.log\n"
