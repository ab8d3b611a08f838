"""The relay's per-box directory (sock/<id>/, bound into the box) holds whatever root in the box put
there: the host replaces it without following anything and forgets it whatever it holds. Real files
under a private HOME; the socket is a real unix socket a client connects to."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_state

BOX_ID = "0badc0de"


@pytest.fixture
def relay_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="rbd-", dir="/tmp"))  # short: socket paths are bounded
    monkeypatch.setenv("HOME", str(home))
    _relay_state.register_box("hostile", BOX_ID, "docker", "local", channel="socket")
    yield home / ".agentbox/relay"
    shutil.rmtree(home)


def served(listener: socket.socket, box_dir: Path) -> bool:
    """A client in the box's directory reaches the listener."""
    listener.listen(1)
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect(str(box_dir / _relay_state.SOCKET_NAME))
        return True
    finally:
        client.close()
        listener.close()


def test_a_directory_tree_at_the_sockets_name_is_replaced_by_the_socket(relay_home: Path) -> None:
    box_dir = relay_home / "sock" / BOX_ID
    tree = box_dir / _relay_state.SOCKET_NAME / "deep/er"
    tree.mkdir(parents=True)
    (tree / "file").write_text("x")
    os.chmod(box_dir / _relay_state.SOCKET_NAME / "deep", 0o500)  # rmtree copes with what the box locked
    listener = _relay_state.bind_box_socket(BOX_ID)
    made = os.lstat(box_dir / _relay_state.SOCKET_NAME)
    assert stat.S_ISSOCK(made.st_mode) and stat.S_IMODE(made.st_mode) == 0o666
    assert served(listener, box_dir)
    assert sorted(os.listdir(relay_home / "sock")) == [BOX_ID]  # the staging name is gone


def test_a_symlink_at_the_sockets_name_is_replaced_and_never_followed(relay_home: Path, tmp_path: Path) -> None:
    victim = tmp_path / "host-file"
    victim.write_text("keep")
    victim.chmod(0o600)
    box_dir = relay_home / "sock" / BOX_ID
    (box_dir / _relay_state.SOCKET_NAME).symlink_to(victim)
    listener = _relay_state.bind_box_socket(BOX_ID)
    assert served(listener, box_dir)
    assert victim.read_text() == "keep" and stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_a_symlink_in_place_of_the_box_directory_is_refused(relay_home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    box_dir = relay_home / "sock" / BOX_ID
    box_dir.rmdir()
    box_dir.symlink_to(elsewhere)
    with pytest.raises(OSError):
        _relay_state.bind_box_socket(BOX_ID)
    assert os.listdir(elsewhere) == []
    # Forgetting the box removes the link itself, never what it points to.
    assert _relay_state.forget_box(BOX_ID) is None
    assert not os.path.lexists(box_dir) and elsewhere.is_dir()


def test_forgetting_a_box_removes_its_files_whatever_it_put_there(relay_home: Path) -> None:
    box_dir = relay_home / "sock" / BOX_ID
    (box_dir / _relay_state.SOCKET_NAME / "a/b").mkdir(parents=True)
    (box_dir / "other").symlink_to("/etc/passwd")
    (box_dir / "fifo").parent.mkdir(exist_ok=True)
    os.mkfifo(box_dir / "fifo")
    assert _relay_state.forget_box(BOX_ID) is None
    assert not os.path.lexists(box_dir)
    assert BOX_ID not in _relay_state.registered_boxes()
    assert os.path.exists("/etc/passwd")
    assert _relay_state.forget_box(BOX_ID) is None  # twice: nothing left, no error
    assert _relay_state.forget_box("../boxes") is not None  # never a path outside sock/
    assert (relay_home / "boxes").is_dir()
