"""Files in and out of a box (issue 18, item 5), on the real engine: the host's ignored .env*
files (and carry_ignored globs) carried on request onto a tmpfs and never into a checkpoint;
download.yml copying a box's tree out, gitignore-aware, untrusted tar entries left out; and
fetch_branch.yml on the local engine saying there is nothing to fetch."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tarfile
from pathlib import Path

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
    _checkpoint, image, export = checkpoint_exported(player, box, tmp_path)
    try:
        with tarfile.open(export) as tar:
            links = {m.name: m.linkname for m in tar.getmembers() if m.name.endswith("/.env")}
        assert token.encode() not in export.read_bytes()
        assert any(target == "/run/agentbox/carried/.env" for target in links.values()), links
    finally:
        remove_image(image)


def checkpoint_exported(player: Player, box: str, tmp_path: Path) -> tuple[str, docker.models.images.Image, Path]:  # noqa: F811
    """A checkpoint of the box (checkpoint.yml), its image, and the image's filesystem exported to a tar."""
    checkpoint = f"ck-{secrets.token_hex(2)}"
    player.ok("checkpoint.yml", f"box={box}", f"checkpoint={checkpoint}")
    engine = docker.from_env()
    image = next(i for i in engine.images.list(filters={"label": "io.agentbox.kind=checkpoint"})
                 if any(t.endswith(f":{checkpoint}") for t in i.tags))  # fmt: skip
    probe = engine.containers.create(image.id, command=["true"], entrypoint=[], labels={"io.agentbox.test": "nc-ck"})
    try:
        export = tmp_path / f"{checkpoint}.tar"
        with open(export, "wb") as handle:
            for chunk in probe.export():
                handle.write(chunk)
    finally:
        probe.remove(v=True, force=True)
    return checkpoint, image, export


def remove_image(image: docker.models.images.Image) -> None:
    for tag in image.tags:
        docker.from_env().images.remove(tag, force=True)


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
    checkpoint, image, export = checkpoint_exported(player, box, tmp_path)
    try:
        assert token.encode() not in export.read_bytes()
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
    player.create(repo, box)
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
    # Again: the earlier export is replaced, not merged into.
    in_box(box, "rm /workspace/notes.md")
    player.ok("download.yml", f"box={box}", f"dest={dest}")
    assert not (dest / "notes.md").exists()
    # A directory that is not an earlier export is refused, before anything is written.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep\n")
    refused = player.run("download.yml", f"box={box}", f"dest={foreign}")
    assert refused.returncode != 0 and "is not empty and holds no earlier export" in flat(refused.stdout)
    assert sorted(p.name for p in foreign.iterdir()) == ["mine.txt"]
    inside = player.run("download.yml", f"box={box}", f"dest={repo}/export")
    assert inside.returncode != 0 and "overlaps the box's host workspace" in flat(inside.stdout)
    assert not (repo / "export").exists()
    # Default destination: ~/.agentbox/export/<box>/.
    player.ok("download.yml", f"box={box}")
    assert (player.home / ".agentbox/export" / box / "src/app.py").read_text() == "v2\n"


def test_fetch_branch_on_the_local_engine_imports_the_box_commits(player: Player, tmp_path: Path) -> None:  # noqa: F811
    repo = make_repo(tmp_path / "ws")
    chown_tree(repo)
    box = name("nc-fb")
    player.create(repo, box)
    in_box(box, "cd /workspace && echo x > x && git add x && git -c user.name=A -c user.email=a@x.invalid commit -qm x")
    box_head = in_box(box, "git -C /workspace rev-parse HEAD").strip()
    # The box's commits stay in its own git layer until imported (docs/architecture.md, the trust boundary).
    assert git(repo, "rev-parse", f"agentbox/{box}").strip() != box_head
    out = flat(player.ok("fetch_branch.yml", f"box={box}"))
    assert git(repo, "rev-parse", f"agentbox/{box}").strip() == box_head
    assert f"agentbox/{box} at {box_head}" in out and "(updated)" in out, out
