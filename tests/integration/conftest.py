"""Expensive things the integration modules share, made once per pytest worker (session scope; under
xdist each worker has its own): the remote engine fleet with the box image loaded.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.support.engines import FLEET_IMAGE, EngineFleet


@pytest.fixture(scope="session")
def loaded_engines(box_image: str) -> Iterator[EngineFleet]:
    """Two engines (sshd + dockerd) with the box image on each as FLEET_IMAGE, streamed once (the reports
    in image_reports). Take `engine_fleet`, which also points AGENTBOX_SSH_CONFIG at them."""
    subprocess.run(["docker", "tag", box_image, FLEET_IMAGE], check=True, capture_output=True)
    try:
        # 3g each: the box image (1.1 GB), its load, checkpoints; a test that fills the disk fills this.
        with EngineFleet(count=2, tmpfs_size="3g", export_env=False) as fleet:
            fleet.load_image(FLEET_IMAGE)
            yield fleet
    finally:
        subprocess.run(["docker", "rmi", FLEET_IMAGE], check=False, capture_output=True)


@pytest.fixture(scope="module")
def engine_fleet(loaded_engines: EngineFleet) -> Iterator[EngineFleet]:
    """The worker's engine fleet, its SSH config in AGENTBOX_SSH_CONFIG for the module. Tests leave the
    engines as they found them: no box, no agentbox/box:latest tag, dockerd running, the disk free."""
    with loaded_engines.exported() as fleet:
        yield fleet
