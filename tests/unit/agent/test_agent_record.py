"""The relay's record of agent states (~/.agentbox/relay/agents.json): written whole, read in one go, aged out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.agent import _agent_record


def entry(name: str, read: float, state: str | None = "idle") -> dict:
    agent = {"name": "claude", "session": "claude", "state": state, "since": None, "quiet_seconds": 3} if state else None
    return {"name": name, "provider": "docker", "engine": "local", "read": read, "agent": agent}


def test_written_private_and_whole_then_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    now = time.time()
    _agent_record.write({"a1": entry("a", now), "b2": entry("b", now, None)}, 30, now)
    path = tmp_path / ".agentbox" / "relay" / "agents.json"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["agents.json"]  # no temporary file left
    found = _agent_record.fresh(now + 10)
    assert found["a1"]["agent"]["state"] == "idle" and found["b2"]["agent"] is None
    assert found["a1"]["read"] == now


def test_reads_older_than_three_passes_are_left_out(tmp_path: Path) -> None:
    path = str(tmp_path / "agents.json")
    now = 1_800_000_000.0
    _agent_record.write({"old": entry("old", now - 91), "new": entry("new", now - 89), "future": entry("f", now + 60)},
                        30, now, path)  # fmt: skip
    assert set(_agent_record.fresh(now, path)) == {"new"}
    # Slow passes (300 s): three of them.
    _agent_record.write({"old": entry("old", now - 800)}, 300, now, path)
    assert set(_agent_record.fresh(now, path)) == {"old"}
    assert _agent_record.fresh(now + 1000, path) == {}


def test_a_missing_or_broken_record_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "agents.json"
    assert _agent_record.fresh(path=str(path)) == {}
    for text in ("not json", "[]", json.dumps({"version": 99, "boxes": {}}), json.dumps({"version": 1, "boxes": []})):
        path.write_text(text)
        assert _agent_record.fresh(path=str(path)) == {}, text
    now = time.time()
    path.write_text(json.dumps({"version": 1, "interval": "x", "boxes": {
        "ok": entry("ok", now), "no-read": {"name": "n", "agent": None}, "bad-agent": {**entry("b", now), "agent": 5},
        "list": [1]}}))  # fmt: skip
    assert set(_agent_record.fresh(now, str(path))) == {"ok"}


def test_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_agent_record, "MAX_BOXES", 3)
    path = str(tmp_path / "agents.json")
    now = time.time()
    _agent_record.write({f"id{i}": entry(f"b{i}", now - i) for i in range(6)}, 30, now, path)
    assert set(_agent_record.fresh(now, path)) == {"id0", "id1", "id2"}  # the latest reads kept


def test_a_record_past_its_size_cap_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "agents.json")
    now = time.time()
    _agent_record.write({f"id{i}": entry(f"b{i}", now) for i in range(20)}, 30, now, path)
    assert len(_agent_record.fresh(now, path)) == 20
    monkeypatch.setattr(_agent_record, "MAX_BYTES", 1000)
    assert _agent_record.fresh(now, path) == {} and _agent_record.load(path) == {}
