"""exec_exit_code: the engine may record an exec's exit a moment after its output stream ends;
pause_patiently: runc may fail to freeze a busy container once and succeed a moment later."""

from __future__ import annotations

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._engine_api import (
    EngineAPIError,
    exec_exit_code,
    pause_patiently,
)


class Answers:
    """An inspect that gives each state in turn (the last one for ever), counting the calls."""

    def __init__(self, *states: dict) -> None:
        self.states, self.calls = states, 0

    def __call__(self) -> dict:
        self.calls += 1
        return self.states[min(self.calls, len(self.states)) - 1]


def test_waits_for_the_exit_the_engine_records_late() -> None:
    inspect = Answers(
        {"Running": True, "ExitCode": None}, {"Running": True, "ExitCode": 0}, {"Running": False, "ExitCode": 3}
    )
    assert exec_exit_code(inspect) == 3
    assert inspect.calls == 3


def test_a_recorded_exit_is_taken_at_once() -> None:
    inspect = Answers({"Running": False, "ExitCode": 0})
    assert exec_exit_code(inspect) == 0
    assert inspect.calls == 1


def test_an_exit_never_recorded_is_minus_one_after_the_deadline() -> None:
    assert exec_exit_code(Answers({"Running": True, "ExitCode": None}), deadline_seconds=0.1) == -1


class Pauses:
    """A pause that fails with each given error in turn, then succeeds."""

    def __init__(self, *errors: EngineAPIError) -> None:
        self.errors, self.calls = list(errors), []

    def __call__(self, container: str) -> None:
        self.calls.append(container)
        if self.errors:
            raise self.errors.pop(0)


FREEZE = EngineAPIError(500, "Cannot pause container c1: OCI runtime pause failed: unable to freeze: unknown")


def test_a_pause_runc_could_not_freeze_is_tried_again() -> None:
    pause = Pauses(FREEZE, FREEZE)
    pause_patiently(pause, "c1", delays=(0, 0, 0))
    assert pause.calls == ["c1", "c1", "c1"]


def test_a_pause_that_never_freezes_fails_with_the_engines_message() -> None:
    pause = Pauses(*[FREEZE] * 4)
    with pytest.raises(EngineAPIError, match="unable to freeze"):
        pause_patiently(pause, "c1", delays=(0, 0))
    assert len(pause.calls) == 3


def test_other_pause_errors_are_not_tried_again() -> None:
    pause = Pauses(EngineAPIError(409, "Container c1 is not running"))
    with pytest.raises(EngineAPIError, match="not running"):
        pause_patiently(pause, "c1", delays=(0, 0))
    assert pause.calls == ["c1"]
