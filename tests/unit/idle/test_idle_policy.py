"""The idle policy as pure functions: a plan from box facts, agent states, the paused-since record and an
injected `now` (no clock, no engine)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.idle import _idle

NOW = 1_800_000_000.0


def iso(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - seconds_ago))


def box(name: str, state: str = "running") -> dict[str, Any]:
    return {"name": name, "id": f"id-{name}", "provider": "docker", "engine": "local", "state": state}


def agent(state: str, seconds_ago: float = 0) -> dict[str, Any]:
    return {"name": "claude", "session": "claude", "state": state, "since": iso(seconds_ago)}


FLEET = [box("a-working"), box("b-waiting"), box("c-idle2"), box("d-idle10"), box("e-none")]
AGENTS = {"a-working": agent("working", 3600), "b-waiting": agent("waiting", 3600),
          "c-idle2": agent("idle", 120), "d-idle10": agent("idle", 600), "e-none": None}  # fmt: skip


def actions(decisions: list[dict[str, Any]]) -> dict[str, str]:
    return {entry["name"]: entry["action"] for entry in decisions}


def test_cap_two_pauses_only_the_idle_ones_longest_first() -> None:
    settings = {"max_running": 2, "idle_minutes": 1}
    decisions = _idle.plan(FLEET, AGENTS, {}, NOW, settings)
    assert actions(decisions) == {"a-working": "keep", "b-waiting": "keep", "c-idle2": "pause",
                                  "d-idle10": "pause", "e-none": "keep"}  # fmt: skip
    by_name = {entry["name"]: entry for entry in decisions}
    assert by_name["d-idle10"]["idle_seconds"] == 600 and by_name["c-idle2"]["idle_seconds"] == 120
    assert "working" in by_name["a-working"]["reason"] and "include_agentless" in by_name["e-none"]["reason"]


def test_longest_idle_goes_first_when_one_pause_is_enough() -> None:
    decisions = _idle.plan(FLEET, AGENTS, {}, NOW, {"max_running": 4, "idle_minutes": 1})
    assert [e["name"] for e in decisions if e["action"] == "pause"] == ["d-idle10"]


def test_idle_minutes_protects_a_recently_idle_agent() -> None:
    decisions = _idle.plan(FLEET, AGENTS, {}, NOW, {"max_running": 0, "idle_minutes": 5})
    assert actions(decisions)["c-idle2"] == "keep" and actions(decisions)["d-idle10"] == "pause"
    assert "less than idle_minutes" in next(e for e in decisions if e["name"] == "c-idle2")["reason"]


def test_within_the_cap_nothing_is_paused() -> None:
    decisions = _idle.plan(FLEET, AGENTS, {}, NOW, {"max_running": 5, "idle_minutes": 0})
    assert set(actions(decisions).values()) == {"keep"}


def test_agentless_only_with_include_agentless_and_after_the_idle_ones() -> None:
    settings = {"max_running": 2, "idle_minutes": 1, "include_agentless": True}
    decisions = _idle.plan([*FLEET, box("f-stopped-agent")], {**AGENTS, "f-stopped-agent": agent("stopped", 9999)},
                           {}, NOW, settings)  # fmt: skip
    # Six running, cap two: four pauses; the two idle ones first, then the agentless ones.
    assert actions(decisions) == {"a-working": "keep", "b-waiting": "keep", "c-idle2": "pause", "d-idle10": "pause",
                                  "e-none": "pause", "f-stopped-agent": "pause"}  # fmt: skip
    capped = _idle.plan([*FLEET], AGENTS, {}, NOW, {**settings, "max_running": 4})
    assert [e["name"] for e in capped if e["action"] == "pause"] == ["d-idle10"]


def test_max_running_counts_each_project_apart_unless_scope_all() -> None:
    # Two projects, two idle boxes each, one relay for both: a cap of 2 leaves each project alone, as one
    # project's boxes must not pause another's. scope all is the one cap over every box of the pass.
    fleet = [{**box(name), "project": project} for name, project in
             (("a1", "aaaa"), ("a2", "aaaa"), ("b1", "bbbb"), ("b2", "bbbb"))]  # fmt: skip
    agents = {"a1": agent("idle", 600), "a2": agent("idle", 300), "b1": agent("idle", 900), "b2": agent("idle", 120)}
    per_project = _idle.plan(fleet, agents, {}, NOW, {"max_running": 2, "idle_minutes": 1})
    assert actions(per_project) == {"a1": "keep", "a2": "keep", "b1": "keep", "b2": "keep"}
    assert "2 running in project aaaa is within max_running" in per_project[0]["reason"]
    one_each = _idle.plan(fleet, agents, {}, NOW, {"max_running": 1, "idle_minutes": 1})
    assert actions(one_each) == {"a1": "pause", "a2": "keep", "b1": "pause", "b2": "keep"}
    assert "2 running in project bbbb, more than max_running (1)" in one_each[2]["reason"]
    together = _idle.plan(fleet, agents, {}, NOW, {"max_running": 2, "idle_minutes": 1, "scope": "all"})
    assert actions(together) == {"a1": "pause", "a2": "keep", "b1": "pause", "b2": "keep"}
    with pytest.raises(ValueError, match="scope must be one of project, all"):
        _idle.validate({"scope": "engine"})


def test_paused_boxes_stop_after_hours_by_the_record() -> None:
    boxes = [box("old", "paused"), box("young", "paused"), box("unknown", "paused"), box("off", "stopped")]
    record = {_idle.record_key(boxes[0]): NOW - 13 * 3600, _idle.record_key(boxes[1]): NOW - 3600}
    decisions = _idle.plan(boxes, {}, record, NOW, {"stop_after_hours": 12})
    assert actions(decisions) == {"old": "stop", "young": "keep", "unknown": "keep", "off": "keep"}
    assert next(e for e in decisions if e["name"] == "old")["paused_seconds"] == 13 * 3600


def test_paused_boxes_do_not_count_against_the_cap() -> None:
    decisions = _idle.plan([*FLEET[:3], box("z", "paused")], AGENTS, {}, NOW, {"max_running": 3, "idle_minutes": 0})
    assert set(actions(decisions).values()) == {"keep"}


def test_an_idle_state_without_since_is_never_paused() -> None:
    decisions = _idle.plan([box("x")], {"x": {"state": "idle", "since": None}}, {}, NOW, {"max_running": 0})
    assert actions(decisions) == {"x": "keep"} and "unknown time" in decisions[0]["reason"]


@pytest.mark.parametrize("bad", [{"max_running": -1}, {"idle_minutes": "soon"}, {"stop_after_hours": -2},
                                 {"stalled_minutes": "never"}])
def test_bad_settings_say_what_to_do(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        _idle.validate(bad)


def test_record_first_seen_paused_and_forgotten_when_running_or_gone(tmp_path: Path) -> None:
    paused, running = box("p", "paused"), box("r")
    gone_key = "docker|local|gone|id-gone"
    other_engine = "docker_ssh|me@remote|q|id-q"
    record = _idle.refresh_record([paused, running], {gone_key: 1.0, other_engine: 2.0,
                                                      _idle.record_key(running): 3.0}, NOW, {"docker|local|"})  # fmt: skip
    assert record == {_idle.record_key(paused): NOW, other_engine: 2.0}
    again = _idle.refresh_record([paused], record, NOW + 60)
    assert again[_idle.record_key(paused)] == NOW  # the first time seen paused stays
    state_file = str(tmp_path / "idle" / "paused.json")
    _idle.save_record(state_file, again)
    assert _idle.load_record(state_file) == again
    assert oct((tmp_path / "idle" / "paused.json").stat().st_mode & 0o777) == "0o600"


def test_relay_policy_file_defaults_switch_and_bad_values(tmp_path: Path) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_idle

    path = tmp_path / "policy.json"
    default = _relay_idle.load_policy(str(path), environ={})
    assert default["enabled"] and default["interval"] == 30 and default["settings"]["max_running"] == 5
    path.write_text('{"enabled": false, "max_running": 2}')
    off = _relay_idle.load_policy(str(path), environ={})
    assert not off["enabled"] and off["settings"]["max_running"] == 2 and off["problem"] is None
    path.write_text('{"max_running": 3}')
    assert not _relay_idle.load_policy(str(path), environ={"AGENTBOX_IDLE_INTERVAL": "0"})["enabled"]
    assert _relay_idle.load_policy(str(path), environ={"AGENTBOX_IDLE_INTERVAL": "7"})["interval"] == 7
    path.write_text('{"max_running": -4}')
    bad = _relay_idle.load_policy(str(path), environ={})
    assert not bad["enabled"] and "max_running must be" in bad["problem"]
    path.write_text("not json")
    broken = _relay_idle.load_policy(str(path), environ={})
    assert broken["problem"] and broken["enabled"]  # the defaults apply; the relay logs the problem


def test_relay_reaches_each_engine_once() -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_idle

    registrations = {"1": {"provider": "docker", "engine": "local", "name": "a"},
                     "2": {"provider": "docker", "engine": "local", "name": "b"},
                     "3": {"provider": "daytona", "engine": "http://127.0.0.1:1", "name": "c"}}  # fmt: skip
    assert [r["name"] for r in _relay_idle.engines_of(registrations)] == ["c", "a"]


def test_terminal_input_ssh_and_web_activity_keep_a_box_running() -> None:
    settings = {"max_running": 0, "idle_minutes": 5, "include_agentless": True}
    boxes = [box("typed"), box("ssh"), box("web"), box("stale"), box("none-typed"), box("none-stale")]
    agents = {name: agent("idle", 3600) for name in ("typed", "ssh", "web", "stale")}
    activity = {"typed": {"input": NOW - 60, "ssh": 0, "web": 0}, "ssh": {"input": None, "ssh": 1, "web": 0},
                "web": {"input": None, "ssh": 0, "web": 2}, "stale": {"input": NOW - 1800, "ssh": 0, "web": 0},
                "none-typed": {"input": NOW - 30, "ssh": 0, "web": 0},
                "none-stale": {"input": NOW - 7200, "ssh": 0, "web": 0}}  # fmt: skip
    decisions = _idle.plan(boxes, agents, {}, NOW, settings, activity)
    by_name = {entry["name"]: entry for entry in decisions}
    assert actions(decisions) == {"typed": "keep", "ssh": "keep", "web": "keep", "stale": "pause",
                                  "none-typed": "keep", "none-stale": "pause"}  # fmt: skip
    assert by_name["typed"]["idle_seconds"] == 60 and "terminal input" in by_name["typed"]["reason"]
    assert by_name["stale"]["idle_seconds"] == 1800  # the later of the agent's since and the input
    assert "ssh session" in by_name["ssh"]["reason"] and "web port" in by_name["web"]["reason"]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["agentbox-activity 1799999000 2 1"], {"input": 1_799_999_000.0, "ssh": 2, "web": 1}),
        (["agentbox-activity 0 0 0"], {"input": None, "ssh": 0, "web": 0}),
        (["agentbox-activity 99999999999 0 0"], {"input": NOW, "ssh": 0, "web": 0}),  # never in the future
        (["agentbox-activity -5 0 0"], None),
        (["agentbox-activity 1 2 3 4"], None),
        (["agentbox-activity 1 9999999 0"], None),
        (["agentbox-activity 1 0 0", "junk"], None),  # only the script's own last line counts
        ([], None),
    ],
)
def test_the_box_activity_line_is_checked(lines: list[str], expected: dict[str, Any] | None) -> None:
    assert _idle.parse_activity(lines, NOW) == expected


def test_a_box_with_a_relay_request_in_flight_is_kept() -> None:
    activity = {"d-idle10": {"input": None, "ssh": 0, "web": 0, "requests": 1}}
    decisions = _idle.plan(FLEET, AGENTS, {}, NOW, {"max_running": 0, "idle_minutes": 1}, activity)
    by_name = {entry["name"]: entry for entry in decisions}
    assert by_name["d-idle10"]["action"] == "keep" and "relay" in by_name["d-idle10"]["reason"]
    assert by_name["c-idle2"]["action"] == "pause"


def test_an_ephemeral_box_is_left_to_the_engine_and_not_counted() -> None:
    # The longest-idle box is ephemeral (its engine deletes it as it stops): never paused, and not counted
    # toward max_running, so the cap of 1 pauses nothing else either (c-idle2 alone runs besides it).
    fleet = [{**box("d-idle10"), "ephemeral": True}, box("c-idle2")]
    decisions = _idle.plan(fleet, AGENTS, {}, NOW, {"max_running": 1, "idle_minutes": 1})
    assert actions(decisions) == {"c-idle2": "keep", "d-idle10": "keep"}
    assert "ephemeral" in next(e for e in decisions if e["name"] == "d-idle10")["reason"]


def test_a_stalled_agent_is_idle_since_its_last_progress() -> None:
    """An agent looping on a connection error reports `working` forever: judged stalled, it is paused like an idle one."""
    from ansible_collections.agentbox.box.plugins.module_utils.agent import _agent

    looping = {**agent("working", 7200), "quiet_seconds": 1800}
    fresh = {**agent("working", 7200), "quiet_seconds": 60}
    settings = _idle.validate({"max_running": 0, "idle_minutes": 5, "stalled_minutes": 20})
    agents = {name: _agent.judged(found, settings["stalled_minutes"], NOW)
              for name, found in (("looping", looping), ("busy", fresh))}  # fmt: skip
    decisions = {e["name"]: e for e in _idle.plan([box("looping"), box("busy")], agents, {}, NOW, settings)}
    assert decisions["looping"]["action"] == "pause" and decisions["looping"]["agent_state"] == "stalled"
    assert decisions["looping"]["idle_seconds"] == 1800 and decisions["looping"]["reason"].startswith("stalled 30.0 min")
    assert decisions["busy"]["action"] == "keep" and decisions["busy"]["reason"] == "its agent is working"
    # With the default (10 minutes) 30 minutes without progress stalls too; with an hour it is still working.
    assert _agent.judged(looping, _idle.validate({})["stalled_minutes"], NOW)["state"] == "stalled"
    assert _agent.judged(looping, 60, NOW)["state"] == "working"
