"""agentbox_worktree run in-process on the fake provider standing in for the local engine: a box that is not
there or not running is refused with what to do; state: present seeds a box made empty, in check mode only
reports it, and a second run has nothing to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.git import _seed
from tests.conftest import make_repo
from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import run_module_inprocess


@pytest.fixture
def empty_box(fake_docker: FakeProvider, home: Path, tmp_path: Path) -> str:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    _box.create_box(fake_docker, _box.CreateRequest(name="empty", workspace=str(repo), boot=False, seed=False))
    return "empty"


def test_a_box_that_is_not_there_or_not_running_is_refused(fake_docker: FakeProvider, empty_box: str) -> None:
    missing = run_module_inprocess("agentbox_worktree", {"box": "nobox"})
    assert missing["failed"] is True and "no box called 'nobox'" in missing["msg"], missing
    assert "create it with agentbox_box first" in missing["msg"]
    invalid = run_module_inprocess("agentbox_worktree", {"box": "Bad Box"})
    assert invalid["failed"] is True and "invalid box name" in invalid["msg"], invalid
    fake_docker.pause(empty_box)
    paused = run_module_inprocess("agentbox_worktree", {"box": empty_box})
    assert paused["failed"] is True and paused["msg"] == f"box {empty_box!r} is paused: start it first (agentbox_box state=started)"
    fake_docker.resume(empty_box)
    assert _seed.read_seed_record(fake_docker, empty_box) is None


def test_seeding_an_empty_box_check_mode_then_once(fake_docker: FakeProvider, empty_box: str) -> None:
    planned = run_module_inprocess("agentbox_worktree", {"box": empty_box}, check_mode=True)
    assert planned["failed"] is False and planned["changed"] is True and planned["seed"] == {}, planned
    assert planned["box"]["name"] == empty_box
    assert _seed.read_seed_record(fake_docker, empty_box) is None  # check mode seeded nothing

    seeded = run_module_inprocess("agentbox_worktree", {"box": empty_box})
    assert seeded["failed"] is False and seeded["changed"] is True and seeded["seed"], seeded
    assert _seed.read_seed_record(fake_docker, empty_box) is not None

    again = run_module_inprocess("agentbox_worktree", {"box": empty_box})
    assert again["changed"] is False, again
    checked = run_module_inprocess("agentbox_worktree", {"box": empty_box}, check_mode=True)
    assert checked["changed"] is False and checked["seed"], checked
