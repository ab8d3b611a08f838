"""doctor.yml on the real engines: one line per check, the fix with each failure, a failing run when a
check fails. This machine's box engine and image, a private HOME's relay, keys and sign-ins, a remote
engine over SSH (the worker's shared test engine: SSH and Docker answer, no box engine, so its isolation
fails with the set-up command; it holds the box image under a test tag only, so agentbox/box:latest is
not there), and an engine address where nothing answers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.support.engines import EngineFleet, free_port

pytestmark = pytest.mark.integration
# The agents' credentials in the environment and the key override: the checks must see only this HOME's.
SIGN_INS = ("ANTHROPIC_", "OPENAI_", "CLAUDE_CODE_", "AGENTBOX_SSH_KEY")


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="abd-", dir="/tmp"))  # short: the relay's socket lives under HOME
    path.chmod(0o755)
    yield path
    subprocess.run([str(REPO / "scripts/agentbox-relay"), "stop"], env={**os.environ, "HOME": str(path)},
                   capture_output=True, check=False)  # fmt: skip
    shutil.rmtree(path, ignore_errors=True)


def doctor(home: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """Exit status, and each printed check line by its 'where: name'."""
    done = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/doctor.yml"), *extra],
        env={**{key: value for key, value in os.environ.items() if not key.startswith(SIGN_INS)},
             "HOME": str(home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             **(env or {})},
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = {}
    for line in done.stdout.splitlines():
        found = re.match(r"\s*(ok|WARN|FAIL)\s+(.+?: [^:]+?)(?:: (.*))?$", line.strip().strip('",'))
        if found:
            lines[found.group(2)] = line.strip().strip('",')
    assert lines, done.stdout + done.stderr
    return done.returncode, lines


def test_doctor_on_this_machine_says_what_is_missing_then_ok(home: Path) -> None:
    rc, lines = doctor(home, "-e", "agents=codex")
    assert rc != 0
    assert lines["box engine: answers and isolates"].startswith("ok")
    assert lines["box engine: box image"].startswith("ok")
    relay = lines["this machine: relay"]
    assert relay.startswith("FAIL") and "fix: ansible-playbook playbooks/relay.yml" in relay
    gateway = lines["this machine: egress gateway"]  # part of the relay: cannot run without it
    assert gateway.startswith("FAIL") and "cannot run: the gateway runs in the relay" in gateway
    assert lines["this machine: ssh CLI"].startswith("ok") and lines["this machine: git CLI"].startswith("ok")
    keys = lines["this machine: keys"]
    assert keys.startswith("FAIL") and "fix:" in keys and "ssh-keygen -t ed25519" in keys
    codex = lines["this machine: codex sign-in"]  # asked for: a failure
    assert codex.startswith("FAIL") and "fix: ansible-playbook playbooks/agent_login.yml -e agent=codex" in codex
    assert lines["this machine: claude sign-in"].startswith("WARN")  # not asked for: worth knowing only

    # Put each right: a relay, a key, a sign-in. The same checks pass.
    subprocess.run([str(REPO / "scripts/agentbox-relay"), "start"], env={**os.environ, "HOME": str(home)},
                   capture_output=True, check=True)  # fmt: skip
    (home / ".ssh").mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh/id_ed25519")], check=True)
    sign_in = home / ".agentbox/agents/codex/.codex/auth.json"
    sign_in.parent.mkdir(parents=True)
    sign_in.write_text('{"tokens": {"access_token": "test"}}')
    _rc, lines = doctor(home, "-e", "agents=codex")
    assert lines["this machine: relay"].startswith("ok")
    assert lines["this machine: egress gateway"].startswith("ok")  # the running relay says it serves the gateway
    assert lines["this machine: keys"].startswith("ok") and str(home / ".ssh/id_ed25519") in lines["this machine: keys"]
    assert lines["this machine: codex sign-in"].startswith("ok") and "~/.codex/auth.json" in lines["this machine: codex sign-in"]
    assert not [line for line in lines.values() if line.startswith("FAIL")], lines


@pytest.fixture(scope="module")
def fresh_engine() -> Iterator[EngineFleet]:
    """An engine of its own (sshd + dockerd, no box image, no box): the run's shared fleet has the other
    worker's boxes on it at any time, and doctor reports every unisolated box it finds."""
    with EngineFleet(count=1, tmpfs_size="512m", export_env=False) as fleet:
        yield fleet


def test_doctor_on_remote_engines(home: Path, tmp_path: Path, fresh_engine: EngineFleet) -> None:
    nothing = f"root@127.0.0.1:{free_port()}"
    engine = fresh_engine.engines[0]
    inventory = tmp_path / "engines.yml"
    inventory.write_text(f"engines:\n  hosts:\n    {engine.alias}: {{}}\n    down: {{agentbox_engine: '{nothing}'}}\n")
    rc, lines = doctor(home, "-i", str(inventory), env=fresh_engine.env)
    assert rc != 0
    where = f"engine {engine.alias}"
    assert lines[f"{where}: SSH answers"].startswith("ok")
    assert lines[f"{where}: Docker answers"].startswith("ok")
    isolation = lines[f"{where}: isolation"]
    assert isolation.startswith("FAIL") and f"fix: ansible-playbook playbooks/box_engine.yml -e engine={engine.alias}" in isolation
    assert lines[f"{where}: box image"].startswith("WARN")  # the first create sends it
    assert lines[f"{where}: unisolated boxes"].startswith("ok")
    down = lines[f"engine {nothing}: SSH answers"]
    assert down.startswith("FAIL") and "refused the connection" in down and "fix: make `ssh" in down
    unchecked = lines[f"engine {nothing}: isolation"]
    assert unchecked.startswith("FAIL") and "cannot run: SSH does not answer" in unchecked
