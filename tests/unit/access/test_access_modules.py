"""agentbox_forward and agentbox_access run in-process on the fake provider standing in for the local engine:
bad ports, lifetimes and names are refused before any box is looked at; a box that is not there or not
running is refused with what to do, and nothing wakes it unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from tests.conftest import make_repo
from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import run_module_inprocess


@pytest.fixture
def box(fake_docker: FakeProvider, home: Path, tmp_path: Path) -> str:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    _box.create_box(fake_docker, _box.CreateRequest(name="fw", workspace=str(repo), boot=False))
    fake_docker.pause("fw")
    return "fw"


BAD_FORWARDS = [
    ({"port": 0}, "port must be 1-65535 and local_port 0-65535"),
    ({"port": 70000}, "port must be 1-65535 and local_port 0-65535"),
    ({"local_port": -1}, "port must be 1-65535 and local_port 0-65535"),
    ({"ttl": 0}, "ttl must be 1-86400 seconds"),
    ({"ttl": 86401}, "ttl must be 1-86400 seconds"),
    ({"name": "Bad Box"}, "invalid box name"),
    ({"name": "nobox"}, "no box called 'nobox'"),
    ({}, "box 'fw' is paused: start it (playbooks/box_state.yml -e state=started)"),
]


@pytest.mark.parametrize(("args", "message"), BAD_FORWARDS, ids=[m[:30] for _a, m in BAD_FORWARDS])
@pytest.mark.parametrize("check_mode", [False, True])
def test_a_forward_of_bad_input_is_refused(fake_docker: FakeProvider, box: str, args: dict, message: str,
                                           check_mode: bool) -> None:  # fmt: skip
    result = run_module_inprocess("agentbox_forward", {"name": box, **args}, check_mode=check_mode)
    assert result["failed"] is True and message in result["msg"], result
    assert fake_docker.find(box).state == "paused"


def test_access_to_a_box_that_is_not_there_or_asleep_without_wake_is_refused(fake_docker: FakeProvider,
                                                                             box: str) -> None:  # fmt: skip
    missing = run_module_inprocess("agentbox_access", {"name": "nobox"}, check_mode=True)
    assert missing["failed"] is True and "no box called 'nobox'" in missing["msg"], missing
    assert "playbooks/create_box.yml -e box=nobox" in missing["msg"]
    invalid = run_module_inprocess("agentbox_access", {"name": "Bad Box"})
    assert invalid["failed"] is True and "invalid box name" in invalid["msg"], invalid
    asleep = run_module_inprocess("agentbox_access", {"name": box, "wake": False})
    assert asleep["failed"] is True and asleep["msg"] == f"box {box!r} is paused: start it (playbooks/box_state.yml -e state=started)"
    assert fake_docker.find(box).state == "paused"
