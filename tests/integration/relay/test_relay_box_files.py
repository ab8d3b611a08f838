"""The relay trusts nothing a box can replace, on the real engine. Root in a box on the user's engine
(`isolation: none`) is the host's root: it remounts its relay directory writable (the bind is
read-only, but the box holds CAP_SYS_ADMIN) and puts a directory tree, or a symlink to a host file,
where its socket was. On the box engine root in a box is nobody on the host and cannot (asserted
first); what such a box would write is then written here, as the host's root it would be. Only that
box loses its channel until the relay makes its socket again; `agentbox-relay restart` serves every
box, that one included; the host file is never followed; destroy removes the box's relay files
whatever they hold. A 2 GiB seed record the box plants is refused in the relay with one line in
relay.log, and the relay stays small."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from tests.integration.relay import test_relay as shared
from tests.integration.relay.test_relay import ctl

# The same module-scoped fixtures as test_relay (a private HOME and relay, one origin, boxes).
engine = shared.engine
host = shared.host
project = shared.project
make_box = shared.make_box

pytestmark = pytest.mark.integration

WRITABLE = "mount -o remount,rw,bind /run/agentbox/relay"
A_TREE = f"{WRITABLE} && cd /run/agentbox/relay && rm -rf relay.sock && mkdir -p relay.sock/deep && touch relay.sock/deep/f"
SOCKET = "relay.sock"


def as_root(engine: docker.DockerClient, box: str, script: str) -> None:
    done = engine.containers.get(f"agentbox-{box}").exec_run(["sh", "-c", script], user="root")
    assert done.exit_code == 0, done.output


def plant_tree(engine: docker.DockerClient, box: str, sock_dir: Path) -> None:
    """A directory tree where the box's socket was, as root of a box on the user's engine makes it. On the
    box engine the box's own attempt is refused (its root is uid 100000 on the host) and changes nothing."""
    tried = engine.containers.get(f"agentbox-{box}").exec_run(["sh", "-c", A_TREE], user="root")
    assert tried.exit_code != 0 and b"Permission denied" in tried.output, tried.output
    assert stat.S_ISSOCK(os.lstat(sock_dir / SOCKET).st_mode)
    (sock_dir / SOCKET).unlink()
    (sock_dir / SOCKET / "deep").mkdir(parents=True)
    (sock_dir / SOCKET / "deep/f").touch()


def box_id(engine: docker.DockerClient, box: str) -> str:
    return engine.containers.get(f"agentbox-{box}").labels["io.agentbox.id"]


def opens(engine: docker.DockerClient, box: str) -> bool:
    return ctl(engine, box, "open", "https://example.invalid/still")[0] == 0


def relay_peak_kib(home: str) -> int:
    pid = int(Path(home, ".agentbox/relay/relay.pid").read_text())
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM for the relay")


def test_a_box_that_replaces_its_socket_breaks_only_itself(
    host: shared.Host, make_box: Callable[[], str], engine: docker.DockerClient, tmp_path: Path
) -> None:
    hostile, other = make_box(), make_box()
    assert opens(engine, hostile) and opens(engine, other)
    sock_dir = Path(host.home, ".agentbox/relay/sock", box_id(engine, hostile))

    plant_tree(engine, hostile, sock_dir)
    assert (sock_dir / "relay.sock/deep/f").exists()  # the host's directory holds what the box made
    assert not opens(engine, hostile) and opens(engine, other)
    restarted = host.relay("restart", check=False)
    assert restarted.returncode == 0, restarted.stderr
    # The relay made the box's socket again in place of the tree: every box is served, that one too.
    assert opens(engine, other) and opens(engine, hostile)
    made = os.lstat(sock_dir / "relay.sock")
    assert stat.S_ISSOCK(made.st_mode) and stat.S_IMODE(made.st_mode) == 0o666

    # A symlink to a host file: replaced, never followed (the file keeps its mode and its bytes).
    victim = tmp_path / "host-file"
    victim.write_text("the host's")
    victim.chmod(0o600)
    os.symlink(victim, sock_dir / "relay.sock.new")  # as root of a box on the user's engine would
    os.rename(sock_dir / "relay.sock.new", sock_dir / SOCKET)
    assert os.path.islink(sock_dir / "relay.sock")
    restarted = host.relay("restart", check=False)
    assert restarted.returncode == 0, restarted.stderr
    assert opens(engine, other) and opens(engine, hostile)
    assert victim.read_text() == "the host's" and stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_destroy_removes_the_boxs_relay_files_whatever_it_put_there(
    host: shared.Host, make_box: Callable[[], str], engine: docker.DockerClient
) -> None:
    hostile, other = make_box(), make_box()
    hostile_id = box_id(engine, hostile)
    plant_tree(engine, hostile, Path(host.home, ".agentbox/relay/sock", hostile_id))
    destroyed = host.module("agentbox_box", {"name": hostile, "state": "absent"})
    assert not destroyed["failed"], destroyed.get("msg")
    relay_home = Path(host.home, ".agentbox/relay")
    assert not os.path.lexists(relay_home / "sock" / hostile_id)
    assert not (relay_home / "boxes" / f"{hostile_id}.json").exists()
    assert opens(engine, other)


def test_a_2gib_seed_record_is_refused_by_the_relay_which_stays_small(
    host: shared.Host, make_box: Callable[[], str], engine: docker.DockerClient
) -> None:
    hostile, other = make_box(), make_box()
    shared.commit_in_box(engine, hostile, "work")
    as_root(engine, hostile, "truncate -s 2G /etc/agentbox/seed.json")
    rc, _out, err = ctl(engine, hostile, "git", "push")
    assert relay_peak_kib(host.home) < 200 * 1024
    assert rc != 0 and "the box's seed record (/etc/agentbox/seed.json) is over 4194304 bytes: refused" in err, err
    log = Path(host.home, ".agentbox/relay/relay.log").read_text()
    assert len([line for line in log.splitlines() if f"box {hostile}: the box's seed record" in line]) == 1
    # The other box pushes as before.
    shared.commit_in_box(engine, other, "other work")
    rc, _out, err = ctl(engine, other, "git", "push")
    assert rc == 0, err
    entry = [e for e in host.audit() if e["box"] == hostile and e.get("operation") == "git.push"][-1]
    assert entry["result"]["rc"] != 0 and "seed record" in entry["result"]["output"]
