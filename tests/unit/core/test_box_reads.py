"""Reads of what a box wrote are bounded at the source: a cap in the exec itself, a capped reader on the
host (CappedOutput, which every provider's exec reads through), and a refusal that is the box's own
error and one line in the host's log. The boxes are the fake provider's real directories (real sh,
head and tar run in them), the files real sparse files of 2 GiB."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.agent import _agent
from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.core._box_data import MAX_JSON_BYTES
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import (
    EXEC_OUTPUT_LIMIT,
    CappedOutput,
    OutputTooLarge,
    read_box_file,
)
from ansible_collections.agentbox.box.plugins.module_utils.git import _seed, _ship
from ansible_collections.agentbox.box.plugins.module_utils.idle import _idle
from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona_exec import (
    WAIT_SCRIPT,
    parse_wait_output,
)
from tests.unit.support.fake_provider import FakeProvider

SPARSE = 2 << 30  # 2 GiB, no blocks on disk


def sparse(path: Path, size: int = SPARSE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)


@pytest.fixture
def box(fake: FakeProvider, tmp_path: Path) -> str:
    workspace = tmp_path / "plain"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    _box.create_box(fake, _box.CreateRequest(name="reads", workspace=str(workspace), boot=False))
    return "reads"


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "agentbox" and record.levelno == logging.WARNING]  # fmt: skip


def test_capped_output_keeps_up_to_the_cap_and_nothing_past_it() -> None:
    output = CappedOutput(10)
    assert output.add(b"12345") and output.add(b"678", stderr=True)
    assert output.room(2) and not output.room(3)
    assert not output.add(b"abc") and output.over
    assert not output.add(b"")  # once over, nothing more is taken
    result = output.result(0)
    assert (result.stdout, result.stderr, output.size) == (b"12345", b"678", 8)
    assert "printed more than the 10 bytes the host reads" in str(output.refused(["cat"], "b"))
    unbounded = CappedOutput(None)
    assert unbounded.add(b"x" * 100) and unbounded.room(1 << 40)


def test_a_command_printing_past_the_default_cap_is_the_boxs_own_error_and_one_log_line(
    fake: FakeProvider, box: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentbox")
    with pytest.raises(OutputTooLarge) as refused:
        fake.exec(box, ["head", "-c", str(EXEC_OUTPUT_LIMIT + 1), "/dev/zero"])
    assert f"the box's output of head is over {EXEC_OUTPUT_LIMIT} bytes: refused" in str(refused.value)
    assert refused.value.box == box
    assert refusals(caplog) == [f"box {box}: {refused.value}"]
    # The user's own command (the connection plugin's) is read whole; a named read says what it was.
    assert len(fake.exec(box, ["head", "-c", str(EXEC_OUTPUT_LIMIT + 1), "/dev/zero"], limit=None).stdout) == \
        EXEC_OUTPUT_LIMIT + 1
    with pytest.raises(OutputTooLarge, match="the box's listing is over 100 bytes"):
        fake.exec(box, ["seq", "1000"], limit=100, what="listing")


def test_a_2gib_sparse_seed_record_is_refused_after_one_byte_past_the_cap(
    fake: FakeProvider, box: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentbox")
    assert _seed.read_seed_record(fake, box)["mode"] == "copy"  # the real record reads as before
    sparse(fake.box_root(box) / _seed.SEED_RECORD.lstrip("/"))
    with pytest.raises(OutputTooLarge) as refused:
        _seed.read_seed_record(fake, box)
    assert f"the box's seed record ({_seed.SEED_RECORD}) is over {MAX_JSON_BYTES} bytes: refused" in str(refused.value)
    assert len(refusals(caplog)) == 1
    # No file: None, as before; a file at the cap exactly is read.
    assert read_box_file(fake, box, "/nowhere", "nothing", 10) is None
    (fake.box_root(box) / "etc/ten").write_bytes(b"0123456789")
    assert read_box_file(fake, box, "/etc/ten", "ten bytes", 10) == b"0123456789"
    with pytest.raises(OutputTooLarge, match="the box's nine is over 9 bytes"):
        read_box_file(fake, box, "/etc/ten", "nine", 9)


def test_an_agent_state_file_over_its_cap_is_refused_and_the_idle_plan_leaves_the_box_as_an_error(
    fake: FakeProvider, box: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentbox")
    states = fake.box_root(box) / _agent.STATE_FILES.lstrip("/")
    states.mkdir(parents=True)
    (states / "claude.state.json").write_text('{"state": "idle", "session": "claude",\n'
                                              ' "since": "2026-01-01T00:00:00Z"}\n')  # fmt: skip
    [read] = _agent.read_states(fake, box)
    assert isinstance(read.pop("quiet_seconds"), int)  # the seconds since its last progress (docs/agents.md)
    assert read == {"name": "claude", "session": "claude", "state": "idle", "since": "2026-01-01T00:00:00Z"}
    sparse(states / "codex.state.json")
    with pytest.raises(OutputTooLarge, match=f"agent state file .* is over {_agent.STATE_FILE_LIMIT} bytes"):
        _agent.read_states(fake, box)
    assert _agent.agents_of(fake, [box]) == {box: None}  # a listing shows the box without an agent
    observed = _idle.observe(fake, [box], 0.0)
    assert observed[box][0] is None and "over 4096 bytes" in observed[box][1]["refused"]
    facts = {"name": box, "state": "running", "provider": "fake", "engine": "e", "id": "1"}
    [decision] = _idle.plan([facts], {box: None}, {}, 0.0, {"max_running": 0, "include_agentless": True},
                            {box: observed[box][1]})
    assert decision["action"] == "error" and "refused" in decision["reason"]
    assert len(refusals(caplog)) == 3  # one line per refused read


def test_the_daytona_waiter_prints_one_byte_past_the_cap_of_each_stream(tmp_path: Path) -> None:
    """The waiter (run by Daytona's toolbox in the box) reads the command's output files with the cap:
    a 2 GiB output comes back as cap + 1 bytes, and the control files it prints are capped too."""
    directory = tmp_path / "exec"
    directory.mkdir()
    sparse(directory / "out")
    (directory / "err").write_bytes(b"oops\n")
    (directory / "rc").write_bytes(b"0")
    done = subprocess.run(["sh", "-c", WAIT_SCRIPT, "agentbox-wait", str(directory), "5", "1000"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert len(done.stdout) < 4096
    status, rc, out, err = parse_wait_output(done.stdout)
    assert (status, rc, len(out), err) == ("DONE", 0, 1001, b"oops\n")
    output = CappedOutput(1000)
    assert not (output.add(out) and output.add(err, stderr=True))
    (directory.parent / "exec.done" / "rc").write_bytes(b"0" * 100)  # a control file the box blew up
    again = subprocess.run(["sh", "-c", WAIT_SCRIPT, "agentbox-wait", str(directory), "5", "1000"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert again.stdout.startswith("AGENTBOX-EXEC DONE " + "0" * 16 + "\n")


class TarFromTheBox(FakeProvider):
    """A provider whose archives the box makes itself (Daytona, boxd run tar in the box): here the
    box's tar is whatever file the box left at <path>.tar."""

    def get_archive(self, name: str, path: str) -> Iterator[bytes]:
        run = self.exec(name, ["cat", f"{path}.tar"], user="root", limit=None)
        return iter([run.stdout[i:i + 65536] for i in range(0, len(run.stdout), 65536)])


@pytest.fixture
def tar_box(tmp_path: Path, home: Path) -> Iterator[tuple[TarFromTheBox, str]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the fake provider mounts and chroots")
    provider = TarFromTheBox(tmp_path / "tar-engine", shares_host_filesystem=False)
    workspace = tmp_path / "tw"
    workspace.mkdir()
    _box.create_box(provider, _box.CreateRequest(name="tars", workspace=str(workspace), boot=False))
    yield provider, "tars"
    provider.destroy("tars")


def member(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info


def test_a_bundle_copied_out_is_streamed_to_a_file_within_its_cap(
    tar_box: tuple[TarFromTheBox, str], tmp_path: Path
) -> None:
    provider, box = tar_box
    root = provider.box_root(box)
    destination = tmp_path / "bundle"

    def plant(data: bytes) -> None:
        (root / "tmp/b.tar").write_bytes(data)

    def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    plant(tar_of((member("b", 5), b"12345")))
    _ship._copy_out(provider, box, "/tmp/b", str(destination), limit=5)
    assert destination.read_bytes() == b"12345"
    destination.unlink()
    plant(tar_of((member("b", 6), b"123456")))
    with pytest.raises(OutputTooLarge, match="the box's bundle /tmp/b is over 5 bytes"):
        _ship._copy_out(provider, box, "/tmp/b", str(destination), limit=5)
    assert not destination.exists()
    plant(tar_of((member("b", 0, tarfile.DIRTYPE), b""), (member("b/x", 5), b"12345")))
    with pytest.raises(_ship.ProviderError, match="is not a file"):
        _ship._copy_out(provider, box, "/tmp/b", str(destination))
    # A pax header that claims 8 MiB of attributes: refused after the header limit, never read whole.
    header = member("b", 5)
    header.pax_headers = {"comment": "x" * (8 << 20)}
    plant(tar_of((header, b"12345")))
    with pytest.raises(OutputTooLarge, match="bundle /tmp/b"):
        _ship._copy_out(provider, box, "/tmp/b", str(destination))
