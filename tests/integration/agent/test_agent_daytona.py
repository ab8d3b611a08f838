"""A coding agent in a Daytona box, on the local Daytona emulator (the real SDK; each sandbox a real container
of the box image). Issue 39, item 5: agents on every provider. world.py's World serves this provider as it
serves the local engine and boxd; every box command goes through Daytona's toolbox, never the container.

- agent.yml starts a custom command (no coding agent's CLI needed) with a first prompt, typed into its
  session (before tasks/_agent_task.py typed it, a custom command's first prompt was dropped: this failed),
  and prints the way to attach: the SSH alias, which reaches the agent's tmux session through the
  emulator's SSH gateway. The states the command reports reach the relay's record and the inventory's
  `daytona:` key.
- A box stop and start, and a pause (on Daytona: a stop, then an archive) and start, run the session again
  (a custom command from the top); the second failed before box/_box.py's set_state resumed the agents
  after a Daytona resume. A prompt for the running session is then typed in through the toolbox.

Boxes are made, stopped, paused and started by agentbox_box's own main (run_module_direct): what is
proven here is the agent, not those playbooks.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import run_module_direct
from tests.daytona_emulator import running_emulator
from tests.integration.agent import world as shared
from tests.integration.agent.world import said

pytestmark = pytest.mark.integration

# Waits for a line, records it, reports idle; reports waiting first (again after each start: from the top).
COMMAND = (
    "agentbox-ctl agent-state waiting; while IFS= read -r line; do agentbox-ctl agent-state working; "
    'printf "%s\\n" "$line" >> /workspace/prompts.txt; agentbox-ctl agent-state idle; done'
)
AGENT = {"agent": "helper", "command": COMMAND, "session": "helper"}


class DaytonaWorld(shared.World):
    """world.py's World with every box on `provider=daytona` and every box command through the toolbox."""

    def __init__(self, client: docker.DockerClient, root: Path, api_url: str, api_key: str) -> None:
        from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

        super().__init__(client, root)
        self.api_url = api_url
        self.provider = DaytonaProvider(api_key=api_key, api_url=api_url)
        # Shipping fetches over file:// as root from a workspace owned by uid 1000.
        self.env = {"DAYTONA_API_URL": api_url, "DAYTONA_API_KEY": api_key, "GIT_CONFIG_COUNT": "1",
                    "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}  # fmt: skip

    def playbook(
        self, name: str, extra: dict[str, Any], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return super().playbook(name, {"provider": "daytona", **extra}, {**self.env, **(env or {})})

    provider_args = {"provider": "daytona"}

    def module_env(self) -> dict[str, str]:
        return {**super().module_env(), **self.env}

    def module(self, module: str, **args: Any) -> dict[str, Any]:
        done = run_module_direct(module, {**self.provider_args, **args}, env=self.module_env())
        assert not done["failed"], done
        return done

    def sh(self, box: str, script: str, user: str = "vscode") -> tuple[int, str]:
        run = self.provider.exec(box, ["bash", "-c", script], user=user, timeout=120)
        return run.rc, (run.stdout + run.stderr).decode("utf-8", "replace")

    def sandbox_state(self, box: str) -> str:
        """Daytona's own word for the sandbox (started, stopped, archived), as its API gives it."""
        from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona_state import state_name

        return state_name(self.provider.get_sandbox(box, "reading its state").state)

    def inventory(self, box: str, **options: Any) -> dict[str, Any]:
        return super().inventory(box, daytona={"api_url": self.api_url}, **options)

    def through_alias(self, box: str, command: str) -> subprocess.CompletedProcess:
        """`command` through the box's SSH alias, as the printed attach line runs it (without its -t: the
        emulator's gateway gives no terminal), with this HOME's ssh_config and the API key to renew a token."""
        config = self.home / ".agentbox" / "ssh_config"
        return subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", f"agentbox-{box}", command],
                              capture_output=True, text=True, timeout=180, check=False,
                              env={**os.environ, **self.module_env(), "SSH_AUTH_SOCK": ""})  # fmt: skip

    def session_back(self, box: str, what: str) -> None:
        """The helper's session runs again after a start, from the top (it reports waiting), and the relay
        records that (its next pass)."""
        self.wait_for(box, "tmux has-session -t helper && grep -q waiting /run/agentbox/agents/helper.state.json",
                      what)  # fmt: skip
        self.recorded(box, "waiting", f"the relay recording waiting {what}")


@pytest.fixture
def world(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[DaytonaWorld]:
    with running_emulator(image=box_image) as (api_url, api_key, _admin):
        made = DaytonaWorld(docker_client, tmp_path, api_url, api_key)
        try:
            yield made
        finally:
            made.cleanup()


def test_custom_agent_on_daytona_takes_a_prompt_and_survives_a_stop_and_an_archive(
    world: DaytonaWorld, workspace: Path
) -> None:
    box = world.box(workspace)
    # Started with a first prompt: a command line of the user's has no place for it, so it is typed in.
    prompt = "the first task: \"quoted\" and 'single' $HOME `id` ; ü ✓"
    out = world.ok("agent.yml", {"box": box, "prompt": prompt, **AGENT})
    attach = f"ssh -F ~/.agentbox/ssh_config -t agentbox-{box} tmux attach -t helper"
    assert f"attach: {attach}" in said(out) and "sent: the prompt" in said(out), out[-2000:]
    assert world.wait_for(box, "cat /workspace/prompts.txt", "the prompt arriving") == prompt + "\n"
    history = world.wait_for(
        box,
        "h=/run/agentbox/agents/helper.history; grep -q working $h && tail -1 $h | grep -q idle && cat $h",
        "idle after the prompt",
    )
    assert [json.loads(line)["state"] for line in history.splitlines()] == ["idle", "waiting", "working", "idle"]
    # Its credentials' directory is a tmpfs in the sandbox, whose /run is on its disk.
    assert world.sh(box, "stat -f -c %T /run/agentbox/agents/")[1].strip() == "tmpfs"

    # The relay reads the box (through the toolbox) and the inventory lists its agent under `daytona`.
    world.recorded(box, "idle", "the relay recording idle")
    listing = world.inventory(box)
    assert listing["agent_idle"]["hosts"] == [box] and box in listing["daytona"]["hosts"], listing
    assert listing["_meta"]["hostvars"][box]["agentbox_agent_state"] == "idle"

    # The attach line's way in: its alias reaches the agent's tmux session, whose screen shows the prompt typed.
    screen = world.through_alias(box, "tmux capture-pane -p -J -t helper")
    assert screen.returncode == 0 and "the first task:" in screen.stdout, (screen.stdout, screen.stderr[-2000:])

    # A box stop and start: the session runs again, from the top.
    assert world.module("agentbox_box", name=box, state="stopped")["box"]["state"] == "stopped"
    assert world.sandbox_state(box) == "stopped"
    world.module("agentbox_box", name=box, state="started")
    world.session_back(box, "after a stop and start")

    # A pause is a stop and an archive on Daytona; a start brings the sandbox and its agent back.
    assert world.module("agentbox_box", name=box, state="paused")["box"]["state"] == "paused"
    assert world.sandbox_state(box) == "archived"
    world.module("agentbox_box", name=box, state="started")
    assert world.sandbox_state(box) == "started"
    world.session_back(box, "after an archive and start")
    # It takes a prompt while it runs (typed in through the toolbox, the same process), and what it wrote before
    # the stops is on the sandbox's disk still.
    pid = world.sh(box, "cat /run/agentbox/agents/helper.pid")[1]
    sent = world.module("agentbox_agent", box=box, prompt="after the archive", **AGENT)
    assert sent["sent"] and sent["attach"] == attach, sent
    assert world.wait_for(box, "grep -c . /workspace/prompts.txt | grep -qx 2 && cat /workspace/prompts.txt",
                          "the second prompt") == f"{prompt}\nafter the archive\n"  # fmt: skip
    assert world.sh(box, "cat /run/agentbox/agents/helper.pid")[1] == pid
