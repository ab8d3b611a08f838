"""Coding agents in real boxes on the local engine, through the playbooks a user runs.

The real Claude Code binary and its sign-in files are in test_agent_claude_code.py (which uses this
module's World and fixtures, as test_agent_boxd.py does).

- A custom command that reports states drives `agentbox_agent_state` and the agent_* groups of the
  inventory, read from the relay's record (no exec in the box), and its tmux session is there again after a
  box stop and start.
- A running agent takes a prompt and shows its screen through agent.yml, without attaching; one that works
  without progress (Claude Code looping on an API that drops every connection; a custom command that says
  `working` and then does nothing) is `stalled` after `stalled_minutes`, and the idle policy pauses it.
- Bad input: an unknown agent, a CLI missing from the image, no credentials, a paused box.

The boxes are removed at the end by agentbox_box's own main (tests/conftest.py (run_module_direct)), not by
destroy_box.yml: that playbook is proven elsewhere. Every playbook runs with a temporary HOME (no credentials
of the machine running the tests can leak in), whose idle-policy file has the relay read the boxes every second (the default is every 30 s; the rest of the
suite switches the relay's policy off).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo, run_module_direct

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")
ANSIBLE_INVENTORY = str(REPO / ".venv" / "bin" / "ansible-inventory")
STANDIN = REPO / "tests" / "fixtures" / "messages_standin.py"
# Quotes of both kinds, a newline, a tab, shell metacharacters and non-ASCII: all must arrive intact.
PROMPT = "Write the file, please: \"quoted\" and 'single' $HOME `id` ; \\ back\nsecond line\tü ✓ 日本語 🚀"


class World:
    """A temp HOME, one workspace, and the boxes and images the test made (removed at the end)."""

    def __init__(self, client: docker.DockerClient, root: Path):
        self.client = client
        self.root = root
        # Short: the relay's socket paths (under HOME) are bounded to 107 bytes; removed by cleanup().
        self.home = Path(tempfile.mkdtemp(prefix="abh-", dir="/tmp"))
        self.home.chmod(0o755)
        # The relay that create_box.yml starts for this HOME reads its boxes' agents every second: its idle
        # policy, which the suite turns off for the shared HOME (conftest), is on in this private one.
        policy = self.home / ".agentbox" / "idle" / "policy.json"
        policy.parent.mkdir(parents=True)
        policy.write_text(json.dumps({"interval": 1}))
        self.boxes: list[str] = []
        self.images: list[str] = []

    def playbook(
        self, name: str, extra: dict[str, Any], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        full_env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("ANTHROPIC_", "CLAUDE_CODE_", "OPENAI_"))
        }
        full_env.update({"HOME": str(self.home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                         "AGENTBOX_IDLE_INTERVAL": ""})  # fmt: skip
        full_env.update(env or {})
        return subprocess.run(
            [ANSIBLE_PLAYBOOK, f"playbooks/{name}", "-e", json.dumps(extra)],
            cwd=REPO,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )

    def ok(self, name: str, extra: dict[str, Any], env: dict[str, str] | None = None) -> str:
        done = self.playbook(name, extra, env)
        assert done.returncode == 0, f"{name} failed:\n{done.stdout[-5000:]}\n{done.stderr[-2000:]}"
        return done.stdout

    def box(self, workspace: Path, **extra: Any) -> str:
        name = f"agt-{secrets.token_hex(3)}"
        self.boxes.append(name)
        self.ok("create_box.yml", {"workspace": str(workspace), "box": name, "checkpoint": "none", **extra})
        return name

    def sh(self, box: str, script: str, user: str = "vscode") -> tuple[int, str]:
        container = self.client.containers.get(f"agentbox-{box}")
        code, output = container.exec_run(["bash", "-c", script], user=user)
        return code, output.decode("utf-8", "replace")

    def wait_for(self, box: str, script: str, what: str, timeout: float = 120) -> str:
        """Run `script` in the box until it exits 0; its output. A deadline, never a fixed sleep."""
        deadline = time.monotonic() + timeout
        while True:
            code, output = self.sh(box, script)
            if code == 0:
                return output
            if time.monotonic() > deadline:
                pane = self.sh(box, "tmux capture-pane -p -t claude 2>&1 | tail -30; cat /run/agentbox/agents/* 2>&1")
                raise AssertionError(f"{what}: not within {timeout:.0f}s; last output {output!r}\n{pane[1]}")
            time.sleep(0.2)

    def wait_until(self, check: Callable[[], Any], what: str, timeout: float = 120) -> Any:
        """check() until it returns something true; that. A deadline, never a fixed sleep."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                log = self.home / ".agentbox" / "relay" / "relay.log"
                tail = log.read_text()[-3000:] if log.exists() else "(no relay log)"
                raise AssertionError(f"{what}: not within {timeout:.0f}s; the relay's log ends:\n{tail}")
            time.sleep(0.3)

    def agent_state(self, box: str, **options: Any) -> str:
        """The inventory's agentbox_agent_state of the box."""
        return self.inventory(box, **options)["_meta"]["hostvars"][box]["agentbox_agent_state"]

    def execs_in(self, box: str, since: float, until: float) -> list[str]:
        """The execs the engine started in the box between two times (its own event log)."""
        events = self.client.api.events(since=f"{since:.9f}", until=f"{until:.9f}", decode=True,
                                        filters={"container": f"agentbox-{box}", "type": "container"})  # fmt: skip
        return [event["Action"] for event in events if event["Action"].startswith("exec_create")]

    def inventory(self, box: str, **options: Any) -> dict[str, Any]:
        config = self.root / "test.agentbox.yml"
        config.write_text(json.dumps({"plugin": "agentbox.box.boxes", "include": [box], **options}))
        done = subprocess.run(
            [ANSIBLE_INVENTORY, "-i", str(config), "--list"],
            cwd=REPO,
            env={**os.environ, "HOME": str(self.home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        # Values read from a box are marked unsafe; --list shows them wrapped.
        return json.loads(done.stdout, object_hook=lambda d: d.get("__ansible_unsafe", d) if len(d) == 1 else d)

    def destroy(self, box: str) -> None:
        """The box removed by agentbox_box's own main, under this HOME (destroy_box.yml is proven elsewhere)."""
        run_module_direct("agentbox_box", {"name": box, "state": "absent", "delete_branch": True},
                          env={"HOME": str(self.home)})  # fmt: skip

    def cleanup(self) -> None:
        for box in self.boxes:
            try:
                self.destroy(box)
            finally:  # whatever the module said, nothing of the box stays
                for container in self.client.containers.list(all=True, filters={"name": f"^/agentbox-{box}$"}):
                    container.remove(force=True, v=True)
        for reference in self.images:
            try:
                self.client.images.remove(reference, force=True)
            except docker.errors.APIError:
                pass
        shutil.rmtree(self.home, ignore_errors=True)  # the relay of this HOME stops once it is gone


@pytest.fixture
def world(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[World]:
    made = World(docker_client, tmp_path)
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "ws", {"README.md": "hello\n"})
    git(repo, "config", "user.name", "Host Person")
    git(repo, "config", "user.email", "host.person@example.invalid")
    chown_tree(repo)
    return repo


def said(out: str) -> str:
    """A playbook's output with its whitespace runs made one space: the output callback wraps long lines."""
    return " ".join(out.split())


def checkpoint_image(workspace: Path, name: str) -> str:
    project = hashlib.sha1(str(workspace.resolve()).encode()).hexdigest()[:16]
    return f"agentbox-ckpt-{project}:{name}"


def images_holding(client: docker.DockerClient, reference: str, needle: str) -> list[str]:
    """Files of the image's top layer that contain `needle`: a layered checkpoint's top layer is the box's
    changes (below it is the box image), a flattened one's is the box's whole file system."""
    driver = client.images.get(reference).attrs["GraphDriver"]
    assert driver["Name"] == "overlay2", f"the layer scan reads overlay2 directories; the engine uses {driver['Name']}"
    found = subprocess.run(
        ["grep", "-rlF", "--no-messages", needle, driver["Data"]["UpperDir"]],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.split()


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
    world.wait_until(lambda: world.agent_state(box) == "waiting", "the inventory showing waiting")
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
    world.wait_until(lambda: world.agent_state(box) == "idle", "the inventory showing idle")
    listing = world.inventory(box)
    assert listing["agent_idle"]["hosts"] == [box] and "hosts" not in listing.get("agent_waiting", {})
    history = world.sh(box, "cat /run/agentbox/agents/helper.history")[1]
    assert [json.loads(line)["state"] for line in history.splitlines()] == ["idle", "waiting", "working", "idle"]

    # A box stop and start: the session was started, so it runs again (a custom command from the top).
    world.ok("box_state.yml", {"box": box, "state": "stopped"})
    assert world.client.containers.get(f"agentbox-{box}").status == "exited"
    world.ok("box_state.yml", {"box": box, "state": "started"})
    world.wait_for(box, "tmux has-session -t helper && grep -q waiting /run/agentbox/agents/helper.state.json",
                   "the session back after the start")  # fmt: skip
    world.wait_until(lambda: world.agent_state(box) == "waiting", "the inventory showing waiting after the start")
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
    world.wait_until(lambda: world.agent_state(box, stalled_minutes=0.05) == "stalled", "the inventory: stalled")
    listing = world.inventory(box, stalled_minutes=0.05)
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
    done = world.playbook("agent.yml", {"box": box, "agent": "aider"})
    assert done.returncode != 0 and "unknown agent 'aider'" in done.stdout
    assert world.sh(box, "tmux ls")[0] != 0  # nothing started
    done = world.playbook("create_box.yml", {"workspace": str(workspace), "box": "never-made", "agent": "aider"})
    assert done.returncode != 0 and "unknown agent aider" in done.stdout
    assert not world.client.containers.list(all=True, filters={"name": "^/agentbox-never-made$"})

    # Codex is not in the default image: the message names the box_image_agents entry that adds it.
    done = world.playbook("agent.yml", {"box": box, "agent": "codex"})
    assert done.returncode != 0 and "add 'codex' to box_image_agents" in done.stdout, done.stdout[-2000:]

    # A paused box is resumed first; no credentials anywhere: a warning saying where it looked, and it starts.
    world.ok("box_state.yml", {"box": box, "state": "paused"})
    done = world.playbook("agent.yml", {"box": box})
    assert done.returncode == 0, done.stdout[-3000:]
    out = done.stdout + done.stderr  # Ansible prints warnings on stderr
    assert world.client.containers.get(f"agentbox-{box}").status == "running"
    assert "no credentials for claude found" in out and f"{world.home}/.claude/.credentials.json" in out
    assert "environment ANTHROPIC_*/CLAUDE_CODE_*" in out
    world.wait_for(box, "tmux has-session -t claude", "claude's session")
