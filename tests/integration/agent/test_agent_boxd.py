"""Claude Code in a boxd box, on the local boxd emulator (real SDK; machines are real containers), through
the playbooks a user runs. Issue 20: the agent on boxd, as tests/integration/agent/test_agent_claude_code.py
does it on the local engine: world.py's World, stand-in and Claude Code checks serve both.

- The stand-in for the Messages API (tests/fixtures/messages_standin.py) runs inside the box, on the box's
  own loopback, and ANTHROPIC_BASE_URL points at 127.0.0.1 in the box: the box reaches nothing else, and
  the test talks only to the emulator on the host's 127.0.0.1 (every box command goes through boxd's
  exec, never the container).
- The real CLI's hooks report working, then idle; the stand-in's one `Write` tool call writes the file.
  A command that asks something reports waiting, and the inventory's `boxd:` key shows it (from the relay's
  record: the relay reads boxd boxes too).
- The key lives on a tmpfs in the machine: not in its labels or env, not on its disk, not in a boxd
  snapshot (`checkpoint.yml`).
- A suspend keeps the agent's process (memory kept); a box stop and start runs Claude Code again with
  `--continue` and the key given again from the host; `agent.yml -e state=stopped` ends the session and a
  start brings it back.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.boxd_emulator import running_emulator
from tests.integration.agent import world as shared
from tests.integration.agent.world import a_key_and_a_port, claude_code_does_the_first_prompt, claude_code_resumed

pytestmark = pytest.mark.integration


class BoxdWorld(shared.World):
    """world.py's World with every playbook on `provider=boxd` and every box command through boxd's exec."""

    def __init__(self, client: docker.DockerClient, root: Path, emu: Any) -> None:
        from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

        super().__init__(client, root)
        self.emu = emu
        self.provider = BoxdProvider(token=emu.token, base_url=emu.base_url)
        # Shipping fetches over file:// as root from a workspace owned by uid 1000.
        self.env = {"BOXD_BASE_URL": emu.base_url, "BOXD_TOKEN": emu.token, "GIT_CONFIG_COUNT": "1",
                    "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}  # fmt: skip

    def playbook(
        self, name: str, extra: dict[str, Any], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return super().playbook(name, {"provider": "boxd", **extra}, {**self.env, **(env or {})})

    provider_args = {"provider": "boxd"}

    def module_env(self) -> dict[str, str]:
        return {**super().module_env(), **self.env}

    def sh(self, box: str, script: str, user: str = "vscode") -> tuple[int, str]:
        run = self.provider.exec(box, ["bash", "-c", script], user=user, timeout=120)
        return run.rc, (run.stdout + run.stderr).decode("utf-8", "replace")

    def machine(self, box: str) -> dict[str, Any]:
        facts = self.provider.find(box)
        assert facts is not None, box
        found = self.emu.control.machine(facts.container)
        assert found is not None, facts.container
        return found

    def inventory(self, box: str, **options: Any) -> dict[str, Any]:
        return super().inventory(box, boxd={"base_url": self.emu.base_url}, **options)

    # The stand-in's files go to /dev/shm, a tmpfs no snapshot keeps; it is started detached from the exec's
    # streams (every box command goes through boxd's exec, never the container).
    standin_dir = "/dev/shm/standin"

    def start_standin(self, box: str, port: int) -> None:
        code, output = self.sh(box, f"mkdir -p {self.standin_dir} && cat > {self.standin_dir}/api.py <<'EOF'\n"
                                    f"{shared.STANDIN.read_text()}\nEOF")  # fmt: skip
        assert code == 0, output
        code, output = self.sh(
            box,
            f"setsid python3 {self.standin_dir}/api.py {port} {self.standin_dir}/log.jsonl "
            "/workspace/from-agent.txt 'written by Claude Code\n' </dev/null >/dev/null 2>&1 &",
        )
        assert code == 0, output
        self.wait_for(box, f"curl -fsS http://127.0.0.1:{port}/v1/models >/dev/null", "the stand-in answering")

    def attach_command(self, box: str) -> str:
        # The one ssh form every output prints: -F while ~/.ssh/config does not include the aliases.
        return f"ssh -F ~/.agentbox/ssh_config -t agentbox-{box} tmux attach -t claude"


@pytest.fixture
def world(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[BoxdWorld]:
    with running_emulator(image=box_image) as emu:
        made = BoxdWorld(docker_client, tmp_path, emu)
        try:
            yield made
        finally:
            made.cleanup()


def snapshot_images(client: docker.DockerClient, emu: Any) -> list[str]:
    """The emulator's snapshots are images it committed from the machine's container (disk only)."""
    return [tag for image in client.images.list(name="boxd-emu-snapshot") for tag in image.tags
            if emu.instance_id in tag]  # fmt: skip


def test_claude_code_on_boxd_with_a_scripted_api_in_the_box(world: BoxdWorld, workspace: Path) -> None:
    box = world.box(workspace)
    key, port = a_key_and_a_port()
    world.start_standin(box, port)
    host_env = {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": key}
    # The file, the states, the key and the prompt at the API, the argv (world.py, as on the local engine).
    pid = claude_code_does_the_first_prompt(world, box, key, host_env)

    # A question asked (waiting), as a second session, reaches the inventory through its `boxd:` key.
    ask = (
        'agentbox-ctl agent-state waiting; read -r answer; echo "$answer" > /workspace/answer.txt; exec sleep infinity'
    )
    world.ok("agent.yml", {"box": box, "agent": "helper", "command": ask, "session": "helper"})
    world.wait_for(box, "grep -q waiting /run/agentbox/agents/helper.state.json", "waiting")
    # From the relay's record: it reads the box at its next pass (every second in the test's HOME).
    world.recorded(box, "waiting", "the relay recording waiting")
    listing = world.inventory(box)
    assert listing["agent_waiting"]["hosts"] == [box] and box in listing["boxd"]["hosts"], listing
    assert listing["_meta"]["hostvars"][box]["agentbox_agent_state"] == "waiting"
    world.ok("agent.yml", {"box": box, "agent": "helper", "command": ask, "session": "helper", "state": "stopped"})
    assert json.loads(world.sh(box, "cat /run/agentbox/agents/helper.state.json")[1])["state"] == "stopped"

    # The key is on a tmpfs in the machine: not in its labels or env, its disk, or a boxd snapshot.
    assert world.sh(box, "stat -f -c %T /run/agentbox/agents/claude/")[1].strip() == "tmpfs"
    assert key not in json.dumps(world.machine(box))
    leaked = world.sh(box, f"grep -rlF {key} /home /workspace/ /etc /var/lib/agentbox /tmp; true", user="root")[1]
    assert leaked.split() == [], leaked
    out = world.ok("checkpoint.yml", {"box": box, "checkpoint": "ck-agent"})
    assert key not in out
    snapshots = snapshot_images(world.client, world.emu)
    assert len(snapshots) == 1, snapshots
    assert shared.images_holding(world.client, snapshots[0], key) == []

    # Suspended and resumed: the memory is kept, so the very same process runs on.
    world.ok("box_state.yml", {"box": box, "state": "paused"})
    assert world.machine(box)["status"] == "suspended"
    world.ok("box_state.yml", {"box": box, "state": "started"}, env=host_env)
    assert world.machine(box)["status"] == "running"
    assert world.sh(box, "tmux has-session -t claude && cat /run/agentbox/agents/claude.pid")[1].strip() == pid

    # A box stop and start: Claude Code runs again, resuming its conversation (the prompt not replayed),
    # the key given again from the host (the tmpfs was emptied).
    world.ok("box_state.yml", {"box": box, "state": "stopped"}, env=host_env)
    assert world.machine(box)["status"] == "stopped"
    world.ok("box_state.yml", {"box": box, "state": "started"}, env=host_env)
    claude_code_resumed(world, box, key, "after the start")

    # Stopped gracefully, then started again: the session ends, the state says so, and it comes back.
    world.ok("agent.yml", {"box": box, "state": "stopped"})
    assert world.sh(box, "tmux has-session -t claude")[0] != 0
    assert json.loads(world.sh(box, "cat /run/agentbox/agents/claude.state.json")[1])["state"] == "stopped"
    world.ok("agent.yml", {"box": box}, env=host_env)
    world.wait_for(box, "tmux has-session -t claude && grep -q idle /run/agentbox/agents/claude.state.json",
                   "claude started again")  # fmt: skip
