"""Claude Code in real boxes on the local engine, through the playbooks a user runs (world.py's World and
conftest.py's fixtures: a temporary HOME whose relay reads the boxes every second). The checks of the first
prompt and of the resume after a start are world.py's, shared with test_agent_boxd.py.

- The real Claude Code binary, with no network: the test runs a scripted stand-in for the Messages API
  inside the box on its loopback (tests/fixtures/messages_standin.py) and points ANTHROPIC_BASE_URL at it
  from the host's environment. The stand-in answers the first prompt with one `Write` tool call, then
  ends the turn; the file must appear in /workspace, the state must go working then idle through the
  CLI's real hooks, and the stand-in must have seen the key the host passed. The key must be in no
  `docker inspect`, no label, no playbook output and neither kind of checkpoint. Claude Code looping on an
  API that drops every connection is `stalled` after `stalled_minutes`, and the idle policy pauses it.
- The sign-in files of the host reach the box on its tmpfs and stay out of checkpoints.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

import pytest

from tests.integration.agent.world import (
    World,
    a_key_and_a_port,
    checkpoint_image,
    claude_code_does_the_first_prompt,
    claude_code_resumed,
    images_holding,
    said,
)

pytestmark = pytest.mark.integration


def test_claude_code_end_to_end_with_a_scripted_api_in_the_box(world: World, workspace: Path) -> None:
    box = world.box(workspace)
    key, port = a_key_and_a_port()
    world.start_standin(box, port)
    # Many retries: an API that cannot be reached (below) keeps the agent retrying while the test looks at it.
    host_env = {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": key,
                "CLAUDE_CODE_MAX_RETRIES": "1000"}  # fmt: skip
    # The file, the states, the key and the prompt at the API, the argv (world.py).
    pid = claude_code_does_the_first_prompt(world, box, key, host_env)

    # The box commits as the host user, with nothing else of the host's git config.
    world.sh(box, "cd /workspace && git add from-agent.txt && git commit -qm 'from the agent'")
    author = world.sh(box, "git -C /workspace log -1 --format='%an <%ae>'")[1].strip()
    assert author == "Host Person <host.person@example.invalid>"
    box_config = world.sh(box, "git config --global --list")[1]
    assert "credential" not in box_config and "user.name=Host Person" in box_config

    # Idempotent: the running session is left alone.
    again = world.ok("agent.yml", {"box": box}, env={"ANTHROPIC_API_KEY": key})
    assert "changed=0" in again.splitlines()[-2] or "changed=0" in again, again[-800:]
    assert world.sh(box, "cat /run/agentbox/agents/claude.pid")[1].strip() == pid

    # A prompt for the running agent, typed into its session as one paste: the API gets it whole, the agent
    # works and idles again; its screen, without attaching. Nothing new is started.
    second = "A second task, please:\nline two, \"quoted\" ü"
    out = world.ok("agent.yml", {"box": box, "prompt": second}, env=host_env)
    assert "sent: the prompt, to the running session" in said(out)

    world.wait_until(lambda: any(second in text for r in world.api_requests(box) if r["tools"] for text in r["user_texts"]),
                     "the second prompt at the API")  # fmt: skip
    world.wait_for(box, "h=/run/agentbox/agents/claude.history; [ $(grep -c working $h) -ge 2 ] && tail -1 $h | "
                        "grep -q idle", "working, then idle again")  # fmt: skip
    out = world.ok("agent.yml", {"box": box, "transcript": 60})
    assert "changed=0" in out and "The file is written." in said(out) and "state: idle" in said(out), out[-3000:]
    assert world.sh(box, "cat /run/agentbox/agents/claude.pid")[1].strip() == pid

    # The key is on the tmpfs only: not in the container's config, labels, or either kind of checkpoint.
    assert key not in json.dumps(world.client.api.inspect_container(f"agentbox-{box}"))
    leaked = world.sh(box, f"grep -rlF {key} /home /workspace/ /etc /var/lib/agentbox; true", user="root")[1]
    assert leaked.split() == [], leaked
    for merged in (False, True):
        name = f"ck-{'flat' if merged else 'layer'}-{secrets.token_hex(2)}"
        out = world.ok("checkpoint.yml", {"box": box, "checkpoint": name, "merged": merged})
        assert key not in out
        reference = checkpoint_image(workspace, name)
        world.images.append(reference)
        assert key not in json.dumps(world.client.api.inspect_image(reference))
        assert images_holding(world.client, reference, key) == [], reference

    # A box stop and start, and a box restored from the checkpoint: Claude Code runs again, resuming its
    # conversation, with the key given again from the host (the tmpfs was emptied), the prompt not replayed.
    world.ok("box_state.yml", {"box": box, "state": "stopped"}, env=host_env)
    world.ok("box_state.yml", {"box": box, "state": "started"}, env=host_env)
    claude_code_resumed(world, box, key, "after the start")
    restored = world.box(workspace, checkpoint=reference.rsplit(":", 1)[1])
    claude_code_resumed(world, restored, None, "in the restored box")  # made without the key

    # The stand-in went with the box's stop: the API cannot be reached, and the agent given a prompt retries on
    # connection errors, `working` all along. No progress (its transcript stays as it was): stalled after
    # stalled_minutes (3 s here), and the idle policy pauses its box as an idle one.
    world.ok("agent.yml", {"box": box, "prompt": "One more thing, please."}, env=host_env)
    world.wait_for(box, "grep -q working /run/agentbox/agents/claude.state.json", "working on the prompt")

    def query(minutes: float) -> str:
        return said(world.ok("agent.yml", {"box": box, "state": "query", "stalled_minutes": minutes}))

    # Working by the default's measure first: that run is time without progress too, so under the full suite's
    # load (about 3 s an agent.yml run) the first look with stalled_minutes (3 s) finds it stalled.
    assert "state: working since" in query(10)
    world.wait_until(lambda: "state: stalled since" in query(0.05), "claude shown stalled")
    out = world.ok("autopause.yml", {"workspace": str(workspace), "max_running": 0, "idle_minutes": 0,
                                     "stalled_minutes": 0.05})  # fmt: skip
    assert f"{box}: pause: stalled" in said(out), out[-3000:]
    assert world.client.containers.get(f"agentbox-{box}").status == "paused"
    world.ok("box_state.yml", {"box": box, "state": "started"}, env=host_env)

    # Stopped gracefully: the session ends and the state says so.
    out = world.ok("agent.yml", {"box": box, "state": "stopped"})
    assert "state: stopped" in said(out) and "tmux attach" not in said(out)
    assert world.sh(box, "tmux has-session -t claude")[0] != 0
    assert json.loads(world.sh(box, "cat /run/agentbox/agents/claude.state.json")[1])["state"] == "stopped"


def test_sign_in_files_reach_the_box_on_the_tmpfs_and_stay_out_of_checkpoints(world: World, workspace: Path):
    token = f"sk-ant-oat01-{secrets.token_hex(10)}"
    claude_dir = world.home / ".claude"
    claude_dir.mkdir()
    credentials = json.dumps({"claudeAiOauth": {"accessToken": token, "refreshToken": token + "-r"}})
    (claude_dir / ".credentials.json").write_text(credentials)
    (world.home / ".claude.json").write_text(json.dumps({"oauthAccount": {"emailAddress": "me@example.invalid"}}))
    before = {p: p.read_bytes() for p in (claude_dir / ".credentials.json", world.home / ".claude.json")}
    box = world.box(workspace, agent="claude")
    # The CLI reads its own path; that path is a link to the tmpfs.
    assert world.sh(box, "cat ~/.claude/.credentials.json")[1] == credentials
    target = world.sh(box, "readlink -f ~/.claude/.credentials.json")[1].strip()
    assert target.startswith("/run/agentbox/agents/claude/")
    assert "me@example.invalid" in world.sh(box, "cat ~/.claude.json")[1]
    assert {p: p.read_bytes() for p in before} == before  # host files read, never modified
    name = f"ck-{secrets.token_hex(2)}"
    # By agentbox_checkpoint's main (the task checkpoint.yml runs: that playbook is the end-to-end test's).
    saved = world.task("agentbox_checkpoint", {"box": box, "name": name})
    assert not saved["failed"] and token not in json.dumps(saved), saved
    reference = checkpoint_image(workspace, name)
    world.images.append(reference)
    assert images_holding(world.client, reference, token) == []
    assert token not in json.dumps(world.client.api.inspect_container(f"agentbox-{box}"))
    shutil.rmtree(claude_dir)
