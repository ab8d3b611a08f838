"""Which host files are named like secrets, and so reach a box only on its tmpfs (issue 33, item 3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._secret_files import named_like_secret
from ansible_collections.agentbox.box.plugins.module_utils.git import _carry_env, _git
from tests.conftest import git, make_repo

KEY = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.mark.parametrize(
    ("path", "content", "secret"),
    [
        (".env", b"API_KEY=1\n", True),
        ("api/.env.local", b"", True),
        (".envrc", b"export X=1\n", True),
        ("certs/dev.pem", b"", True),
        ("tls/server.key", b"", True),
        ("store.p12", b"", True),
        (".netrc", b"", True),
        (".git-credentials", b"", True),
        ("deploy/id_ed25519", KEY, True),
        ("deploy/id_ed25519.pub", b"ssh-ed25519 AAAA me\n", False),
        ("src/id_utils.py", b"def f(): pass\n", False),
        (".npmrc", b"//registry.npmjs.org/:_authToken=npm_abc\n", True),
        (".npmrc", b"save-exact=true\n", False),
        (".yarnrc.yml", b"npmAuthToken: abc\n", True),
        (".pypirc", b"[pypi]\npassword = pypi-abc\n", True),
        ("README.md", b"", False),
        ("environment.md", b"", False),
    ],
)
def test_the_secret_name_rule(path: str, content: bytes, secret: bool) -> None:
    assert named_like_secret(path, lambda: content) is secret


def test_the_name_decides_without_reading_when_it_can() -> None:
    def unread() -> bytes:
        raise AssertionError("the file was read")

    assert named_like_secret(".env", unread) and not named_like_secret("main.py", unread)


def test_the_carry_over_keeps_secret_named_files_out_of_the_untracked_ones(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "ws", {"README.md": "r\n", ".gitignore": "node_modules/\n"})
    (repo / ".env").write_text("API_KEY=1\n")  # not ignored by .gitignore: a secret all the same
    (repo / "deploy").mkdir()
    (repo / "deploy/id_rsa").write_bytes(KEY)
    (repo / "deploy/id_rsa.pub").write_text("ssh-rsa AAAA me\n")
    (repo / ".npmrc").write_text("save-exact=true\n")
    (repo / "notes.md").write_text("n\n")
    os.symlink("/etc/hostname", repo / ".env.linked")  # a link carries no content: it travels as it is
    (repo / "node_modules").mkdir()
    (repo / "node_modules/.env").write_text("ignored\n")
    root = _git.find_repos(str(repo))[0]
    carry = _git.capture_carry_over(root)
    assert carry.secret == [".env", "deploy/id_rsa"]
    assert sorted(carry.untracked) == [".env.linked", ".npmrc", "deploy/id_rsa.pub", "notes.md"]
    assert _carry_env.secret_paths({"": carry, "sub": _git.CarryOver(None, [], secret=["a.pem"])}) == [
        ".env", "deploy/id_rsa", "sub/a.pem"]


@pytest.mark.parametrize(
    ("path", "line"),
    [(".env", "/.env"), ("a b/x.pem ", "/a b/x.pem\\ "), ("odd[1]*?.key", "/odd\\[1]\\*\\?.key"), ("new\nline.pem", None)],
)
def test_an_exclude_line_matches_exactly_its_path(tmp_path: Path, path: str, line: str | None) -> None:
    assert _carry_env.exclude_line(path) == line
    if line is None:
        return
    # As git reads it: the file is excluded, a neighbour the pattern's specials would match is not.
    repo = make_repo(tmp_path / "ws")
    (repo / ".git/info/exclude").write_text(line + "\n")
    target = repo / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("x\n")
    (target.parent / "odd1x.key").write_text("y\n")
    listed = git(repo, "status", "--porcelain", "-uall", "-z").split("\0")
    assert f"?? {path}" not in listed and f"?? {os.path.relpath(target.parent / 'odd1x.key', repo)}" in listed
