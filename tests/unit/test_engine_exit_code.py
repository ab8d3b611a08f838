"""exec_exit_code: the engine may record an exec's exit a moment after its output stream ends."""

from __future__ import annotations

from ansible_collections.agentbox.box.plugins.module_utils._engine_api import exec_exit_code


class Answers:
    """An inspect that gives each state in turn (the last one for ever), counting the calls."""

    def __init__(self, *states: dict) -> None:
        self.states, self.calls = states, 0

    def __call__(self) -> dict:
        self.calls += 1
        return self.states[min(self.calls, len(self.states)) - 1]


def test_waits_for_the_exit_the_engine_records_late() -> None:
    inspect = Answers({"Running": True, "ExitCode": None}, {"Running": True, "ExitCode": 0},
                      {"Running": False, "ExitCode": 3})
    assert exec_exit_code(inspect) == 3
    assert inspect.calls == 3


def test_a_recorded_exit_is_taken_at_once() -> None:
    inspect = Answers({"Running": False, "ExitCode": 0})
    assert exec_exit_code(inspect) == 0
    assert inspect.calls == 1


def test_an_exit_never_recorded_is_minus_one_after_the_deadline() -> None:
    assert exec_exit_code(Answers({"Running": True, "ExitCode": None}), deadline_seconds=0.1) == -1
