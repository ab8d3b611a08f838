"""Progress on the long image build (issue 18, item 1): agentbox_image prints a readable line with
the build step, the output so far and where the log is while the build runs, before its task
answers. A real build on the real engine of a context whose one step takes a while (a loop that
prints a tick a second: a long step to watch, not a wait in the test)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def test_image_build_prints_progress_before_the_task_ends(tmp_path: Path) -> None:
    repository = f"agentbox-test/progress-{secrets.token_hex(4)}"
    context = tmp_path / "ctx"
    context.mkdir()
    marker = secrets.token_hex(4)
    (context / "Dockerfile").write_text(
        "FROM debian:bookworm\n"
        f"RUN for i in $(seq 1 12); do echo tick-{marker}-$i; sleep 1; done\n"
    )
    log = tmp_path / "logs" / "build.log"
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [{"name": "Build", "agentbox.box.agentbox_image": {
            "context": str(context), "tag": repository, "build_log": str(log), "keep_previous": 0}}],
    }]))  # fmt: skip
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "AGENTBOX_PROGRESS_SECONDS": "2", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    seen: list[tuple[str, bool]] = []  # (line, was the playbook still running when it arrived)
    try:
        with subprocess.Popen([str(REPO / ".venv/bin/ansible-playbook"), str(play)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:  # fmt: skip
            assert proc.stdout is not None
            for line in proc.stdout:
                seen.append((line.rstrip("\n"), proc.poll() is None))
            assert proc.wait() == 0, "\n".join(text for text, _stream in seen)[-3000:]
    finally:
        client = docker.from_env()
        for image in client.images.list(name=repository):
            for tag in image.tags:
                client.images.remove(tag, force=True)
    lines = [text for text, _stream in seen]
    progress = [i for i, text in enumerate(lines) if "box image build:" in text]
    answer = next(i for i, text in enumerate(lines) if text.startswith("changed: [localhost]"))
    assert progress, "\n".join(lines)
    assert progress[0] < answer and seen[progress[0]][1]  # before the task answered, while it ran
    first = lines[progress[0]]
    assert f"(log {log})" in first and " s " in first + " " and "MB of output" in first
    # The stage read from the log: Docker's "Step N/M" of the build (the engine adds LABEL steps).
    assert any(re.search(r"build: step \d+/\d+: [A-Z]+ ", lines[i]) for i in progress), "\n".join(lines[i] for i in progress)
