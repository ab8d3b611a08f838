"""Checkpoint logic that needs no engine: the tar filter, config replay text, names and counters,
manifest/label round trips, and the in-box restore script run against real git repositories.

The restore script is the exact program a restore runs in the box; here it runs on the host
against a real repository, with a copy of a "source box" worktree standing in for the tree baked
into the checkpoint image.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import (  # noqa: E402
    _checkpoint,
    _checkpoint_records,
    _restore,
)
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import (  # noqa: E402
    _image_flatten,
    _image_store,
)

GIT = ["git", "-c", "safe.directory=*", "-c", "user.name=T", "-c", "user.email=t@example.invalid"]


# -- the tar filter -------------------------------------------------------------------------------
def _tar(entries: list[tuple[str, bytes | None, str]], fmt: int) -> bytes:
    """entries: (name, content or None for a directory, kind 'file'|'dir'|'link:<target>'|'hard:<target>')."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, content, kind in entries:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind.startswith("link:"):
                info.type, info.linkname = tarfile.SYMTYPE, kind[5:]
                tar.addfile(info)
            elif kind.startswith("hard:"):
                info.type, info.linkname = tarfile.LNKTYPE, kind[5:]
                tar.addfile(info)
            else:
                info.size = len(content or b"")
                tar.addfile(info, io.BytesIO(content or b""))
    return buffer.getvalue()


def _chunks(data: bytes, sizes: list[int]) -> list[bytes]:
    out, position, index = [], 0, 0
    while position < len(data):
        size = sizes[index % len(sizes)]
        out.append(data[position : position + size])
        position += size
        index += 1
    return out


LONG = "run/agentbox/secrets/" + "deep/" * 30 + "token"
KEPT_LONG = "workspace/" + "node_modules/" * 12 + "index.js"


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_filter_tar_drops_only_entries_under_run_agentbox(fmt: int) -> None:
    big = os.urandom(3 * 1024 * 1024 + 17)
    entries: list[tuple[str, bytes | None, str]] = [
        ("run/", None, "dir"),
        ("run/agentbox/", None, "dir"),
        ("run/agentbox/secrets/", None, "dir"),
        ("run/agentbox/secrets/API_KEY", b"sk-secret", "file"),
        ("run/agentbox/ctl.sock.link", None, "link:/nowhere"),
        ("run/agentboxes.txt", b"not under the prefix", "file"),
        ("workspace/big.bin", big, "file"),
        ("workspace/empty", b"", "file"),
        ("workspace/link", None, "link:big.bin"),
        ("workspace/hard", None, "hard:workspace/big.bin"),
    ]
    if fmt != tarfile.USTAR_FORMAT:  # ustar cannot hold names this long
        entries += [(LONG, b"sk-deep-secret", "file"), (KEPT_LONG, b"module.exports = 1", "file")]
    data = _tar(entries, fmt)
    for sizes in ([7, 1000, 511], [1 << 20], [512]):
        filtered = b"".join(_image_flatten.filter_tar(_chunks(data, sizes)))
        with tarfile.open(fileobj=io.BytesIO(filtered)) as tar:
            members = {m.name: m for m in tar.getmembers()}
            assert "run/agentbox" in members and "run/agentboxes.txt" in members
            assert not [n for n in members if n.startswith("run/agentbox/")]
            assert tar.extractfile("workspace/big.bin").read() == big
            assert members["workspace/link"].linkname == "big.bin"
            assert members["workspace/hard"].islnk()
            if fmt != tarfile.USTAR_FORMAT:
                assert tar.extractfile(KEPT_LONG).read() == b"module.exports = 1" and LONG not in members
        assert b"sk-secret" not in filtered and b"sk-deep-secret" not in filtered


def test_filter_tar_keeps_a_stream_without_excluded_entries_byte_for_byte() -> None:
    data = _tar([("a/", None, "dir"), ("a/b", b"x" * 1000, "file"), (KEPT_LONG, b"y", "file")], tarfile.PAX_FORMAT)
    assert b"".join(_image_flatten.filter_tar(_chunks(data, [333]))) == data


