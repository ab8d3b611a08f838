"""The documented Molecule scenario (docs/molecule.md) on a user's role: molecule_init.yml writes it into a copy of
tests/fixtures/molecule_role/sample_greeting, then `molecule converge`, `verify` and `destroy` make a box on the
box engine with the collection's modules, run the role in it through the agentbox.box.box connection, check it
there and remove the box. The full sequence (idempotence included) and the scenario's own prepare step are what
the inbox_supervisor gate runs (scripts/test.sh) with the same create.yml and destroy.yml; the scenario's files
and their docker_ssh form are checked in tests/unit/playbooks/test_molecule_scenario.py."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, run_module_direct

pytestmark = pytest.mark.integration
SAMPLE = REPO / "tests/fixtures/molecule_role/sample_greeting"
VERIFY = """---
- name: Verify
  hosts: all
  gather_facts: false
  tasks:
    - name: Read the greeting the role wrote
      ansible.builtin.slurp:
        src: /etc/sample-greeting
      register: greeting

    - name: Look at the user's copy
      ansible.builtin.stat:
        path: ~/greeting.txt
      register: mine

    - name: Both are there, the user's as the box user's, as the role says
      ansible.builtin.assert:
        that:
          - greeting.content | b64decode == 'hello from a role tested in a box\\n'
          - mine.stat.pw_name == 'vscode' and mine.stat.mode == '0600'
"""


class World:
    def __init__(self, home: str, role: Path):
        self.home, self.role = home, role
        self.env = {**os.environ, "HOME": home, "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"),
                    "AGENTBOX_IDLE_INTERVAL": "0", "ANSIBLE_NOCOLOR": "1", "NO_COLOR": "1",
                    # molecule starts ansible-playbook and ansible-config by name: the venv's, whatever PATH is
                    "PATH": f"{REPO / '.venv/bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.env.pop("ANSIBLE_CONFIG", None)  # molecule writes its own; molecule_init gets the checkout's below

    def init(self) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/molecule_init.yml"),
             "-e", f"role_path={self.role}"],
            env={**self.env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
            capture_output=True, text=True,
            check=False, cwd=REPO)

    def molecule(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(REPO / ".venv/bin/molecule"), command, "-s", "agentbox"], env=self.env,
                              capture_output=True, text=True, check=False, cwd=self.role)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tempfile.mkdtemp(prefix="abm-", dir="/tmp")  # short: the relay's socket paths are bounded
    os.chmod(home, 0o755)
    role = tmp_path_factory.mktemp("roles") / f"greeting_{secrets.token_hex(3)}"
    shutil.copytree(SAMPLE, role)
    made = World(home, role)
    yield made
    # Whatever a failed step left: the box, then the relay its create started under this HOME.
    run_module_direct("agentbox_box", {"name": f"molecule-{role.name}", "state": "absent"}, env={"HOME": home})
    subprocess.run([str(REPO / "scripts/agentbox-relay"), "stop"], env=made.env, capture_output=True, check=False)
    shutil.rmtree(home, ignore_errors=True)


def test_a_users_role_converges_and_verifies_in_a_box_made_by_the_documented_scenario(
    world: World, docker_client: docker.DockerClient, box_image: str
) -> None:
    written = world.init()
    assert written.returncode == 0, written.stdout + written.stderr
    scenario = world.role / "molecule/agentbox"
    assert sorted(p.name for p in scenario.iterdir()) == ["converge.yml", "create.yml", "destroy.yml", "molecule.yml",
                                                          "verify.yml"]
    assert f"molecule test -s agentbox` (box molecule-{world.role.name} on this machine)" in written.stdout
    again = world.init()  # never over an existing scenario
    assert again.returncode != 0 and "exists already: nothing was written" in again.stdout
    (scenario / "verify.yml").write_text(VERIFY)  # the user's own checks of the role

    converged = world.molecule("converge")
    assert converged.returncode == 0, converged.stdout[-4000:] + converged.stderr[-4000:]
    box = docker_client.containers.get(f"agentbox-molecule-{world.role.name}")
    assert box.status == "running" and box.labels["io.agentbox.box"] == f"molecule-{world.role.name}"
    assert box.labels["io.agentbox.workspace"].endswith(f"/workspace-molecule-{world.role.name}")

    verified = world.molecule("verify")
    assert verified.returncode == 0, verified.stdout[-4000:] + verified.stderr[-4000:]
    assert "Both are there" in verified.stdout + verified.stderr

    destroyed = world.molecule("destroy")
    assert destroyed.returncode == 0, destroyed.stdout[-4000:] + destroyed.stderr[-4000:]
    assert not docker_client.containers.list(all=True, filters={"label": f"io.agentbox.box=molecule-{world.role.name}"})
    assert not Path(box.labels["io.agentbox.workspace"]).exists()
