"""Coding agents in real boxes on the local engine, through the playbooks a user runs.

The real Claude Code binary and its sign-in files are in test_agent_claude_code.py. The World, the fixtures and
the checks the agent tests share are in world.py and conftest.py beside this file.

- A custom command that reports states drives `agentbox_agent_state` and the agent_* groups of the
  inventory, read from the relay's record (no exec in the box), and its tmux session is there again after a
  box stop and start.
- A running agent takes a prompt and shows its screen through agent.yml, without attaching; one that works
  without progress (Claude Code looping on an API that drops every connection; a custom command that says
  `working` and then does nothing) is `stalled` after `stalled_minutes`, and the idle policy pauses it.
- Bad input: an unknown agent, a CLI missing from the image, no credentials, a paused box.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent.world import World, said

pytestmark = pytest.mark.integration


def test_custom_command_states_reach_the_inventory_and_survive_a_stop_and_start(world: World, workspace: Path):
    box = world.box(workspace)
    # Asks the user something (waiting), works once answered, then idles until the session ends.
    command = (
        "agentbox-ctl agent-state waiting; read -r answer; agentbox-ctl agent-state working; "
        'echo "$answer" > /workspace/answer.txt; agentbox-ctl agent-state idle; exec sleep infinity'
    )
    out = world.ok("agent.yml", {"box": box, "agent": "helper", "command": command, "session": "helper"})
    assert "tmux attach -t helper" in out
    world.wait_for(box, "grep -q waiting /run/agentbox/agents/helper.state.json", "waiting")
    # The relay reads the box at its next pass (every second here) and keeps it in its record.
    world.recorded(box, "waiting", "the relay recording waiting")
    assert world.agent_state(box) == "waiting"
    # The inventory reads the relay's record, not the box: with the relay stopped (its record still fresh),
    # listing the box starts no exec in it.
    world.ok("relay.yml", {"state": "stopped"})
    before = time.time()
    listing = world.inventory(box)
    execs = world.execs_in(box, before, time.time())
    assert execs == [], execs
    assert listing["agent_waiting"]["hosts"] == [box]
    assert listing["_meta"]["hostvars"][box]["agentbox_agent_state"] == "waiting"
    # Asked for, each box is read (one exec).
    before = time.time()
    assert world.agent_state(box, agent_state_source="boxes") == "waiting"
    assert len(world.execs_in(box, before, time.time())) == 1
    world.ok("relay.yml", {"state": "started"})

    world.sh(box, "tmux send-keys -t helper 'yes, go ahead' Enter")
    world.wait_for(box, "grep -q idle /run/agentbox/agents/helper.state.json", "idle after the answer")
    assert world.sh(box, "cat /workspace/answer.txt")[1] == "yes, go ahead\n"
    world.recorded(box, "idle", "the relay recording idle")
    listing = world.inventory(box)
    assert listing["_meta"]["hostvars"][box]["agentbox_agent_state"] == "idle"
    assert listing["agent_idle"]["hosts"] == [box] and "hosts" not in listing.get("agent_waiting", {})
    history = world.sh(box, "cat /run/agentbox/agents/helper.history")[1]
    assert [json.loads(line)["state"] for line in history.splitlines()] == ["idle", "waiting", "working", "idle"]

    # A box stop and start: the session was started, so it runs again (a custom command from the top).
    world.ok("box_state.yml", {"box": box, "state": "stopped"})
    assert world.client.containers.get(f"agentbox-{box}").status == "exited"
    world.ok("box_state.yml", {"box": box, "state": "started"})
    world.wait_for(box, "tmux has-session -t helper && grep -q waiting /run/agentbox/agents/helper.state.json",
                   "the session back after the start")  # fmt: skip
    world.recorded(box, "waiting", "the relay recording waiting after the start")
    assert world.agent_state(box) == "waiting"
    listed = world.ok("list_boxes.yml", {})
    assert any(box in line and "helper:waiting" in line for line in listed.splitlines()), listed[-2000:]


def test_a_running_agent_takes_prompts_shows_its_screen_and_stalls_without_progress(world: World, workspace: Path):
    box = world.box(workspace)
    # Says `working` once, then only echoes what it is given: no progress, as an agent stuck in a loop.
    command = ('agentbox-ctl agent-state working; while IFS= read -r line; do printf "got: %s\\n" "$line"; '
               'printf "%s\\n" "$line" >> /workspace/prompts.txt; done')  # fmt: skip
    spec = {"box": box, "agent": "looper", "command": command, "session": "looper"}
    world.ok("agent.yml", spec)
    world.wait_for(box, "grep -q working /run/agentbox/agents/looper.state.json", "working")

    # A prompt for the running session: typed in and submitted; nothing new is started.
    pid = world.sh(box, "cat /run/agentbox/agents/looper.pid")[1]
    prompt = "the next task: \"quoted\" and 'single' $HOME `id` ; ü ✓"
    out = world.ok("agent.yml", {**spec, "prompt": prompt})
    assert "sent: the prompt, to the running session" in said(out) and "tmux attach -t looper" in said(out)
    assert world.wait_for(box, "cat /workspace/prompts.txt", "the prompt arriving") == prompt + "\n"
    assert world.sh(box, "cat /run/agentbox/agents/looper.pid")[1] == pid

    # Its screen, without attaching: a look starts and changes nothing.
    out = world.ok("agent.yml", {"box": box, "session": "looper", "transcript": 20})
    assert "changed=0" in out and "got: the next task: " in said(out) and "transcript (last 20 lines):" in said(out)
    assert world.sh(box, "cat /run/agentbox/agents/looper.pid")[1] == pid

    # Working, and no progress since it said so: stalled after stalled_minutes (3 s here), working before.
    def query(minutes: float) -> str:
        return said(world.ok("agent.yml", {"box": box, "session": "looper", "state": "query",
                                           "stalled_minutes": minutes}))  # fmt: skip

    assert "state: working since" in query(10)
    world.wait_until(lambda: "state: stalled since" in query(0.05), "agent.yml showing stalled")

    def stalled_listing() -> dict[str, Any] | None:  # one ansible-inventory run a try, its listing kept
        listing = world.inventory(box, stalled_minutes=0.05)
        return listing if listing["_meta"]["hostvars"][box]["agentbox_agent_state"] == "stalled" else None

    listing = world.wait_until(stalled_listing, "the inventory: stalled")
    assert listing["agent_stalled"]["hosts"] == [box]
    assert world.agent_state(box) == "working"  # the default, 10 minutes, is not over

    # The idle policy pauses a stalled agent's box as an idle one; a working one it keeps.
    policy = {"workspace": str(workspace), "max_running": 0, "idle_minutes": 0}
    out = world.ok("autopause.yml", policy)
    assert f"{box}: keep: its agent is working" in said(out)
    assert world.client.containers.get(f"agentbox-{box}").status == "running"
    out = world.ok("autopause.yml", {**policy, "stalled_minutes": 0.05})
    assert f"{box}: pause: stalled" in said(out), out[-2000:]
    assert world.client.containers.get(f"agentbox-{box}").status == "paused"

    # Stopped: the playbook says so, and prints no way to attach.
    world.ok("box_state.yml", {"box": box, "state": "started"})
    out = world.ok("agent.yml", {**spec, "state": "stopped"})
    assert "state: stopped" in said(out) and "tmux attach" not in said(out) and "attach:" not in out
    assert world.sh(box, "tmux has-session -t looper")[0] != 0


def test_bad_input_is_refused_or_explained(world: World, workspace: Path):
    box = world.box(workspace)
    # agentbox_agent's checks by its main (World.task: the task agent.yml runs, whose output is the module's msg);
    # create_box.yml's own check of the agent, before anything is made, through the playbook.
    done = world.task("agentbox_agent", {"box": box, "agent": "aider"})
    assert done["failed"] and "unknown agent 'aider'" in done["msg"], done
    assert world.sh(box, "tmux ls")[0] != 0  # nothing started
    done = world.playbook("create_box.yml", {"workspace": str(workspace), "box": "never-made", "agent": "aider"})
    assert done.returncode != 0 and "unknown agent aider" in done.stdout
    assert not world.client.containers.list(all=True, filters={"name": "^/agentbox-never-made$"})

    # Codex is not in the default image: the message names the box_image_agents entry that adds it.
    done = world.task("agentbox_agent", {"box": box, "agent": "codex"})
    assert done["failed"] and "add 'codex' to box_image_agents" in done["msg"], done

    # A paused box is resumed first; no credentials anywhere: a warning saying where it looked, and it starts.
    paused = world.task("agentbox_box", {"name": box, "state": "paused"})
    assert not paused["failed"] and world.client.containers.get(f"agentbox-{box}").status == "paused", paused
    done = world.task("agentbox_agent", {"box": box})
    assert not done["failed"], done
    warned = " ".join(done["warnings"])  # what Ansible prints after "[WARNING]: "
    assert world.client.containers.get(f"agentbox-{box}").status == "running"
    assert "no credentials for claude found" in warned and f"{world.home}/.claude/.credentials.json" in warned
    assert "environment ANTHROPIC_*/CLAUDE_CODE_*" in warned
    world.wait_for(box, "tmux has-session -t claude", "claude's session")
