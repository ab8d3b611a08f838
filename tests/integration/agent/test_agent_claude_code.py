"""Claude Code in real boxes on the local engine, through the playbooks a user runs (test_agent_box.py's World
and fixtures: a temporary HOME whose relay reads the boxes every second).

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
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent import test_agent_box as shared
from tests.integration.agent.test_agent_box import PROMPT, STANDIN, World, checkpoint_image, images_holding, said

pytestmark = pytest.mark.integration

world = shared.world
workspace = shared.workspace


def test_claude_code_end_to_end_with_a_scripted_api_in_the_box(world: World, workspace: Path) -> None:
    box = world.box(workspace)
    key = f"sk-ant-test-{secrets.token_hex(12)}"
    port = 8000 + secrets.randbelow(1000)
    container = world.client.containers.get(f"agentbox-{box}")
    # The stand-in plays the API, which lives outside the box: its files (a log of the keys it saw) go
    # on the tmpfs, where no checkpoint looks.
    code, _output = world.sh(box, f"mkdir -p /run/agentbox/standin && cat > /run/agentbox/standin/api.py <<'EOF'\n{STANDIN.read_text()}\nEOF")
    assert code == 0
    container.exec_run(
        ["python3", "/run/agentbox/standin/api.py", str(port), "/run/agentbox/standin/log.jsonl", "/workspace/from-agent.txt",
         "written by Claude Code\n"],
        user="vscode",
        detach=True,
    )  # fmt: skip
    world.wait_for(box, f"curl -fsS http://127.0.0.1:{port}/v1/models >/dev/null", "the stand-in answering")

    # Many retries: an API that cannot be reached (below) keeps the agent retrying while the test looks at it.
    host_env = {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": key,
                "CLAUDE_CODE_MAX_RETRIES": "1000"}  # fmt: skip
    out = world.ok("agent.yml", {"box": box, "prompt": PROMPT}, env=host_env)
    attach = f"docker -H {os.environ['DOCKER_HOST']} exec -it -u vscode agentbox-{box} tmux attach -t claude"
    assert attach in " ".join(out.split())  # the output callback wraps long lines
    assert key not in out

    # The file the tool call wrote, in /workspace, and the states the real hooks reported.
    assert world.wait_for(box, "cat /workspace/from-agent.txt", "the agent's file") == "written by Claude Code\n"
    history = world.wait_for(
        box,
        "h=/run/agentbox/agents/claude.history; grep -q '\"working\"' $h && tail -1 $h | grep -q '\"idle\"' && cat $h",
        "the state going idle",
    )
    states = [json.loads(line)["state"] for line in history.splitlines()]
    assert "working" in states and states.index("working") < len(states) - 1 - states[::-1].index("idle"), states
    status = world.sh(box, "agentbox-ctl status")[1]
    assert "agent: claude (tmux session claude) idle since" in status, status

    # The key reached the API (the host's key, from its environment) and the prompt arrived intact.
    requests = [json.loads(line) for line in world.sh(box, "cat /run/agentbox/standin/log.jsonl")[1].splitlines()]
    conversation = [r for r in requests if r["tools"]]
    assert conversation and all(r["x_api_key"] == key for r in requests), requests
    assert any(PROMPT in text for r in conversation for text in r["user_texts"]), conversation[0]["user_texts"]
    pid = world.sh(box, "cat /run/agentbox/agents/claude.pid")[1].strip()
    argv = world.sh(box, f"cat /proc/{pid}/cmdline")[1].split("\0")
    assert argv[0] == "claude" and "--dangerously-skip-permissions" in argv and argv[-2:] == [PROMPT, ""], argv

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

    def api_requests() -> list[dict[str, Any]]:
        return [json.loads(line) for line in world.sh(box, "cat /run/agentbox/standin/log.jsonl")[1].splitlines()]

    world.wait_until(lambda: any(second in text for r in api_requests() if r["tools"] for text in r["user_texts"]),
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
    resumed_argv = (
        "p=$(cat /run/agentbox/agents/claude.pid) && tmux has-session -t claude && "
        "tr '\\0' '\\n' < /proc/$p/cmdline | grep -qx -- --continue && tr '\\0' '\\n' < /proc/$p/cmdline"
    )
    world.ok("box_state.yml", {"box": box, "state": "stopped"}, env=host_env)
    world.ok("box_state.yml", {"box": box, "state": "started"}, env=host_env)
    argv = world.wait_for(box, resumed_argv, "claude --continue after the start").splitlines()
    assert PROMPT.splitlines()[0] not in argv and "--dangerously-skip-permissions" in argv, argv
    assert world.sh(box, "cat /run/agentbox/agents/claude/api-key")[1] == key
    restored = world.box(workspace, checkpoint=reference.rsplit(":", 1)[1])
    world.wait_for(restored, resumed_argv, "claude --continue in the restored box")

    # The stand-in went with the box's stop: the API cannot be reached, and the agent given a prompt retries on
    # connection errors, `working` all along. No progress (its transcript stays as it was): stalled after
    # stalled_minutes (3 s here), and the idle policy pauses its box as an idle one.
    world.ok("agent.yml", {"box": box, "prompt": "One more thing, please."}, env=host_env)
    world.wait_for(box, "grep -q working /run/agentbox/agents/claude.state.json", "working on the prompt")

    def query(minutes: float) -> str:
        return said(world.ok("agent.yml", {"box": box, "state": "query", "stalled_minutes": minutes}))

    world.wait_until(lambda: "state: stalled since" in query(0.05), "claude shown stalled")
    assert "state: working since" in query(10)
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
    world.ok("checkpoint.yml", {"box": box, "checkpoint": name})
    reference = checkpoint_image(workspace, name)
    world.images.append(reference)
    assert images_holding(world.client, reference, token) == []
    assert token not in json.dumps(world.client.api.inspect_container(f"agentbox-{box}"))
    shutil.rmtree(claude_dir)
