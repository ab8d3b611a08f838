"""Seeding on the fake provider: the host's uncommitted work arrives in the box byte for byte, by
both ways a git workspace is seeded (a worktree on the host's .git through the box's git layer,
and a shipped repository), and the seed record is the last thing written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from tests.conftest import git, make_repo
from tests.unit.support.fake_provider import FakeProvider

ODD_NAMES = ["with space.txt", "new\nline.txt", "ünïcødé.txt", "-dash.txt", "back\\slash.txt", 'quo"te.txt',
             "star*.txt", "tab\tname.txt", "ends with space "]  # fmt: skip
BINARY = bytes(range(256)) * 4 + b"\r\n\0tail"


def torture_workspace(tmp_path: Path) -> Path:
    """A repo with every kind of uncommitted change, staged and not."""
    files: dict[str, str | bytes] = {
        "tracked.txt": "one\n",
        "staged.txt": "base\n",
        "deleted.txt": "bye\n",
        "staged_deleted.txt": "bye too\n",
        "old_name.txt": "moving\n",
        "script.sh": "#!/bin/sh\necho hi\n",
        "binary.bin": BINARY,
        "no_newline.txt": "last line",
        "dir/nested/deep.txt": "deep\n",
        **{f"odd/{name}": f"{name!r}\n" for name in ODD_NAMES},
    }
    repo = make_repo(tmp_path / "ws", files)
    (repo / "link").symlink_to("tracked.txt")
    (repo / "dir_link").symlink_to("dir/nested")
    git(repo, "add", "link", "dir_link")
    git(repo, "commit", "-qm", "links")
    (repo / ".gitignore").write_text("ignored.log\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore")
    # Staged and unstaged changes, the two differing on one file.
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    (repo / "staged.txt").write_text("staged, then edited again\n")
    (repo / "tracked.txt").write_text("one, edited\n")
    (repo / "binary.bin").write_bytes(BINARY[::-1])
    (repo / "no_newline.txt").write_text("last line, changed")
    (repo / "deleted.txt").unlink()
    git(repo, "rm", "-q", "staged_deleted.txt")
    git(repo, "mv", "old_name.txt", "new_name.txt")
    (repo / "script.sh").chmod(0o755)
    (repo / "link").unlink()
    (repo / "link").symlink_to("new_name.txt")
    for name in ODD_NAMES[:4]:
        (repo / "odd" / name).write_text(f"{name!r} edited\n")
    git(repo, "add", f"odd/{ODD_NAMES[0]}")
    # Untracked: plain, empty, executable, in new directories, odd names, links (dangling too).
    (repo / "untracked.txt").write_text("new\n")
    (repo / "empty").write_bytes(b"")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "new/dir/tree").mkdir(parents=True)
    (repo / "new/dir/tree/file.bin").write_bytes(BINARY)
    for name in ODD_NAMES:
        (repo / "new" / name).write_text(f"untracked {name!r}\n")
    (repo / "new/link").symlink_to("../untracked.txt")
    (repo / "new/dangling").symlink_to("nowhere")
    (repo / "ignored.log").write_text("stays home\n")
    return repo


def tree(root: Path) -> dict[str, tuple[str, bytes | str, bool]]:
    """path -> (kind, content or link target, executable) for everything but .git and ignored files."""
    found: dict[str, tuple[str, bytes | str, bool]] = {}
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            path = Path(dirpath) / name
            relative = str(path.relative_to(root))
            if relative in (".git", "ignored.log"):
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                found[relative] = ("link", os.readlink(path), False)
            else:
                found[relative] = ("file", path.read_bytes(), bool(info.st_mode & 0o100))
    return found


def box_tree_root(fake: FakeProvider, box: str) -> Path:
    root = fake.box_root(box)
    workspace = root / "workspace"
    return root / os.readlink(workspace).lstrip("/") if workspace.is_symlink() else workspace


def box_git(fake: FakeProvider, box: str, *args: str) -> str:
    return fake.exec(box, ["git", "-C", "/workspace", *args]).check(f"git {args[0]}", box).text


@pytest.mark.parametrize("engine", ["local", "remote"])
def test_uncommitted_work_arrives_byte_for_byte(engine: str, fake: FakeProvider, remote_fake: FakeProvider,
                                                tmp_path: Path):  # fmt: skip
    provider = fake if engine == "local" else remote_fake
    repo = torture_workspace(tmp_path)
    host = tree(repo)
    staged = git(repo, "diff", "--cached", "--name-status", "-z", "-M")
    unstaged = git(repo, "diff", "--name-status", "-z")
    untracked = git(repo, "ls-files", "--others", "--exclude-standard", "-z")
    created = _box.create_box(provider, _box.CreateRequest(name="seeded", workspace=str(repo)))
    assert created.seed.mode == ("worktree" if engine == "local" else "shipped")
    assert created.seed.warnings == []
    in_box = tree(box_tree_root(provider, "seeded"))
    assert sorted(in_box) == sorted(host)
    for path, entry in host.items():
        assert in_box[path] == entry, path
    assert box_git(provider, "seeded", "diff", "--cached", "--name-status", "-z", "-M") == staged
    assert box_git(provider, "seeded", "diff", "--name-status", "-z") == unstaged
    assert box_git(provider, "seeded", "ls-files", "--others", "--exclude-standard", "-z") == untracked
    assert box_git(provider, "seeded", "rev-parse", "--abbrev-ref", "HEAD").strip() == "agentbox/seeded"
    assert created.seed.untracked == len(untracked.split("\0")) - 1


@pytest.mark.parametrize("engine", ["local", "remote"])
@pytest.mark.parametrize("with_untracked", [True, False])
def test_the_seed_record_is_written_last(engine: str, with_untracked: bool, fake: FakeProvider,
                                         remote_fake: FakeProvider, tmp_path: Path):  # fmt: skip
    provider = fake if engine == "local" else remote_fake
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    (repo / "a.txt").write_text("edited\n")
    if with_untracked:
        (repo / "new.txt").write_text("new\n")
    _box.create_box(provider, _box.CreateRequest(name="ordered", workspace=str(repo), boot=False))
    steps = [(method, had_record) for method, box, had_record in provider.calls if box == "ordered"]
    # The create's last call may be the one that wrote it (nothing runs in the box after the seed's exec).
    steps.append(("after the create", (provider.box_root("ordered") / "etc/agentbox/seed.json").exists()))
    first_with_record = next(index for index, (_method, had_record) in enumerate(steps) if had_record)
    # Nothing that fills the workspace ran once the record was there: the record says "complete".
    filling = [index for index, (method, _had) in enumerate(steps) if method in ("put_archive", "create")]
    assert filling and max(filling) < first_with_record, steps
    writes_record = steps[first_with_record - 1]
    # Local untracked files: the record is the stream's last member (_tarstream.tar_ending_with).
    assert writes_record[0] == ("put_archive" if engine == "local" and with_untracked else "exec")
    tree_root = box_tree_root(provider, "ordered")
    assert (tree_root / "a.txt").read_text() == "edited\n"
    assert (tree_root / "new.txt").exists() == with_untracked


def test_a_failed_stream_leaves_no_seed_record(fake: FakeProvider, tmp_path: Path):
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    (repo / "new.txt").write_text("new\n")
    name = "half"
    fake.fail_on("put_archive")
    seen: list[bool] = []
    destroy = fake.destroy

    def destroy_watching(box: str) -> None:
        # The rollback removes the box: look at it just before, as a crash would have left it.
        seen.append((fake.box_root(box) / "etc/agentbox/seed.json").exists())
        destroy(box)

    fake.destroy = destroy_watching  # type: ignore[method-assign]
    with pytest.raises(Exception, match="injected failure of put_archive"):
        _box.create_box(fake, _box.CreateRequest(name=name, workspace=str(repo), boot=False))
    assert seen == [False]
