"""Boxes on the user's own engine (made with isolation none, or before the box engine existed) keep
working until destroyed, with no isolation given anywhere: the inventory lists them (as unisolated),
the connection plugin runs tasks and moves files in them, ssh reaches them, their state changes and
destroy find them. The user's engine here is the machine's default one (/var/run/docker.sock), the
box engine another daemon, as on a user's machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import REPO, make_repo, run_module

pytestmark = pytest.mark.integration

USER_ENGINE = "unix:///var/run/docker.sock"


class Home:
    """A private HOME whose commands see the user's engine as DOCKER_HOST (and the box engine as its default)."""

    def __init__(self, path: str):
        self.path = path
        self.env = {"HOME": path, "DOCKER_HOST": USER_ENGINE, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                    "ANSIBLE_NOCOLOR": "1"}  # fmt: skip

    def module(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return run_module(name, args, env=self.env)

    def run(self, *argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env={**os.environ, **self.env}, cwd=cwd, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip

    def playbook(self, name: str, *extra: str) -> subprocess.CompletedProcess:
        return self.run(str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks" / name), *extra)


@pytest.fixture(scope="module")
def home() -> Iterator[Home]:
    path = tempfile.mkdtemp(prefix="abu-", dir="/tmp")  # short: the relay's socket lives under HOME
    os.chmod(path, 0o755)
    yield Home(path)
    subprocess.run([str(REPO / "scripts/agentbox-relay"), "stop"], env={**os.environ, "HOME": path},
                   capture_output=True, check=False)  # fmt: skip
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def box(home: Home, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workspace = make_repo(tmp_path_factory.mktemp("unisolated") / "ws", {"README.md": "hello\n"})
    name = f"uni-{secrets.token_hex(3)}"
    made = home.module("agentbox_box", {"name": name, "workspace": str(workspace), "isolation": "none",
                                        "state": "started"})  # fmt: skip
    assert not made["failed"], made.get("msg")
    assert made["box"]["labels"]["isolation"] == "none"
    yield name
    home.module("agentbox_box", {"name": name, "state": "absent", "isolation": "none", "delete_branch": True})


def on_engine(address: str, name: str) -> bool:
    client = docker.DockerClient(base_url=address)
    try:
        return bool(client.containers.list(all=True, filters={"name": f"^agentbox-{name}$"}))
    finally:
        client.close()


def test_box_on_the_user_engine_works_through_inventory_connection_ssh_state_and_destroy(home: Home, box: str,
                                                                                         tmp_path: Path) -> None:
    assert on_engine(USER_ENGINE, box)
    assert not on_engine(os.environ.get("AGENTBOX_ENGINE") or "unix:///run/agentbox-engine/docker.sock", box)

    # The inventory (no isolation anywhere) lists it, labelled unisolated.
    inventory = tmp_path / "here.agentbox.yml"
    inventory.write_text("plugin: agentbox.box.boxes\nlocal: true\nverbose_output: true\n")
    listed = home.run(str(REPO / ".venv/bin/ansible-inventory"), "-i", str(inventory), "--host", box)
    assert listed.returncode == 0, listed.stderr
    variables = json.loads(listed.stdout)
    assert variables["agentbox_labels"]["isolation"] == "none" and variables["agentbox_engine"] == "local"

    # The connection plugin: a command, a file put and read back, a file fetched.
    ansible = str(REPO / ".venv/bin/ansible")
    ran = home.run(ansible, "-i", str(inventory), box, "-m", "ansible.builtin.command", "-a", "id -un")
    assert ran.returncode == 0 and "vscode" in ran.stdout, ran.stdout + ran.stderr
    token = secrets.token_hex(6)
    put = home.run(ansible, "-i", str(inventory), box, "-m", "ansible.builtin.copy",
                   "-a", f"content={token} dest=/tmp/token")  # fmt: skip
    assert put.returncode == 0, put.stdout + put.stderr
    fetched = home.run(ansible, "-i", str(inventory), box, "-m", "ansible.builtin.fetch",
                       "-a", f"src=/tmp/token dest={tmp_path}/ flat=true")  # fmt: skip
    assert fetched.returncode == 0 and (tmp_path / "token").read_text() == token, fetched.stdout + fetched.stderr

    # list_boxes.yml says it is unisolated.
    table = home.playbook("list_boxes.yml")
    assert table.returncode == 0 and any(box in line and "(unisolated)" in line for line in table.stdout.splitlines()), \
        table.stdout  # fmt: skip

    # doctor.yml lists it by name among the unisolated boxes (a warning, not a failure).
    checked = home.playbook("doctor.yml")
    assert any("WARN" in line and "unisolated boxes" in line and box in line for line in checked.stdout.splitlines()), \
        checked.stdout  # fmt: skip

    # State changes, then ssh through the alias the start rewrote, then destroy: none told the isolation.
    for state in ("paused", "started", "stopped", "started"):
        changed = home.playbook("box_state.yml", "-e", f"box={box}", "-e", f"state={state}")
        assert changed.returncode == 0, f"{state}: {changed.stdout[-2000:]}{changed.stderr[-1000:]}"
    config = Path(home.path) / ".agentbox" / "ssh_config"
    shell = home.run("ssh", "-F", str(config), "-o", "BatchMode=yes", f"agentbox-{box}", "id -un; pwd")
    assert shell.returncode == 0 and shell.stdout.split() == ["vscode", "/workspace"], shell.stdout + shell.stderr
    gone = home.playbook("destroy_box.yml", "-e", f"box={box}", "-e", "delete_branch=true")
    assert gone.returncode == 0, gone.stdout[-2000:] + gone.stderr[-1000:]
    assert not on_engine(USER_ENGINE, box)
