"""The agent CLIs baked into the box image, run as the box user on the real engine.

The role builds the image with every known agent under a test repository (the Claude layer is shared
with agentbox/box:latest when that is current, so only Codex and OpenCode are fetched from npm), then
each CLI answers --version as vscode; Codex and OpenCode start through playbooks/agent.yml in a box of
that image (flags, prompt, key in the process only, their hook settings); an unknown agent name fails
before any build.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import chown_tree, run_module_direct
from tests.integration.box.conftest import box_task

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")
pytestmark = pytest.mark.integration
EXPECTED = {"claude": "(Claude Code)", "codex": "codex-cli ", "opencode": ""}


@pytest.fixture(scope="module")
def client(docker_client: docker.DockerClient) -> docker.DockerClient:
    """The engine (tests/conftest.py fails the test when there is none: never a skip)."""
    return docker_client


def build(tmp_path: Path, repository: str, agents: list[str]) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "build.yml"
    playbook.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                    "roles": [
                        {
                            "role": "agentbox.box.box_image",
                            "box_image_tag": repository,
                            "box_image_agents": agents,
                            "box_image_build_log": str(tmp_path / "build.log"),
                        }
                    ],
                }
            ]
        )
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", str(playbook)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def playbook(tmp_path: Path, name: str, extra: dict[str, Any], env: dict[str, str] | None = None) -> str:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_CODE_", "OPENAI_"))}
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, f"playbooks/{name}", "-e", json.dumps(extra)],
        cwd=REPO,
        env={**clean, "HOME": str(home), **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"{name}: {done.stdout[-4000:]}"
    return done.stdout


def codex_and_opencode_in_a_box(client: Any, tmp_path: Path, image: str, workspace: Path) -> None:
    box = f"agi-{secrets.token_hex(3)}"
    key = f"sk-openai-test-{secrets.token_hex(8)}"
    container = None
    try:
        # The box by agentbox_box's main in this process, the task create_box.yml runs (create_box.yml with
        # image= is test_playbook_inputs.py's): what is tested here is the agents in it.
        (tmp_path / "home").mkdir(exist_ok=True)
        made = box_task({"name": box, "workspace": str(workspace), "image": image, "checkpoint": "none",
                         "state": "started"}, env={"HOME": str(tmp_path / "home")})  # fmt: skip
        assert not made["failed"], made
        container = client.containers.get(f"agentbox-{box}")
        out = playbook(tmp_path, "agent.yml", {"box": box, "agent": "codex", "prompt": 'say "hi"\nthen stop'},
                       env={"OPENAI_API_KEY": key})  # fmt: skip
        assert key not in out and f"agentbox-{box} tmux attach -t codex" in " ".join(out.split())
        playbook(tmp_path, "agent.yml", {"box": box, "agent": "opencode", "prompt": "hello ü"})

        def in_box(script: str) -> str:
            code, output = container.exec_run(["bash", "-c", script], user="vscode")
            assert code == 0, output.decode()
            return output.decode()

        def argv_and_env(session: str) -> tuple[list[str], str]:
            pid = in_box(f"cat /run/agentbox/agents/{session}.pid").strip()
            return in_box(f"cat /proc/{pid}/cmdline").split("\0")[:-1], in_box(f"cat /proc/{pid}/environ")

        codex_argv, codex_env = argv_and_env("codex")
        assert codex_argv[-2:] == ["--dangerously-bypass-approvals-and-sandbox", 'say "hi"\nthen stop'], codex_argv
        assert f"OPENAI_API_KEY={key}" in codex_env.split("\0")
        opencode_argv, _environ = argv_and_env("opencode")
        assert opencode_argv[-2:] == ["--prompt", "hello ü"], opencode_argv
        assert key not in json.dumps(client.api.inspect_container(f"agentbox-{box}"))
        # Their hook settings: Codex's notify program and trusted /workspace, OpenCode's event plugin.
        config = in_box("cat ~/.codex/config.toml")
        assert 'notify = ["agentbox-agent", "notify"]' in config and '[projects."/workspace"]' in config
        assert "agentbox-ctl agent-state" in in_box("cat ~/.config/opencode/plugin/agentbox.js")
        in_box("AGENTBOX_AGENT_SESSION=codex agentbox-agent notify '{\"type\": \"agent-turn-complete\"}'")
        assert json.loads(in_box("cat /run/agentbox/agents/codex.state.json"))["state"] == "idle"
        sessions = in_box("tmux ls -F '#{session_name}'").split()
        assert sorted(sessions) == ["codex", "opencode"]
    finally:
        if container is not None:  # agentbox_box's own main: destroy_box.yml is proven elsewhere
            removed = run_module_direct("agentbox_box", {"name": box, "state": "absent", "delete_branch": True},
                                        env={"HOME": str(tmp_path / "home")})  # fmt: skip
            assert not removed["failed"], removed


def test_every_agent_cli_runs_as_vscode(client: Any, tmp_path: Path, repo_factory: Any) -> None:
    repository = f"agentbox-test/agents-{secrets.token_hex(4)}"
    try:
        done = build(tmp_path, repository, ["claude", "codex", "opencode"])
        assert done.returncode == 0, done.stdout[-4000:]
        image = client.images.get(f"{repository}:latest")
        assert image.labels["io.agentbox.agents"].split(",") == [
            "@anthropic-ai/claude-code@2.1.328",
            "@openai/codex@0.171.0",
            "opencode-ai@1.18.33",
        ]
        # One container: each CLI's version as vscode, and the glibc binaries only (npm's musl twins are removed
        # from the layers; find's complaints are counted too, so a directory vscode cannot read fails the check).
        script = ("for cli in claude codex opencode; do printf '%s=' $cli; $cli --version 2>&1 | tail -1; done; "
                  "printf 'musl=%s\\n' \"$(find /usr/local/lib/node_modules -name '*-linux-*-musl' 2>&1 | wc -l)\"; id -un")  # fmt: skip
        output = client.containers.run(image.id, ["sh", "-c", script], user="vscode", remove=True).decode()
        lines = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
        assert output.splitlines()[-1] == "vscode"
        assert lines["claude"].startswith("2.1.328 ") and EXPECTED["claude"] in lines["claude"], output
        assert lines["codex"] == "codex-cli 0.171.0", output
        assert lines["opencode"] == "1.18.33", output
        assert lines["musl"] == "0", output
        workspace = repo_factory("ws")
        chown_tree(workspace)
        codex_and_opencode_in_a_box(client, tmp_path, f"{repository}:latest", workspace)
    finally:
        for image in client.images.list(name=repository):
            for reference in image.tags:
                if reference.startswith(repository + ":"):
                    client.images.remove(reference)


def test_unknown_agent_fails_before_any_build(client: Any, tmp_path: Path) -> None:
    repository = f"agentbox-test/agents-{secrets.token_hex(4)}"
    done = build(tmp_path, repository, ["claude", "aider"])
    assert done.returncode != 0
    assert "box_image_agents names aider" in done.stdout and "claude, codex, opencode" in done.stdout, done.stdout
    assert client.images.list(name=repository) == []
