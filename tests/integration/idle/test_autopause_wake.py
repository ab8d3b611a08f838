"""Every way in wakes a box the idle policy put to sleep, on the real local engine: a box stopped by the
policy "13 hours later" (injected time) comes back through a connection-plugin task, and
`ssh agentbox-<box>` (the real OpenSSH client, `-F` the private HOME's ssh_config) works on a paused and on
a stopped box. The user's real ~/.agentbox is never touched (a temporary HOME)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, run_module
from tests.integration.access.test_access import home  # noqa: F401  # pylint: disable=unused-import
from tests.integration.idle.test_autopause_local import set_state

pytestmark = pytest.mark.integration


@pytest.fixture
def sleepy(docker_client: docker.DockerClient, home: Path, repo_factory, tmp_path: Path) -> Iterator[dict]:  # noqa: F811
    repo = repo_factory("ws")
    name = f"wake-{secrets.token_hex(3)}"
    try:
        made = run_module("agentbox_box", {"name": name, "workspace": str(repo), "boot": False})
        assert made.get("failed") is not True, made
        yield {"name": name, "workspace": str(repo), "client": docker_client, "home": home,
               "state_file": str(tmp_path / "paused.json")}  # fmt: skip
    finally:
        run_module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})


def status(box: dict) -> str:
    return box["client"].containers.get(f"agentbox-{box['name']}").status


def ssh(box: dict, command: str, *, sighup_ignored: bool = False) -> subprocess.CompletedProcess:
    config = box["home"] / ".agentbox" / "ssh_config"
    argv = ["ssh", "-F", str(config), "-o", "BatchMode=yes", f"agentbox-{box['name']}", command]
    # `nohup ssh ...`: ssh's SIGHUP to its ProxyCommand at the end then kills nothing.
    ignore = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if sighup_ignored else None
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, preexec_fn=ignore)


def test_a_finished_session_never_runs_the_wake_even_under_nohup(sleepy: dict) -> None:
    """sshd -i exits 255 after every session, so the direct path's `||` runs the wake then; ssh kills
    it first unless SIGHUP is ignored. The wake must see that ssh is gone and do nothing."""
    for login in range(3):
        done = ssh(sleepy, "true", sighup_ignored=True)
        assert done.returncode == 0, (login, done.stderr)
        assert "agentbox:" not in done.stderr, (login, done.stderr)
    # Before a session, ssh still waits: a paused box is woken under nohup too.
    sleepy["client"].containers.get(f"agentbox-{sleepy['name']}").pause()
    woke = ssh(sleepy, "id -un", sighup_ignored=True)
    assert woke.returncode == 0 and woke.stdout == "vscode\n", woke.stderr
    assert woke.stderr.count("agentbox:") == 1 and "was paused" in woke.stderr, woke.stderr
    assert status(sleepy) == "running"


def test_a_box_the_policy_stopped_comes_back_through_a_connection_plugin_task(sleepy: dict) -> None:
    now = float(int(time.time()))
    set_state(sleepy["client"].containers.get(f"agentbox-{sleepy['name']}"), "idle", 600, now)
    args = {"workspace": sleepy["workspace"], "max_running": 0, "idle_minutes": 1, "now": now,
            "state_file": sleepy["state_file"]}  # fmt: skip
    paused = run_module("agentbox_idle", args)
    assert paused.get("paused") == [sleepy["name"]], paused
    stopped = run_module("agentbox_idle", {**args, "now": now + 13 * 3600})
    assert stopped.get("stopped") == [sleepy["name"]], stopped
    assert status(sleepy) == "exited"

    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    task = subprocess.run(
        [str(REPO / ".venv/bin/ansible"), "all", "-i", f"{sleepy['name']},", "-c", "agentbox.box.box",
         "-m", "ansible.builtin.command", "-a", "git -C /workspace rev-parse --abbrev-ref HEAD"],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert task.returncode == 0 and f"agentbox/{sleepy['name']}" in task.stdout, task.stdout + task.stderr
    assert status(sleepy) == "running"


def test_the_ssh_alias_wakes_a_paused_and_a_stopped_box(sleepy: dict) -> None:
    entry = (sleepy["home"] / ".agentbox" / "ssh_config").read_text()
    assert "&& exit 0;" in entry and "agentbox-wake" in entry  # the wake runs only when the direct exec fails
    assert (sleepy["home"] / ".agentbox" / "bin" / "agentbox-wake").stat().st_mode & 0o777 == 0o700

    running = ssh(sleepy, "true")
    assert running.returncode == 0, running.stderr
    assert "agentbox:" not in running.stderr  # the fast path never ran the wake

    sleepy["client"].containers.get(f"agentbox-{sleepy['name']}").pause()
    woke = ssh(sleepy, "true")
    assert woke.returncode == 0, woke.stderr
    assert "was paused" in woke.stderr and status(sleepy) == "running"
    # One clear line: the wake's, not Docker's raw "Container ... is paused" before it.
    assert woke.stderr.splitlines() == [f"agentbox: box '{sleepy['name']}' was paused; it runs again"], woke.stderr

    stop = run_module("agentbox_box", {"name": sleepy["name"], "state": "stopped"})
    assert stop.get("failed") is not True and status(sleepy) == "exited", stop
    started = ssh(sleepy, "cat /workspace/README.md && whoami")
    assert started.returncode == 0, started.stderr
    assert "was stopped" in started.stderr and started.stdout.endswith("vscode\n"), started.stdout
    assert "is not running" not in started.stderr and "Error response" not in started.stderr, started.stderr
    assert status(sleepy) == "running"
