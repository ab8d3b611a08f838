"""docker_ssh failures against real engine hosts: each a clear message, fast, nothing left behind.

Engine down, wrong key, unknown and changed host keys, the relaxed check, docker daemon not
running, no docker command at all. (Disk full during the upload is in test_docker_ssh.py: it
needs the box image on the engine.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
for entry in (str(HERE.parents[3] / ".collections"),):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import EngineUnreachable, ProviderError  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import get_provider  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _engine_sdk  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.ssh import _ssh  # noqa: E402
from tests.integration.support.engines import EngineFleet, free_port  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet():
    # One working engine, one with sshd but no dockerd (and later no docker CLI).
    with EngineFleet(count=1, bare=1) as engines:
        yield engines


@pytest.fixture(autouse=True)
def fresh_connections():
    """Each case connects anew: cached connections would hide what it checks."""
    _ssh.close_all()
    _engine_sdk.forget_all_clients()
    yield
    _ssh.close_all()
    _engine_sdk.forget_all_clients()


def write_config(fleet: EngineFleet, path: Path, *, known_hosts: str, identity: str | None) -> None:
    engine = fleet.engines[0]
    lines = [f"Host {engine.alias}", "  HostName 127.0.0.1", f"  Port {engine.port}", "  User root",
             f"  UserKnownHostsFile {known_hosts}", "  IdentitiesOnly yes"]  # fmt: skip
    if identity:
        lines.append(f"  IdentityFile {identity}")
    path.write_text("\n".join(lines) + "\n")


def test_engine_down_is_a_refusal_not_a_wait_for_the_timeout():
    port = free_port()
    with pytest.raises(EngineUnreachable) as failure:
        get_provider("docker_ssh", engine=f"root@127.0.0.1:{port}", ssh_options={}).list_boxes()
    assert f"root@127.0.0.1:{port}" in str(failure.value)
    assert "refused the connection" in str(failure.value) and "SSH server" in str(failure.value)


def test_port_that_is_not_ssh_fails_within_the_connect_timeout(fleet):
    # Something listens but never speaks SSH: bounded by the handshake timeout, not hanging.
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        with pytest.raises(EngineUnreachable) as failure:
            _ssh.connection_for(f"root@127.0.0.1:{port}", connect_timeout=2)
        assert "no SSH session started within 2 s" in str(failure.value)
    finally:
        listener.close()


def test_wrong_key_is_refused(fleet, tmp_path, monkeypatch):
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    config = tmp_path / "config"
    write_config(fleet, config, known_hosts=fleet.known_hosts, identity=None)
    monkeypatch.setenv(_ssh.SSH_CONFIG_ENV, str(config))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* keys or agent to fall back on
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    engine = fleet.engines[0].alias
    with pytest.raises(_ssh.AuthenticationRefused) as failure:
        DockerProvider(engine=engine, ssh_options={"private_key_file": str(wrong)}).list_boxes()
    message = str(failure.value)
    assert engine in message and str(wrong) in message and "authorized_keys" in message
    # The right key through the same option works.
    assert DockerProvider(engine=engine, ssh_options={"private_key_file": fleet.key}).list_boxes() == []


def test_unknown_host_key_is_refused_then_relaxed(fleet, tmp_path, monkeypatch):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = tmp_path / "config"
    write_config(fleet, config, known_hosts=str(empty), identity=fleet.key)
    monkeypatch.setenv(_ssh.SSH_CONFIG_ENV, str(config))
    engine = fleet.engines[0]
    fingerprint = subprocess.run(
        ["ssh-keygen", "-lf", "-"], input=engine.host_key_line.split(" ", 1)[1], capture_output=True, text=True,
        check=True,
    ).stdout.split()[1]  # fmt: skip
    with pytest.raises(_ssh.HostKeyUnknown) as failure:
        DockerProvider(engine=engine.alias, ssh_options={}).list_boxes()
    message = str(failure.value)
    assert fingerprint in message and f"[127.0.0.1]:{engine.port}" in message
    assert "ssh-keyscan" in message and "ssh_strict_host_key_checking" in message
    assert empty.read_text() == ""  # nothing recorded behind the user's back
    relaxed = DockerProvider(engine=engine.alias, ssh_options={"strict_host_key_checking": False})
    assert relaxed.list_boxes() == []


def test_changed_host_key_is_refused(fleet, tmp_path, monkeypatch):
    engine = fleet.engines[0]
    other = fleet.engines[1]  # another host's key recorded for this engine's address
    forged = tmp_path / "known_hosts"
    forged.write_text(f"[127.0.0.1]:{engine.port} {other.host_key_line.split(' ', 1)[1]}\n")
    config = tmp_path / "config"
    write_config(fleet, config, known_hosts=str(forged), identity=fleet.key)
    monkeypatch.setenv(_ssh.SSH_CONFIG_ENV, str(config))
    with pytest.raises(_ssh.HostKeyMismatch) as failure:
        DockerProvider(engine=engine.alias, ssh_options={}).list_boxes()
    assert "CHANGED" in str(failure.value) and "ssh-keygen -R" in str(failure.value)


def test_docker_daemon_not_running(fleet):
    bare = fleet.engines[1]
    with pytest.raises(_ssh.DockerMissing) as failure:
        DockerProvider(engine=bare.alias, ssh_options={}).list_boxes()
    message = str(failure.value)
    assert bare.alias in message and "Docker daemon does not answer" in message and "start it" in message.lower()


def test_no_docker_command_on_the_engine(fleet):
    bare = fleet.engines[1]
    bare.shell("mv /usr/bin/docker /usr/bin/docker.moved-by-test")
    try:
        with pytest.raises(_ssh.DockerMissing) as failure:
            DockerProvider(engine=bare.destination, ssh_options={}).find("anything")
        message = str(failure.value)
        assert "no 'docker' command" in message and "Install Docker Engine" in message
    finally:
        bare.shell("mv /usr/bin/docker.moved-by-test /usr/bin/docker")


def test_one_connection_per_engine_and_reconnect_after_it_drops(fleet):
    engine = fleet.engines[0]

    def sessions() -> str:
        return engine.shell("pgrep -c -f '[s]shd: root@' || true").stdout.strip()

    deadline = time.monotonic() + 10
    while sessions() != "0" and time.monotonic() < deadline:
        time.sleep(0.2)  # sessions of earlier cases are still being torn down
    first = _ssh.docker_client_over_ssh(engine.alias)
    connection = _ssh.connection_for(engine.alias)
    transport = connection.transport()
    for _round in range(3):
        _ssh.docker_client_over_ssh(engine.alias).ping()
    assert connection.transport() is transport  # same SSH session, reused
    assert sessions() == "1"
    transport.close()  # the link drops
    assert first.ping() is True  # next request reconnects on its own
    assert connection.transport() is not transport


def test_forked_child_gets_its_own_connection(fleet):
    engine = fleet.engines[0]
    client = _ssh.docker_client_over_ssh(engine.alias)
    assert client.ping()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not use the parent's session, and must work
        try:
            ok = client.ping() and client.containers.list() == []
            os.write(write_end, b"ok" if ok else b"no")
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write_end, repr(exc).encode()[:200])
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    answer = os.read(read_end, 300)
    os.close(read_end)
    assert answer == b"ok", answer
    assert client.ping()  # the parent's connection is still good


def test_engine_without_box_engine_refuses_create_unless_isolation_none(fleet, tmp_path):
    """A remote engine where root in a box would be root on its host (no box engine answers there and its
    own daemon does not remap, as the test engines): create refuses, saying how to set up the box engine or
    to pass isolation=none, before any image is sent or anything made on the engine."""
    from ansible_collections.agentbox.box.plugins.module_utils.box import _box
    from tests.conftest import make_repo

    engine = fleet.engines[0]
    repo = make_repo(tmp_path / "ws")
    provider = DockerProvider(engine=engine.alias, ssh_options={})
    with pytest.raises(ProviderError) as refused:
        _box.create_box(provider, _box.CreateRequest(name="unasked", workspace=str(repo)))
    message = str(refused.value)
    assert f"engine {engine.alias} does not remap user namespaces" in message
    assert f"playbooks/box_engine.yml -e engine={engine.alias}" in message and "isolation=none" in message
    assert engine.agentbox_objects() == []
    assert engine.shell("docker images -q agentbox/box").stdout.strip() == ""  # no image was sent
    # Asked explicitly, the refusal is not there (the same engine, isolation none: only the image is missing).
    explicit = DockerProvider(engine=engine.alias, ssh_options={}, isolation="none")
    explicit.check_can_create("unasked")
    assert explicit.reopen_options()["isolation"] == "none" and "remote_socket" not in explicit.reopen_options()


def test_box_engine_set_up_over_ssh_says_what_the_engine_lacks(fleet):
    """box_engine.yml on an engine: --check says it would set it up; the set-up sends the script over the
    engine's SSH connection and runs it as root there, and an engine that lacks what it needs (these test
    engines have no iproute2) fails the play with the script's own message, no box engine made, creates
    still refused."""
    engine = fleet.engines[0]
    env = {**os.environ, **fleet.env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}

    def box_engine(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/box_engine.yml"),
                               "-e", f"engine={engine.alias}", *extra],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip

    checked = box_engine("--check")
    assert checked.returncode == 0 and "box engine would be set up" in checked.stdout, checked.stdout + checked.stderr
    failed = box_engine()
    assert failed.returncode != 0
    said = " ".join(failed.stdout.split())
    assert f"engine {engine.alias}: setting up the box engine failed" in said, failed.stdout
    assert "ip is missing: apt-get install docker.io iproute2 iptables" in said, failed.stdout
    assert engine.shell("docker -H unix:///run/agentbox-engine/docker.sock info", check=False).returncode != 0
    assert engine.shell("ls /tmp/*/ensure-box-engine.sh 2>/dev/null || true").stdout == ""  # its temp dir is gone
    with pytest.raises(ProviderError, match=r"box_engine\.yml"):
        DockerProvider(engine=engine.alias, ssh_options={}).check_can_create("after")
