"""`agentbox-ctl cp` on the host, in-process on real files: which host paths a box may name, which wait for the
user, which are refused, and what the host does with the file a box sends (no engine: the box's tar stream is
made here; tests/integration/relay/test_relay_copy.py runs the copy through a real box and relay)."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import types
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxFacts
from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_files
from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_ops import Outcome
from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_protocol import (
    MAX_COPY_BYTES,
    Request,
    RequestError,
    parse_request,
)


def copy(direction: str, host: str, box: str = "/workspace/f.txt") -> Request:
    line = json.dumps({"v": 1, "op": "file.cp", "args": {"direction": direction, "host": host, "box": box}})
    return parse_request(line.encode())


def facts(workspace: Path) -> BoxFacts:
    return BoxFacts(name="b", id="0123abcd", provider="docker", engine="local", state="running", container="agentbox-b",
                    image="agentbox/box:latest", project="p", workspace=str(workspace), branch="agentbox/b", created="")


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    workspace = tmp_path / "ws"
    (workspace / "docs").mkdir(parents=True)
    (workspace / "docs/notes.md").write_text("notes\n")
    (workspace / ".git/hooks").mkdir(parents=True)
    (workspace / ".git/config").write_text("[core]\n")
    (workspace / ".env").write_text("TOKEN=x\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host only\n")
    (workspace / "escape").symlink_to(outside)
    (workspace / "link.md").symlink_to(workspace / "docs/notes.md")
    return {"workspace": workspace, "outside": outside}


def staged(world: dict[str, Path], direction: str, host: str) -> _relay_files.StagedCopy | Outcome:
    return _relay_files.stage(facts(world["workspace"]), copy(direction, host))


def tar_of(name: str, content: bytes, mode: int = 0o644, kind: bytes = tarfile.REGTYPE, size: int | None = None) -> list[bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.mode = kind, mode
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    else:
        info.size = len(content) if size is None else size
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if size is None and kind == tarfile.REGTYPE:
            tar.addfile(info, io.BytesIO(content))
        else:
            out.write(info.tobuf(tarfile.PAX_FORMAT))
    return [out.getvalue()]


@pytest.mark.parametrize(("args", "message"), [
    ({"direction": "out", "host": "../x", "box": "/workspace/a"}, "holds '..'"),
    ({"direction": "out", "host": "docs/../../x", "box": "/workspace/a"}, "holds '..'"),
    ({"direction": "in", "host": "a", "box": "relative/a"}, "must be absolute"),
    ({"direction": "in", "host": "a", "box": "/tmp/x/../../etc/shadow"}, "holds '..'"),
    ({"direction": "out", "host": "dir/", "box": "/workspace/a"}, "names a directory"),
    ({"direction": "sideways", "host": "a", "box": "/workspace/a"}, "direction is 'in'"),
    ({"direction": "out", "host": "a\nb", "box": "/workspace/a"}, "control characters"),
    ({"direction": "out", "host": "a" * 5000, "box": "/workspace/a"}, "longer than"),
    ({"direction": "out", "box": "/workspace/a"}, "needs the host path"),
    ({"direction": "out", "host": "a", "box": "/workspace/a", "mode": "4755"}, "unknown arguments: mode"),
])
def test_copy_requests_with_bad_paths_are_refused_before_anything_runs(args: dict, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_request(json.dumps({"v": 1, "op": "file.cp", "args": args}).encode())


def test_reading_a_workspace_file_needs_no_approval_and_a_new_file_there_waits_for_the_user(world: dict[str, Path]) -> None:
    read = staged(world, "in", "docs/notes.md")
    assert isinstance(read, _relay_files.StagedCopy) and read.reason is None
    # A file the box sends changes the host's working tree: the user says yes first.
    found = staged(world, "out", "docs/report.txt")
    assert isinstance(found, _relay_files.StagedCopy) and found.reason
    assert "writes a new file" in found.reason and "working tree" in found.reason
    assert found.host_path == str(world["workspace"] / "docs/report.txt") and not found.exists
    # An absolute path inside the workspace is the same path.
    again = staged(world, "out", str(world["workspace"] / "docs/report.txt"))
    assert isinstance(again, _relay_files.StagedCopy) and again.parts == ("docs", "report.txt")
    assert again.reason == found.reason


def test_outside_the_workspace_replacing_secrets_and_git_config_wait_for_the_user(world: dict[str, Path]) -> None:
    reasons = {
        ("out", str(world["outside"] / "new.txt")): "outside the box's workspace",
        ("in", str(world["outside"] / "secret.txt")): "outside the box's workspace",
        ("out", "docs/notes.md"): "replaces the existing file",
        ("in", ".env"): "named like a secret file",
        ("in", ".git/config"): "in the host repository's .git",
    }
    for (direction, host), reason in reasons.items():
        found = staged(world, direction, host)
        assert isinstance(found, _relay_files.StagedCopy), (host, found)
        assert found.reason and reason in found.reason, (host, found.reason)


def test_links_git_writes_and_missing_places_are_refused(world: dict[str, Path]) -> None:
    refused = {
        ("out", "escape/new.txt"): "which is a symbolic link on the host",
        ("in", "escape/secret.txt"): "which is a symbolic link on the host",
        ("in", "link.md"): "is a symbolic link on the host",
        ("out", "link.md"): "is a symbolic link on the host",
        ("out", ".git/hooks/pre-commit"): "never writes a repository's own files",
        ("out", ".GIT/hooks/pre-commit"): "never writes a repository's own files",  # a case-insensitive disk's .git
        ("out", "nowhere/x.txt"): "does not exist",
        ("in", "docs/none.md"): "there is no file",
        ("out", "docs"): "not a regular file",
        ("out", "docs/notes.md/x"): "not a directory",
        ("in", "big.bin"): f"over the {MAX_COPY_BYTES} a copy may carry",
    }
    with open(world["workspace"] / "big.bin", "wb") as handle:  # sparse: the size is what is checked
        handle.truncate(MAX_COPY_BYTES + 1)
    for (direction, host), message in refused.items():
        found = staged(world, direction, host)
        assert isinstance(found, Outcome) and found.rc == 1, (host, found)
        assert message in found.stderr, (host, found.stderr)


def test_a_file_from_the_box_lands_whole_as_a_new_file_without_its_mode_bits(world: dict[str, Path]) -> None:
    found = staged(world, "out", "docs/report.txt")
    assert isinstance(found, _relay_files.StagedCopy)
    size = _relay_files.receive(tar_of("report.txt", b"from the box\n", mode=0o6777), found, replace=False)
    target = world["workspace"] / "docs/report.txt"
    assert size == 13 and target.read_bytes() == b"from the box\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(os.listdir(world["workspace"] / "docs")) == ["notes.md", "report.txt"]  # no temporary left


def test_what_the_box_sends_is_checked_before_a_byte_is_written(world: dict[str, Path]) -> None:
    found = staged(world, "out", "docs/report.txt")
    assert isinstance(found, _relay_files.StagedCopy)
    cases = {
        "is a symlink, not a regular file": tar_of("report.txt", b"", kind=tarfile.SYMTYPE),
        f"over the {MAX_COPY_BYTES}": tar_of("report.txt", b"", size=MAX_COPY_BYTES + 1),
        "empty archive": [b"\0" * 1024],
    }
    for message, chunks in cases.items():
        with pytest.raises(_relay_files.Refused, match=message):
            _relay_files.receive(chunks, found, replace=False)
    # A stream cut short leaves nothing behind.
    with pytest.raises(_relay_files.ArchiveRefused, match="cut short"):
        _relay_files.receive([tar_of("report.txt", b"x" * 4000)[0][:2048]], found, replace=False)
    assert sorted(os.listdir(world["workspace"] / "docs")) == ["notes.md"]


def test_a_file_that_appears_meanwhile_is_not_replaced_unless_approved(world: dict[str, Path]) -> None:
    found = staged(world, "out", "docs/late.txt")
    assert isinstance(found, _relay_files.StagedCopy) and not found.exists
    (world["workspace"] / "docs/late.txt").write_text("the user's\n")
    with pytest.raises(_relay_files.Refused, match="appeared on the host meanwhile"):
        _relay_files.receive(tar_of("late.txt", b"box\n"), found, replace=False)
    assert (world["workspace"] / "docs/late.txt").read_text() == "the user's\n"
    # Approved (the user saw "replaces the existing file"): replaced whole.
    _relay_files.receive(tar_of("late.txt", b"box\n"), found, replace=True)
    assert (world["workspace"] / "docs/late.txt").read_text() == "box\n"
    assert sorted(os.listdir(world["workspace"] / "docs")) == ["late.txt", "notes.md"]


def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(world: dict[str, Path]) -> None:
    found = staged(world, "out", "docs/report.txt")
    assert isinstance(found, _relay_files.StagedCopy)
    docs = world["workspace"] / "docs"
    docs.rename(world["workspace"] / "docs.old")
    docs.symlink_to(world["outside"])
    with pytest.raises(_relay_files.Refused, match="symbolic link"):
        _relay_files.receive(tar_of("report.txt", b"box\n"), found, replace=False)
    assert sorted(os.listdir(world["outside"])) == ["secret.txt"]


def client() -> types.ModuleType:
    """The in-box relay client (standard library only), loaded from the checkout as the box runs it."""
    import importlib.machinery
    import importlib.util

    from tests.conftest import REPO

    loader = importlib.machinery.SourceFileLoader("agentbox_relay_client",
                                                  str(REPO / "roles/inbox_supervisor/files/agentbox-relay-client"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_box_side_names_the_copy_the_host_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "into").mkdir()
    made = client().copy_request
    out = {"direction": "out", "host": "reports/r.html", "box": str(tmp_path / "dist/r.html")}
    assert made("dist/r.html", "host:reports/") == out
    assert made("/tmp/a.txt", "host:") == {"direction": "out", "host": "a.txt", "box": "/tmp/a.txt"}
    into = {"direction": "in", "host": "fixtures/big.json", "box": str(tmp_path / "into/big.json")}
    assert made("host:fixtures/big.json", "into") == into
    assert made("host:a", "host:b") is None and made("a", "b") is None
    # What it sends passes the host's checks as it is.
    request = made("/tmp/a.txt", "host:out/a.txt")
    assert parse_request(json.dumps({"v": 1, "op": "file.cp", "args": request}).encode()).args == request