# -- config replay --------------------------------------------------------------------------------
def test_config_changes_quote_what_dockerfile_would_expand() -> None:
    changes = _image_flatten.config_changes(
        {
            "Env": ["PATH=/usr/bin:/bin", 'TRICKY=$HOME "q" \\x a=b'],
            "WorkingDir": "/workspace",
            "User": "1000:1000",
            "ExposedPorts": {"80/tcp": {}, "6080/tcp": {}},
            "Entrypoint": ["/usr/bin/tini", "--"],
            "Cmd": ["sleep", "infinity"],
        },
        {"io.agentbox.kind": "checkpoint", "note": 'say "$hi"'},
    )
    assert changes == [
        'ENV PATH="/usr/bin:/bin"',
        'ENV TRICKY="\\$HOME \\"q\\" \\\\x a=b"',
        "WORKDIR /workspace",
        "USER 1000:1000",
        "EXPOSE 6080/tcp",
        "EXPOSE 80/tcp",
        'ENTRYPOINT ["/usr/bin/tini", "--"]',
        'CMD ["sleep", "infinity"]',
        'LABEL "io.agentbox.kind"="checkpoint"',
        'LABEL "note"="say \\"\\$hi\\""',
    ]


def test_config_changes_refuse_a_line_break() -> None:
    with pytest.raises(_checkpoint.CheckpointError, match="MULTI holds a line break"):
        _image_flatten.config_changes({"Env": ["MULTI=a\nb"]}, {})


# -- names, counters, defaults, manifests ---------------------------------------------------------
def test_numbers_are_never_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _checkpoint_records.next_number("p1", "box", []) == 1
    _checkpoint_records.record_number("p1", "box", "box-1")
    _checkpoint_records.record_number("p1", "box", "box-2")
    # box-2 was removed since: its number stays used.
    assert _checkpoint_records.next_number("p1", "box", ["box-1"]) == 3
    assert _checkpoint_records.next_number("p1", "box", ["box-7", "box-x", "boxy-9"]) == 8
    assert _checkpoint_records.next_number("p1", "other", []) == 1
    assert _checkpoint_records.next_number("p2", "box", []) == 1
    _checkpoint_records.record_number("p1", "box", "custom-name")  # not numbered: ignored
    assert json.loads((tmp_path / ".agentbox/checkpoints/p1/.counters.json").read_text()) == {"box": 2}


def test_default_is_kept_with_the_other_project_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = Path(_checkpoint_records.project_config_path("p1"))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"someone_else": {"keep": True}}))
    from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider

    local = DockerProvider()  # no engine call: only its provider name and engine are read
    assert _checkpoint.project_default(local, "p1") is None
    _checkpoint_records.set_project_default("p1", "warm-1", "/src/app", provider=local)
    assert _checkpoint.project_default(local, "p1") == "warm-1"
    _checkpoint_records.set_project_default("p1", None, provider=local)
    assert json.loads(path.read_text()) == {
        "someone_else": {"keep": True}, "workspace": "/src/app", "default_checkpoints": {}}
    # A default written before defaults were per engine is the local engine's.
    path.write_text(json.dumps({"default_checkpoint": "old-1"}))
    assert _checkpoint.project_default(local, "p1") == "old-1"
    assert _checkpoint.project_default(DockerProvider(engine="u@127.0.0.1:2201"), "p1") is None
    path.write_text("{not json")
    with pytest.raises(_checkpoint.CheckpointError, match="not readable JSON"):
        _checkpoint.project_default(local, "p1")


def test_labels_carry_the_manifest_facts() -> None:
    record = {
        "name": "warm-2",
        "type": "layered",
        "project": "0123456789abcdef",
        "workspace": "/src/app",
        "parents": ["warm-1", "base-1"],
        "layers": 2,
        "source_box": "app-1",
        "source_box_id": "deadbeef",
        "branch": "agentbox/app-1",
        "commit": "a" * 40,
        "worktrees": [
            {
                "sub": "",
                "git_dir": "/src/app/.git",
                "path": "/home/vscode/.agentbox-worktrees/app-1",
                "branch": "agentbox/app-1",
                "commit": "a" * 40,
            }
        ],
        "base_image": "agentbox/box:latest",
        "base_image_id": "sha256:" + "b" * 64,
        "base_fingerprint": "f" * 64,
        "collection_version": "0.1.0",
        "engine": "docker:local",
        "created": "2026-11-29T09:00:00Z",
    }
    labels = _image_store.record_to_labels(record)
    assert labels["io.agentbox.kind"] == "checkpoint" and labels["io.agentbox.checkpoint"] == "warm-2"
    assert all(f"io.agentbox.{key}" in labels for key in _image_store.LABEL_KEYS)
    back = _image_store.labels_to_record(labels)
    assert {key: back[key] for key in record} == record and back["schema"] == _checkpoint_records.SCHEMA_VERSION


