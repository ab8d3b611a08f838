"""Unit tests of _boxd_state: the boxd status table, the one exec error that is retried, machine names."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.providers._snapshot_store import parse_snapshot_name
from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd import _boxd_state as st
from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd_store import BoxdCheckpoints

# The table in _boxd_state's docstring and docs/providers/boxd.md, row by row:
# status -> (box state, needs a start, ready for an exec without waiting).
TABLE = {
    "running": ("running", False, True),
    "starting": ("running", False, False),
    "creating": ("running", False, False),
    "booting": ("running", False, False),
    "pending": ("running", False, False),
    "scheduled": ("running", False, False),
    "migrating": ("running", False, False),  # moving between workers: waited for, never started
    "suspending": ("paused", False, False),
    "suspended": ("paused", False, True),
    "hibernating": ("paused", False, False),
    "hibernated": ("paused", False, True),
    "stopping": ("stopped", True, False),
    "stopped": ("stopped", True, False),
    "failed": ("stopped", True, False),
    "destroyed": ("missing", False, False),
    "destroying": ("missing", False, False),
    "deleted": ("missing", False, False),
}


@pytest.mark.parametrize("status", sorted(TABLE))
def test_every_status_of_the_table(status: str) -> None:
    state, start, ready = TABLE[status]
    for spelled in (status, status.upper(), status.capitalize()):  # the server's case is not ours to trust
        assert (st.box_state(spelled), st.needs_start(spelled), st.is_ready(spelled)) == (state, start, ready)


def test_the_table_covers_every_status_the_module_names() -> None:
    named = st.RUNNING | st.COMING_UP | st.ASLEEP | st.DOWN | st.GONE
    assert named == set(TABLE)
    assert st.READY <= named


def test_an_unknown_or_empty_status_reads_as_stopped_and_is_not_started_blindly() -> None:
    # A status added server-side later: the box shows as stopped (a start brings it back), but the
    # provider neither waits on it as ready nor sends a start on its own.
    for status in ("rebooting", "", None):
        assert st.box_state(status) == "stopped"  # type: ignore[arg-type]
        assert not st.is_ready(status)  # type: ignore[arg-type]
        assert not st.needs_start(status)  # type: ignore[arg-type]


def test_only_a_conflict_naming_a_stopped_machine_is_safe_to_retry() -> None:
    assert st.conflict_names_stopped("machine vm-0123 is stopped: start it first")
    assert st.conflict_names_stopped("FAILED_PRECONDITION: machine is Stopped")
    assert st.conflict_names_stopped("machine vm-1 is not running")
    assert st.conflict_names_stopped("Machine Not Running")
    for message in ("machine vm-1 is stopping", "a machine named 'x' already exists", "unstopped", "",
                    "exec failed: connection reset", "machine vm-1 is suspended", None):
        assert not st.conflict_names_stopped(message), message  # type: ignore[arg-type]


def test_a_plain_box_name_keeps_its_machine_name() -> None:
    assert st.machine_name("bx-1a2b3c") == "agentbox-bx-1a2b3c"
    assert st.machine_name("web", prefix="team-") == "team-web"
    assert st.MACHINE_NAME.fullmatch(st.machine_name("a"))


@pytest.mark.parametrize("box", ["Web", "my_box", "box.dev", "box-", "ünïcode", "x" * 80, "a b"])
def test_a_box_name_boxd_would_refuse_becomes_a_valid_distinct_machine_name(box: str) -> None:
    made = st.machine_name(box)
    assert st.MACHINE_NAME.fullmatch(made), made
    assert len(made) <= 63 and made.startswith("agentbox-")
    assert re.search(r"-[0-9a-f]{6}$", made)  # a short hash of the box name tells it apart
    assert made == st.machine_name(box)  # the same box, the same machine, in any process


def test_two_boxes_never_share_a_machine_name() -> None:
    boxes = ["Web", "web", "my_box", "my-box", "my.box", "x" * 80, "x" * 81, "box-", "box", "a b", "a-b"]
    names = [st.machine_name(b) for b in boxes]
    assert len(set(names)) == len(boxes), dict(zip(boxes, names, strict=True))


def test_a_checkpoint_snapshot_name_is_a_boxd_name_of_at_most_63_characters() -> None:
    store = BoxdCheckpoints(SimpleNamespace(settings=None))  # snapshot_name reads neither SDK nor settings
    project = "0123456789abcdef"
    made = store.snapshot_name(project, "warm-1")
    assert parse_snapshot_name(made) == (project, "warm-1")
    assert store.snapshot_name(project, "warm-1") != made  # a fresh nonce: a deleted name may linger on boxd
    for checkpoint in ("Warm Cache/Day 1 of a long checkpoint name", "x" * 200, "a" * 22 + "-b", "///", "Ü.ß"):
        made = store.snapshot_name(project, checkpoint)
        assert len(made) <= 63 and st.MACHINE_NAME.fullmatch(made), (checkpoint, made)
    # The checkpoint part is lowercased, cleaned, cut to 23 and never ends in '-'; nothing left reads 'ckpt'.
    longest = store.snapshot_name(project, "Warm Cache/Day 1 of a long checkpoint name")
    assert len(longest) == 63 and parse_snapshot_name(longest) == (project, "warm-cache-day-1-of-a-l")
    assert parse_snapshot_name(store.snapshot_name(project, "a" * 22 + "-b")) == (project, "a" * 22)
    assert parse_snapshot_name(store.snapshot_name(project, "///")) == (project, "ckpt")
