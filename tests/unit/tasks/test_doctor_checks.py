"""doctor.yml's lines (module_utils/tasks/_doctor): the status, where, the check, what was found and the fix, and a
check that cannot run saying why and what to install. No engine: the probes here are plain functions."""

from __future__ import annotations

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import EngineUnreachable, ProviderError
from ansible_collections.agentbox.box.plugins.module_utils.tasks import _doctor


def test_a_check_line_says_status_where_what_and_the_fix() -> None:
    check = _doctor.run_check("this machine", "relay", lambda: (_doctor.FAIL, "does not run", "playbooks/relay.yml"))
    assert check.line == "FAIL  this machine: relay: does not run -> fix: playbooks/relay.yml"
    passed = _doctor.run_check("box engine", "box image", lambda: (_doctor.OK, "agentbox/box:latest is there", ""))
    assert passed.line == "ok    box engine: box image: agentbox/box:latest is there"
    assert passed.to_dict()["line"] == passed.line and passed.to_dict()["status"] == "ok"


def test_a_check_that_cannot_run_says_why_and_what_to_install() -> None:
    def needs_a_package() -> tuple[str, str, str]:
        raise ImportError("No module named 'paramiko'")

    missing = _doctor.run_check("engine e1", "SSH answers", needs_a_package)
    assert missing.status == _doctor.FAIL and "cannot run: No module named 'paramiko'" in missing.line
    assert "requirements.txt" in missing.fix
    said = _doctor.run_check("engine e1", "SSH answers", lambda: (nothing for nothing in ()).throw(
        ProviderError("the Python 'paramiko' package is required on the controller")))  # fmt: skip
    assert said.detail.startswith("cannot run:") and said.fix == _doctor.INSTALL_HINT


def test_an_error_is_its_fail_line_with_the_fix_given_for_it() -> None:
    def refused() -> tuple[str, str, str]:
        raise EngineUnreachable("engine e1 (127.0.0.1:9) refused the connection")

    check = _doctor.run_check("engine e1", "SSH answers", refused, "make `ssh e1 true` work")
    assert check.line == ("FAIL  engine e1: SSH answers: engine e1 (127.0.0.1:9) refused the connection "
                          "-> fix: make `ssh e1 true` work")
