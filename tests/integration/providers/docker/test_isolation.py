"""Root in a box is nobody on the host: boxes on the box engine, tried as a hostile agent would.

Every escape below is tried as root in a box (the agent's user has passwordless sudo) in its
non-destructive form (a sysctl written back with the value it has, a file opened for writing and
closed unwritten), and must fail without changing anything on the host. The workspace is owned by
root here: a host user that is not the box user (uid 1000), as on most machines but one.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import git, make_repo
from tests.integration.relay.test_relay import Host

pytestmark = pytest.mark.integration

BOX_GIT = "git -c user.email=agent@box.invalid -c user.name=agent"


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    home = Path(f"/tmp/abi-{secrets.token_hex(3)}")
    home.mkdir(mode=0o755)
    made = Host(str(home))
    yield made
    made.relay("stop", check=False)
    subprocess.run(["rm", "-rf", str(home)], check=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A root-owned workspace cloned from a bare origin, with what a box must never see in its config."""
    root = tmp_path_factory.mktemp("iso")
    origin = root / "hidden" / "origin.git"
    origin.parent.mkdir()
    git(origin.parent, "init", "-q", "--bare", "-b", "main", str(origin))
    seed = make_repo(root / "seed", {"README.md": "hello\n"})
    git(seed, "push", "-q", str(origin), "main")
    workspace = root / "ws"
    git(root, "clone", "-q", str(origin), str(workspace))
    git(workspace, "config", "remote.mirror.url", "https://user:s3cr3t-token@example.invalid/repo.git")
    git(workspace, "config", "credential.helper", "store --file /root/.git-credentials")
    git(workspace, "config", "include.path", "/etc/agentbox-test-include")
    git(workspace, "branch", "host-feature")
    return {"origin": origin, "workspace": workspace}


@pytest.fixture(scope="module")
def boxes(host: Host, project: dict[str, Path]) -> Iterator[list[str]]:
    names: list[str] = []
    for _box in range(2):
        name = f"iso-{secrets.token_hex(3)}"
        made = host.module("agentbox_box", {"name": name, "workspace": str(project["workspace"]), "state": "started"})
        assert not made["failed"], made.get("msg")
        assert made["box"]["labels"]["isolation"] == "userns"
        names.append(name)
    yield names
    for name in names:
        host.module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})


def in_box(name: str, script: str, user: str = "root") -> tuple[int, str]:
    container = docker.from_env().containers.get(f"agentbox-{name}")
    result = container.exec_run(["bash", "-c", script], user=user, workdir="/workspace")
    return result.exit_code, result.output.decode("utf-8", "replace")


def host_pid(name: str) -> int:
    return int(docker.from_env().containers.get(f"agentbox-{name}").attrs["State"]["Pid"])


def test_root_in_a_box_is_an_unprivileged_uid_on_the_host(boxes: list[str]) -> None:
    rc, out = in_box(boxes[0], "cat /proc/self/uid_map; id -u")
    assert rc == 0, out
    inside, outside, count = (int(word) for word in out.split()[:3])
    assert (inside, outside) == (0, 100000) and count >= 65536  # not the identity map '0 0 4294967295'
    status = Path(f"/proc/{host_pid(boxes[0])}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert all(int(uid) >= 100000 for uid in uids), status


# Each line prints "<what>: <result>"; every attempt must fail. @DEVICE@: the host's root block device.
ESCAPES = r"""
try() { what=$1; shift; if ( "$@" ) 2>/dev/null; then echo "$what: ESCAPED"; else echo "$what: refused"; fi; }
mount -o remount,rw /proc/sys 2>/dev/null
try core_pattern sh -c 'v=$(cat /proc/sys/kernel/core_pattern); printf "%s\n" "$v" > /proc/sys/kernel/core_pattern'
try overcommit sh -c 'v=$(cat /proc/sys/vm/overcommit_memory); printf "%s\n" "$v" > /proc/sys/vm/overcommit_memory'
mkdir -p /tmp/fresh-proc && mount -t proc proc /tmp/fresh-proc 2>/dev/null
try fresh_core_pattern sh -c 'v=$(cat /tmp/fresh-proc/sys/kernel/core_pattern); printf "%s\n" "$v" > /tmp/fresh-proc/sys/kernel/core_pattern'
try sysrq sh -c 'exec 3>>/tmp/fresh-proc/sysrq-trigger'
mkdir -p /tmp/cg && mount -t cgroup -o memory cgroup /tmp/cg 2>/dev/null
try release_agent sh -c 'exec 3>>/tmp/cg/release_agent'
try host_disk sh -c "mknod /tmp/disk b @DEVICE@ && mount /tmp/disk /mnt"
try module python3 -c 'import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/dev/null", os.O_RDONLY); sys.exit(0 if libc.syscall(313, fd, b"", 0) == 0 else 1)'
mount -o remount,rw /sys 2>/dev/null
try sys_write sh -c 'v=$(cat /sys/kernel/mm/ksm/run); printf "%s\n" "$v" > /sys/kernel/mm/ksm/run'
try host_pid sh -c "grep -q pytest /proc/@PID@/cmdline"
umount /tmp/fresh-proc /tmp/cg 2>/dev/null
"""


def test_escapes_tried_as_root_in_a_box_change_nothing_on_the_host(boxes: list[str]) -> None:
    watched = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/overcommit_memory", "/sys/kernel/mm/ksm/run",
               "/sys/fs/cgroup/memory/release_agent"]
    before = {path: Path(path).read_text() for path in watched if os.path.exists(path)}
    device = os.stat("/").st_dev
    _rc, out = in_box(boxes[0], ESCAPES.replace("@DEVICE@", f"{os.major(device)} {os.minor(device)}")
                      .replace("@PID@", str(os.getpid())))
    results = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert set(results) >= {"core_pattern", "overcommit", "fresh_core_pattern", "sysrq", "release_agent",
                            "host_disk", "module", "sys_write", "host_pid"}, out
    assert all(result == "refused" for result in results.values()), out
    assert {path: Path(path).read_text() for path in before} == before


