"""The idle policy (agentbox_idle, playbooks/autopause.yml) on the real local engine: five boxes with agents
working, waiting, idle for 2 and 10 minutes and none; time is injected (the states' `since` and the module's
test-only `now`), never slept. Scoped to the test's own workspace, so no other box is looked at.

The five boxes are made once for the module; each test gets them back running with their states as made
(`fleet`). The boxes are made and the module is run by its own main (tests/conftest.py (run_module_direct));
autopause.yml and the connection plugin go through Ansible."""

from __future__ import annotations

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

from tests.conftest import REPO, chown_tree, make_repo, run_module_direct

pytestmark = pytest.mark.integration

ROLES = ("working", "waiting", "idle2", "idle10", "none")


def set_state(container: docker.models.containers.Container, state: str, seconds_ago: float, now: float) -> None:
    """Record the state the way the agent's hooks do, then move its `since` back (the injected time)."""
    done = container.exec_run(["agentbox-ctl", "agent-state", state, "--session", "claude"], user="vscode")
    assert done.exit_code == 0, done.output
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - seconds_ago))
    moved = container.exec_run(
        ["sed", "-i", f's/"since": "[^"]*"/"since": "{since}"/', "/run/agentbox/agents/claude.state.json"],
        user="vscode",
    )
    assert moved.exit_code == 0, moved.output


AGENT_STATES = {"working": ("working", 3600), "waiting": ("waiting", 3600), "idle2": ("idle", 120),
                "idle10": ("idle", 600)}  # fmt: skip


