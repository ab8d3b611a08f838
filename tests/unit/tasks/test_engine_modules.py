"""agentbox_engine and agentbox_doctor run in-process: an engine that is not an SSH destination is refused
with an example of one (the engine module fails, the doctor reports a FAIL line with the fix and changes
nothing); with nothing to check the doctor reports nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import provider_as, run_module_inprocess

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


def test_the_doctor_checks_a_clouds_api_and_box_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cloud with its key set is checked: its API answers and the image is there (the fake provider stands in
    for Daytona's; the real one is proven on its emulator); with no answer, the image check cannot run."""
    for key in ("BOXD_API_KEY", "BOXD_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DAYTONA_API_KEY", "test-key")
    with provider_as("daytona", FakeProvider(tmp_path)) as fake:
        there = run_module_inprocess("agentbox_doctor", {"local": False})
        assert there["lines"] == [f"ok    daytona: API answers: {fake.engine} answers (0 boxes)",
                                  "ok    daytona: box image: agentbox/box:latest is there"], there
        missing = run_module_inprocess("agentbox_doctor", {"local": False, "image": "ghost:1"})
        assert missing["lines"][1] == ("FAIL  daytona: box image: ghost:1 is not there: a create on daytona is refused "
                                       "-> fix: make it there (docs/providers/daytona.md), or name one that is with "
                                       "-e image=REF") and missing["failures"] == 1
        fake.fail_on("list_boxes")
        down = run_module_inprocess("agentbox_doctor", {"local": False})
    assert [c["status"] for c in down["checks"]] == ["FAIL", "FAIL"], down
    assert down["checks"][1]["detail"] == "cannot run: the API does not answer (see above)"