def test_a_box_cannot_read_another_box_s_files(boxes: list[str]) -> None:
    token = f"other-box-secret-{secrets.token_hex(4)}"
    rc, out = in_box(boxes[1], f"echo {token} > /tmp/{token}")
    assert rc == 0, out
    # Everything the first box's root can walk (its whole file system, its processes' roots), but no procfs or sysfs.
    _rc, out = in_box(boxes[0], "find / /proc/[0-9]*/root/ \\( -fstype proc -o -fstype sysfs -o -fstype cgroup \\) -prune "
                                f"-o -name '{token}' -print 2>/dev/null; echo searched")
    assert "searched" in out and token not in out, out


def test_git_in_a_box_keeps_working_while_the_host_writes_its_git(
    host: Host, boxes: list[str], project: dict[str, Path]
) -> None:
    workspace = project["workspace"]
    box = boxes[0]
    rc, out = in_box(box, f"{BOX_GIT} commit -q --allow-empty -m first", user="vscode")
    assert rc == 0, out
    # The host writes 300 loose objects, commits, rewrites a ref and packs, while the box lives.
    objects = "".join(f"host object {n}\n" for n in range(300))
    for line in objects.splitlines():
        subprocess.run(["git", "-C", str(workspace), "hash-object", "-w", "--stdin"], input=line.encode(), check=True,
                       capture_output=True)
    git(workspace, "-c", "user.email=h@h", "-c", "user.name=h", "commit", "-q", "--allow-empty", "-m", "host")
    git(workspace, "branch", "-f", "host-feature", "HEAD")
    git(workspace, "gc", "-q")
    script = f"""
      ok=0
      for n in $(seq 30); do echo $n > box-$n.txt; git add box-$n.txt && {BOX_GIT} commit -q -m "box $n" && ok=$((ok+1)); done
      echo "ok=$ok"
      ls -l "$(git rev-parse --git-common-dir)/refs/heads" | grep -c '?' || true
    """
    rc, out = in_box(box, script, user="vscode")
    assert "ok=30" in out, out
    assert out.strip().splitlines()[-1] == "0", out  # no entry the overlay cannot stat
    assert host.module("agentbox_box", {"name": box, "state": "stopped"}).get("failed") is not True
    assert host.module("agentbox_box", {"name": box, "state": "started"}).get("failed") is not True
    rc, out = in_box(box, script.replace("box-", "again-"), user="vscode")
    assert "ok=30" in out, out
    fetched = host.module("agentbox_worktree", {"box": box, "state": "fetched"})
    assert fetched.get("failed") is not True, fetched
    log = git(workspace, "log", "--format=%s", f"agentbox/{box}")
    assert "box 30" in log and "again-30" not in log and log.count("box ") == 60


def test_the_box_view_of_the_host_git_holds_no_credential_or_other_branch(boxes: list[str]) -> None:
    rc, out = in_box(boxes[0], "git config --list --show-origin; echo ---; git for-each-ref --format='%(refname)'",
                     user="vscode")
    assert rc == 0, out
    config, refs = out.split("---\n")
    for secret in ("s3cr3t-token", "example.invalid", "credential", "include", "remote."):
        assert secret not in config, config
    assert f"refs/heads/agentbox/{boxes[1]}" not in refs and "host-feature" not in refs, refs
    assert f"refs/heads/agentbox/{boxes[0]}" in refs, refs
    rc, out = in_box(boxes[0], f"git show --stat agentbox/{boxes[1]}", user="vscode")
    assert rc != 0


def test_fetch_works_in_a_box_made_before_the_host_had_its_remote_tracking_refs(
    host: Host, boxes: list[str], project: dict[str, Path]
) -> None:
    early, pusher = boxes
    assert not (project["workspace"] / ".git/refs/remotes/origin/agentbox").exists()
    rc, out = in_box(pusher, f"{BOX_GIT} commit -q --allow-empty -m pushed && agentbox-ctl git push", user="vscode")
    assert rc == 0, out
    assert git(project["workspace"], "for-each-ref", "refs/remotes/origin/agentbox/").strip(), "the push made none"
    for command in ("agentbox-ctl git fetch", "env GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b.invalid "
                    "GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@b.invalid agentbox-ctl git pull"):
        rc, out = in_box(early, command, user="vscode")
        assert rc == 0, out