@pytest.fixture(scope="module")
def boxes(docker_client: docker.DockerClient, box_image: str) -> Iterator[dict]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-autopause-", dir="/tmp"))
    root.chmod(0o755)  # the box user reaches the workspace
    repo = make_repo(root / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    token = secrets.token_hex(3)
    names = {role: f"idle-{role}-{token}" for role in ROLES}
    now = float(int(time.time()))
    try:
        for name in names.values():
            made = run_module_direct("agentbox_box", {"name": name, "workspace": str(repo), "image": box_image,
                                                      "boot": False})  # fmt: skip
            assert made.get("failed") is not True, made
        for role, (state, ago) in AGENT_STATES.items():
            set_state(docker_client.containers.get(f"agentbox-{names[role]}"), state, ago, now)
        yield {"names": names, "workspace": str(repo), "client": docker_client, "now": now}
    finally:
        for name in names.values():
            run_module_direct("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fleet(boxes: dict, box_image: str, tmp_path: Path) -> dict:
    """The module's five boxes, each running with its agent's state as made (a test before may have paused or
    stopped some: those are started again and their states, gone with a stop's tmpfs, recorded again)."""
    for role, name in boxes["names"].items():
        container = boxes["client"].containers.get(f"agentbox-{name}")
        if container.status == "running":
            continue
        started = run_module_direct("agentbox_box", {"name": name, "workspace": boxes["workspace"], "image": box_image,
                                                     "boot": False, "state": "started"})  # fmt: skip
        assert started.get("failed") is not True, started
        if role in AGENT_STATES:
            set_state(container, *AGENT_STATES[role], boxes["now"])
    assert all(status == "running" for status in states(boxes).values()), states(boxes)
    return {**boxes, "state_file": str(tmp_path / "idle" / "paused.json")}


def states(fleet: dict) -> dict[str, str]:
    client = fleet["client"]
    return {role: client.containers.get(f"agentbox-{name}").status for role, name in fleet["names"].items()}


def test_cap_pauses_exactly_the_idle_ones_longest_first_then_stops_after_hours(fleet: dict) -> None:
    names = fleet["names"]
    args = {"workspace": fleet["workspace"], "max_running": 2, "idle_minutes": 1, "stop_after_hours": 12,
            "now": fleet["now"], "state_file": fleet["state_file"]}  # fmt: skip
    planned = run_module_direct("agentbox_idle", args, check_mode=True)
    assert planned.get("failed") is not True, planned
    assert planned["paused"] == [names["idle10"], names["idle2"]] and planned["stopped"] == []
    assert all(states(fleet)[role] == "running" for role in ROLES)
    assert not Path(fleet["state_file"]).exists()  # check mode writes nothing

    done = run_module_direct("agentbox_idle", args)
    assert done.get("failed") is not True and done["changed"] is True, done
    assert done["paused"] == [names["idle10"], names["idle2"]], done["boxes"]
    by_name = {entry["name"]: entry for entry in done["boxes"]}
    assert by_name[names["idle10"]]["idle_seconds"] == 600 and by_name[names["idle2"]]["idle_seconds"] == 120
    assert "working" in by_name[names["working"]]["reason"] and "waiting" in by_name[names["waiting"]]["reason"]
    assert "no agent" in by_name[names["none"]]["reason"]
    assert states(fleet) == {"working": "running", "waiting": "running", "idle2": "paused", "idle10": "paused",
                             "none": "running"}  # fmt: skip

    # An hour later nothing changes; thirteen hours later the two paused boxes are stopped.
    later = run_module_direct("agentbox_idle", {**args, "now": fleet["now"] + 3600})
    assert later["changed"] is False and later["stopped"] == [], later["boxes"]
    stop_args = {**args, "now": fleet["now"] + 13 * 3600}
    would = run_module_direct("agentbox_idle", stop_args, check_mode=True)
    assert sorted(would["stopped"]) == sorted([names["idle2"], names["idle10"]])
    stopped = run_module_direct("agentbox_idle", stop_args)
    assert stopped.get("failed") is not True and sorted(stopped["stopped"]) == sorted([names["idle2"], names["idle10"]])
    assert states(fleet) == {"working": "running", "waiting": "running", "idle2": "exited", "idle10": "exited",
                             "none": "running"}  # fmt: skip


def test_autopause_playbook_plans_the_policy_and_a_way_in_wakes_a_paused_box(fleet: dict) -> None:
    """The playbook in check mode plans on the real clock and pauses nothing; a task through the connection plugin
    wakes a box the policy paused. (A bad setting fails before any box is read: tests/unit/idle/test_idle_modules.py.)"""
    base = [
        str(REPO / ".venv/bin/ansible-playbook"),
        "playbooks/autopause.yml",
        "-e",
        f"workspace={fleet['workspace']}",
    ]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    checked = subprocess.run([*base, "-e", "max_running=2", "-e", "idle_minutes=1", "--check"], cwd=REPO, env=env,
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The real clock here (no `now`): both idle agents are over one minute, the others are kept.
    for role in ("idle10", "idle2"):
        assert f"{fleet['names'][role]}: pause: idle " in checked.stdout, checked.stdout
    for role in ("working", "waiting", "none"):
        assert f"{fleet['names'][role]}: keep: " in checked.stdout, checked.stdout
    assert all(states(fleet)[role] == "running" for role in ROLES)  # check mode paused nothing

    # A way in wakes a box the policy put to sleep: a task through the connection plugin resumes it.
    paused = run_module_direct("agentbox_idle", {"workspace": fleet["workspace"], "max_running": 2, "idle_minutes": 1,
                                                 "state_file": fleet["state_file"]})  # fmt: skip
    assert paused.get("failed") is not True and states(fleet)["idle10"] == "paused", paused
    woke = subprocess.run(
        [str(REPO / ".venv/bin/ansible"), "all", "-i", f"{fleet['names']['idle10']},", "-c", "agentbox.box.box",
         "-e", f"agentbox_box={fleet['names']['idle10']}", "-m", "raw", "-a", "echo awake"],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert woke.returncode == 0 and "awake" in woke.stdout, woke.stdout + woke.stderr
    assert states(fleet)["idle10"] == "running"


def test_relay_scope_forgets_the_pause_records_of_unregistered_boxes(tmp_path: Path) -> None:
    """The relay's pass (box_ids: its registrations) on the real engine: nothing else on the engine is
    counted; the pause record of a box no longer registered goes, another engine's stays."""
    from ansible_collections.agentbox.box.plugins.module_utils.idle import _idle
    from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider

    provider = DockerProvider()
    state_file = str(tmp_path / "paused.json")
    gone = f"docker|{provider.engine}|old-box|0123abcd"
    elsewhere = "docker_ssh|me@remote|other|4567ef01"
    _idle.save_record(state_file, {gone: 1.0, elsewhere: 2.0})
    try:
        result = _idle.run_pass(provider, {"max_running": 0}, state_file=state_file, box_ids=set())
    finally:
        provider.close()
    assert result["boxes"] == [] and result["changed"] is False
    assert _idle.load_record(state_file) == {elsewhere: 2.0}
