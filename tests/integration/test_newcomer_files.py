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
from tests.integration.test_newcomer_output import Player, flat, name, player  # noqa: F401  # pylint: disable=unused-import

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
    checkpoint = f"env-{secrets.token_hex(2)}"
    player.ok("checkpoint.yml", f"box={box}", f"checkpoint={checkpoint}")
    engine = docker.from_env()
    image = next(i for i in engine.images.list(filters={"label": "io.agentbox.kind=checkpoint"})
                 if any(t.endswith(f":{checkpoint}") for t in i.tags))  # fmt: skip
    probe = engine.containers.create(image.id, command=["true"], entrypoint=[], labels={"io.agentbox.test": "nc-env"})
    try:
        export = tmp_path / "image.tar"
        with open(export, "wb") as handle:
            for chunk in probe.export():
                handle.write(chunk)
        with tarfile.open(export) as tar:
            links = {m.name: m.linkname for m in tar.getmembers() if m.name.endswith("/.env")}
        assert token.encode() not in export.read_bytes()
        assert any(target == "/run/agentbox/carried/.env" for target in links.values()), links
    finally:
        probe.remove(v=True, force=True)
        for tag in image.tags:
            engine.images.remove(tag, force=True)


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
