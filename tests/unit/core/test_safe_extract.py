"""Box-made tar archives unpacked on the host (_safe_extract), on archives built here with tarfile the
way a hostile box would: each refused with the entry named, nothing written outside the target
(checked on the file system), and a large stream unpacked in bounded memory."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.core._safe_extract import (  # noqa: E402
    ArchiveRefused,
    extract,
    extract_as,
)
from ansible_collections.agentbox.box.plugins.plugin_utils._filetar import (  # noqa: E402
    NotARegularFile,
    extract_single_file,
)


# -- building archives --------------------------------------------------------------------------
def regular(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
    return info, data


def special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o755
    return info, None


def archive(*entries: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def in_chunks(data: bytes, size: int = 1000) -> Iterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


def cve_2025_4517(staging: Path) -> bytes:
    """CPython's own reproducer of CVE-2025-4517 (Lib/test/test_tarfile.py, gh-135034): directories
    whose names fill PATH_MAX behind a chain of links, so os.path.realpath gives up resolving, then a
    link past them back to the top and one more '..', and files written through it. Sized for
    `staging`, the directory it is unpacked in; `escape/pwned` lands in staging's parent."""
    steps = "abcdefghijklmnop"
    component = "d" * ((os.pathconf(staging.parent, "PC_PATH_MAX") - len(str(staging)) - 1) // (len(steps) + 1))
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    path = ""
    for step in steps:
        entries.append(special(os.path.join(path, component), tarfile.DIRTYPE))
        entries.append(special(os.path.join(path, step), tarfile.SYMTYPE, component))
        path = os.path.join(path, component)
    linkpath = os.path.join(*steps, "l" * 254)
    entries.append(special(linkpath, tarfile.SYMTYPE, os.path.join(*[".."] * len(steps))))
    entries.append(special("escape", tarfile.SYMTYPE, os.path.join(linkpath, "..")))
    entries.append(regular("escape/pwned", b"written outside\n"))
    return archive(*entries)


# -- the file system, before and after ----------------------------------------------------------
def snapshot(top: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under `top` (links not followed): its type and mode, and a file's content hash."""
    seen: dict[str, tuple[int, bytes]] = {}
    for base, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            digest = hashlib.sha256(Path(path).read_bytes()).digest() if stat.S_ISREG(info.st_mode) else b""
            seen[os.path.relpath(path, top)] = (info.st_mode, digest)
    return seen


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(parent, target): the target is an empty directory; the parent holds a file of its own."""
    parent = tmp_path / "parent"
    target = parent / "target"
    target.mkdir(parents=True)
    (parent / "keep.txt").write_text("keep\n")
    yield parent, target


def unpack(target: Path, data: bytes, reserved: frozenset[bytes] = frozenset()):
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return extract(in_chunks(data), fd, reserved)
    finally:
        os.close(fd)


def refused(parent: Path, target: Path, data: bytes) -> ArchiveRefused:
    """The archive is refused, and nothing outside `target` changed (the parent and /etc/passwd)."""
    before = snapshot(parent)
    outside = {path: value for path, value in before.items() if not path.startswith("target")}
    passwd = Path("/etc/passwd").read_bytes()
    with pytest.raises(ArchiveRefused) as caught:
        unpack(target, data)
    after = snapshot(parent)
    assert {path: value for path, value in after.items() if not path.startswith("target")} == outside
    assert Path("/etc/passwd").read_bytes() == passwd
    return caught.value


# -- refused ------------------------------------------------------------------------------------
def test_the_cve_2025_4517_archive_is_refused_at_the_link_chain(sandbox: tuple[Path, Path]) -> None:
    parent, target = sandbox
    refusal = refused(parent, target, cve_2025_4517(target))
    assert refusal.entry.startswith("a/b/c/") and refusal.entry.endswith("l" * 254)
    assert refusal.reason == "its path goes through the symbolic link 'a'"
    assert not (parent / "pwned").exists()


@pytest.mark.parametrize(
    ("entry", "name", "reason"),
    [
        (regular("../outside.txt"), "../outside.txt", "'..' in the name"),
        (regular("sub/../../outside.txt"), "sub/../../outside.txt", "'..' in the name"),
        (regular("/tmp/absolute.txt"), "/tmp/absolute.txt", "an absolute name"),
        (special("passwd", tarfile.LNKTYPE, "/etc/passwd"), "passwd",
         "a hard link (to '/etc/passwd'): only files, directories and symbolic links are taken"),
        (special("null", tarfile.CHRTYPE), "null",
         "a character device: only files, directories and symbolic links are taken"),
        (special("disk", tarfile.BLKTYPE), "disk", "a block device: only files, directories and symbolic links are taken"),
        (special("pipe", tarfile.FIFOTYPE), "pipe", "a fifo: only files, directories and symbolic links are taken"),
    ],
)  # fmt: skip
def test_names_leaving_the_target_and_special_entries_are_refused(
    sandbox: tuple[Path, Path], entry: tuple[tarfile.TarInfo, bytes | None], name: str, reason: str
) -> None:
    parent, target = sandbox
    refusal = refused(parent, target, archive(regular("first.txt"), entry, regular("after.txt")))
    assert (refusal.entry, refusal.reason) == (name, reason)
    assert not (target / "after.txt").exists()  # nothing after the refused entry


def test_a_file_through_a_symlink_is_refused_even_when_the_link_stays_inside(sandbox: tuple[Path, Path]) -> None:
    parent, target = sandbox
    inside = archive(special("real", tarfile.DIRTYPE), special("via", tarfile.SYMTYPE, "real"), regular("via/f.txt"))
    refusal = refused(parent, target, inside)
    assert (refusal.entry, refusal.reason) == ("via/f.txt", "its path goes through the symbolic link 'via'")
    # And a link out of the tree (left out, never made), then a file through it.
    outward = archive(special("out", tarfile.SYMTYPE, "../.."), regular("out/keep.txt", b"overwritten\n"))
    (target / "via").unlink()
    refusal = refused(parent, target, outward)
    assert (refusal.entry, refusal.reason) == (
        "out/keep.txt",
        "its path goes through the symbolic link 'out', which was left out",
    )
    assert (parent / "keep.txt").read_text() == "keep\n"


def test_a_name_given_twice_is_refused(sandbox: tuple[Path, Path]) -> None:
    parent, target = sandbox
    refusal = refused(parent, target, archive(special("a", tarfile.SYMTYPE, "b"), regular("a", b"second")))
    assert (refusal.entry, refusal.reason) == ("a", "the name is already taken (the archive has it twice)")
    assert os.readlink(target / "a") == "b"


def test_headers_larger_than_any_name_are_refused_before_they_are_read(sandbox: tuple[Path, Path]) -> None:
    parent, target = sandbox
    # A GNU long-name header declaring 1 GiB, with no data behind it: refused from its size alone.
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, 1 << 30
    refusal = refused(parent, target, header.tobuf(tarfile.GNU_FORMAT))
    assert refusal.reason == f"a header of {1 << 30} bytes (at most 4097 are read)"
    pax = tarfile.TarInfo("PaxHeaders/x")
    pax.type, pax.size = tarfile.XHDTYPE, 1 << 30
    assert refused(parent, target, pax.tobuf(tarfile.USTAR_FORMAT)).reason == f"a header of {1 << 30} bytes (at most 65536 are read)"


def test_an_archive_cut_short_is_refused(sandbox: tuple[Path, Path]) -> None:
    parent, target = sandbox
    whole = archive(regular("big.bin", b"y" * 5000))
    assert refused(parent, target, whole[:3000]).reason == "the archive ends inside this entry: it was cut short"
    (target / "big.bin").unlink()
    assert "cut short" in refused(parent, target, whole[:512 + 5120]).reason  # no end-of-archive blocks
    (target / "big.bin").unlink()
    assert "checksum" in refused(parent, target, b"not a tar archive".ljust(1024, b"!")).reason


# -- taken --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_files_links_empty_files_and_odd_names_arrive_byte_for_byte(sandbox: tuple[Path, Path], fmt: int) -> None:
    _parent, target = sandbox
    odd = "sp ace/new\nline/ünï/\udcff\udcfe-not-utf8"
    long = "deep/" + "n" * 120 + "/" + "m" * 200 + ".txt"
    data = archive(
        regular("src/app.py", b"print('hi')\n"),
        regular("bin/run", b"#!/bin/sh\n", 0o4775),  # setuid and group write are not kept
        regular("notes/plain.txt", b"rw\n", 0o666),
        regular("empty", b""),
        regular(odd, bytes(range(256))),
        regular(long, b"long\n"),
        special("link", tarfile.SYMTYPE, "src/app.py"),
        special("src/up", tarfile.SYMTYPE, "../notes/plain.txt"),
        special("dangling", tarfile.SYMTYPE, "nowhere/at/all"),
        special("absolute", tarfile.SYMTYPE, "/etc/passwd"),
        special("above", tarfile.SYMTYPE, "../outside"),
        special("sneaky", tarfile.SYMTYPE, "src/../.."),
        regular(".agentbox-export.json", b"{}"),
        fmt=fmt,
    )  # fmt: skip
    done = unpack(target, data, frozenset({b".agentbox-export.json"}))
    assert (done.files, done.bytes) == (6, 12 + 10 + 3 + 256 + 5)
    raw = os.fsencode(target)
    assert Path(os.fsdecode(raw + b"/" + os.fsencode(odd))).read_bytes() == bytes(range(256))
    assert (target / "src/app.py").read_bytes() == b"print('hi')\n" and (target / long).read_bytes() == b"long\n"
    assert (target / "empty").read_bytes() == b"" and stat.S_IMODE((target / "bin/run").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "notes/plain.txt").stat().st_mode) == 0o644
    assert (target / "src/app.py").stat().st_mtime == 1_700_000_000
    assert os.readlink(target / "link") == "src/app.py" and (target / "src/up").read_bytes() == b"rw\n"
    assert os.readlink(target / "dangling") == "nowhere/at/all"
    for name in ("absolute", "above", "sneaky", ".agentbox-export.json"):
        assert not os.path.lexists(target / name)
    assert done.left_out == [
        "absolute: its target is an absolute path",
        "above: its target is above the tree",
        "sneaky: its target has '..' after a name (another link there could lead out)",
        ".agentbox-export.json: the name is reserved for the export's own record",
    ]


def test_extract_single_file_reads_the_first_entry_bounded() -> None:
    out = io.BytesIO()
    assert extract_single_file(in_chunks(archive(regular("f.bin", b"z" * 3000))), out) == 3000
    assert out.getvalue() == b"z" * 3000
    with pytest.raises(NotARegularFile) as caught:
        extract_single_file(in_chunks(archive(special("l", tarfile.SYMTYPE, "../t"))), io.BytesIO())
    assert caught.value.link_target == "../t"
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, 1 << 30
    with pytest.raises(NotARegularFile, match="a header of 1073741824 bytes"):
        extract_single_file(iter([header.tobuf(tarfile.GNU_FORMAT)]), io.BytesIO())


# -- as the target's owner ----------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: extract_as changes to another user")
def test_extract_as_unpacks_as_the_owner_and_refuses_in_the_child(sandbox: tuple[Path, Path]) -> None:
    parent, target = sandbox

    def as_user(directory: Path, data: bytes):
        directory.mkdir(exist_ok=True)
        os.chown(directory, 1000, 1000)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return extract_as(in_chunks(data), fd, (1000, 1000))
        finally:
            os.close(fd)

    done = as_user(target, archive(regular("a/b.txt", b"b\n"), regular("c")))
    assert (done.files, done.bytes, done.left_out) == (2, 3, [])
    for path in (target / "a", target / "a/b.txt", target / "c"):
        assert (path.stat().st_uid, path.stat().st_gid) == (1000, 1000)
    crafted = parent / "crafted"
    with pytest.raises(ArchiveRefused) as caught:
        as_user(crafted, cve_2025_4517(crafted))
    assert caught.value.reason == "its path goes through the symbolic link 'a'"
    assert not (parent / "pwned").exists()
    # What uid 1000 may not write stays unwritten, whatever the archive says.
    (target / "rootonly").mkdir(mode=0o755)
    with pytest.raises(ArchiveRefused, match="Permission denied"):
        as_user(target, archive(regular("rootonly/x")))
    assert not (target / "rootonly/x").exists()


# -- memory -------------------------------------------------------------------------------------
MEMORY_PROBE = r"""
import os, resource, sys, tarfile
sys.path.insert(0, sys.argv[2])
from ansible_collections.agentbox.box.plugins.module_utils.core._safe_extract import extract, first_entry

SIZES = [100 << 20, 150 << 20, 50 << 20, 0]  # 300 MiB of zeros in a few files
ZEROS = bytes(1 << 16)

def member(name, size):
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.GNU_FORMAT)

def inner():
    for number, size in enumerate(SIZES):
        yield member(f"dir{number}/zeros-{number}.bin", size)
        left = size
        while left:
            yield ZEROS[: min(left, len(ZEROS))]
            left -= min(left, len(ZEROS))
        yield bytes(-size % 512)
    yield bytes(1024)

def outer():
    # As get_archive sends it: the box's tar is the one file of a tar of its own.
    size = sum(len(chunk) for chunk in inner())
    yield member("agentbox-export.tar", size)
    yield from inner()
    yield bytes(-size % 512) + bytes(1024)

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
root = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
entry, data = first_entry(outer())
done = extract(data, root)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(done.files, done.bytes, before, after)
"""


def test_a_300_mib_stream_is_unpacked_in_bounded_memory(tmp_path: Path) -> None:
    target = tmp_path / "big"
    target.mkdir()
    run = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(target), str(REPO / ".collections")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    files, size, before, after = (int(word) for word in run.stdout.split())
    assert (files, size) == (4, 300 << 20)
    assert (target / "dir1/zeros-1.bin").stat().st_size == 150 << 20
    assert after - before <= 64 * 1024, f"peak RSS grew by {(after - before) // 1024} MiB"  # ru_maxrss is in KiB
