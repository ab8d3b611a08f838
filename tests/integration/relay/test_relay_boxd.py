"""The relay and a boxd box on the local boxd emulator (real SDK, machines are real containers): the box
cannot reach the host, so the relay polls its queue through exec, as for Daytona, and writes the answers
back. The box's commits are fetched back into the host repository, then pushed to an origin the box
cannot see. A suspended box is not woken by the polls (each poll reads the machine's state first).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.boxd_emulator import running_emulator
from tests.integration.relay import test_relay as shared
from tests.integration.support.cloud_relay import relay_with, started_box

pytestmark = pytest.mark.integration

host = shared.host
project = shared.project


@pytest.fixture(scope="module")
def boxd(host: shared.Host, box_image: str) -> Iterator[dict[str, Any]]:
    with running_emulator(image=box_image) as emu:
        env = {"BOXD_TOKEN": emu.token, "BOXD_BASE_URL": emu.base_url}
        with relay_with(host, env):
            yield {"emu": emu, "env": env}


@pytest.fixture(scope="module")
def boxd_box(host: shared.Host, project: dict[str, Path], boxd: dict[str, Any]) -> Iterator[tuple[Any, str]]:
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    with started_box(host, project, "boxd", boxd["env"], "rl-bx") as name:
        yield BoxdProvider(token=boxd["env"]["BOXD_TOKEN"], base_url=boxd["env"]["BOXD_BASE_URL"]), name


def test_push_from_a_boxd_box(host: shared.Host, boxd_box: tuple[Any, str], project: dict[str, Path]) -> None:
    provider, box = boxd_box
    # The box has no route to origin: the path does not exist in it and nothing carries credentials.
    direct = provider.exec(box, ["sh", "-c", f"cd /workspace && git push {project['origin']} HEAD"])
    assert direct.rc != 0
    in_box = ["sh", "-c", "cd /workspace && git -c user.name=agent -c user.email=a@b.invalid "
              "commit -q --allow-empty -m 'from boxd' && git rev-parse HEAD"]  # fmt: skip
    head = provider.exec(box, in_box).check("commit in the box").text.strip()
    pushed = provider.exec(box, ["sh", "-c", "cd /workspace && agentbox-ctl git push --timeout 120"])
    log = Path(host.home, ".agentbox/relay/relay.log").read_text()[-3000:]
    assert pushed.rc == 0, f"{pushed.stderr.decode()}\nrelay.log:\n{log}"
    assert shared.origin_ref(project, f"refs/heads/agentbox/{box}") == head
    assert shared.git(project["workspace"], "rev-parse", f"refs/heads/agentbox/{box}").strip() == head
    entry = [e for e in host.audit() if e["box"] == box and e.get("operation") == "git.push"][-1]
    assert entry["provider"] == "boxd" and entry["decision"] == "allowed"
    # The queue holds nothing afterwards: requests and answers are removed by the client.
    left = provider.exec(box, ["sh", "-c", "ls -A /run/agentbox/relay-queue"]).check("list the queue").text.split()
    assert left == []


def test_polls_do_not_wake_a_suspended_box(boxd_box: tuple[Any, str], boxd: dict[str, Any]) -> None:
    provider, box = boxd_box
    control = boxd["emu"].control
    machine_id = provider.find(box).container
    provider.pause(box)
    assert control.machine(machine_id)["status"] == "suspended"
    since = time.time()
    # Proof that the relay polled meanwhile (its state lookups reach the emulator; this test makes none).
    deadline = time.monotonic() + shared.DEADLINE
    while len([r for r in control.requests() if r["time"] > since and r["method"] == "GetVm"]) < 2:
        assert time.monotonic() < deadline, "the relay made no state lookup of the suspended box"
        time.sleep(0.5)
    assert control.machine(machine_id)["status"] == "suspended"
    assert not [r for r in control.requests() if r["time"] > since and r["method"] == "Exec"]
    # Resumed, the box is served again.
    provider.resume(box)
    opened = provider.exec(box, ["sh", "-c", "cd /workspace && agentbox-ctl open https://example.invalid/after"])
    assert opened.rc == 0, opened.stderr.decode()
