"""The relay's channel to a box on a remote engine (docker_ssh): a test engine (sshd + dockerd in a
container, reached on a 127.0.0.1 port only). The relay opens the channel over the engine's SSH
connection; the box's commits are fetched back into the host repository, then pushed to an origin
that neither the box nor the engine can see.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.conftest import run_module
from tests.integration.relay import test_relay as shared
from tests.integration.support.engines import FLEET_IMAGE, EngineFleet

pytestmark = pytest.mark.integration

host = shared.host
project = shared.project
BOX_GIT = shared.BOX_GIT


@pytest.fixture(scope="module")
def remote_box(
    engine_fleet: EngineFleet, host: shared.Host, project: dict[str, Path]
) -> Iterator[tuple[DockerProvider, str]]:
    """One box on the worker's shared engine (tests/integration/conftest.py), from the image loaded there."""
    engine = engine_fleet.engines[0]
    name = f"rl-ssh-{secrets.token_hex(3)}"
    env = {"HOME": host.home, **engine_fleet.env}
    created = run_module(
        "agentbox_box",
        {"name": name, "workspace": str(project["workspace"]), "provider": "docker_ssh", "engine": engine.alias,
         "isolation": "none", "state": "started", "image": FLEET_IMAGE},
        env=env,
    )
    assert not created["failed"], created.get("msg")
    provider = DockerProvider(engine=engine.alias, ssh_options={}, isolation="none")
    yield provider, name
    run_module("agentbox_box", {"name": name, "provider": "docker_ssh", "engine": engine.alias, "state": "absent"},
               env=env)


def wait_for_channel(provider: DockerProvider, box: str) -> None:
    """The relay opens the channel on its own once the box runs: wait for the socket it makes."""
    deadline = time.monotonic() + shared.DEADLINE
    while provider.exec(box, ["test", "-S", "/run/agentbox/relay/relay.sock"]).rc != 0:
        assert time.monotonic() < deadline, "the relay never opened the channel to the remote box"
        time.sleep(0.2)


def push_from_box(provider: DockerProvider, box: str, message: str) -> str:
    provider.exec(box, [*BOX_GIT, "commit", "-q", "--allow-empty", "-m", message], workdir="/workspace").check("commit")
    head = provider.exec(box, ["git", "rev-parse", "HEAD"], workdir="/workspace").check("rev-parse").text.strip()
    pushed = provider.exec(box, ["agentbox-ctl", "git", "push"], workdir="/workspace")
    assert pushed.rc == 0, pushed.stderr.decode()
    return head


def test_push_from_a_box_on_a_remote_engine(
    host: shared.Host, remote_box: tuple[DockerProvider, str], project: dict[str, Path]
) -> None:
    provider, box = remote_box
    wait_for_channel(provider, box)
    # No route from the remote box to the host's origin, and no credentials in it.
    direct = provider.exec(box, ["git", "push", "origin", "HEAD"], workdir="/workspace")
    assert direct.rc != 0
    head = push_from_box(provider, box, "from the remote box")
    assert shared.origin_ref(project, f"refs/heads/agentbox/{box}") == head
    # The box's commit was fetched back into the host repository first, as its own branch.
    assert shared.git(project["workspace"], "rev-parse", f"refs/heads/agentbox/{box}").strip() == head
    entry = [e for e in host.audit() if e["box"] == box and e.get("operation") == "git.push"][-1]
    assert entry["provider"] == "docker_ssh" and entry["decision"] == "allowed"

    # The relay restarts: the channel comes back by itself and the next push works.
    host.relay("restart")
    wait_for_channel(provider, box)
    deadline = time.monotonic() + shared.DEADLINE
    while True:  # the old forwarder's socket may answer once more before the new one replaces it
        provider.exec(box, [*BOX_GIT, "commit", "-q", "--allow-empty", "-m", "after restart"], workdir="/workspace")
        head = provider.exec(box, ["git", "rev-parse", "HEAD"], workdir="/workspace").text.strip()
        pushed = provider.exec(box, ["agentbox-ctl", "git", "push"], workdir="/workspace")
        if pushed.rc == 0:
            break
        assert time.monotonic() < deadline, pushed.stderr.decode()
        time.sleep(0.2)
    assert shared.origin_ref(project, f"refs/heads/agentbox/{box}") == head


def test_pull_brings_a_new_origin_commit_into_the_remote_box(
    remote_box: tuple[DockerProvider, str], project: dict[str, Path]
) -> None:
    provider, box = remote_box
    wait_for_channel(provider, box)
    other = project["other"]
    shared.git_as_owner(other, "pull", "-q", "--ff-only", "origin", "main")
    (other / "remote-upstream.txt").write_text("for the remote box\n")
    shared.git_as_owner(other, "add", "remote-upstream.txt")
    shared.git_as_owner(other, "commit", "-q", "-m", "upstream for the remote box")
    shared.git_as_owner(other, "push", "-q", "origin", "HEAD:main")
    upstream = shared.git_as_owner(other, "rev-parse", "HEAD").strip()
    identity = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b.invalid", "GIT_COMMITTER_NAME": "a",
                "GIT_COMMITTER_EMAIL": "a@b.invalid"}
    pulled = provider.exec(box, ["agentbox-ctl", "git", "pull"], workdir="/workspace", env=identity)
    assert pulled.rc == 0, pulled.stderr.decode()
    assert provider.exec(box, ["git", "merge-base", "--is-ancestor", upstream, "HEAD"], workdir="/workspace").rc == 0
    assert provider.exec(box, ["cat", "remote-upstream.txt"], workdir="/workspace").text == "for the remote box\n"
