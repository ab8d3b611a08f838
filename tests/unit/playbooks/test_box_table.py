"""The box_table filter, applied by Ansible's own templating in-process: every column, alignment, and the empty table."""

from __future__ import annotations

from pathlib import Path

from tests.unit.support.templating import render

NOW = 1_800_000_000  # a fixed clock: ages are exact


def table(boxes: list[dict], tmp_path: Path) -> str:
    return str(render(f"{{{{ boxes | agentbox.box.box_table(now={NOW}) }}}}", {"boxes": boxes}))


def created(seconds_ago: int) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - seconds_ago))


def test_every_column_aligned(tmp_path: Path) -> None:
    boxes = [
        {"name": "alpha", "state": "running", "provider": "docker", "engine": "local", "branch": "agentbox/alpha",
         "workspace": "/src/app", "ports": {"80": 49153, "6080": 49154}, "created": created(42),
         "agent": {"name": "claude", "session": "claude", "state": "working", "since": "2026-11-30T10:00:00Z"}},
        {"name": "b", "state": "paused", "provider": "docker_ssh", "engine": "builder1", "branch": "",
         "workspace": "", "ports": {}, "created": created(3 * 3600 + 5)},
        {"name": "c-long-name", "state": "stopped", "provider": "daytona", "engine": "",
         "branch": "agentbox/c-long-name", "workspace": "/src/other", "created": created(2 * 86400)},
        {"name": "d", "state": "running", "provider": "docker", "created": "not a date"},
    ]  # fmt: skip
    lines = table(boxes, tmp_path).splitlines()
    assert lines[0].split() == ["BOX", "STATE", "PROVIDER", "BRANCH", "WORKSPACE", "PORTS", "AGE", "AGENT"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["alpha"] == ["alpha", "running", "docker", "agentbox/alpha", "/src/app",
                             "127.0.0.1:49153->80,127.0.0.1:49154->6080", "42s", "claude:working"]  # fmt: skip
    assert rows["b"] == ["b", "paused", "docker_ssh@builder1", "-", "-", "-", "3h", "-"]
    assert rows["c-long-name"] == ["c-long-name", "stopped", "daytona", "agentbox/c-long-name", "/src/other", "-", "2d",
                                   "-"]  # fmt: skip
    assert rows["d"] == ["d", "running", "docker", "-", "-", "-", "?", "-"]
    # Aligned: each column starts at the same offset on every line.
    for column in ("STATE", "PROVIDER", "BRANCH", "WORKSPACE", "PORTS", "AGE", "AGENT"):
        offset = lines[0].index(column)
        for line in lines[1:]:
            assert line[offset - 2 : offset] == "  " and line[offset] != " ", (column, line)
    assert all(line == line.rstrip() for line in lines)


def test_no_boxes_says_so_under_the_header(tmp_path: Path) -> None:
    assert table([], tmp_path).splitlines() == ["BOX  STATE  PROVIDER  BRANCH  WORKSPACE  PORTS  AGE  AGENT", "(no boxes)"]


def test_an_unisolated_box_is_marked_so() -> None:
    from ansible_collections.agentbox.box.plugins.filter.box_table import box_table

    boxes = [
        {"name": "old", "state": "running", "provider": "docker", "engine": "local", "labels": {"isolation": "none"}},
        {"name": "new", "state": "running", "provider": "docker", "engine": "local", "labels": {"isolation": "userns"}},
    ]
    lines = box_table(boxes, now=NOW).splitlines()
    assert "docker (unisolated)" in lines[1] and lines[1].startswith("old")
    assert "unisolated" not in lines[2] and lines[2].startswith("new")
