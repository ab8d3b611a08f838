"""What counts as activity for the idle policy, on the real local engine: typing into a pty in the box and an
open `ssh agentbox-<box>` session (the real OpenSSH client) keep a box whose agent is long idle from being
paused. Time is injected (the agent's `since` moved back, the module's test-only `now`), never slept; a
private HOME keeps the user's ~/.agentbox untouched."""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import run_module
from tests.integration.access.test_access import home  # noqa: F401  # pylint: disable=unused-import
from tests.integration.idle.test_autopause_local import set_state

pytestmark = pytest.mark.integration


@pytest.fixture
def idle_box(docker_client: docker.DockerClient, home: Path, repo_factory, tmp_path: Path) -> Iterator[dict]:  # noqa: F811
    """One box whose agent went idle ten minutes ago (by its recorded `since`)."""
    repo = repo_factory("ws")
    name = f"act-{secrets.token_hex(3)}"
    now = float(int(time.time()))
    try:
        made = run_module("agentbox_box", {"name": name, "workspace": str(repo), "boot": False})
        assert made.get("failed") is not True, made
        container = docker_client.containers.get(f"agentbox-{name}")
        set_state(container, "idle", 600, now)
        yield {"name": name, "workspace": str(repo), "container": container, "home": home, "now": now,
               "state_file": str(tmp_path / "paused.json")}  # fmt: skip
    finally:
        run_module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})


def policy(box: dict, now: float, check_mode: bool = True) -> dict:
    """One pass over the box's project, cap 0: only activity can keep it running."""
    args = {"workspace": box["workspace"], "max_running": 0, "idle_minutes": 5, "now": now,
            "state_file": box["state_file"]}  # fmt: skip
    result = run_module("agentbox_idle", args, check_mode=check_mode)
    assert result.get("failed") is not True, result
    return result["boxes"][0]


def test_typing_into_a_pty_in_the_box_keeps_it_running(idle_box: dict) -> None:
    container, now = idle_box["container"], idle_box["now"]
    before = policy(idle_box, now)
    assert before["action"] == "pause" and before["idle_seconds"] == 600, before

    # A terminal in the box (a tmux pane, as shell.yml makes) and keys typed into it: `cat` reads them
    # from the pty, which moves the pty's atime, the kernel's own record of input.
    made = container.exec_run(["tmux", "new-session", "-d", "-s", "typing", "cat"], user="vscode")
    assert made.exit_code == 0, made.output
    typed = container.exec_run(["tmux", "send-keys", "-t", "typing", "hello", "Enter"], user="vscode")
    assert typed.exit_code == 0, typed.output
    kept = policy(idle_box, now, check_mode=False)
    assert kept["action"] == "keep" and "terminal input" in kept["reason"], kept
    assert kept["idle_seconds"] < 300
    container.reload()
    assert container.status == "running"

    # An hour later that input is old: the box is paused like any idle one.
    later = policy(idle_box, now + 3600)
    assert later["action"] == "pause" and later["idle_seconds"] > 3000, later


def test_an_open_ssh_session_keeps_it_running(idle_box: dict) -> None:
    config = idle_box["home"] / ".agentbox" / "ssh_config"
    alias = f"agentbox-{idle_box['name']}"
    session = subprocess.Popen(
        ["ssh", "-F", str(config), "-o", "BatchMode=yes", alias, "echo ready; cat"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert session.stdout is not None and session.stdout.readline() == "ready\n", session.stderr
        # Thirteen hours on, and no input: only the open session keeps the box.
        kept = policy(idle_box, idle_box["now"] + 13 * 3600, check_mode=False)
        assert kept["action"] == "keep" and "1 ssh session(s) open" in kept["reason"], kept
    finally:
        session.communicate(input="", timeout=60)
    assert session.returncode == 0, session.stderr
    # The client has gone; the box's sshd (`sshd -i` behind the ProxyCommand) notices its closed input
    # and exits a moment later, on a busy machine after the client: the policy is asked once it has.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = idle_box["container"].exec_run(["pgrep", "-c", "-f", r"^(sshd|sshd-session): vscode \[priv\]"])
        if left.output.strip() == b"0":
            break
        time.sleep(0.2)
    gone = policy(idle_box, idle_box["now"] + 13 * 3600)
    assert gone["action"] == "pause", gone
