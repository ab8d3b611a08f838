"""The trust boundary between a box and the host's .git, tried the way a hostile agent would.

The agent in a box is assumed hostile: as vscode, and as root through its passwordless sudo (root
in a box has CAP_SYS_ADMIN, so it can remount or unmount whatever is mounted there). Whatever it
writes to the .git it sees, the host must never run, and no host ref may move but the box's own
branch, and that only through a fetch. See docs/architecture.md, "The trust boundary".
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import get_provider
from tests.conftest import GIT_ENV, chown_tree, git, make_repo, run_module_direct
from tests.integration.box.conftest import box_task

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
BOX_UID = 1000


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    client = docker.from_env()
    if not any(IMAGE in image.tags for image in client.images.list(name="agentbox/box")):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    return client


@pytest.fixture
def boxes(engine: docker.DockerClient) -> Iterator[list[str]]:
    """Boxes a test makes; whatever is left is destroyed (in-process: a clean-up, not a check)."""
    names: list[str] = []
    yield names
    for name in names:
        box_task({"name": name, "state": "absent", "delete_branch": True})
        for leftover in engine.containers.list(all=True, filters={"name": f"agentbox-{name}"}):
            leftover.remove(force=True, v=True)


@pytest.fixture
def checkpoints() -> Iterator[list[tuple[Path, str]]]:
    """(workspace, name) of checkpoints a test takes: removed at the end, in-process (a clean-up, not a check;
    a checkpoint the user took stays when its box goes)."""
    taken: list[tuple[Path, str]] = []
    yield taken
    provider = get_provider("docker")
    for workspace, name in taken:
        found = _checkpoint.find_checkpoint(provider, _naming.project_id(_naming.workspace_path(str(workspace))), name)
        if found is not None:
            _checkpoint.remove(provider, found)


# The boxes a test drives with git and the shell alone are made with nothing started in them (boot=False:
# the git layer and its view are made by the create, before any boot); the first attack box is booted.
def box_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def in_box(engine: docker.DockerClient, name: str, script: str, user: str = "vscode") -> tuple[int, str]:
    result = engine.containers.get(f"agentbox-{name}").exec_run(["bash", "-c", script], user=user, demux=False)
    return result.exit_code, result.output.decode("utf-8", "replace")


def as_owner(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """The host user's own git (uid 1000 owns the test repos), as they would run it."""
    env = {**os.environ, "HOME": str(repo.parent), "GIT_AUTHOR_NAME": "Host", "GIT_AUTHOR_EMAIL": "host@example.invalid"}
    env.update(GIT_COMMITTER_NAME="Host", GIT_COMMITTER_EMAIL="host@example.invalid")
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, user=BOX_UID,
                          group=BOX_UID, check=False)