def test_references_of_another_project_are_refused() -> None:
    assert _checkpoint_records.parse_reference("warm-1", "p" * 16) == "warm-1"
    assert _checkpoint_records.parse_reference("agentbox-ckpt-" + "p" * 16 + ":warm-1", "p" * 16) == "warm-1"
    with pytest.raises(_checkpoint.CheckpointError, match="belongs to project"):
        _checkpoint_records.parse_reference("agentbox-ckpt-" + "q" * 16 + ":warm-1", "p" * 16)
    with pytest.raises(ValueError, match="invalid checkpoint name"):
        _checkpoint_records.parse_reference("Warm 1", "p" * 16)


# -- the in-box restore script, on real repositories ----------------------------------------------
def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def run_restore(request: dict) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "R",
        "GIT_AUTHOR_EMAIL": "r@x",
        "GIT_COMMITTER_NAME": "R",
        "GIT_COMMITTER_EMAIL": "r@x",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
    }
    return subprocess.run(
        [sys.executable, "-c", _restore.RESTORE_SCRIPT],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


@pytest.fixture
def world(tmp_path: Path) -> dict:
    """A host repo, a source-box worktree with warm state, the checkpoint's copy of it, and a host that moved on."""
    host = tmp_path / "host"
    home = tmp_path / "worktrees"
    home.mkdir()
    host.mkdir()
    git(host, "init", "-q", "-b", "main")
    write(host / ".gitignore", "node_modules/\n.env\n")
    write(host / "README.md", "1\n2\n3\n4\n5\n6\n7\n8\n")
    write(host / "app.js", "a\nb\nc\n")
    write(host / "gone.txt", "to be deleted by the host\n")
    git(host, "add", ".")
    git(host, "commit", "-q", "-m", "init")
    base = git(host, "rev-parse", "HEAD")
    source = home / "src"
    git(host, "worktree", "add", "-q", "--lock", str(source), "-b", "agentbox/src")
    # The agent's work in the source box: a commit, warm state, uncommitted edits, a stray untracked file.
    write(source / "README.md", "1 box\n2\n3\n4\n5\n6\n7\n8\n")
    git(source, "commit", "-q", "-am", "box commit")
    write(source / "node_modules/dep/index.js", "module.exports = 42\n")
    write(source / ".env", "LOCAL=1\n")
    write(source / "app.js", "a\nb box-uncommitted\nc\n")
    write(source / "shared-new.txt", "the box's version\n")
    write(source / "later.txt", "box has it too, differently\n")
    checkpoint_commit = git(source, "rev-parse", "HEAD")
    source_status = git(source, "status", "--porcelain")
    source_admin = sorted(p.name for p in (host / ".git/worktrees/src").iterdir())
    baked = home / "baked-src"  # the checkpoint image's copy of the source worktree
    shutil.copytree(source, baked, symlinks=True)
    # The host moves on: commits touching README (line 1 conflicts, line 8 merges), app.js, a new file.
    write(host / "README.md", "1 host\n2\n3\n4\n5\n6\n7\n8 host\n")
    write(host / "shared-new.txt", "the host's version\n")
    write(host / "app.js", "a\nb host-commit\nc\n")
    git(host, "add", ".")
    git(host, "commit", "-q", "-m", "host commit")
    # ... and has uncommitted work: a deletion, an edit, an edit the box also made, untracked files.
    (host / "gone.txt").unlink()
    write(host / "README.md", "1 host\n2\n3\n4 host-dirty\n5\n6\n7\n8 host\n")
    write(host / "later.txt", "untracked on the host\n")
    write(host / "fresh.txt", "only on the host\n")
    stash = git(host, "stash", "create")
    head = git(host, "rev-parse", "HEAD")
    git(host, "update-ref", "refs/heads/agentbox/new", head, "")
    new_path = home / "new"
    request = {
        "box": "new",
        "checkpoint": "ck-1",
        "worktrees_home": str(home),
        "jobs": [
            {
                "sub": "",
                "common_dir": str(host / ".git"),
                "old_path": str(baked),
                "new_path": str(new_path),
                "branch": "agentbox/new",
                "commit": checkpoint_commit,
                "host_head": head,
                "host_stash": stash,
                "untracked": ["later.txt", "fresh.txt"],
                "owner_uid": os.getuid(),
            }
        ],
    }
    return {
        "host": host,
        "source": source,
        "baked": baked,
        "new": new_path,
        "request": request,
        "base": base,
        "checkpoint_commit": checkpoint_commit,
        "head": head,
        "source_status": source_status,
        "source_admin": source_admin,
    }


def test_restore_merges_host_head_box_wins_and_reports_every_conflict(world: dict) -> None:
    done = run_restore(world["request"])
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])["worktrees"][0]
    new, host = world["new"], world["host"]
    # Registered for the new path, pointing at the baked tree, on the new branch.
    assert os.path.realpath(new) == str(world["baked"])
    assert Path(host / ".git/worktrees/new/gitdir").read_text().strip() == f"{new}/.git"
    assert git(new, "symbolic-ref", "--short", "HEAD") == "agentbox/new"
    # The branch: the checkpoint's commit merged with the host's HEAD.
    assert answer["merge"] == "merged" and answer["head"] == git(host, "rev-parse", "agentbox/new")
    parents = git(host, "rev-list", "--parents", "-n1", "agentbox/new").split()[1:]
    assert parents == [world["checkpoint_commit"], world["head"]]
    # Contents: box wins conflicting hunks, host's others are in; host's uncommitted work overlaid.
    assert (new / "README.md").read_text() == "1 box\n2\n3\n4 host-dirty\n5\n6\n7\n8 host\n"
    assert (new / "app.js").read_text() == "a\nb box-uncommitted\nc\n"
    assert (new / "shared-new.txt").read_text() == "the box's version\n"
    assert not (new / "gone.txt").exists()
    assert (new / "node_modules/dep/index.js").read_text() == "module.exports = 42\n"
    assert (new / ".env").read_text() == "LOCAL=1\n"
    kinds = {(c["path"], c["kind"]) for c in answer["conflicts"]}
    assert ("README.md", "merge") in kinds
    assert ("shared-new.txt", "merge") in kinds  # untracked in the box, committed on the host
    assert ("app.js", "checkpoint-changes") in kinds  # the box's uncommitted edit vs the host's commit
    assert all(c["kept"] == "box" for c in answer["conflicts"])
    # Host untracked files: one the box also has (reported with its hash), one to be copied in.
    assert set(answer["untracked_existing"]) == {"later.txt"} and answer["untracked_blocked"] == []
    # Everything is unstaged; the index is the branch's commit.
    assert git(new, "diff", "--cached", "--name-only") == ""
    # The source box's worktree and its registration are untouched.
    assert git(world["source"], "status", "--porcelain") == world["source_status"]
    assert git(world["source"], "rev-parse", "HEAD") == world["checkpoint_commit"]
    assert sorted(p.name for p in (host / ".git/worktrees/src").iterdir()) == world["source_admin"]
    assert Path(host / ".git/worktrees/src/gitdir").read_text().strip() == f"{world['source']}/.git"


