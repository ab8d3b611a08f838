"""The boxd emulator (scripts/boxd-emulator) driven by the real boxd==0.2.19 SDK, real containers behind it.

The machines run the tiny busybox test image (tests/daytona_emulator/testimage.py); every container and
snapshot image of the emulator is removed at the end, which the module fixture checks.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from boxd import (  # noqa: E402 - imported after tests.boxd_emulator chose the gRPC poller
    APIConnectionError,
    AuthenticationError,
    Boxd,
    ConflictError,
    NotFoundError,
    RateLimitError,
)
from boxd._generated import api_pb2  # noqa: E402

from tests.boxd_emulator import running_emulator  # noqa: E402 - after the sys.path set-up; sets the gRPC poller
from tests.daytona_emulator import EMULATOR_LABEL, TEST_IMAGE, ensure_test_image  # noqa: E402

pytestmark = pytest.mark.integration
MIB = 1 << 20


@pytest.fixture(scope="module")
def emu(docker_client):
    ensure_test_image(docker_client)
    with running_emulator(image=TEST_IMAGE) as running:
        yield running
    label = f"{EMULATOR_LABEL}={running.instance_id}"
    assert docker_client.containers.list(all=True, filters={"label": label}) == []
    assert docker_client.images.list(filters={"label": label}) == []


@pytest.fixture
def client(emu):
    sdk = Boxd(token=emu.token, base_url=emu.base_url, max_retries=0)
    yield sdk
    emu.control.clear_faults()
    for machine in sdk.machines.list():
        sdk.machines.delete(machine.id)
    sdk.close()


def _machine(client, **kwargs):
    machine = client.machines.create(f"t-{secrets.token_hex(4)}", **kwargs)
    return client.machines.wait_until_ready(machine.id, timeout=60)


def test_lifecycle_ids_labels_and_wake_on_exec(client, emu, docker_client):
    tag = secrets.token_hex(4)
    created = client.machines.create(f"life-{tag}", labels={"io.agentbox.box": tag}, env={"GREETING": "hé llo"},
                                     vcpu=2, memory="2G")
    assert created.status == "starting"
    machine = client.machines.wait_until_ready(created.id, timeout=60)
    assert machine.status == "running"
    assert machine.resources.vcpu == 2 and machine.resources.memory_bytes == 2 << 30
    # Addressed by id only: the name is not found, as on the production cluster.
    with pytest.raises(NotFoundError):
        client.machines.get(f"life-{tag}")
    assert [m.id for m in client.machines.list(labels={"io.agentbox.box": tag})] == [created.id]
    assert client.machines.list(labels={"io.agentbox.box": "other"}) == []
    assert client.machines.exec(created.id, "printf %s \"$GREETING\"").stdout == "hé llo"

    container = docker_client.containers.get(emu.control.machine(created.id)["container"])
    client.machines.pause(created.id)
    assert client.machines.get(created.id).status == "suspended"
    container.reload()
    assert container.status == "paused"
    assert client.machines.exec(created.id, "echo awake").stdout == "awake\n"  # wakes on exec
    assert client.machines.get(created.id).status == "running"

    client.machines.hibernate(created.id)
    assert client.machines.get(created.id).status == "hibernated"
    client.machines.wake(created.id)
    assert client.machines.get(created.id).status == "running"

    client.machines.stop(created.id)
    assert client.machines.get(created.id).status == "stopped"
    with pytest.raises(ConflictError, match="stopped"):
        client.machines.exec(created.id, "true")
    client.machines.start(created.id)
    assert client.machines.wait_until_ready(created.id, timeout=60).status == "running"

    with pytest.raises(ConflictError):
        client.machines.create(f"life-{tag}")  # a name is taken once
    client.machines.delete(created.id)
    with pytest.raises(NotFoundError):
        client.machines.get(created.id)
    assert docker_client.containers.list(all=True, filters={"id": container.id}) == []


def test_exec_exit_codes_stderr_and_20_mib_streamed(client):
    machine = _machine(client)
    for code in (0, 1, 3, 124, 255):
        result = client.machines.exec(machine.id, f"echo out; echo err >&2; exit {code}")
        assert (result.exit_code, result.stdout, result.stderr) == (code, "out\n", "err\n")
    # 20 MiB of non-repeating output, streamed in messages under the 4 MiB cap, byte for byte.
    digest, size, chunks = hashlib.sha256(), 0, 0
    with client.machines.stream_exec(machine.id, command="head -c 20971520 /dev/urandom | tee /tmp/out | wc -c >&2",
                                     close_stdin=True) as stream:
        stderr = b""
        for chunk in stream.iter_chunks():
            if chunk.is_stderr:
                stderr += chunk.data
    assert stream.exit_code == 0 and stderr.strip() == b"20971520"
    with client.machines.stream_exec(machine.id, command="cat /tmp/out", close_stdin=True) as stream:
        for chunk in stream.iter_chunks():
            digest.update(chunk.data)
            size += len(chunk.data)
            chunks += 1
    assert stream.exit_code == 0 and size == 20 * MIB and chunks > 5
    remote = client.machines.exec(machine.id, "sha256sum /tmp/out").stdout.split()[0]
    assert remote == digest.hexdigest()
    # stdin reaches the command; the client's half-close is its EOF.
    stream = client.machines.stream_exec(machine.id, command="wc -c")
    stream.write(b"x" * 100_000)
    stream.write_eof()
    assert b"".join(stream).strip() == b"100000" and stream.exit_code == 0


def test_upload_download_10_mib_unicode_name(client, emu):
    machine = _machine(client)
    payload = os.urandom(10 * MIB)
    path = "/tmp/deep/ñame dir/naïve файл 東京.bin"
    assert client.machines.files.upload(machine.id, path, payload) == len(payload)  # parents created
    assert client.machines.files.download(machine.id, path) == payload
    listing = client.machines.exec(machine.id, "find '/tmp/deep/ñame dir' -mindepth 1").stdout
    assert listing == f"{path}\n"  # no temporary file left behind
    # The unary call is capped at 4 MiB like production; the streamed one is not.
    channel_call = client._transport.call  # the SDK's own transport, to reach the capped unary RPC
    with pytest.raises(RateLimitError, match="4 MiB"):
        channel_call("DownloadFile", api_pb2.DownloadFileRequest(vm_id=machine.id, path=path))
    with pytest.raises(NotFoundError):
        client.machines.files.download(machine.id, "/tmp/deep/missing")


def test_auto_suspend_then_wake(client, emu):
    # Not wait_until_ready: it wants "running", which an idle machine may already have left for "suspended".
    machine = client.machines.create(f"t-{secrets.token_hex(4)}", auto_suspend_timeout=1)
    deadline = time.monotonic() + 60
    while client.machines.get(machine.id).status != "suspended":
        assert time.monotonic() < deadline, "the idle machine was never suspended"
        emu.control.tick()
        time.sleep(0.2)
    assert client.machines.exec(machine.id, "echo hi").stdout == "hi\n"


def _ready(client, name: str, version: int):
    deadline = time.monotonic() + 60
    while (found := client.snapshots.get(name)).status != "ready" or found.version != version:
        assert found.status == "pending" and time.monotonic() < deadline, found
        time.sleep(0.05)
    return found


def test_snapshot_versions_new_machine_and_delete(client, emu):
    """A capture is pending, then ready; saving the name again makes version 2 (created_at stays, updated_at
    moves) and a new machine gets the latest; an archived snapshot makes no machine and is not saved again."""
    machine = _machine(client, labels={"io.agentbox.box": "a"})
    client.machines.exec(machine.id, "echo warm > /tmp/state")
    snapshot_name = f"s-{secrets.token_hex(4)}"
    made = client.snapshots.create(machine.id, snapshot_name)
    assert (made.version, made.status) == (1, "pending")
    first = _ready(client, snapshot_name, 1)
    client.machines.exec(machine.id, "echo warmer > /tmp/state")
    again = client.snapshots.create(machine.id, snapshot_name)
    assert (again.id, again.version, again.status) == (first.id, 2, "pending")
    assert client.snapshots.get(snapshot_name).version == 1  # the latest ready one, until 2 is
    second = _ready(client, snapshot_name, 2)
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at
    restored = client.machines.create(f"r-{secrets.token_hex(4)}", from_snapshot=snapshot_name,
                                      labels={"io.agentbox.box": "b"})
    client.machines.wait_until_ready(restored.id, timeout=60)
    assert client.machines.exec(restored.id, "cat /tmp/state").stdout == "warmer\n"
    assert client.machines.get(restored.id).labels == {"io.agentbox.box": "b"}
    with pytest.raises(ConflictError):
        client.snapshots.delete(snapshot_name)  # still in use
    client.machines.delete(restored.id)

    client.snapshots.create(machine.id, snapshot_name)
    emu.control.fail_snapshot(snapshot_name, "disk full")
    failed = client.snapshots.get(snapshot_name)
    assert (failed.status, failed.version) == ("failed", 2)  # version 2 stays the one to restore
    emu.control.archive_snapshot(snapshot_name)
    archived = client.snapshots.get(snapshot_name)
    assert archived.archived and archived.storage == "archived"
    with pytest.raises(ConflictError, match="archived"):
        client.machines.create(f"r-{secrets.token_hex(4)}", from_snapshot=snapshot_name)
    with pytest.raises(ConflictError, match="archived"):
        client.snapshots.create(machine.id, snapshot_name)
    client.snapshots.delete(snapshot_name)
    assert snapshot_name not in [s.name for s in client.snapshots.list()]


def test_a_hibernated_machine_is_woken_not_resumed(client):
    machine = _machine(client)
    client.machines.hibernate(machine.id)
    with pytest.raises(ConflictError, match="hibernated: wake it"):
        client.machines.resume(machine.id)
    client.machines.wake(machine.id)
    assert client.machines.get(machine.id).status == "running"
    client.machines.pause(machine.id)
    client.machines.resume(machine.id)
    assert client.machines.get(machine.id).status == "running"


def test_a_create_spec_carries_labels_env_and_egress(client, emu):
    """create(spec=...): the spec holds the labels, env and egress list, set at create; an image next to it
    is refused (the SDK refuses it before sending, as boxd does)."""
    from boxd.spec import MachineSpecError

    spec = {"labels": {"io.agentbox.box": "s"}, "env": {"MODE": "x"}, "egress": ["github.com"]}
    machine = client.machines.create(f"t-{secrets.token_hex(4)}", spec=spec)
    recorded = emu.control.machine(machine.id)
    assert (recorded["labels"], recorded["env"], recorded["egress_allow"]) == (
        {"io.agentbox.box": "s"}, {"MODE": "x"}, ["github.com"])
    with pytest.raises(MachineSpecError, match="does not accept image"):
        client.machines.create(f"t-{secrets.token_hex(4)}", image=TEST_IMAGE, spec=spec)


def test_faults_token_and_requests(client, emu):
    machine = _machine(client)
    emu.control.add_fault(method="Exec", action="error", code="FAILED_PRECONDITION",
                          message=f"machine {machine.id} is stopped")
    with pytest.raises(ConflictError, match="stopped"):
        client.machines.exec(machine.id, "true")
    assert client.machines.exec(machine.id, "true").exit_code == 0  # one hit, then gone

    # A dropped stream mid-exec: the client sees a transport error after some output.
    emu.control.add_fault(method="Exec", action="drop", after=2)
    seen = b""
    with pytest.raises(APIConnectionError):
        with client.machines.stream_exec(machine.id, command="head -c 8388608 /dev/zero", close_stdin=True) as s:
            for data in s:
                seen += data
    assert 0 < len(seen) < 8 * MIB

    # The work done, the answer lost: the machine exists though the create failed.
    name = f"lost-{secrets.token_hex(3)}"
    emu.control.add_fault(method="CreateVm", action="error_after", code="UNAVAILABLE")
    with pytest.raises(APIConnectionError):
        client.machines.create(name, labels={"io.agentbox.id": name})
    assert [m.name for m in client.machines.list(labels={"io.agentbox.id": name})] == [name]

    emu.control.add_fault(method="GetVm", action="delay", seconds=0.5)  # slow, then answered normally
    assert client.machines.get(machine.id).status == "running"
    assert any(r["method"] == "GetVm" for r in emu.control.requests())

    with pytest.raises(AuthenticationError):
        Boxd(token="wrong", base_url=emu.base_url, max_retries=0).machines.list()


def test_exposed_ports_forward_on_127_0_0_1(client, emu):
    import socket

    machine = _machine(client, image=TEST_IMAGE)
    web = client.machines.ports.expose(machine.id, 80)
    assert (web.dns, web.machine_port, web.protocol) == ("127.0.0.1", 80, "tcp") and web.public_port > 0
    assert client.machines.ports.expose(machine.id, 80).public_port == web.public_port  # re-expose keeps it
    client.machines.ports.expose(machine.id, 7000)
    client.machines.ports.expose(machine.id, 7001)
    with pytest.raises(ConflictError, match="already exposes 3 ports"):
        client.machines.ports.expose(machine.id, 7002)
    assert [f.machine_port for f in client.machines.ports.list(machine.id)] == [80, 7000, 7001]
    # busybox's nc answers one connection on 7000 (the exec returns once it listens); the forward carries it.
    client.machines.exec(machine.id, ["sh", "-c", "(echo pong | nc -l -p 7000 >/dev/null 2>&1 &) ; "
                                      "until netstat -ltn | grep -q ':7000 '; do :; done"])
    forward = next(f for f in client.machines.ports.list(machine.id) if f.machine_port == 7000)
    with socket.create_connection((forward.dns, forward.public_port), timeout=30) as conn:
        conn.sendall(b"ping\n")
        assert conn.makefile("rb").readline() == b"pong\n"
    gone = client.machines.ports.unexpose(machine.id, 7001)
    assert gone.machine_port == 7001
    with pytest.raises(NotFoundError):
        client.machines.ports.unexpose(machine.id, 7001)
    client.machines.delete(machine.id)
    assert [f for f in client.machines.ports.list() if f.machine_id == machine.id] == []
    with pytest.raises(ConnectionError):
        socket.create_connection((web.dns, web.public_port), timeout=5).close()  # the listener went with it


def test_api_key_exchange_and_its_rate_limit(emu):
    """The SDK's own key path: the key exchanged at the base URL's /api/v1/auth/token (HTTP/1.1 on the gRPC
    port, as boxd's development server serves both), then gRPC with the token; a wrong key is 401, and past
    the per-address limit the exchange answers 429 with Retry-After."""
    import httpx

    sdk = Boxd(api_key=emu.api_key, base_url=emu.base_url, max_retries=0)
    try:
        assert isinstance(sdk.machines.list(), list)
    finally:
        sdk.close()
    with pytest.raises(AuthenticationError, match="invalid or expired API key"):
        Boxd(api_key="bxd_wrong", base_url=emu.base_url, max_retries=0).machines.list()
    url = f"{emu.base_url}/api/v1/auth/token"
    emu.control.configure(exchange_limit=1, exchange_window=30)
    try:
        first = httpx.post(url, json={"api_key": emu.api_key}, timeout=10)
        assert first.status_code == 200 and first.json()["expires_at"] > time.time() + 3000
        again = httpx.post(url, json={"api_key": emu.api_key}, timeout=10)
        assert again.status_code == 429 and 0 < int(again.headers["retry-after"]) <= 30
    finally:
        emu.control.configure(exchange_limit=10, exchange_window=60)
    assert [r["status"] for r in emu.control.requests() if r["method"] == "ExchangeToken"][-4:] == [200, 401, 200, 429]
