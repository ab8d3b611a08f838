"""The boxd provider's promises that the lifecycle tests do not pin, through the emulator and the real SDK:
atomic uploads (also when the stream is cut), a hibernated machine woken by an exec, every create option
reaching boxd, and creates that fail after the machine exists leaving nothing behind."""

from __future__ import annotations

import hashlib
import io
import secrets
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.boxd_emulator import running_emulator
from tests.integration.providers.boxd.test_boxd_provider import IMAGE, World

pytestmark = pytest.mark.integration

MIB = 1 << 20


@pytest.fixture(scope="module")
def world(box_image: str) -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-bg-", dir="/tmp"))
    root.chmod(0o755)
    try:
        with running_emulator(image=box_image) as emu:
            yield World(emu, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def spec_of(world: World, name: str, **extra):
    from ansible_collections.agentbox.box.plugins.module_utils.core._naming import box_labels
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec

    box_id = secrets.token_hex(8)
    labels = box_labels(box=name, box_id=box_id, project="0" * 16, workspace=str(world.root), branch="",
                        image_fingerprint="", provider="boxd", engine=world.base_url, checkpoint=None)
    return BoxSpec(name=name, box_id=box_id, project="0" * 16, workspace=str(world.root), image=IMAGE,
                   labels=labels, **extra)


@pytest.fixture(scope="module")
def box(world: World) -> Iterator[str]:
    """One box for the file tests."""
    provider = world.provider()
    name = f"bu-{secrets.token_hex(3)}"
    provider.create(spec_of(world, name))
    try:
        yield name
    finally:
        provider.destroy(name)


def one_file_tar(name: str, data: bytes) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size, info.uid, info.gid, info.mode = len(data), 1000, 1000, 0o644
        archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def sha256_in_box(provider, box: str, path: str) -> str:
    return provider.exec(box, ["sha256sum", path], user="root").check("sha256sum", box).text.split()[0]


def entries(provider, box: str, directory: str) -> list[str]:
    return sorted(provider.exec(box, ["ls", "-A", directory], user="root").check("ls", box).text.split())


READER = r"""
f=$1; stop=$2; ready=$3; old=$4; new=$5; n=0; seen_old=0; seen_new=0; last=0
while [ "$last" = 0 ]; do
  [ -e "$stop" ] && last=1  # one more look once told to stop: the upload is over by then
  s=$(stat -c %s "$f" 2>/dev/null || echo missing)
  case $s in "$old") seen_old=1;; "$new") seen_new=1;; *) echo "partial $s";; esac
  n=$((n+1)); [ "$n" = 1 ] && touch "$ready"
done
echo "loops $n old $seen_old new $seen_new"
"""


def test_an_upload_over_a_file_never_shows_a_reader_a_partial_file(world: World, box: str) -> None:
    """A reader in the box stats the file in a loop while 8 MiB replace it: it sees the old size, then the
    new one, never anything between (nor no file); the temporary directory is gone afterwards."""
    provider = world.provider()
    directory = f"/tmp/atomic-{secrets.token_hex(3)}"
    old, new = b"o" * (8 * MIB), b"n" * (8 * MIB + 3)
    provider.put_archive(box, directory, one_file_tar("big.bin", old))
    stop, ready = f"{directory}.stop", f"{directory}.ready"
    seen: dict[str, object] = {}

    def read_loop() -> None:
        try:
            seen["result"] = provider.exec(box, ["sh", "-c", READER, "reader", f"{directory}/big.bin", stop, ready,
                                                 str(len(old)), str(len(new))], timeout=300)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            seen["error"] = exc

    reader = threading.Thread(target=read_loop, daemon=True)
    reader.start()
    try:
        waited = provider.exec(box, ["sh", "-c", 'i=0; until [ -e "$1" ]; do i=$((i+1)); [ $i -gt 6000 ] && '
                                     'exit 1; sleep 0.01; done', "wait", ready])
        assert waited.rc == 0, "the reader loop never started"
        provider.put_archive(box, directory, one_file_tar("big.bin", new))
    finally:
        provider.exec(box, ["touch", stop]).check("stopping the reader", box)
        reader.join(120)
    assert "error" not in seen, seen.get("error")
    out = seen["result"].check("reader", box).text  # type: ignore[union-attr]
    assert "partial" not in out, out[:2000]
    assert out.strip().endswith("old 1 new 1"), out[-500:]  # it ran before and after the replacement
    assert sha256_in_box(provider, box, f"{directory}/big.bin") == hashlib.sha256(new).hexdigest()
    owner = provider.exec(box, ["stat", "-c", "%u:%g %a", f"{directory}/big.bin"]).check("stat", box).text.strip()
    assert owner == "1000:1000 644"
    assert entries(provider, box, directory) == ["big.bin"]  # no temporary directory left


def test_an_upload_cut_off_mid_stream_leaves_the_old_file_and_no_debris(world: World, box: str) -> None:
    """The exec's stdin is cut after 3 MiB (the call cancelled, the command killed by the emulator as boxd
    does): the upload fails, the old file is whole, nothing temporary stays, nothing of the upload runs."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = world.provider()
    directory = f"/tmp/cut-{secrets.token_hex(3)}"
    old = secrets.token_bytes(2 * MIB)
    provider.put_archive(box, directory, one_file_tar("keep.bin", old))
    world.emu.control.add_fault(method="Exec", action="drop_input", after=4)  # the command, then 3 x 1 MiB
    try:
        with pytest.raises(ProviderError):
            provider.put_archive(box, directory, one_file_tar("keep.bin", b"x" * (8 * MIB)))
    finally:
        world.emu.control.clear_faults()
    assert sha256_in_box(provider, box, f"{directory}/keep.bin") == hashlib.sha256(old).hexdigest()
    assert entries(provider, box, directory) == ["keep.bin"]
    running = provider.exec(box, ["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"],
                            user="root").check("ps", box).text
    assert not [line for line in running.splitlines() if "tar -x" in line], running


def test_an_exec_wakes_a_hibernated_machine_with_its_exit_code(world: World, box: str) -> None:
    from boxd import Boxd

    provider = world.provider()
    machine_id = provider.find(box).container
    sdk = Boxd(token=world.token, base_url=world.base_url, max_retries=0)
    try:
        sdk.machines.hibernate(machine_id)
        assert world.emu.control.machine(machine_id)["status"] == "hibernated"
        assert provider.find(box).state == "paused"
        result = provider.exec(box, ["sh", "-c", "echo awake; echo late >&2; exit 3"])
        assert (result.rc, result.stdout, result.stderr) == (3, b"awake\n", b"late\n")
        assert world.emu.control.machine(machine_id)["status"] == "running"
        assert provider.find(box).state == "running"
    finally:
        sdk.close()


def test_every_create_option_reaches_boxd(world: World) -> None:
    """env, vCPUs, memory, disk, the auto-suspend timeout and the egress allow list, as boxd recorded them
    (the emulator's state and the SDK's own reading of the machine), and the env inside the box."""
    from boxd import Boxd

    egress = ["github.com", "pypi.org", "10.1.0.0/16"]
    provider = world.provider(auto_suspend=900, disk=30, egress_allow=egress)
    name = f"bo-{secrets.token_hex(3)}"
    env = {"GREETING": "hé llo", "MODE": "a b=c"}
    facts = provider.create(spec_of(world, name, env=env, resources={"cpus": 1.5, "memory": "3g"}))
    sdk = Boxd(token=world.token, base_url=world.base_url, max_retries=0)
    try:
        recorded = world.emu.control.machine(facts.container)
        assert recorded["env"] == env
        assert (recorded["vcpu"], recorded["memory_bytes"], recorded["disk_bytes"]) == (2, 3 << 30, 30 << 30)
        assert recorded["auto_suspend_secs"] == 900
        assert recorded["egress_allow"] == egress
        machine = sdk.machines.get(facts.container)
        assert (machine.resources.vcpu, machine.resources.memory_bytes, machine.resources.disk_bytes) == (
            2, 3 << 30, 30 << 30)
        assert machine.idle.suspend_after == 900 and machine.egress_allow == egress
        assert provider.exec(name, ["printenv", "GREETING", "MODE"]).stdout == "hé llo\na b=c\n".encode()
    finally:
        sdk.close()
        provider.destroy(name)


@pytest.mark.parametrize("step", ["egress", "secrets"])
def test_a_create_failing_after_the_machine_exists_leaves_no_machine(world: World, step: str) -> None:
    """The egress call or the secrets exec fails once the machine is made, and the first delete of the
    clean-up loses its connection: the create fails, and no machine of that box is left."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    control = world.emu.control
    provider = world.provider(egress_allow=["github.com"] if step == "egress" else [])
    name = f"bz-{secrets.token_hex(3)}"
    spec = spec_of(world, name, secrets={"TOKEN": "s3cret"} if step == "secrets" else {})
    before = len(control.requests())
    control.add_fault(method="SetVmEgressAllow" if step == "egress" else "Exec", action="error", code="INTERNAL",
                      message=f"injected failure of the {step} step")
    control.add_fault(method="DestroyVm", action="error", code="UNAVAILABLE")
    try:
        with pytest.raises(ProviderError, match=f"the {step} step"):
            provider.create(spec)
    finally:
        control.clear_faults()
    calls = [r["method"] for r in control.requests()[before:]]
    assert calls.count("CreateVm") == 1 and "DestroyVm" in calls
    assert not [m for m in world.machines() if m["labels"].get("io.agentbox.id") == spec.box_id]
    assert provider.find(name) is None
