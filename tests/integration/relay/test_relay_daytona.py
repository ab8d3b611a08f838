"""The relay and a Daytona box on the local emulator (real SDK, sandboxes are real containers): the box
cannot reach the host, so the relay collects its queued requests through the toolbox and writes the
answers back. The box's commits are fetched back into the host repository, then pushed to an origin
the box cannot see.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_module
from tests.daytona_emulator import running_emulator
from tests.integration.relay import test_relay as shared
from tests.integration.support.cloud_relay import relay_with, started_box

pytestmark = pytest.mark.integration

host = shared.host
project = shared.project


@pytest.fixture(scope="module")
def daytona(host: shared.Host) -> Iterator[dict[str, Any]]:
    with running_emulator(image="agentbox/box:latest") as (api_url, api_key, _admin):
        env = {"DAYTONA_API_KEY": api_key, "DAYTONA_API_URL": api_url}
        with relay_with(host, env):
            yield {"url": api_url, "key": api_key, "env": env}


@pytest.fixture(scope="module")
def daytona_box(host: shared.Host, project: dict[str, Path], daytona: dict[str, Any]) -> Iterator[tuple[Any, str]]:
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

    with started_box(host, project, "daytona", daytona["env"], "rl-dt") as name:
        yield DaytonaProvider(api_key=daytona["key"], api_url=daytona["url"]), name


def test_push_from_a_daytona_box(
    host: shared.Host, daytona_box: tuple[Any, str], project: dict[str, Path]
) -> None:
    provider, box = daytona_box
    in_box = ["sh", "-c", "cd /workspace && git -c user.name=agent -c user.email=a@b.invalid "
              "commit -q --allow-empty -m 'from daytona' && git rev-parse HEAD"]  # fmt: skip
    head = provider.exec(box, in_box).check("commit in the box").text.strip()
    pushed = provider.exec(box, ["sh", "-c", "cd /workspace && agentbox-ctl git push --timeout 120"])
    log = Path(host.home, ".agentbox/relay/relay.log").read_text()[-3000:]
    assert pushed.rc == 0, f"{pushed.stderr.decode()}\nrelay.log:\n{log}"
    assert shared.origin_ref(project, f"refs/heads/agentbox/{box}") == head
    assert shared.git(project["workspace"], "rev-parse", f"refs/heads/agentbox/{box}").strip() == head
    entry = [e for e in host.audit() if e["box"] == box and e.get("operation") == "git.push"][-1]
    assert entry["provider"] == "daytona" and entry["decision"] == "allowed"
    # The queue holds nothing afterwards: requests and answers are removed by the client.
    left = provider.exec(box, ["sh", "-c", "ls -A /run/agentbox/relay-queue"]).check("list the queue").text.split()
    assert left == []


def test_approval_from_a_daytona_box(host: shared.Host, daytona_box: tuple[Any, str]) -> None:
    provider, box = daytona_box
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(provider.exec, box, ["sh", "-c", "cd /workspace && agentbox-ctl git push --as main"])
        approval = host.wait_pending(box)
        assert host.relay("approvals", "--deny", approval).returncode == 0
        done = asked.result(timeout=shared.DEADLINE)
    assert done.rc == 1
    assert "waiting for approval on the host" in done.stderr.decode() and "denied" in done.stderr.decode()
    assert os.path.exists(os.path.join(host.home, ".agentbox/relay/audit.jsonl"))


def test_checkpoint_from_a_daytona_box(
    host: shared.Host, daytona_box: tuple[Any, str], project: dict[str, Path], daytona: dict[str, Any]
) -> None:
    """The snapshot stops the box: the relay answers first, then captures, and audits the result."""
    provider, box = daytona_box
    name = f"relay-{secrets.token_hex(3)}"
    env = {"HOME": host.home, **daytona["env"]}
    try:
        asked = provider.exec(box, ["sh", "-c", f"cd /workspace && agentbox-ctl checkpoint --name {name}"])
        assert asked.rc == 0, asked.stderr.decode()
        assert f"checkpoint {name} (snapshot) is being taken" in asked.stdout.decode()
        deadline = time.monotonic() + 600  # a condition to wait for (the capture's own audit line), not a timing
        while not (done := [e for e in host.audit() if e["box"] == box and e.get("phase") == "after the answer"]):
            assert time.monotonic() < deadline, "the relay never audited the checkpoint's capture"
            time.sleep(1)
        assert done[-1]["operation"] == "checkpoint" and done[-1]["result"]["rc"] == 0, done[-1]
        listed = run_module("agentbox_checkpoint_info", {"provider": "daytona", "workspace": str(project["workspace"])},
                            env=env)
        assert name in {c["name"] for c in listed["checkpoints"]}, listed
        # The box runs again, and its relay channel with it.
        assert provider.find(box).state == "running"
        again = provider.exec(box, ["sh", "-c", "cd /workspace && agentbox-ctl open https://example.invalid/after"])
        assert again.rc == 0, again.stderr.decode()
    finally:
        run_module("agentbox_checkpoint", {"name": name, "state": "absent", "provider": "daytona",
                                           "workspace": str(project["workspace"])}, env=env)
