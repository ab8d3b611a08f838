"""Expensive things the integration modules share, made once per test run: the remote engine fleet with the
box image loaded, shared by the xdist workers (tests/integration/support/engines.py run_fleet).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.journeys import JOURNEYS
from tests.integration.support.engines import EngineFleet, run_fleet


@pytest.fixture(scope="session")
def loaded_engines(box_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
    """Two engines (sshd + dockerd) with the box image on each as FLEET_IMAGE, streamed once (the reports
    in image_reports), for the whole run: under xdist the workers' base temps share a parent, the run's.
    Take `engine_fleet`, which also points AGENTBOX_SSH_CONFIG at them."""
    base = tmp_path_factory.getbasetemp()
    with run_fleet(box_image, base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def engine_fleet(loaded_engines: EngineFleet) -> Iterator[EngineFleet]:
    """The run's engine fleet, its SSH config in AGENTBOX_SSH_CONFIG for the module. Both workers may use it
    at once, so a test names its own boxes and checks only those, keeps dockerd running and gives back the
    disk. docker_ssh's disk-full test fills engines[1], holding it (EngineFleet.holding): a test of another
    module that makes boxes there holds it too. A test that needs an engine without boxes or the box image
    (doctor) starts its own."""
    with loaded_engines.exported() as fleet:
        yield fleet


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the end-to-end journeys (tests/integration/journeys.py) so `pytest -m journey` runs them alone."""
    for item in items:
        path, name = item.nodeid.split("::", 1)
        if f"{path.removeprefix('tests/integration/')}::{name.split('[')[0]}" in JOURNEYS:
            item.add_marker(pytest.mark.journey)