def test_restore_fast_forwards_when_the_box_made_no_commits(world: dict, tmp_path: Path) -> None:
    host = world["host"]
    request = world["request"]
    job = request["jobs"][0]
    job["commit"] = world["base"]  # as if the checkpoint's branch never moved
    job["host_stash"] = ""
    job["untracked"] = []
    done = run_restore(request)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])["worktrees"][0]
    assert answer["merge"] == "fast-forward" and git(host, "rev-parse", "agentbox/new") == world["head"]


def test_restore_fails_cleanly_when_the_baked_tree_is_missing(world: dict) -> None:
    request = world["request"]
    request["jobs"][0]["old_path"] = str(world["baked"]) + "-missing"
    done = run_restore(request)
    assert done.returncode == 1 and "has no worktree" in done.stderr
    assert not (world["host"] / ".git/worktrees/new").exists() and not os.path.lexists(world["new"])


def test_restore_leaves_no_registration_when_the_branch_is_taken(world: dict) -> None:
    request = world["request"]
    request["jobs"][0]["branch"] = "agentbox/src"  # checked out by the source worktree: git refuses
    done = run_restore(request)
    assert done.returncode == 1 and "worktree add" in done.stderr
    assert sorted(p.name for p in (world["host"] / ".git/worktrees").iterdir()) == ["src"]
    assert not [p for p in Path(request["worktrees_home"]).iterdir() if p.name.startswith(".restore-")]


