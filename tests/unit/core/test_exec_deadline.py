"""exec_deadline: one bound on every exec a workflow makes in a box (the fetch-back of destroy and stop),
nested bounds keep the earlier end, and an exec's own timeout still applies when it is shorter."""

from __future__ import annotations

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import exec_deadline, exec_time_left


def test_no_deadline_leaves_an_exec_its_own_timeout() -> None:
    assert exec_time_left() is None and exec_time_left(10.0) == 10.0
    with exec_deadline(None):
        assert exec_time_left() is None


def test_the_earliest_end_wins_and_the_bound_ends_with_its_block() -> None:
    with exec_deadline(100.0):
        assert 5.0 < (exec_time_left() or 0) <= 100.0
        assert exec_time_left(10.0) == 10.0  # the exec's own, shorter
        with exec_deadline(1000.0):  # an inner, later end does not lift the outer one
            assert (exec_time_left() or 0) <= 100.0
        with exec_deadline(5.0):
            assert (exec_time_left() or 0) <= 5.0
        assert (exec_time_left() or 0) > 5.0
    assert exec_time_left() is None
    with exec_deadline(-3.0):
        assert exec_time_left(30.0) == 0.0  # spent: the next exec is given no time
