"""The relay applies the idle policy by itself (docs/idle.md): under a private HOME (so the relay and its
policy file belong to the test, and it only ever sees the test's own boxes), three boxes with agents working,
idle 10 minutes and idle 2 minutes, `max_running: 1`: the relay pauses the two idle ones and keeps the
working one, with no playbook run. Time is injected through the states' `since`; the test waits on the
containers' state with a deadline."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, chown_tree, make_repo, run_module
from tests.integration.idle.test_autopause_local import set_state

pytestmark = pytest.mark.integration

DEADLINE = 120.0
RELAY = str(REPO / "scripts/agentbox-relay")


def write_policy(home: str, policy: dict) -> None:
    directory = Path(home, ".agentbox", "idle")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "policy.json").write_text(json.dumps(policy))


@pytest.fixture
def relayed(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[dict]:
    home = tempfile.mkdtemp(prefix="abi-", dir="/tmp")  # short: the relay's socket paths are bounded
    os.chmod(home, 0o755)
    # The suite turns the policy off for every relay (conftest); this relay is the policy under test.
    env = {"HOME": home, "AGENTBOX_IDLE_INTERVAL": ""}
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    token = secrets.token_hex(3)
    names = {role: f"rly-{role}-{token}" for role in ("working", "idle10", "idle2")}
    # Off while the boxes are made and their states set: the switch is read again every interval.
    write_policy(home, {"enabled": False, "interval": 1, "max_running": 1, "idle_minutes": 1})
    try:
        for name in names.values():
            made = run_module("agentbox_box", {"name": name, "workspace": str(repo), "image": box_image,
                                               "boot": False}, env=env)  # fmt: skip
            assert made.get("failed") is not True, made
        now = time.time()
        for role, (state, ago) in {
            "working": ("working", 3600),
            "idle10": ("idle", 600),
            "idle2": ("idle", 120),
        }.items():
            set_state(docker_client.containers.get(f"agentbox-{names[role]}"), state, ago, now)
        yield {"names": names, "home": home, "client": docker_client}
    finally:
        for name in names.values():
            run_module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True}, env=env)
        subprocess.run([RELAY, "stop"], env={**os.environ, **env}, capture_output=True, check=False)
        shutil.rmtree(home, ignore_errors=True)


def test_the_relay_pauses_the_idle_boxes_over_the_cap(relayed: dict) -> None:
    names, client = relayed["names"], relayed["client"]
    status = subprocess.run([RELAY, "status"], env={**os.environ, "HOME": relayed["home"]}, capture_output=True,
                            text=True, check=False)  # fmt: skip
    assert status.returncode == 0, f"the create did not start the relay: {status.stdout}{status.stderr}"

    def states() -> dict[str, str]:
        return {role: client.containers.get(f"agentbox-{name}").status for role, name in names.items()}

    assert states() == {"working": "running", "idle10": "running", "idle2": "running"}  # switched off so far
    write_policy(relayed["home"], {"interval": 1, "max_running": 1, "idle_minutes": 1})
    deadline = time.monotonic() + DEADLINE
    while states() != {"working": "running", "idle10": "paused", "idle2": "paused"}:
        assert time.monotonic() < deadline, f"the relay did not apply the policy: {states()}"
        time.sleep(0.5)
    # The pass logs what it did once it has done all of it: the pauses can be seen a moment before the lines.
    log = Path(relayed["home"], ".agentbox", "relay", "relay.log")
    wanted = [f"idle policy: pause {names['idle10']}", f"idle policy: pause {names['idle2']}"]
    text = ""
    while not all(line in text for line in wanted):
        assert time.monotonic() < deadline, f"the relay did not log its pauses: {text[-2000:]}"
        time.sleep(0.2)
        text = log.read_text() if log.exists() else ""
    assert f"idle policy: pause {names['working']}" not in text