def test_restore_registers_nested_repositories_inside_the_baked_root(tmp_path: Path) -> None:
    home = tmp_path / "worktrees"
    home.mkdir()
    host = tmp_path / "host"
    nested = host / "lib"
    for repo in (host, nested):
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q", "-b", "main")
        write(repo / "file.txt", f"{repo.name}\n")
        git(repo, "add", "file.txt")
        git(repo, "commit", "-q", "-m", "init")
    source = home / "src"
    git(host, "worktree", "add", "-q", "--lock", str(source), "-b", "agentbox/src")
    git(nested, "worktree", "add", "-q", "--lock", str(source / "lib"), "-b", "agentbox/src")
    write(source / "lib" / "node_modules" / "x.js", "warm\n")
    baked = home / "baked"
    shutil.copytree(source, baked, symlinks=True)
    jobs = []
    for repo, sub in ((host, ""), (nested, "lib")):
        head = git(repo, "rev-parse", "main")
        git(repo, "update-ref", "refs/heads/agentbox/new", head, "")
        jobs.append(
            {
                "sub": sub,
                "common_dir": str(repo / ".git"),
                "old_path": str(baked / sub) if sub else str(baked),
                "new_path": str(home / "new" / sub) if sub else str(home / "new"),
                "branch": "agentbox/new",
                "commit": git(repo, "rev-parse", "agentbox/src"),
                "host_head": head,
                "host_stash": "",
                "untracked": [],
                "owner_uid": os.getuid(),
            }
        )
    done = run_restore({"box": "new", "checkpoint": "ck", "worktrees_home": str(home), "jobs": list(reversed(jobs))})
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout.splitlines()[-1])["worktrees"]
    assert [a["sub"] for a in answers] == ["", "lib"]  # the root first, whatever the order asked
    assert os.path.realpath(home / "new" / "lib") == str(baked / "lib")
    admin = Path((home / "new" / "lib" / ".git").read_text().split("gitdir:", 1)[1].strip())
    assert admin.parent == nested / ".git" / "worktrees" and admin.name != "lib"  # "lib" is the source's
    assert (admin / "gitdir").read_text().strip() == f"{home}/new/lib/.git"
    assert (nested / ".git/worktrees/lib/gitdir").read_text().strip() == f"{source}/lib/.git"
    assert git(home / "new" / "lib", "symbolic-ref", "--short", "HEAD") == "agentbox/new"
    assert git(home / "new", "symbolic-ref", "--short", "HEAD") == "agentbox/new"
    assert (home / "new" / "lib" / "node_modules" / "x.js").read_text() == "warm\n"
    assert git(source / "lib", "symbolic-ref", "--short", "HEAD") == "agentbox/src"


def test_blob_ids_are_gits_own_for_links_dangling_links_and_odd_names(tmp_path: Path) -> None:
    """Untracked files the box and the host both have are compared by blob id: git's own id of what is
    there, a symlink by its target text (a dangling one too), a name holding a newline as one path."""
    from ansible_collections.agentbox.box.plugins.module_utils.checkpoint._restore_program import (
        blob_ids,
        object_format,
    )

    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo / "a.txt", "a\n")
    (repo / "new\nline.txt").write_bytes(b"\0bin\r\nary")
    (repo / "dangling").symlink_to("nowhere")
    (repo / "link").symlink_to("a.txt")
    paths = ["a.txt", "new\nline.txt", "dangling", "link"]
    git(repo, "add", "-A")
    staged = {}  # path -> the blob id git stored for it: "<mode> <id> <stage>\t<path>"
    for entry in filter(None, git(repo, "ls-files", "-s", "-z").split("\0")):
        meta, path = entry.split("\t", 1)
        staged[path] = meta.split(" ")[1]
    assert blob_ids(str(repo), paths, object_format(str(repo))) == [staged[path] for path in paths]
