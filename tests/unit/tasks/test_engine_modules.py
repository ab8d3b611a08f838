"""agentbox_engine and agentbox_doctor run in-process: an engine that is not an SSH destination is refused
with an example of one (the engine module fails, the doctor reports a FAIL line with the fix and changes
nothing); with nothing to check the doctor reports nothing."""

from __future__ import annotations

from pathlib import Path

from tests.unit.support.inprocess import run_module_inprocess

NOT_A_DESTINATION = "user@host:notaport"
WHY = f"engine {NOT_A_DESTINATION!r} is not an SSH destination: use an ~/.ssh/config alias or user@host[:port]"


def test_an_engine_that_is_not_an_ssh_destination_is_refused(tmp_path: Path) -> None:
    for check_mode in (True, False):
        refused = run_module_inprocess("agentbox_engine", {"engine": NOT_A_DESTINATION, "scripts_dir": str(tmp_path)},
                                       check_mode=check_mode)  # fmt: skip
        assert refused["failed"] is True and refused["msg"].startswith(WHY), refused
    assert list(tmp_path.iterdir()) == []


def test_the_doctor_reports_a_bad_engine_as_a_failed_check() -> None:
    nothing = run_module_inprocess("agentbox_doctor", {"local": False, "clouds": False}, check_mode=True)
    assert nothing["failed"] is False and nothing["changed"] is False, nothing
    assert (nothing["checks"], nothing["lines"], nothing["failures"]) == ([], [], 0)

    found = run_module_inprocess("agentbox_doctor", {"local": False, "clouds": False,
                                                     "engines": [{"engine": NOT_A_DESTINATION}]})  # fmt: skip
    assert found["failed"] is False and found["changed"] is False, found
    first, *after = found["checks"]
    assert first["status"] == "FAIL" and first["where"] == f"engine {NOT_A_DESTINATION}", first
    assert first["name"] == "SSH answers" and WHY in first["detail"] and first["fix"]
    # What needs SSH is not tried, and says why.
    assert after and all(c["status"] == "FAIL" and "cannot run: SSH does not answer" in c["detail"] for c in after)
    assert found["failures"] == len(found["checks"]) and found["lines"] == [c["line"] for c in found["checks"]]
