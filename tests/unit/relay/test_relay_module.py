"""agentbox_relay run in-process under a HOME of the test where no relay runs: check mode reports the start it
would make and starts nothing; stopping a relay that does not run changes nothing; an answer with no relay
to take it is refused; the listing's keys are there."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_state
from tests.unit.support.inprocess import run_module_inprocess


def test_the_relay_module_without_a_relay(home: Path) -> None:
    listed = run_module_inprocess("agentbox_relay", {})
    assert listed["failed"] is False and listed["changed"] is False, listed
    assert (listed["running"], listed["pid"], listed["pending"], listed["lines"]) == (False, None, [], [])
    assert listed["home"] == _relay_state.relay_home() and listed["home"].startswith(str(home))

    for state in ("started", "restarted"):
        planned = run_module_inprocess("agentbox_relay", {"state": state}, check_mode=True, diff=True)
        assert planned["failed"] is False and planned["changed"] is True, planned
        assert planned["diff"]["before"] == {"running": False}
        assert _relay_state.running_pid() is None  # check mode started nothing

    for check_mode in (True, False):
        stopped = run_module_inprocess("agentbox_relay", {"state": "stopped"}, check_mode=check_mode, diff=True)
        assert stopped["failed"] is False and stopped["changed"] is False, stopped
        assert stopped["diff"] == {"before": {"running": False}, "after": {"running": False}}

    for answer in ("approve", "deny"):
        refused = run_module_inprocess("agentbox_relay", {answer: "a1b2"})
        assert refused["failed"] is True, refused
        assert refused["msg"] == "the relay is not running, so nothing waits for approval"
    assert _relay_state.running_pid() is None
