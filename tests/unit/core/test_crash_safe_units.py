"""Pure parts of crash-safe create and checkpoint env: name rules, which env a checkpoint keeps,
the journal's lock between two holders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core import _journal, _naming
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _ckpt_env


@pytest.mark.parametrize("name", ["fix\n", "fix.lock", "a..b", "fix.", "Fix", "-x", "", "x" * 64])
def test_names_git_or_docker_refuse_are_refused(name: str) -> None:
    with pytest.raises(_naming.NameError_):
        _naming.validate_box_name(name)


@pytest.mark.parametrize("name", ["fix", "fix.lock2", "a.b", "f-1_2.x", "x" * 63])
def test_good_names_pass(name: str) -> None:
    assert _naming.validate_box_name(name) == name


def test_a_generated_name_from_a_dotted_directory_is_a_valid_branch() -> None:
    assert _naming.default_box_name("/src/my..repo.", "ab12cd34") == "my.repo-ab12cd34"


def test_a_checkpoint_keeps_only_the_image_s_own_env() -> None:
    container = ["PATH=/box/bin", "LANG=C.UTF-8", "MY_API_KEY=sk-1", "AGENTBOX_BOX_NAME=b"]
    own = ["PATH=/usr/bin", "LANG=C.UTF-8"]
    assert _ckpt_env.image_env(container, own, blank_added=False) == ["PATH=/usr/bin", "LANG=C.UTF-8"]
    assert _ckpt_env.image_env(container, own, blank_added=True) == [
        "PATH=/usr/bin", "LANG=C.UTF-8", "MY_API_KEY=", "AGENTBOX_BOX_NAME="]


def test_the_journal_lock_stops_a_second_holder_and_dies_with_its_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    first = _journal.Journal("docker", "local", "b1")
    assert first.claim() is None
    first.write(box="b1", box_id="1234", stage="reserved")
    # Another process (the lock is per open file, so a second process is the honest test).
    probe = (
        "import sys; from ansible_collections.agentbox.box.plugins.module_utils.core import _journal\n"
        "try:\n    _journal.Journal('docker', 'local', 'b1').claim()\nexcept _journal.CreateInProgress as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / ".collections")}
    busy = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
    assert busy.returncode == 3 and f"pid {os.getpid()}" in busy.stdout, busy.stderr
    first.release()
    # Released without forget(): the record is what a dead run leaves, and the next claim gets it.
    second = _journal.Journal("docker", "local", "b1")
    assert second.claim() == {"box": "b1", "box_id": "1234", "stage": "reserved", "pid": os.getpid()}
    second.forget()
    second.release()
    assert _journal.Journal("docker", "local", "b1").claim() is None
