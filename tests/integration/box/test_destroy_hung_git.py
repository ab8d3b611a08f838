"""destroy_box.yml on a box whose git never answers (root in the box replaced it with a program that
sleeps): the fetch-back of the box's last commits is bounded (-e fetch_timeout), -e fetch=false skips
it, and either way the box is destroyed and the output says what was not fetched."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator

import docker
import pytest

from tests.conftest import REPO, chown_tree, git, run_module

pytestmark = pytest.mark.integration

# Longer than any destroy here should take, so a hang fails the test instead of stalling the run.
HANG_GUARD = 300
HUNG_GIT = "#!/bin/sh\n# never answers\nexec sleep 86400\n"


@pytest.fixture
def hung_box(docker_client: docker.DockerClient, box_image: str, repo_factory) -> Iterator[dict]:
    """A box with one commit of its own on its branch (never fetched to the host), then its git replaced."""
    repo = repo_factory("ws")
    chown_tree(repo)
    name = f"hung-{secrets.token_hex(3)}"
    made = run_module("agentbox_box", {"name": name, "workspace": str(repo), "boot": False})
    assert made.get("failed") is not True, made
    try:
        container = docker_client.containers.get(f"agentbox-{name}")
        committed = container.exec_run(
            ["git", "-C", "/workspace", "-c", "user.name=box", "-c", "user.email=box@example.invalid", "commit",
             "-q", "--allow-empty", "-m", "the box's own work"], user="vscode")  # fmt: skip
        assert committed.exit_code == 0, committed.output.decode()
        replaced = container.exec_run(
            ["sh", "-c", 'p=$(command -v git) && mv "$p" "$p.real" && printf "%s" "$1" > "$p" && chmod 755 "$p"',
             "hang", HUNG_GIT], user="root")  # fmt: skip
        assert replaced.exit_code == 0, replaced.output.decode()
        host_tip = git(repo, "rev-parse", f"agentbox/{name}").strip()
        yield {"name": name, "repo": repo, "host_tip": host_tip, "client": docker_client}
    finally:
        run_module("agentbox_box", {"name": name, "state": "absent", "fetch": False, "delete_branch": True})


def destroy(*extra: str) -> subprocess.CompletedProcess:
    """destroy_box.yml, in a session of its own: past the hang guard the whole run is killed and the test fails."""
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-e",
            f"ansible_python_interpreter={sys.executable}", "playbooks/destroy_box.yml", *extra]  # fmt: skip
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    with subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as run:
        try:
            stdout, stderr = run.communicate(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
            pytest.fail(f"destroy_box.yml {' '.join(extra)} still ran after {HANG_GUARD} s: the box's git hung it")
    return subprocess.CompletedProcess(argv, run.returncode, stdout, stderr)


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["-e", "fetch_timeout=5"], "did not answer within 5 s (fetch_timeout)"),
        (["-e", "fetch=false"], "(fetch=false)"),
    ],
)
def test_destroy_of_a_box_whose_git_never_answers_ends_and_says_what_was_not_fetched(
    hung_box: dict, extra: list[str], why: str
) -> None:
    name = hung_box["name"]
    done = destroy("-e", f"box={name}", *extra)
    output = " ".join((done.stdout + done.stderr).split())  # the callbacks fold long lines
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"destroyed {name}" in output and "its last commits were NOT fetched" in output, output[-3000:]
    assert why in output and f"the host's agentbox/{name} stays as it was" in output, output[-3000:]
    assert f"{hung_box['repo']} at {hung_box['host_tip'][:12]}" in output, output[-3000:]
    with pytest.raises(docker.errors.NotFound):
        hung_box["client"].containers.get(f"agentbox-{name}")
    # The host's branch is where it was: the box's commit went with the box.
    assert git(hung_box["repo"], "rev-parse", f"agentbox/{name}").strip() == hung_box["host_tip"]
