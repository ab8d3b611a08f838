"""Files in and out of a box (issue 18, item 5), on the real engine: the host's ignored .env*
files (and carry_ignored globs) carried on request onto a tmpfs and never into a checkpoint;
download.yml copying a box's tree out, gitignore-aware, untrusted tar entries left out; and
fetch_branch.yml on the local engine saying there is nothing to fetch."""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo
from tests.integration.playbooks.test_playbook_output import Player, flat, name, player  # noqa: F401  # pylint: disable=unused-import

pytestmark = pytest.mark.integration


def in_box(box: str, script: str, user: str = "vscode") -> str:
    done = subprocess.run(["docker", "exec", "-u", user, f"agentbox-{box}", "sh", "-c", script],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_with_env_carries_ignored_env_files_onto_tmpfs_never_into_a_checkpoint(player: Player, tmp_path: Path) -> None:  # noqa: F811
    token = secrets.token_hex(16)
    repo = make_repo(tmp_path / "ws", {"README.md": "r\n", ".gitignore": ".env*\nlocal/\nnode_modules/\n"})
    (repo / ".env").write_text(f"API_KEY={token}\n")
    (repo / "api").mkdir()
    (repo / "api/.env.local").write_text("DEBUG=1\n")
    (repo / "local").mkdir()
    (repo / "local/settings.local").write_text("x=1\n")
    (repo / "node_modules").mkdir()
    (repo / "node_modules/big.js").write_text("ignored, not asked for\n")
    chown_tree(repo)
    box = name("nc-env")
    out = player.create(repo, box, "with_env=true", '{"carry_ignored": ["local/*.local"]}')
    assert "ignored: 3 ignored files on a tmpfs, never checkpointed: .env, api/.env.local, local/settings.local" in flat(out)
    assert in_box(box, "cat /workspace/.env /workspace/api/.env.local /workspace/local/settings.local") == (
        f"API_KEY={token}\nDEBUG=1\nx=1\n"
    )
    assert in_box(box, "stat -f -c %T \"$(readlink -f /workspace/.env)\"").strip() == "tmpfs"
    assert in_box(box, "test ! -e /workspace/node_modules && echo absent").strip() == "absent"
    assert in_box(box, "git -C /workspace status --porcelain").strip() == ""  # ignored in the box too
    # A checkpoint of the box: the image holds no byte of the secret (only a dangling link).
    _checkpoint, image, found, links = checkpoint_scanned(player, box, [token.encode()], env_links=True)
    try:
        assert found == []
        assert any(target == "/run/agentbox/carried/.env" for target in links.values()), links
    finally:
        remove_image(image)


class ScanningReader(io.RawIOBase):
    """The chunks of a streamed export as a file tarfile can read, noting every needle that passes by
    (one pass, never on disk)."""

    def __init__(self, chunks: Iterator[bytes], needles: list[bytes]) -> None:
        self.chunks, self.needles, self.found = chunks, needles, set[bytes]()
        self.keep = max(len(n) for n in needles)
        self.pending, self.tail = b"", b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            chunk = next(self.chunks, b"")
            if not chunk:
                return 0
            window = self.tail + chunk
            self.found.update(n for n in self.needles if n in window)
            self.tail, self.pending = window[-self.keep:], chunk
        size = min(len(buffer), len(self.pending))
        buffer[:size], self.pending = self.pending[:size], self.pending[size:]
        return size


def checkpoint_scanned(player: Player, box: str, needles: list[bytes],  # noqa: F811
                       env_links: bool = False) -> tuple[str, str, list[bytes], dict[str, str]]:  # fmt: skip
    """A checkpoint of the box (agentbox_checkpoint's main, as checkpoint.yml runs it: the playbook is proven
    in tests/integration/checkpoint/), its name, its image, the needles its exported filesystem holds, and (env_links)
    the targets of its links named .env."""
    checkpoint = f"ck-{secrets.token_hex(2)}"
    saved = player.module("agentbox_checkpoint", {"box": box, "name": checkpoint})
    assert not saved["failed"], saved
    image = saved["checkpoint"]["image"]
    engine = docker.from_env()
    probe = engine.containers.create(image, command=["true"], entrypoint=[], labels={"io.agentbox.test": "nc-ck"})
    try:
        reader = ScanningReader(iter(engine.api.export(probe.id, chunk_size=1 << 20)), needles)
        links: dict[str, str] = {}
        if env_links:
            with tarfile.open(fileobj=io.BufferedReader(reader, 1 << 20), mode="r|") as tar:
                links = {m.name: m.linkname for m in tar if m.name.endswith("/.env")}
        else:  # the needles only: no tar parsing
            while reader.read(1 << 20):
                pass
    finally:
        probe.remove(v=True, force=True)
    return checkpoint, image, sorted(reader.found), links


def remove_image(image: str) -> None:
    engine = docker.from_env()
    for tag in engine.images.get(image).tags:
        engine.images.remove(tag, force=True)


def test_secret_named_files_go_to_the_tmpfs_whatever_gitignore_says(player: Player, tmp_path: Path) -> None:  # noqa: F811
    """Issue 33, item 3: a .env (and a key, an .npmrc with a token) that .gitignore does not ignore is not
    seeded as an untracked file: it reaches the box on its tmpfs only, the summary says so, git in the box
    does not offer it for a commit, and no checkpoint holds a byte of it; a box restored from that
    checkpoint gets it from the host again."""
    token = secrets.token_hex(16)
    repo = make_repo(tmp_path / "ws", {"README.md": "r\n", ".gitignore": "node_modules/\n"})
    (repo / ".env").write_text(f"API_KEY={token}\n")
    (repo / "certs").mkdir()
    (repo / "certs/dev.pem").write_text(f"-----BEGIN PRIVATE KEY-----\n{token}\n-----END PRIVATE KEY-----\n")
    (repo / ".npmrc").write_text(f"//registry.npmjs.org/:_authToken={token}\n")
    (repo / "notes.md").write_text("plain untracked\n")
    chown_tree(repo)
    box = name("nc-sec")
    out = flat(player.create(repo, box))
    assert "carried: 0 modified, 0 deleted, 0 renamed, 1 untracked" in out, out
    assert "ignored: none carried" in out, out
    assert ("secrets: 3 untracked files named like secrets, on a tmpfs only (never in a layer or a checkpoint): "
            ".env, .npmrc, certs/dev.pem") in out, out
    assert in_box(box, "cat /workspace/.env").strip() == f"API_KEY={token}"
    for path in (".env", ".npmrc", "certs/dev.pem"):
        assert in_box(box, f"stat -f -c %T \"$(readlink -f /workspace/{path})\"").strip() == "tmpfs", path
    assert in_box(box, "git -C /workspace status --porcelain -uall").split() == ["??", "notes.md"]
    checkpoint, image, found, _links = checkpoint_scanned(player, box, [token.encode()])
    try:
        assert found == []
        restored = name("nc-srs")
        out = flat(player.create(repo, restored, f"checkpoint={checkpoint}"))
        assert "secrets: 3 untracked files named like secrets" in out, out
        assert in_box(restored, "cat /workspace/.env").strip() == f"API_KEY={token}"
    finally:
        remove_image(image)


def test_download_copies_the_box_tree_without_ignored_files_or_unsafe_entries(player: Player, tmp_path: Path) -> None:  # noqa: F811
    repo = make_repo(tmp_path / "ws", {"README.md": "r\n", "src/app.py": "v1\n", ".gitignore": "*.log\n"})
    chown_tree(repo)
    before = git(repo, "status", "--porcelain")
    box = name("nc-dl")
    player.make(repo, box)  # create_box.yml's output: the other tests here and tests/integration/playbooks/
    in_box(box, "cd /workspace && echo v2 > src/app.py && echo new > notes.md && echo noise > run.log "
                "&& ln -s /etc/passwd escape && ln -s ../../outside up && mkdir -p deep && echo d > deep/f.txt")  # fmt: skip
    dest = tmp_path / "out"
    out = flat(player.ok("download.yml", f"box={box}", f"dest={dest}"))
    assert f"to: {dest}" in out
    assert (dest / "src/app.py").read_text() == "v2\n" and (dest / "notes.md").read_text() == "new\n"
    assert (dest / "deep/f.txt").read_text() == "d\n" and (dest / "README.md").read_text() == "r\n"
    assert not (dest / "run.log").exists() and not (dest / ".git").exists()
    assert not os.path.lexists(dest / "escape") and not os.path.lexists(dest / "up")  # links leaving dest
    assert "escape" in out and "up" in out  # reported as left out
    marker = json.loads((dest / ".agentbox-export.json").read_text())
    assert marker["box"] == box and any("notes.md" in entry for entry in marker["uncommitted"])
    assert git(repo, "status", "--porcelain") == before  # the host's tree untouched
    # The rest is agentbox_worktree's (download.yml only passes box and dest), by its main.

    def download(dest: Path | None = None) -> dict[str, Any]:
        return player.module("agentbox_worktree", {"box": box, "state": "downloaded", **({"dest": str(dest)} if dest else {})})

    # Again: the earlier export is replaced, not merged into.
    in_box(box, "rm /workspace/notes.md")
    assert not download(dest)["failed"]
    assert not (dest / "notes.md").exists()
    # A directory that is not an earlier export is refused, before anything is written.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep\n")
    refused = download(foreign)
    assert refused["failed"] and "is not empty and holds no earlier export" in flat(refused["msg"])
    assert sorted(p.name for p in foreign.iterdir()) == ["mine.txt"]
    inside = download(repo / "export")
    assert inside["failed"] and "overlaps the box's host workspace" in flat(inside["msg"])
    assert not (repo / "export").exists()
    # Default destination: ~/.agentbox/export/<box>/.
    assert not download()["failed"]
    assert (player.home / ".agentbox/export" / box / "src/app.py").read_text() == "v2\n"


def test_fetch_branch_on_the_local_engine_imports_the_box_commits(player: Player, tmp_path: Path) -> None:  # noqa: F811
    repo = make_repo(tmp_path / "ws")
    chown_tree(repo)
    box = name("nc-fb")
    player.make(repo, box)
    in_box(box, "cd /workspace && echo x > x && git add x && git -c user.name=A -c user.email=a@x.invalid commit -qm x")
    box_head = in_box(box, "git -C /workspace rev-parse HEAD").strip()
    # The box's commits stay in its own git layer until imported (docs/architecture.md, the trust boundary).
    assert git(repo, "rev-parse", f"agentbox/{box}").strip() != box_head
    out = flat(player.ok("fetch_branch.yml", f"box={box}"))
    assert git(repo, "rev-parse", f"agentbox/{box}").strip() == box_head
    assert f"agentbox/{box} at {box_head}" in out and "(updated)" in out, out
