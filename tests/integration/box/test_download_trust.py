"""download.yml against a real box on the local engine (issue 32, item 2): a tree of ordinary files,
symbolic links, empty files and odd names arrives byte for byte; a box whose `tar` was replaced by
root in the box sends the CVE-2025-4517 archive, and the download is refused naming the entry,
with nothing written outside the destination and an earlier export there left as it was."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, make_repo
from tests.integration.playbooks.test_playbook_output import IMAGE, Player, flat
from tests.unit.core.test_safe_extract import cve_2025_4517, snapshot

pytestmark = pytest.mark.integration


def in_box(box: str, argv: list[str | bytes], user: str = "vscode", stdin: bytes | None = None) -> bytes:
    done = subprocess.run(["docker", "exec", "-i", "-u", user, f"agentbox-{box}", *argv], input=stdin,
                          capture_output=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def boxed() -> Iterator[tuple[Player, str, Path]]:
    """(player, box, a directory for destinations): one box, its workspace a small repository."""
    if not docker.from_env().images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    root = Path(tempfile.mkdtemp(prefix="abdl-", dir="/tmp"))
    root.chmod(0o755)  # the box's user reads the workspace's .git
    player = Player(root / "home")
    player.home.mkdir()
    repo = make_repo(root / "ws", {"README.md": "r\n", "src/app.py": "v1\n", ".gitignore": "*.log\n"})
    chown_tree(repo)
    box = f"dl-{secrets.token_hex(3)}"
    try:
        player.create(repo, box)
        yield player, box, root
    finally:
        for made in player.made:
            player.run("destroy_box.yml", f"box={made}")
        player.run("relay.yml", "state=stopped")
        shutil.rmtree(root, ignore_errors=True)


# Names that pass through `docker exec`'s argv (UTF-8 only: the Engine API carries JSON); the script
# below adds one that is not UTF-8.
ODD = ["sp ace.txt", "new\nline.txt", "ünï-cödé.txt", "-dash.txt", "deep/" + "n" * 120 + "/" + "m" * 200 + ".txt"]


# The n-th path git lists in the box (by number: a name need not be UTF-8), as L<target> or X|F<content>.
PROBE = r"""
cd /workspace && mapfile -d '' names < <(git ls-files -z --cached --others --exclude-standard)
name=${names[$1]}
if [ -L "$name" ]; then printf L; readlink -n -- "$name"; else { test -x "$name" && printf X || printf F; }; cat -- "$name"; fi
"""


def box_tree(box: str) -> dict[bytes, tuple[str, bytes, bool]]:
    """What the box would export: every listed path, as ('link', target) or ('file', content, exec bit)."""
    listed = in_box(box, ["sh", "-c", "cd /workspace && git ls-files -z --cached --others --exclude-standard"])
    tree: dict[bytes, tuple[str, bytes, bool]] = {}
    for number, name in enumerate(listed.split(b"\0")[:-1]):
        got = in_box(box, ["bash", "-c", PROBE, "bash", str(number)])
        tree[name] = ("link", got[1:], False) if got[:1] == b"L" else ("file", got[1:], got[:1] == b"X")
    return tree


def host_tree(top: Path) -> dict[bytes, tuple[str, bytes, bool]]:
    tree: dict[bytes, tuple[str, bytes, bool]] = {}
    raw = os.fsencode(top)
    for base, dirs, files in os.walk(raw):
        for name in dirs + files:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, raw)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                tree[rel] = ("link", os.readlink(path), False)
            elif stat.S_ISREG(info.st_mode):
                tree[rel] = ("file", Path(os.fsdecode(path)).read_bytes(), bool(info.st_mode & 0o100))
    return tree


def test_download_brings_files_links_empty_files_and_odd_names_byte_for_byte(boxed: tuple[Player, str, Path]) -> None:
    player, box, root = boxed
    script = r"""
set -e
cd /workspace
mkdir -p lib
printf '' > empty.txt
head -c 3000000 /dev/urandom > lib/blob.bin
printf '#!/bin/sh\necho run\n' > run.sh && chmod 755 run.sh
echo noise > debug.log
echo shared > lib/one.txt && ln lib/one.txt lib/two.txt
ln -s src/app.py app-link && ln -s ../README.md lib/readme-link && ln -s src lib-dir-link && ln -s missing/file dangling
for name in "$@" "$(printf 'bytes-\377\376.bin')"; do mkdir -p "$(dirname "$name")" && printf 'odd %s\n' "$name" > "$name"; done
"""
    in_box(box, ["sh", "-c", script, "sh", *ODD])
    expected = box_tree(box)
    assert b"debug.log" not in expected and b"bytes-\xff\xfe.bin" in expected and ODD[-1].encode() in expected
    dest = root / "round-trip"
    out = flat(player.ok("download.yml", f"box={box}", f"dest={dest}"))
    assert "left out (unsafe in a tar from the box): nothing" in out
    got = host_tree(dest)
    assert got.pop(b".agentbox-export.json")[0] == "file"
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == value, name
    assert not any(name.startswith(".agentbox-export-") for name in os.listdir(root))  # no staging left


def test_a_box_sending_the_cve_2025_4517_archive_is_refused_and_writes_nothing_outside(
    boxed: tuple[Player, str, Path],
) -> None:
    player, box, root = boxed
    exports = root / "exports"
    exports.mkdir()
    dest = exports / "out"
    player.ok("download.yml", f"box={box}", f"dest={dest}")  # an earlier export, which must stay as it is
    # The staging directory the download unpacks in: next to dest, '.agentbox-export-' and 8 characters.
    crafted = cve_2025_4517(exports / ".agentbox-export-xxxxxxxx")
    in_box(box, ["sh", "-c", "cat > /opt/crafted.tar"], user="root", stdin=crafted)
    in_box(box, ["sh", "-c", "printf '#!/bin/sh\\nexec cat /opt/crafted.tar\\n' > /usr/local/bin/tar && "
                             "chmod 755 /usr/local/bin/tar"], user="root")  # fmt: skip
    try:
        before = snapshot(exports)
        refused = player.run("download.yml", f"box={box}", f"dest={dest}")
        after = snapshot(exports)
    finally:
        in_box(box, ["rm", "-f", "/usr/local/bin/tar", "/opt/crafted.tar"], user="root")
    said = flat(refused.stdout)
    assert refused.returncode != 0, said[-3000:]
    assert f"the box's tree was not downloaded to {dest} (an earlier export there is unchanged)" in said
    assert "its archive was refused at entry 'a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/" + "l" * 254 + "'" in said
    assert "its path goes through the symbolic link 'a'" in said
    assert not (exports / "pwned").exists()
    assert after == before  # the earlier export byte for byte, and no staging directory left


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the download drops to the destination's owner")
def test_download_as_root_into_a_users_directory_unpacks_as_that_user(boxed: tuple[Player, str, Path]) -> None:
    player, box, root = boxed
    users = root / "users"
    users.mkdir()
    os.chown(users, 1000, 1000)
    dest = users / "out"
    player.ok("download.yml", f"box={box}", f"dest={dest}")
    assert (dest / "README.md").read_text() == "r\n" and (dest / "src/app.py").read_text() == "v1\n"
    for path in (dest, dest / "src", dest / "src/app.py", dest / ".agentbox-export.json"):
        assert (path.lstat().st_uid, path.lstat().st_gid) == (1000, 1000), path