def snapshot(repo: Path) -> dict[str, object]:
    """What the host trusts in its .git: every ref but the boxes' own, and the bytes of config,
    HEAD, packed-refs, hooks/, info/ and worktrees/ (the host's own worktree registrations)."""
    gitdir = repo / ".git"
    refs = [
        line
        for line in git(repo, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
        if not line.startswith(("refs/heads/agentbox/", "refs/agentbox/"))
    ]
    files: dict[str, bytes] = {}
    for name in ("config", "HEAD", "packed-refs"):
        if (gitdir / name).exists():
            files[name] = (gitdir / name).read_bytes()
    for folder in ("hooks", "info", "worktrees"):
        for path in sorted((gitdir / folder).rglob("*")) if (gitdir / folder).exists() else []:
            if path.is_file() and path.name != "index":
                files[str(path.relative_to(gitdir))] = path.read_bytes()
            elif path.is_dir():
                files[str(path.relative_to(gitdir)) + "/"] = oct(path.stat().st_mode).encode()
    return {"refs": refs, "files": files}


# Every write the issue lists, aimed at the .git the box sees (at the host's own path). Arguments:
# the .git path, the host marker directory (absent in the box), the host worktree's admin name.
ATTACK = r"""
G=$1 M=$2 W=$3
cd /workspace
# The box's view holds neither the host's hooks nor its other worktrees: make them, to write there anyway.
mkdir -p "$G/hooks" "$G/worktrees/$W"
hook='#!/bin/sh
touch "'$M'/hook-$(basename "$0")" 2>/dev/null; exit 0'
for h in pre-commit commit-msg post-commit reference-transaction post-checkout pre-auto-gc post-index-change; do
  printf '%s\n' "$hook" > "$G/hooks/$h" && chmod +x "$G/hooks/$h" && echo "wrote hooks/$h"
done
git config --file "$G/config" core.fsmonitor "touch $M/fsmonitor; false" && echo "wrote core.fsmonitor"
git config --file "$G/config" core.hooksPath "$G/hooks" && echo "wrote core.hooksPath"
git config --file "$G/config" core.sshCommand "touch $M/ssh; ssh" && echo "wrote core.sshCommand"
git config --file "$G/config" filter.evil.clean "sh -c 'touch $M/filter; cat'" && echo "wrote filter"
git config --file "$G/config" core.pager "touch $M/pager; cat" && echo "wrote core.pager"
mkdir -p "$G/info" && printf '* filter=evil\n' > "$G/info/attributes" && echo "wrote info/attributes"
git -c user.name=e -c user.email=e@e commit-tree -m evil "HEAD^{tree}" > /tmp/evil && git update-ref refs/heads/main "$(cat /tmp/evil)" && echo "moved main"
printf '%s refs/heads/main\n' "$(cat /tmp/evil)" > "$G/packed-refs" && echo "wrote packed-refs"
git update-ref refs/heads/feature "$(cat /tmp/evil)" && echo "moved feature"
echo "gitdir: /nowhere" > "$G/worktrees/$W/gitdir" && echo "wrote worktrees/$W/gitdir"
echo "$(cat /tmp/evil)" > "$G/worktrees/$W/HEAD" && echo "wrote worktrees/$W/HEAD"
true
"""

# Root in the box: reach the host's .git under the box's view, by remounting and unmounting.
ROOT_ESCAPE = r"""
G=$1 M=$2
mount -o remount,rw "$G" && echo remounted
mount -o remount,rw,bind "$G" && echo rebound
mkdir -p "$G/hooks"
printf '#!/bin/sh\ntouch %s/root-hook\n' "$M" > "$G/hooks/post-commit" && chmod +x "$G/hooks/post-commit" && echo "wrote as root"
while umount "$G" 2>/dev/null; do echo unmounted; done
mkdir -p "$G/hooks" && printf '#!/bin/sh\ntouch %s/root-hook\n' "$M" > "$G/hooks/pre-commit" && chmod +x "$G/hooks/pre-commit" && echo "wrote under the mount"
grep -c " $G " /proc/mounts
true
"""


def test_a_hostile_box_cannot_plant_anything_the_host_runs(engine, boxes, checkpoints, tmp_path):
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n", "b.txt": "b\n"})
    git(repo, "worktree", "add", "-q", str(tmp_path / "host-wt"), "-b", "feature")
    chown_tree(tmp_path)
    markers = tmp_path / "markers"
    markers.mkdir()
    markers.chmod(0o777)
    gitdir = str(repo / ".git")
    before = snapshot(repo)

    name = box_name("atk")
    boxes.append(name)
    made = run_module_direct("agentbox_box", {"name": name, "workspace": str(repo)})
    assert made.get("failed") is not True, made
    assert made["box"]["labels"]["git_layers"] == "1"

    attack = engine.containers.get(f"agentbox-{name}").exec_run(
        ["bash", "-c", ATTACK, "attack", gitdir, str(markers), "host-wt"], user="vscode"
    )
    out = attack.output.decode()
    # The writes succeed, in the box's own view: it may do as it likes with its copy.
    for done in ("wrote hooks/pre-commit", "wrote core.fsmonitor", "moved main", "wrote packed-refs",
                 "wrote worktrees/host-wt/gitdir", "wrote info/attributes"):
        assert done in out, out
    # Root (sudo) in a second box: remount its view read-write, unmount it, write beneath.
    escaper = box_name("esc")
    boxes.append(escaper)
    assert box_task({"name": escaper, "workspace": str(repo), "boot": False}).get("failed") is not True
    escape = engine.containers.get(f"agentbox-{escaper}").exec_run(
        ["bash", "-c", ROOT_ESCAPE, "escape", gitdir, str(markers)], user="root"
    )
    out = escape.output.decode()
    # Remounting is refused in a user-namespaced box (its mounts' flags are locked); unmounting works.
    assert "unmounted" in out and "wrote under the mount" in out, out

    # Nothing of it reached the host.
    assert snapshot(repo) == before
    assert not any(markers.iterdir())

    # The host user works on, and the collection runs create, checkpoint, fetch and destroy.
    (repo / "a.txt").write_text("host edit, carried over by the next create\n")
    done = as_owner(repo, "commit", "-q", "-am", "host commit")
    assert done.returncode == 0, done.stderr
    as_owner(repo, "status", "--porcelain")
    host_main = git(repo, "rev-parse", "main").strip()
    (repo / "b.txt").write_text("host edit left uncommitted\n")
    second = box_name("atk2")
    boxes.append(second)
    assert box_task({"name": second, "workspace": str(repo), "boot": False}).get("failed") is not True
    checkpoint = f"ck-{secrets.token_hex(3)}"
    checkpoints.append((repo, checkpoint))
    taken = run_module_direct("agentbox_checkpoint", {"box": name, "name": checkpoint})
    assert taken.get("failed") is not True, taken
    fetched = run_module_direct("agentbox_worktree", {"box": name, "state": "fetched"})
    assert fetched.get("failed") is not True, fetched
    for box in (name, second, escaper):
        gone = box_task({"name": box, "state": "absent"})
        assert gone.get("failed") is not True, gone

    assert not any(markers.iterdir()), sorted(p.name for p in markers.iterdir())
    assert git(repo, "rev-parse", "main").strip() == host_main
    after = snapshot(repo)
    main_before = next(line for line in before["refs"] if line.startswith("refs/heads/main "))
    assert [line for line in after["refs"] if not line.startswith("refs/heads/main ")] == [
        line for line in before["refs"] if line != main_before
    ]
    assert after["files"] == before["files"]
    # The only ref the box moved is its own branch, and only to commits git verified on fetch.
    assert git(repo, "fsck", "--connectivity-only", "--no-dangling").strip() == ""


def test_the_agent_commits_amends_and_rebases_and_the_host_fetches_it(engine, boxes, tmp_path):
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    name = box_name("ag")
    boxes.append(name)
    assert box_task({"name": name, "workspace": str(repo), "boot": False}).get("failed") is not True
    ident = "-c user.email=agent@example.invalid -c user.name=agent"
    rc, out = in_box(engine, name, f"""
        set -e
        cd /workspace
        echo one > one.txt && git add one.txt && git {ident} commit -q -m one
        echo two > two.txt && git add two.txt && git {ident} commit -q -m two
        git {ident} commit -q --amend -m 'two, amended'
        GIT_SEQUENCE_EDITOR='sed -i 1s/^pick/reword/' GIT_EDITOR='sed -i 1s/.*/one,\\ reworded/' \
          git {ident} rebase -q -i HEAD~2
        git {ident} gc --auto -q
        git log --format=%s
    """)
    assert rc == 0, out
    assert out.strip().splitlines()[-3:] == ["two, amended", "one, reworded", "initial"], out
    head = in_box(engine, name, "git -C /workspace rev-parse HEAD")[1].strip()
    fetched = run_module_direct("agentbox_worktree", {"box": name, "state": "fetched"})
    assert fetched["changed"], fetched
    assert git(repo, "rev-parse", f"agentbox/{name}").strip() == head
    assert git(repo, "log", "--format=%s", f"agentbox/{name}").splitlines() == ["two, amended", "one, reworded", "initial"]
    # A rewrite in the box moves the box's own branch on the next fetch, nothing else.
    rc, out = in_box(engine, name, f"cd /workspace && git {ident} commit -q --amend -m 'amended again'")
    assert rc == 0, out
    # Destroy brings the last commits in before the box goes.
    gone = box_task({"name": name, "state": "absent"})
    assert gone.get("failed") is not True, gone
    assert git(repo, "log", "-1", "--format=%s", f"agentbox/{name}").strip() == "amended again"


def test_root_owned_repository_under_a_private_directory(engine, boxes, tmp_path):
    """/root/src/app-like: root's repository under a 0700 parent. The box user commits in its own
    layer; the host .git gets no ACL and no file changes owner."""
    if os.geteuid() != 0:
        pytest.skip("needs root to own the test repository")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    repo = make_repo(private / "app", {"a.txt": "a\n"})
    owners = {str(p): (p.stat().st_uid, stat.S_IMODE(p.stat().st_mode)) for p in (repo / ".git").rglob("*")}
    name = box_name("root")
    boxes.append(name)
    made = box_task({"name": name, "workspace": str(repo), "boot": False})
    assert made.get("failed") is not True, made
    assert not made["seed"]["warnings"], made["seed"]["warnings"]
    rc, out = in_box(engine, name, "cd /workspace && echo x > x && git add x && "
                     "git -c user.email=a@b -c user.name=agent commit -q -m boxed && git log -1 --format=%s")
    assert rc == 0 and out.strip() == "boxed", out
    acl = subprocess.run(["getfacl", "-R", "-s", "-p", str(repo / ".git")], capture_output=True, text=True, check=False)
    assert acl.stdout.strip() == "", acl.stdout[:2000]
    assert {str(p): (p.stat().st_uid, stat.S_IMODE(p.stat().st_mode)) for p in (repo / ".git").rglob("*")
            if str(p) in owners} == owners
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert run_module_direct("agentbox_worktree", {"box": name, "state": "fetched"})["changed"]
    assert git(repo, "log", "-1", "--format=%s", f"agentbox/{name}").strip() == "boxed"


def test_the_collections_host_git_ignores_repository_planted_config(engine, boxes, checkpoints, tmp_path):
    """Defence in depth: a repository whose own config plants hooks, an fsmonitor, a filter and a
    pager (whoever wrote them) runs none of them when the collection's host git reads it."""
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n", "b.txt": "b\n"})
    markers = tmp_path / "markers"
    markers.mkdir(mode=0o777)
    markers.chmod(0o777)
    hooks = repo / ".git" / "hooks"
    for hook in ("pre-commit", "post-commit", "reference-transaction", "post-checkout", "pre-auto-gc",
                 "post-index-change", "post-rewrite", "fsmonitor-watchman"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {markers}/hook-{hook} 2>/dev/null\nexit 0\n")
        (hooks / hook).chmod(0o755)
    for key, value in (
        ("core.fsmonitor", f"touch {markers}/fsmonitor 2>/dev/null; false"),
        ("filter.evil.clean", f"sh -c 'touch {markers}/filter 2>/dev/null; cat'"),
        ("filter.evil.smudge", "cat"),
        ("filter.evil.required", "true"),
        ("core.pager", f"touch {markers}/pager 2>/dev/null; cat"),
        ("core.sshCommand", f"touch {markers}/ssh 2>/dev/null; ssh"),
        ("gc.auto", "1"),
    ):
        git(repo, "config", key, value)
    (repo / ".git" / "info" / "attributes").write_text("*.txt filter=evil\n")
    chown_tree(repo)
    (repo / "a.txt").write_text("dirty, so create hashes it\n")

    name = box_name("cfg")
    boxes.append(name)
    made = box_task({"name": name, "workspace": str(repo), "boot": False})
    assert made.get("failed") is not True, made
    assert made["seed"]["modified"] == 1
    rc, out = in_box(engine, name, "cd /workspace && git -c user.email=a@b -c user.name=a commit -qam boxed")
    assert rc == 0, out
    checkpoint = f"ck-{secrets.token_hex(3)}"
    checkpoints.append((repo, checkpoint))
    assert run_module_direct("agentbox_checkpoint", {"box": name, "name": checkpoint}).get("failed") is not True
    assert run_module_direct("agentbox_worktree", {"box": name, "state": "fetched"}).get("failed") is not True
    assert box_task({"name": name, "state": "stopped"}).get("failed") is not True
    assert box_task({"name": name, "state": "absent"}).get("failed") is not True
    assert sorted(p.name for p in markers.iterdir()) == []
    assert git(repo, "log", "-1", "--format=%s", f"agentbox/{name}").strip() == "boxed"


def test_a_commit_with_dotgit_entries_never_enters_the_host(engine, boxes, tmp_path):
    """Issue 33, item 4: the box commits a tree with `.git/hooks` and `.GIT/hooks` entries (git's plumbing
    makes one); the host's fetch runs git's object checks, refuses it with a clear message, and neither
    the commit nor any object of it reaches the host's store (`git fsck` stays clean)."""
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    name = box_name("dg")
    boxes.append(name)
    assert box_task({"name": name, "workspace": str(repo), "boot": False}).get("failed") is not True
    before = git(repo, "rev-parse", f"agentbox/{name}").strip()
    rc, out = in_box(engine, name, f"""
        set -e
        cd /workspace
        blob=$(printf '#!/bin/sh\\necho planted > /tmp/planted\\n' | git hash-object -w --stdin)
        hooks=$(printf '100755 blob %s\\tpost-checkout\\n' "$blob" | git mktree)
        dotgit=$(printf '040000 tree %s\\thooks\\n' "$hooks" | git mktree)
        tree=$( (git ls-tree HEAD; printf '040000 tree %s\\t.GIT\\n040000 tree %s\\t.git\\n' "$dotgit" "$dotgit") | git mktree)
        commit=$(git -c user.name=a -c user.email=a@b commit-tree "$tree" -p HEAD -m innocent)
        git update-ref refs/heads/agentbox/{name} "$commit"
        echo "$commit"
    """)
    assert rc == 0, out
    evil = out.strip().splitlines()[-1]
    fetched = run_module_direct("agentbox_worktree", {"box": name, "state": "fetched"})
    assert fetched.get("failed"), fetched
    message = fetched["msg"]
    assert "refused the box's commits: git's object checks failed" in message and "hasDotgit" in message, message
    assert "Nothing was fetched and no branch moved" in message, message
    assert git(repo, "rev-parse", f"agentbox/{name}").strip() == before
    assert subprocess.run(["git", "-C", str(repo), "cat-file", "-e", evil], capture_output=True,
                          env={**os.environ, **GIT_ENV}, check=False).returncode != 0  # fmt: skip
    git(repo, "fsck", "--strict")  # fails on any hasDotgit object in the host's store
