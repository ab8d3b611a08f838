"""agentbox_idle and agentbox_reap run in-process on the fake provider standing in for the local engine: a bad
setting fails before any box is looked at; check mode reports what would be paused or stopped and changes
nothing (no box, no pause record); a second pass has nothing left to do."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from tests.conftest import make_repo
from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import run_module_inprocess


def boxes(fake: FakeProvider, tmp_path: Path, *names: str) -> Path:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    for name in names:
        _box.create_box(fake, _box.CreateRequest(name=name, workspace=str(repo), boot=False))
    return repo


def states(fake: FakeProvider) -> dict[str, str]:
    return {facts.name: facts.state for facts in fake.list_boxes()}


BAD_IDLE = [
    ({"max_running": -1}, "max_running must be a whole number of boxes, 0 or more, not -1"),
    ({"idle_minutes": -1}, "idle_minutes must be 0 or more, not -1.0"),
    ({"stop_after_hours": -2}, "stop_after_hours must be 0 or more, not -2.0"),
    ({"stalled_minutes": -0.5}, "stalled_minutes must be 0 or more, not -0.5"),
]


@pytest.mark.parametrize(("args", "message"), BAD_IDLE, ids=[next(iter(a)) for a, _m in BAD_IDLE])
def test_a_bad_idle_setting_fails_first_and_pauses_nothing(fake_docker: FakeProvider, tmp_path: Path, args: dict,
                                                           message: str) -> None:  # fmt: skip
    repo = boxes(fake_docker, tmp_path, "b1", "b2")
    state_file = tmp_path / "paused.json"
    base = {"workspace": str(repo), "max_running": 0, "idle_minutes": 0, "include_agentless": True,
            "state_file": str(state_file)}  # fmt: skip
    bad = run_module_inprocess("agentbox_idle", {**base, **args})
    assert bad["failed"] is True and bad["msg"] == message, bad
    assert states(fake_docker) == {"b1": "running", "b2": "running"} and not state_file.exists()


def test_idle_check_mode_plans_the_pauses_then_the_pass_makes_them_once(fake_docker: FakeProvider,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    repo = boxes(fake_docker, tmp_path, "b1", "b2")
    state_file = tmp_path / "idle" / "paused.json"
    now = float(int(time.time()))
    args = {"workspace": str(repo), "max_running": 0, "idle_minutes": 0, "include_agentless": True,
            "state_file": str(state_file), "now": now}  # fmt: skip

    kept = run_module_inprocess("agentbox_idle", {**args, "include_agentless": False})
    assert kept["changed"] is False and kept["paused"] == [], kept  # no agent: never paused unless asked
    assert {entry["action"] for entry in kept["boxes"]} == {"keep"}

    recorded = state_file.read_bytes() if state_file.exists() else None
    planned = run_module_inprocess("agentbox_idle", args, check_mode=True)
    assert planned["failed"] is False and planned["changed"] is True, planned
    assert sorted(planned["paused"]) == ["b1", "b2"] and planned["stopped"] == []
    assert all(entry["action"] == "pause" and entry["done"] is False for entry in planned["boxes"])
    assert states(fake_docker) == {"b1": "running", "b2": "running"}  # check mode paused nothing
    assert (state_file.read_bytes() if state_file.exists() else None) == recorded  # nor recorded a pause

    done = run_module_inprocess("agentbox_idle", args)
    assert done["changed"] is True and sorted(done["paused"]) == ["b1", "b2"], done
    assert states(fake_docker) == {"b1": "paused", "b2": "paused"}
    assert set(json.loads(state_file.read_text())) and all(entry["done"] for entry in done["boxes"])

    again = run_module_inprocess("agentbox_idle", args)
    assert again["changed"] is False and again["paused"] == [] and again["stopped"] == [], again

    later = {**args, "now": now + 13 * 3600}
    would_stop = run_module_inprocess("agentbox_idle", later, check_mode=True)
    assert would_stop["changed"] is True and sorted(would_stop["stopped"]) == ["b1", "b2"], would_stop
    assert states(fake_docker) == {"b1": "paused", "b2": "paused"}
    stopped = run_module_inprocess("agentbox_idle", later)
    assert stopped["changed"] is True and sorted(stopped["stopped"]) == ["b1", "b2"], stopped
    assert states(fake_docker) == {"b1": "stopped", "b2": "stopped"}


@pytest.mark.parametrize("key", ["idle_timeout", "default_idle_timeout"])
@pytest.mark.parametrize("value", [0, -5])
def test_a_reap_timeout_that_is_not_positive_is_refused(fake_docker: FakeProvider, tmp_path: Path, key: str,
                                                        value: float) -> None:  # fmt: skip
    repo = boxes(fake_docker, tmp_path, "b1")
    bad = run_module_inprocess("agentbox_reap", {"workspace": str(repo), key: value})
    assert bad["failed"] is True and bad["msg"] == f"{key} must be a positive number of minutes, not {float(value)}"
    assert states(fake_docker) == {"b1": "running"}


def test_reap_of_a_box_that_is_not_there_says_so(fake_docker: FakeProvider) -> None:
    missing = run_module_inprocess("agentbox_reap", {"name": "nobox", "idle_timeout": 1})
    assert missing["failed"] is True and missing["msg"] == f"no box called 'nobox' on engine {fake_docker.engine}"
    invalid = run_module_inprocess("agentbox_reap", {"name": "Bad Name", "idle_timeout": 1})
    assert invalid["failed"] is True and "invalid box name" in invalid["msg"], invalid


def test_reap_check_mode_pauses_nothing_then_the_idle_box_only_once(fake_docker: FakeProvider,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    """The integration test_reap_local.py's plan on the fake: an agent heartbeat an hour old and nothing
    under /workspace changed since is idle; a box with no idle signal is kept."""
    repo = boxes(fake_docker, tmp_path, "idle", "quiet")
    hour_ago = int(time.time()) - 3600
    heartbeat = fake_docker.exec("idle", ["sh", "-c", f"mkdir -p ~/.agentbox && touch -d @{hour_ago} ~/.agentbox/last-activity"])
    aged = fake_docker.exec("idle", ["sh", "-c", f"find /workspace/ -exec touch -h -d @{hour_ago} {{}} +"], user="root")
    assert heartbeat.rc == 0 and aged.rc == 0, (heartbeat, aged)
    args = {"workspace": str(repo), "idle_timeout": 1}

    planned = run_module_inprocess("agentbox_reap", args, check_mode=True)
    assert planned["failed"] is False and planned["changed"] is True, planned
    assert {entry["name"]: entry["action"] for entry in planned["boxes"]} == {"idle": "would_pause", "quiet": "kept"}
    assert planned["paused"] == ["idle"] and planned["box"] == {}
    assert states(fake_docker) == {"idle": "running", "quiet": "running"}

    done = run_module_inprocess("agentbox_reap", args)
    by_name = {entry["name"]: entry for entry in done["boxes"]}
    assert done["changed"] is True and by_name["idle"]["action"] == "paused", done
    assert by_name["quiet"]["action"] == "kept" and "no idle signal" in by_name["quiet"]["reason"]
    assert by_name["idle"]["idle_seconds"] >= 3600 and by_name["idle"]["idle_timeout"] == 1
    assert states(fake_docker) == {"idle": "paused", "quiet": "running"}

    again = run_module_inprocess("agentbox_reap", args)
    assert again["changed"] is False and again["paused"] == [], again
    one = run_module_inprocess("agentbox_reap", {"name": "idle", "idle_timeout": 1})
    assert one["changed"] is False and one["box"]["state"] == "paused", one  # `box`: the named box after the task
