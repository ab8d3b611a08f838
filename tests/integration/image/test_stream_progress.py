"""Progress while the box image streams to a remote engine for its first box (issue 18, item 1):
create_box.yml with provider=docker_ssh prints "streaming ... MB read, ... MB sent" lines before
its create task answers, writes them to ~/.agentbox/logs/image-transfer.log, and its summary ends
with the figures (path, size, bytes sent, seconds). A real engine over real SSH: the worker's shared one
(tests/integration/conftest.py), which holds the box image under a test tag only, so agentbox/box:latest
is not there and the create streams it whole; the tag is removed again after."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO, chown_tree, make_repo, run_module_direct
from tests.integration.support.engines import EngineFleet

LATEST = "agentbox/box:latest"

pytestmark = pytest.mark.integration


def test_first_image_stream_prints_progress_and_figures(tmp_path: Path, engine_fleet: EngineFleet) -> None:
    repo = make_repo(tmp_path / "ws")
    chown_tree(repo)
    engine = engine_fleet.engines[0]
    assert engine.shell(f"docker images -q {LATEST}").stdout.strip() == ""  # the first stream of this image
    home = Path(tempfile.mkdtemp(prefix="abh-", dir="/tmp"))  # short: the relay's socket lives under HOME
    env = {**os.environ, **engine_fleet.env, "HOME": str(home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "AGENTBOX_PROGRESS_SECONDS": "2", "PWD": str(repo)}  # fmt: skip
    argv = [str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/create_box.yml"),
            "-e", "provider=docker_ssh", "-e", f"engine={engine.alias}", "-e", f"workspace={repo}", "-e", "box=nc-stream",
            "-e", "isolation=none"]  # fmt: skip
    seen: list[tuple[str, bool]] = []
    try:
        with subprocess.Popen(argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:  # fmt: skip
            assert proc.stdout is not None
            for line in proc.stdout:
                seen.append((line.rstrip("\n"), proc.poll() is None))
            assert proc.wait() == 0, "\n".join(text for text, _stream in seen)[-4000:]
    finally:
        # The box and the relay create_box.yml started, removed by the modules' own main (no ansible start:
        # destroy_box.yml and relay.yml are proven elsewhere).
        module_env = {**engine_fleet.env, "HOME": str(home)}
        run_module_direct("agentbox_box", {"name": "nc-stream", "state": "absent", "provider": "docker_ssh",
                                           "engine": engine.alias}, env=module_env)  # fmt: skip
        run_module_direct("agentbox_relay", {"state": "stopped"}, env=module_env)
        # The shared engine as it was: without agentbox/box:latest (its layers stay, under the fleet's tag).
        engine.shell(f"docker rmi {LATEST} >/dev/null 2>&1; docker image prune -f >/dev/null", check=False)
    lines = [text for text, _stream in seen]
    streaming = [i for i, text in enumerate(lines) if re.search(r"streaming \S+ to engine .*: \d+ MB read, \d+ MB sent", text)]
    answer = next(i for i, text in enumerate(lines) if text.startswith("changed: [localhost]") and i > 0)
    try:
        assert streaming and streaming[0] < answer and seen[streaming[0]][1], "\n".join(lines)[-4000:]
        log = home / ".agentbox/logs/image-transfer.log"
        assert f"(log {log})" in lines[streaming[0]]
        assert re.search(r"streaming .*: done, \d+ MB image, \d+ MB sent in [\d.]+ s", log.read_text())
        summary = " ".join(" ".join(lines).split())
        assert re.search(r"image: agentbox/box:latest \(streamed to \S+: \d+ MB, \d+ MB sent in [\d.]+ s\)", summary), summary[-3000:]
    finally:
        shutil.rmtree(home, ignore_errors=True)
