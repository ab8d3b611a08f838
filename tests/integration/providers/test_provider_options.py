"""Provider settings given as module options win over the environment (Daytona, through the local emulator).
The module runs in-process (tests/unit/support/inprocess.py): the emulator is what is real here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daytona_emulator import running_emulator
from tests.daytona_emulator.harness import RunningEmulator
from tests.unit.support.inprocess import run_module_inprocess

pytestmark = pytest.mark.integration

# The environment points somewhere useless: only the module options can make the calls work.
WRONG_ENV = {"DAYTONA_API_URL": "http://127.0.0.1:9/api", "DAYTONA_API_KEY": "not-the-key", "DAYTONA_TARGET": ""}


@pytest.fixture(scope="module")
def emulator(box_image: str) -> Iterator[RunningEmulator]:
    with running_emulator(image=box_image) as running:
        yield running


def environment(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_daytona_url_and_key_as_module_options(emulator: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    options = {"provider": "daytona", "daytona_api_url": emulator.api_url, "daytona_api_key": emulator.api_key}
    since = len(emulator.admin.requests())
    environment(monkeypatch, WRONG_ENV)
    listed = run_module_inprocess("agentbox_box_info", options)
    assert listed.get("failed") is not True, listed
    assert listed["boxes"] == []
    # The emulator saw the module's calls (the environment's URL has nothing listening).
    assert any(r["path"].startswith("/api/sandbox") for r in emulator.admin.requests(since))


def test_a_wrong_key_given_as_option_is_refused_by_name(emulator: RunningEmulator,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    options = {"provider": "daytona", "daytona_api_url": emulator.api_url, "daytona_api_key": "wrong-key"}
    environment(monkeypatch, {**WRONG_ENV, "DAYTONA_API_KEY": emulator.api_key})
    refused = run_module_inprocess("agentbox_box_info", options)
    assert refused.get("failed") is True
    assert "refused the API key (401)" in refused["msg"] and "daytona_api_key" in refused["msg"]
    assert "wrong-key" not in refused["msg"] and emulator.api_key not in refused["msg"]
