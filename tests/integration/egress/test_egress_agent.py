"""Claude Code in a box with an egress policy (docs/egress.md, "Agents' credentials"): the real CLI talks to
its base URL at the gateway's in-box endpoint with a placeholder key; the gateway on the host adds the
host's key and carries the request to a stand-in Messages API on the host's 127.0.0.1 (the relay's
AGENTBOX_GATEWAY_UPSTREAM_ANTHROPIC, a host setting no box can change), which checks the key it gets.
The key is in no file, tmpfs, environment or container config of the box, and `agentbox-ctl status` names
it (its kind and source) without its value."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.agent import conftest as agent_fixtures
from tests.integration.agent.world import PROMPT, REPO, STANDIN, World

pytestmark = pytest.mark.integration

world = agent_fixtures.world  # the agent tests' fixtures, shared
workspace = agent_fixtures.workspace

RELAY = str(REPO / "scripts/agentbox-relay")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The stand-in Messages API on the host's loopback: its port and the log of what it received."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "api.jsonl"
    process = subprocess.Popen([sys.executable, str(STANDIN), str(port), str(log), "/workspace/from-agent.txt",
                                "written through the gateway\n"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield port, log
    finally:
        process.terminate()
        process.wait(10)


def test_claude_code_gets_the_hosts_key_added_by_the_gateway_and_the_box_never_holds_it(
    world: World, workspace: Path, standin: tuple[int, Path]
) -> None:
    port, log = standin
    # The relay (and its gateway) of this HOME, started with the test-only upstream before the box exists.
    env = {**os.environ, "HOME": str(world.home), "AGENTBOX_GATEWAY_UPSTREAM_ANTHROPIC": f"http://127.0.0.1:{port}"}
    subprocess.run([RELAY, "start"], env=env, capture_output=True, check=True)
    box = world.box(workspace, egress="allowlist")
    key = f"sk-ant-test-{secrets.token_hex(12)}"
    out = world.ok("agent.yml", {"box": box, "prompt": PROMPT}, env={"ANTHROPIC_API_KEY": key,
                                                                     "CLAUDE_CODE_MAX_RETRIES": "1000"})
    assert key not in out
    assert world.wait_for(box, "cat /workspace/from-agent.txt", "the agent's file") == "written through the gateway\n"

    # The stand-in got the host's key on every request, and the prompt intact.
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    conversation = [r for r in requests if r["tools"]]
    assert conversation and all(r["x_api_key"] == key for r in requests), requests
    assert any(PROMPT in text for r in conversation for text in r["user_texts"])
    audit = [json.loads(line) for line in (world.home / ".agentbox/gateway/audit.jsonl").read_text().splitlines()]
    api = [line for line in audit if line["box"] == box and line["host"] == "127.0.0.1"]
    assert api and all(line["reason"].endswith("ANTHROPIC_API_KEY added") for line in api), api

    # The agent runs against the gateway with the placeholder; the key is nowhere in the box.
    pid = world.sh(box, "cat /run/agentbox/agents/claude.pid")[1].strip()
    # (A process's environ is readable by its own user only: root in the box lacks CAP_SYS_PTRACE.)
    environ = world.sh(box, f"tr '\\0' '\\n' < /proc/{pid}/environ")[1].splitlines()
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:3128/anthropic" in environ, environ
    found = world.sh(box, f"grep -rlsF -D skip -e '{key}' / --exclude-dir=proc --exclude-dir=sys", user="root")[1]
    assert found == "", found  # every file, the tmpfs included
    for user in ("vscode", "root"):
        count = world.sh(box, f"cat /proc/[0-9]*/environ 2>/dev/null | grep -caF -e '{key}'", user=user)[1]
        assert count.strip() == "0", (user, count)
    attrs = world.client.api.inspect_container(f"agentbox-{box}")
    assert key not in json.dumps(attrs)
    # agentbox-ctl status names the credential the gateway adds, never its value.
    status = world.sh(box, "agentbox-ctl status")[1]
    assert "credential: Claude Code: API key from the host's ANTHROPIC_API_KEY via the gateway" in status, status
    assert key not in status
