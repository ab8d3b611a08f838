"""_box_mounts: an overlay and a read-only bind made on the host and put into another process's mount
namespace (what a claimed pooled box gets, docs/pool.md), on a real process in its own namespace."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _box_mounts


@pytest.fixture
def namespace() -> Iterator[int]:
    """A process in a mount namespace of its own (as a box's init is): its pid."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace of its own and mounts in it")
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", "echo up; exec sleep 600"],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    yield proc.pid
    proc.kill()
    proc.wait()


def test_an_overlay_and_a_read_only_bind_reach_that_namespace_only(namespace: int, tmp_path: Path) -> None:
    for name in ("lower", "upper", "work", "git", "relay", "sock"):
        (tmp_path / name).mkdir()
    (tmp_path / "lower" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "relay" / "r").write_text("relay\n")
    _box_mounts.attach(namespace, [
        _box_mounts.overlay(str(tmp_path / "lower"), str(tmp_path / "upper"), str(tmp_path / "work"),
                            str(tmp_path / "git")),
        _box_mounts.bind(str(tmp_path / "relay"), str(tmp_path / "sock")),
    ])
    assert os.listdir(tmp_path / "git") == [] and os.listdir(tmp_path / "sock") == []  # not on the host
    inside = ["nsenter", "-t", str(namespace), "-m", "sh", "-c",
              'cat "$0/git/HEAD" "$0/sock/r"; echo w > "$0/git/new"; touch "$0/sock/x" 2>/dev/null || echo ro',
              str(tmp_path)]
    ran = subprocess.run(inside, capture_output=True, text=True, check=True)
    assert ran.stdout == "ref: refs/heads/main\nrelay\nro\n"
    assert os.listdir(tmp_path / "upper") == ["new"] and sorted(os.listdir(tmp_path / "lower")) == ["HEAD"]


def test_a_mount_point_through_a_symbolic_link_is_refused(namespace: int, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(_box_mounts.MountError, match="at 'link'"):
        _box_mounts.attach(namespace, [_box_mounts.bind(str(tmp_path / "src"), str(tmp_path / "link"))])
    with pytest.raises(_box_mounts.MountError, match="No such file"):
        _box_mounts.attach(namespace, [_box_mounts.bind(str(tmp_path / "src"), str(tmp_path / "missing"))])
