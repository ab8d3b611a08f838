"""agentbox_agent run in-process on the fake provider standing in for the local engine: bad input is refused
before the box is touched; check mode on a paused box reports the resume it would make and makes none."""

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
    _box.create_box(fake_docker, _box.CreateRequest(name="ag", workspace=str(repo), boot=False))
    fake_docker.pause("ag")
    return "ag"


BAD = [
    ({"agent": "aider"}, "unknown agent 'aider': use one of"),
    ({"agent": "mine", "command": "  "}, "'command' is empty"),
    ({"agent": "my agent", "command": "./run"}, "agent name 'my agent' must be 1-63 characters"),
    ({"session": "no spaces please"}, "session name 'no spaces please' must match"),
    ({"transcript": -1}, "transcript (a number of lines) and stalled_minutes must be 0 or more"),
    ({"stalled_minutes": -1}, "transcript (a number of lines) and stalled_minutes must be 0 or more"),
    ({"box": "Bad Box"}, "invalid box name"),
    ({"box": "nobox"}, "no box called 'nobox'"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[message[:30] for _a, message in BAD])
def test_bad_agent_input_is_refused_before_the_box_is_touched(fake_docker: FakeProvider, box: str, args: dict,
                                                              message: str) -> None:  # fmt: skip
    result = run_module_inprocess("agentbox_agent", {"box": box, **args})
    assert result["failed"] is True and message in result["msg"], result
    assert fake_docker.find(box).state == "paused"  # not resumed


def test_check_mode_on_a_paused_box_reports_the_resume_and_makes_none(fake_docker: FakeProvider, box: str) -> None:
    planned = run_module_inprocess("agentbox_agent", {"box": box}, check_mode=True)
    assert planned["failed"] is False and planned["changed"] is True, planned
    assert planned["box"]["state"] == "running" and planned["box"]["agent"] is None
    assert planned["session"] == "claude" and planned["attach"]
    assert fake_docker.find(box).state == "paused"
    # Stopping or asking about the agent of a paused box changes nothing: no agent runs there.
    for state in ("stopped", "query"):
        result = run_module_inprocess("agentbox_agent", {"box": box, "state": state})
        assert result["failed"] is False and result["changed"] is False, result
        assert result["box"]["state"] == "paused" and result["box"]["agent"] is None
    assert fake_docker.find(box).state == "paused"


def test_check_mode_without_credentials_warns_where_it_looked_and_starts_nothing(fake_docker: FakeProvider, box: str,
                                                                                 home: Path) -> None:  # fmt: skip
    fake_docker.resume(box)
    planned = run_module_inprocess("agentbox_agent", {"box": box}, check_mode=True)
    assert planned["failed"] is False and planned["changed"] is True and planned["credentials"] == [], planned
    [warning] = planned["warnings"]
    assert "no credentials for claude found" in warning and f"{home}/.claude/.credentials.json" in warning
    assert "environment ANTHROPIC_*/CLAUDE_CODE_*" in warning and "playbooks/agent_login.yml" in warning
    assert planned["box"]["agent"] is None  # nothing started
    # A task's warnings are its own: the next run starts with none.
    assert run_module_inprocess("agentbox_agent", {"box": box, "state": "query"})["warnings"] == []
