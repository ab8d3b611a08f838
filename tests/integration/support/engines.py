"""Remote Docker engines for tests and benchmarks: containers running sshd and dockerd.

Each engine is a container of the box image (it has openssh-server and docker.io) with the
box capabilities (never --privileged), its Docker data on a tmpfs (nothing left on disk when it
goes), and sshd published on an ephemeral port of 127.0.0.1 only. A generated ed25519 key is
authorised for root; a temp ssh config names each engine (`<prefix>1`, `<prefix>2`...) with its
port, the key and a temp known_hosts holding the engine's host key. AGENTBOX_SSH_CONFIG points
the collection at that config, so `engine: <alias>` and `engine: root@127.0.0.1:<port>` both
work with nothing written to ~/.ssh.

Usage:
    with EngineFleet(count=2) as fleet:
        fleet.engines[0].alias, fleet.engines[0].destination, fleet.env

Tests that need engines with the box image take the `engine_fleet` fixture (tests/integration/conftest.py):
two engines started once per test run (shared by the xdist workers, see run_fleet), the box image loaded on
each once, as FLEET_IMAGE. Both workers may use them at once: a test names its own boxes and checks only them.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import pickle
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parents[3]
# Import the collection from the checkout (.collections/ansible_collections/agentbox/box -> ../../..).
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

ENGINE_IMAGE = os.environ.get("AGENTBOX_TEST_ENGINE_IMAGE", "agentbox/box:latest")
TEST_LABEL = "io.agentbox.test"
SSH_CONFIG_ENV = "AGENTBOX_SSH_CONFIG"
BOX_CAPS = ["--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--device", "/dev/fuse"]
BOX_SECURITY = ["--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined"]
# The box image as the shared fleet's engines hold it: a tag of this run's (the same in every xdist worker), so a build that moves
# agentbox/box:latest meanwhile neither makes the engines load a second 1.1 GB image nor changes what
# "the same image" means. The engines never hold agentbox/box:latest itself: a test that wants the
# engine without the box image (doctor's warning, the first stream) has it that way.
RUN_KEY = os.environ.get("PYTEST_XDIST_TESTRUNUID") or secrets.token_hex(8)
FLEET_IMAGE = f"agentbox-test/engine-box-{RUN_KEY[:8]}:pinned"

# Runs as the engine container's main process. Non-privileged containers see cgroup v1
# hierarchies read-only: mount fresh ones (allowed with SYS_ADMIN in a private cgroup namespace)
# so the inner dockerd can make cgroups for its containers. cgroup v2 needs nothing.
ENGINE_SCRIPT = r"""
set -eu
if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  for dir in /sys/fs/cgroup/*/; do
    name=$(basename "$dir"); opts=$name
    [ "$name" = systemd ] && opts=none,name=systemd
    umount "$dir" 2>/dev/null && mount -t cgroup -o "$opts" cgroup "$dir" || true
  done
fi
ssh-keygen -A >/dev/null
install -d -m 0700 /root/.ssh
printf '%s\n' "$ENGINE_AUTHORIZED_KEY" > /root/.ssh/authorized_keys
chmod 0600 /root/.ssh/authorized_keys
mkdir -p /run/sshd
/usr/sbin/sshd -e -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no
if [ "$ENGINE_DOCKERD" = 1 ]; then
  echo '{}' > /etc/docker/daemon.json
  dockerd --storage-driver overlay2 >/var/log/dockerd.log 2>&1 &
fi
echo engine-ready > /run/engine-ready
exec sleep infinity
"""


@dataclasses.dataclass
class Engine:
    alias: str
    container: str
    port: int
    host_key_line: str
    dockerd: bool

    @property
    def destination(self) -> str:
        return f"root@127.0.0.1:{self.port}"

    def shell(self, script: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a shell script on the engine host itself (through the local engine, not SSH)."""
        return subprocess.run(
            ["docker", "exec", self.container, "sh", "-c", script], capture_output=True, text=True, check=check
        )

    def agentbox_objects(self, *boxes: str) -> list[str]:
        """Containers and volumes on this engine carrying io.agentbox labels (what a box leaves): those of
        `boxes`, or of every box. On the shared fleet name the boxes: the other worker's may be there."""
        labels = [f"label=io.agentbox.box={box}" for box in boxes] or ["label=io.agentbox.box"]
        out = self.shell("".join(
            f"docker ps -a --filter {label} --format 'container {{{{.Names}}}}'; "
            f"docker volume ls --filter {label} --format 'volume {{{{.Name}}}}'; "
            for label in labels
        )).stdout
        return [line for line in out.splitlines() if line.strip()]


class EngineFleet:
    """Start `count` engines (plus `bare` engines with sshd but no dockerd); remove all on exit."""

    def __init__(self, count: int = 2, bare: int = 0, prefix: str | None = None, tmpfs_size: str | list[str] = "6g",
                 export_env: bool = True):
        """tmpfs_size: each engine's Docker storage, or a list of sizes, the engines' in order."""
        self.count = count
        self.export_env = export_env  # False: AGENTBOX_SSH_CONFIG only inside exported()
        self.bare = bare
        self.run_id = secrets.token_hex(3)
        self.prefix = prefix or f"abx-eng-{self.run_id}-"
        self.tmpfs_size = tmpfs_size
        self.engines: list[Engine] = []
        self.dir = tempfile.mkdtemp(prefix="agentbox-engines-")
        self.key = os.path.join(self.dir, "id_ed25519")
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.ssh_config = os.path.join(self.dir, "ssh_config")
        self._old_env: str | None = None
        self.image_reports: dict[str, Any] = {}

    # -- set-up --------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def env(self) -> dict[str, str]:
        return {SSH_CONFIG_ENV: self.ssh_config}

    def start(self) -> None:
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "agentbox-test", "-f", self.key], check=True
        )
        with open(self.key + ".pub", encoding="utf-8") as handle:
            public_key = handle.read().strip()
        for index in range(self.count + self.bare):
            self.engines.append(self._start_engine(index + 1, public_key, dockerd=index < self.count))
        for engine in self.engines:
            self._wait_ready(engine)
        self.write_config()
        self._old_env = os.environ.get(SSH_CONFIG_ENV)
        if self.export_env:
            os.environ[SSH_CONFIG_ENV] = self.ssh_config

    @contextmanager
    def exported(self) -> Iterator[Self]:
        """AGENTBOX_SSH_CONFIG names this fleet's config inside the block (what the collection reads in this
        process), and is as it was after: a shared fleet's config must not reach modules that do not use it."""
        old = os.environ.get(SSH_CONFIG_ENV)
        os.environ[SSH_CONFIG_ENV] = self.ssh_config
        try:
            yield self
        finally:
            if old is None:
                os.environ.pop(SSH_CONFIG_ENV, None)
            else:
                os.environ[SSH_CONFIG_ENV] = old

    @contextmanager
    def holding(self, engine: Engine) -> Iterator[Engine]:
        """`engine` kept from other holders while the block runs: a test that fills its disk, one whose boxes
        need that disk. A file lock in the fleet's directory, which the workers sharing the fleet all see."""
        with _locked(Path(self.dir) / f"{engine.alias}.hold"):
            yield engine

    def load_image(self, image: str) -> None:
        """Stream `image` from the local engine to every engine with dockerd, in parallel; the reports go to
        image_reports by alias. Uncompressed: on loopback the link is not the bottleneck, the 2 CPUs are."""
        from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image_transfer
        from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider

        failures: list[BaseException] = []

        def ship(engine: Engine) -> None:
            try:
                provider = DockerProvider(engine=engine.alias, ssh_options={}, isolation="none")
                self.image_reports[engine.alias] = _image_transfer.ensure_image(provider, image, compress=False)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                failures.append(exc)

        with self.exported():
            threads = [threading.Thread(target=ship, args=(engine,)) for engine in self.engines if engine.dockerd]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if failures:
            raise failures[0]

    def _start_engine(self, number: int, public_key: str, dockerd: bool) -> Engine:
        container = f"{self.prefix}{number}"
        size = self.tmpfs_size[number - 1] if isinstance(self.tmpfs_size, list) else self.tmpfs_size
        command = [
            "docker", "run", "-d", "--name", container, "--hostname", container,
            "--label", f"{TEST_LABEL}=engine", "--label", f"{TEST_LABEL}.run={self.run_id}",
            *BOX_CAPS, *BOX_SECURITY, "--cgroupns", "private",
            "--tmpfs", f"/var/lib/docker:size={size}",
            "-p", "127.0.0.1:0:22",
            "-e", f"ENGINE_AUTHORIZED_KEY={public_key}", "-e", f"ENGINE_DOCKERD={1 if dockerd else 0}",
            "--entrypoint", "bash", ENGINE_IMAGE, "-c", ENGINE_SCRIPT,
        ]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True)
        port_line = subprocess.run(
            ["docker", "port", container, "22/tcp"], check=True, capture_output=True, text=True
        ).stdout.splitlines()[0]
        port = int(port_line.rsplit(":", 1)[1])
        return Engine(alias=container, container=container, port=port, host_key_line="", dockerd=dockerd)

    def _wait_ready(self, engine: Engine, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = engine.shell("test -f /run/engine-ready && cat /etc/ssh/ssh_host_ed25519_key.pub", check=False)
            if ready.returncode == 0 and _ssh_banner(engine.port) and (not engine.dockerd or _dockerd_up(engine)):
                key_type, key_data = ready.stdout.split()[:2]
                engine.host_key_line = f"[127.0.0.1]:{engine.port} {key_type} {key_data}"
                return
            time.sleep(0.5)
        logs = subprocess.run(
            ["docker", "logs", "--tail", "30", engine.container], check=False, capture_output=True, text=True
        )
        raise RuntimeError(f"engine {engine.container} did not come up in {timeout} s: {logs.stdout}{logs.stderr}")

    def write_config(self, known_hosts_lines: list[str] | None = None) -> None:
        lines = known_hosts_lines if known_hosts_lines is not None else [e.host_key_line for e in self.engines]
        with open(self.known_hosts, "w", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
        blocks = []
        for engine in self.engines:
            blocks.append(
                f"Host {engine.alias}\n  HostName 127.0.0.1\n  Port {engine.port}\n  User root\n"
                f"  IdentityFile {self.key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {self.known_hosts}\n"
            )
        # user@127.0.0.1:<port> destinations get the same key and known_hosts.
        blocks.append(
            f"Host 127.0.0.1\n  IdentityFile {self.key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {self.known_hosts}\n"
        )
        with open(self.ssh_config, "w", encoding="utf-8") as handle:
            handle.write("\n".join(blocks))

    # -- tear-down -------------------------------------------------------------------------------
    def stop(self) -> None:
        if self.export_env and self._old_env is None:
            os.environ.pop(SSH_CONFIG_ENV, None)
        elif self.export_env:
            os.environ[SSH_CONFIG_ENV] = self._old_env
        try:
            from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _engine_sdk
            from ansible_collections.agentbox.box.plugins.module_utils.ssh import _ssh

            for engine in self.engines:
                for name in (engine.alias, engine.destination):
                    _engine_sdk.forget_client(name)
            _ssh.close_all()
        except ImportError:
            pass
        names = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={TEST_LABEL}.run={self.run_id}"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout.split()
        if names:
            subprocess.run(["docker", "rm", "-f", "-v", *names], check=False, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def run_fleet(box_image: str, shared: Path) -> Iterator[EngineFleet]:
    """The run's fleet (two engines, box_image on both as FLEET_IMAGE): the first worker to ask
    makes it under a file lock in `shared` (a directory every worker of the run sees), the other reuses it,
    and the last one out (counted under the lock) removes it and the local tag. A worker that asks after the
    last one left makes a new one."""
    state, users = shared / "fleet.pickle", shared / "fleet.users"
    with _locked(shared / "fleet.lock"):
        if state.exists():
            fleet = pickle.loads(state.read_bytes())
        else:
            subprocess.run(["docker", "tag", box_image, FLEET_IMAGE], check=True, capture_output=True)
            # The box image (1.1 GB), its load, checkpoints. engines[0] holds both workers' boxes at once and a
            # second load of the image (the first-stream test: the load's tar lands on the disk before its
            # layers are found present); engines[1] is filled by the disk-full test, so it stays small.
            fleet = EngineFleet(count=2, tmpfs_size=["5g", "3g"], export_env=False)
            try:
                fleet.start()
                fleet.load_image(FLEET_IMAGE)
            except BaseException:
                fleet.stop()
                subprocess.run(["docker", "rmi", FLEET_IMAGE], check=False, capture_output=True)
                raise
            state.write_bytes(pickle.dumps(fleet))
        users.write_text(str(int(users.read_text() or 0) + 1 if users.exists() else 1))
    try:
        yield fleet
    finally:
        with _locked(shared / "fleet.lock"):
            left = int(users.read_text()) - 1
            users.write_text(str(left))
            if left == 0:
                fleet.stop()
                subprocess.run(["docker", "rmi", FLEET_IMAGE], check=False, capture_output=True)
                state.unlink()


def _ssh_banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.settimeout(2)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _dockerd_up(engine: Engine) -> bool:
    return engine.shell("docker info >/dev/null 2>&1", check=False).returncode == 0


def free_port() -> int:
    """A 127.0.0.1 port nothing listens on (an engine that is down)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ssh_options(**overrides: Any) -> dict[str, Any]:
    return {"strict_host_key_checking": True, "private_key_file": None, **overrides}
