"""The agent CLIs baked into the box image, run as the box user on the real engine.

The role builds the image with every known agent under a test repository (the Claude layer is shared
with agentbox/box:latest when that is current, so only Codex and OpenCode are fetched from npm), then
each CLI answers --version as vscode, and an unknown agent name fails before any build.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

REPO = Path(__file__).resolve().parents[2]
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


def test_every_agent_cli_runs_as_vscode(client: Any, tmp_path: Path) -> None:
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
        script = "for cli in claude codex opencode; do printf '%s=' $cli; $cli --version 2>&1 | tail -1; done; id -un"
        output = client.containers.run(image.id, ["sh", "-c", script], user="vscode", remove=True).decode()
        lines = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
        assert output.splitlines()[-1] == "vscode"
        assert lines["claude"].startswith("2.1.328 ") and EXPECTED["claude"] in lines["claude"], output
        assert lines["codex"] == "codex-cli 0.171.0", output
        assert lines["opencode"] == "1.18.33", output
        # The glibc binaries only: npm's musl twins are removed from the layers.
        musl = client.containers.run(
            image.id, ["sh", "-c", "find /usr/local/lib/node_modules -name '*-linux-*-musl' | wc -l"], remove=True
        ).decode()
        assert musl.strip() == "0"
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
