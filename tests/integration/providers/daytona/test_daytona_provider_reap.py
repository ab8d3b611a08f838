"""reap_idle.yml through the Daytona emulator: an idle box is paused, a busy one and one without an idle
signal are left running. The boxes are real containers from agentbox/box:latest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import docker
import pytest

from tests.conftest import REPO
from tests.daytona_emulator import running_emulator

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
VENV_BIN = REPO / ".venv" / "bin"


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict]:
    if not docker.from_env().images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

    with running_emulator(image=IMAGE) as (api_url, api_key, admin):
        provider = DaytonaProvider(api_key=api_key, api_url=api_url, idle_timeout=20)
        suffix = uuid.uuid4().hex[:4]
        names = {role: f"reap-{role}-{suffix}" for role in ("idle", "busy", "quiet")}
        try:
            for name in names.values():
                box_id = uuid.uuid4().hex[:8]
                labels = _naming.box_labels(box=name, box_id=box_id, project="e" * 16, workspace="/nowhere",
                                            branch="", image_fingerprint="", provider="daytona", engine=api_url)  # fmt: skip
                provider.create(BoxSpec(name=name, box_id=box_id, project="e" * 16, workspace="/nowhere",
                                        image=IMAGE, labels=labels))  # fmt: skip
            old = int(time.time()) - 3600
            # The idle agent: a heartbeat an hour old and nothing changed under /workspace since.
            provider.exec(
                names["idle"],
                ["sh", "-c", f"mkdir -p ~/.agentbox && touch -d @{old} ~/.agentbox/last-activity && "
                             f"echo x > /workspace/file && find /workspace -exec touch -h -d @{old} {{}} +"],
            ).check("idle box setup")  # fmt: skip
            # The busy agent: a live tmux window that keeps printing (its activity stays recent however long
            # the tests take: window_activity moves with the window's output).
            provider.exec(names["busy"], ["tmux", "new-session", "-d", "-s", "agent",
                                          "while :; do date; sleep 5; done"]).check("tmux")  # fmt: skip
            yield {"provider": provider, "names": names, "admin": admin, "api_url": api_url, "api_key": api_key}
        finally:
            for name in names.values():
                provider.destroy(name)


def _reap(fleet: dict, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAYTONA_API_URL": fleet["api_url"], "DAYTONA_API_KEY": fleet["api_key"],
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}  # fmt: skip
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            "playbooks/reap_idle.yml", "-e", "idle_timeout=1", *extra]  # fmt: skip
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def _states(fleet: dict) -> dict[str, str]:
    by_name = {s["name"]: s["state"] for s in fleet["admin"].state()["sandboxes"]}
    return {role: by_name.get(name) for role, name in fleet["names"].items()}


def test_check_mode_reports_then_the_reap_pauses_the_idle_box_only(fleet: dict) -> None:
    # One test: the real run pauses the idle box, so check mode must see the fleet before it.
    planned = _reap(fleet, "--check")
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-2000:]
    assert f"{fleet['names']['idle']}: would_pause" in planned.stdout
    assert _states(fleet) == {"idle": "started", "busy": "started", "quiet": "started"}

    done = _reap(fleet)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert _states(fleet) == {"idle": "archived", "busy": "started", "quiet": "started"}
    out = done.stdout
    assert f"{fleet['names']['idle']}: paused: idle for" in out
    assert f"{fleet['names']['busy']}: kept: busy: last agent activity" in out
    assert f"{fleet['names']['quiet']}: kept: no idle signal" in out
    # A second run finds nothing more to do.
    again = _reap(fleet)
    assert again.returncode == 0 and f"{fleet['names']['idle']}: skipped: the box is paused" in again.stdout


def test_label_timeout_applies_without_override(fleet: dict) -> None:
    # Boxes carry io.agentbox.idle_timeout=20 (minutes): the busy box stays, nothing else changes.
    provider = fleet["provider"]
    facts = provider.find(fleet["names"]["busy"])
    assert facts.labels["idle_timeout"] == "20"
    argv = [str(VENV_BIN / "ansible"), "-i", "localhost,", "-c", "local", "localhost", "-e",
            f"ansible_python_interpreter={sys.executable}", "-m", "agentbox.box.agentbox_reap",
            "-a", json.dumps({"provider": "daytona", "name": fleet["names"]["busy"]})]  # fmt: skip
    env = {**os.environ, "DAYTONA_API_URL": fleet["api_url"], "DAYTONA_API_KEY": fleet["api_key"],
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "idle_timeout: 20.0" in done.stdout and "action: kept" in done.stdout
