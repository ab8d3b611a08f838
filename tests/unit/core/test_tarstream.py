"""The seed's one tar stream (_tarstream.tar_ending_with): every part's files under its target, then
the seed record as the last member, in a chunk of its own, so a stream cut short never carries it."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from ansible_collections.agentbox.box.plugins.module_utils.core._tarstream import Final, tar_ending_with

RECORD = "/etc/agentbox/seed.json"


def members(data: bytes) -> list[tarfile.TarInfo]:
    """The members an engine makes from `data`, cut where it ends: a member whose header arrived is
    made even when its content is cut short (seen on Docker 20.10: a partial file stays)."""
    found = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
            for member in tar:
                found.append(member)
    except (tarfile.ReadError, EOFError):
        pass
    return found


def test_the_record_is_the_last_member_and_comes_whole_or_not_at_all(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    (one / "sub").mkdir(parents=True)
    (one / "sub" / "a.txt").write_bytes(b"a\n")
    (one / "big.bin").write_bytes(os.urandom(300_000))  # many chunks
    (two).mkdir()
    (two / "b.txt").write_bytes(b"b\n")
    record = b'{"mode": "worktree"}\n' * 40
    chunks = list(tar_ending_with(
        [(str(one), ["sub/a.txt", "big.bin"], "/home/vscode/wt/box"), (str(two), ["b.txt"], "/home/vscode/wt/box/two")],
        Final(RECORD, record),
    ))  # fmt: skip
    whole = members(b"".join(chunks))
    assert [m.name for m in whole] == [
        "home/vscode/wt/box/sub", "home/vscode/wt/box/sub/a.txt", "home/vscode/wt/box/big.bin",
        "home/vscode/wt/box/two/b.txt", "etc/agentbox", "etc/agentbox/seed.json",
    ]  # fmt: skip
    assert [(m.uid, m.gid) for m in whole[:4]] == [(1000, 1000)] * 4
    directory, last = whole[-2:]
    assert directory.isdir() and (directory.uid, directory.gid, directory.mode) == (1000, 1000, 0o755)
    assert last.isreg() and (last.uid, last.gid, last.mode, last.size) == (0, 0, 0o644, len(record))
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        assert tar.extractfile("etc/agentbox/seed.json").read() == record  # type: ignore[union-attr]
    # Cut after any chunk but the last, or anywhere inside one: no record, not even a partial one.
    assert len(chunks) > 3
    sent = b"".join(chunks[:-1])
    assert len(members(sent)) == 4  # every file before it, whole
    for cut in [*range(0, len(sent) + 1, 4096), len(sent)]:
        assert "etc/agentbox/seed.json" not in [m.name for m in members(sent[:cut])], cut
    # The last chunk is the record's directory and file and the end of the archive, nothing else.
    assert chunks[-1].endswith(b"\0" * 1024) and record in chunks[-1]
    assert members(b"".join(chunks[:-1]) + chunks[-1][:-1024])[-1].name == "etc/agentbox/seed.json"
