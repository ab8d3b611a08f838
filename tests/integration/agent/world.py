"""What the agent tests share (no tests here): the World a test's playbooks run in, and the checks of the real
Claude Code that test_agent_claude_code.py (a box on the local engine) and test_agent_boxd.py (a boxd box on
its emulator) both make, so the two providers are held to one list.

Every playbook runs with a temporary HOME (no credentials of the machine running the tests can leak in),
whose idle-policy file has the relay read the boxes every second (the default is every 30 s; the rest of
the suite switches the relay's policy off). The boxes are removed at the end by agentbox_box's own main
(tests/conftest.py (run_module_direct)), not by destroy_box.yml: that playbook is proven elsewhere.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import docker

from tests.conftest import run_module_direct
from tests.unit.support.inprocess import run_module_inprocess

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")
ANSIBLE_INVENTORY = str(REPO / ".venv" / "bin" / "ansible-inventory")
STANDIN = REPO / "tests" / "fixtures" / "messages_standin.py"
# The host's variables a playbook of these tests never sees (the machine's own keys must not leak in).
HOST_CREDENTIALS = ("ANTHROPIC_", "CLAUDE_CODE_", "OPENAI_")
# Quotes of both kinds, a newline, a tab, shell metacharacters and non-ASCII: all must arrive intact.
PROMPT = "Write the file, please: \"quoted\" and 'single' $HOME `id` ; \\ back\nsecond line\tü ✓ 日本語 🚀"
# Claude Code's process once it runs again after a start: `--continue`, in its tmux session; its argv.
RESUMED_ARGV = (
    "p=$(cat /run/agentbox/agents/claude.pid) && tmux has-session -t claude && "
    "tr '\\0' '\\n' < /proc/$p/cmdline | grep -qx -- --continue && tr '\\0' '\\n' < /proc/$p/cmdline"
)


class World:
    """A temp HOME, one workspace, and the boxes and images the test made (removed at the end)."""

    def __init__(self, client: docker.DockerClient, root: Path):
        self.client = client
        self.root = root
        # Short: the relay's socket paths (under HOME) are bounded to 107 bytes; removed by cleanup().
        self.home = Path(tempfile.mkdtemp(prefix="abh-", dir="/tmp"))
        self.home.chmod(0o755)
        # The relay that the first box's create starts for this HOME reads its boxes' agents every second: its idle
        # policy, which the suite turns off for the shared HOME (conftest), is on in this private one.
        policy = self.home / ".agentbox" / "idle" / "policy.json"
        policy.parent.mkdir(parents=True)
        policy.write_text(json.dumps({"interval": 1}))
        self.boxes: list[str] = []
        self.images: list[str] = []

    def playbook(
        self, name: str, extra: dict[str, Any], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        full_env = {key: value for key, value in os.environ.items() if not key.startswith(HOST_CREDENTIALS)}
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
        """A running box of `workspace` (`checkpoint` to restore one). With `agent`, create_box.yml makes it and
        starts that agent (its second play); without, agentbox_box's own main in a fresh Python, as the
        playbook's create task runs it: the create is these tests' set-up, create_box.yml is proven elsewhere."""
        name = f"agt-{secrets.token_hex(3)}"
        self.boxes.append(name)
        if "agent" in extra:
            self.ok("create_box.yml", {"workspace": str(workspace), "box": name, "checkpoint": "none", **extra})
            return name
        args = {"name": name, "workspace": str(workspace), "image": "agentbox/box:latest", "checkpoint": "none",
                "state": "started", **self.provider_args, **extra}  # fmt: skip
        made = run_module_direct("agentbox_box", args, env=self.module_env())
        assert not made["failed"], made
        return name

    # The provider's arguments and environment for a module run directly (the local engine: none).
    provider_args: dict[str, Any] = {}

    def module_env(self) -> dict[str, str]:
        """A module's environment as playbook() gives it: this HOME, the relay's idle policy from its file."""
        return {"HOME": str(self.home), "AGENTBOX_IDLE_INTERVAL": ""}

    def task(self, module: str, args: dict[str, Any]) -> dict[str, Any]:
        """The module's own main() in this process (run_module_inprocess: the task its action plugin runs in a
        playbook), in the environment playbook() gives a playbook: this HOME, none of the host's credential
        variables. For set-up and bad input, where the path through Ansible is not what a test proves."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(HOST_CREDENTIALS)}
        with mock.patch.dict(os.environ, {**env, **self.module_env()}, clear=True):
            return run_module_inprocess(module, {**self.provider_args, **args})

    # Where the API stand-in keeps its files: on a tmpfs no checkpoint looks at (it plays the API, which lives
    # outside the box; its log holds the keys it saw).
    standin_dir = "/run/agentbox/standin"

    def start_standin(self, box: str, port: int) -> None:
        """The Messages API stand-in on the box's loopback, as vscode, detached."""
        code, output = self.sh(box, f"mkdir -p {self.standin_dir} && cat > {self.standin_dir}/api.py <<'EOF'\n"
                                    f"{STANDIN.read_text()}\nEOF")  # fmt: skip
        assert code == 0, output
        self.client.containers.get(f"agentbox-{box}").exec_run(
            ["python3", f"{self.standin_dir}/api.py", str(port), f"{self.standin_dir}/log.jsonl",
             "/workspace/from-agent.txt", "written by Claude Code\n"],
            user="vscode",
            detach=True,
        )  # fmt: skip
        self.wait_for(box, f"curl -fsS http://127.0.0.1:{port}/v1/models >/dev/null", "the stand-in answering")

    def api_requests(self, box: str) -> list[dict[str, Any]]:
        """Every request the stand-in got, in order."""
        return [json.loads(line) for line in self.sh(box, f"cat {self.standin_dir}/log.jsonl")[1].splitlines()]

    def attach_command(self, box: str) -> str:
        """The one way to attach to Claude Code's session that agent.yml prints for this provider."""
        return f"docker -H {os.environ['DOCKER_HOST']} exec -it -u vscode agentbox-{box} tmux attach -t claude"

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

    def recorded(self, box: str, state: str, what: str) -> None:
        """Wait until the relay's record (~/.agentbox/relay/agents.json of this HOME, what the inventory reads)
        holds `state` for the box's agent: one file read a try, where polling the inventory starts Ansible each
        time. The caller then asks the inventory once."""

        def found() -> bool:
            try:
                record = json.loads((self.home / ".agentbox" / "relay" / "agents.json").read_text())
            except (OSError, ValueError):
                return False
            return any(entry.get("name") == box and (entry.get("agent") or {}).get("state") == state
                       for entry in record.get("boxes", {}).values())  # fmt: skip

        self.wait_until(found, what)

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
            env={**os.environ, **self.module_env(), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
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
        run_module_direct("agentbox_box", {"name": box, "state": "absent", "delete_branch": True,
                                           **self.provider_args}, env=self.module_env())  # fmt: skip

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


def claude_code_does_the_first_prompt(world: World, box: str, key: str, host_env: dict[str, str]) -> str:
    """agent.yml with PROMPT, the key and the stand-in's address in the host's environment: it prints how to
    attach and never the key; the stand-in's one `Write` tool call writes the file in /workspace; the CLI's
    real hooks report working, then idle; the stand-in saw the host's key on every request and the prompt
    intact; Claude Code runs with the prompt as its last argument. Returns its pid."""
    out = world.ok("agent.yml", {"box": box, "prompt": PROMPT}, env=host_env)
    assert world.attach_command(box) in said(out), out[-2000:]  # the output callback wraps long lines
    assert key not in out

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

    requests = world.api_requests(box)
    conversation = [r for r in requests if r["tools"]]
    assert conversation and all(r["x_api_key"] == key for r in requests), requests
    assert any(PROMPT in text for r in conversation for text in r["user_texts"]), conversation[0]["user_texts"]
    pid = world.sh(box, "cat /run/agentbox/agents/claude.pid")[1].strip()
    argv = world.sh(box, f"cat /proc/{pid}/cmdline")[1].split("\0")
    assert argv[0] == "claude" and "--dangerously-skip-permissions" in argv and argv[-2:] == [PROMPT, ""], argv
    return pid


def claude_code_resumed(world: World, box: str, key: str | None, what: str) -> None:
    """After a box start (or a restore): Claude Code runs again with `--continue`, resuming its conversation
    without replaying the prompt; with `key`, the key is given again from the host onto the tmpfs (a stop
    empties it)."""
    argv = world.wait_for(box, RESUMED_ARGV, f"claude --continue {what}").splitlines()
    assert PROMPT.splitlines()[0] not in argv and "--dangerously-skip-permissions" in argv, argv
    if key is None:
        return
    assert world.sh(box, "cat /run/agentbox/agents/claude/api-key")[1] == key
    assert world.sh(box, "stat -f -c %T /run/agentbox/agents/claude/")[1].strip() == "tmpfs"


def a_key_and_a_port() -> tuple[str, int]:
    """A fresh fake API key (so a search for it can only find this test's copies) and a port for the stand-in."""
    return f"sk-ant-test-{secrets.token_hex(12)}", 8000 + secrets.randbelow(1000)
