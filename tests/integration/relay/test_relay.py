"""The host relay on the real engine: boxes push, fetch, pull and checkpoint through the host.

`origin` is a bare repository on the host under a directory the box never sees (nothing of it is
bound into the box, and the box has no credentials); every test's relay runs under a private
HOME, so its ~/.agentbox/relay/ belongs to the test alone.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import GIT_ENV, REPO, chown_tree, git, make_repo, run_module_direct

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
RELAY = str(REPO / "scripts/agentbox-relay")
BOX_GIT = ["git", "-c", "user.email=agent@box.invalid", "-c", "user.name=agent"]
DEADLINE = 60.0


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    client = docker.from_env()
    if not any(IMAGE in image.tags for image in client.images.list(name="agentbox/box")):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    return client


class Host:
    """The host side of one test module: a private HOME (short: socket paths are bounded), the relay."""

    def __init__(self, home: str):
        self.home = home
        self.env = {**os.environ, "HOME": home}

    def relay(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([RELAY, *args], env=self.env, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"agentbox-relay {' '.join(args)}: {result.stderr}")
        return result

    def status(self) -> dict[str, Any]:
        return json.loads(self.relay("status", check=False).stdout)

    def playbook(self, name: str, *extra: str) -> subprocess.CompletedProcess:
        env = {**self.env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
        return subprocess.run(
            [str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks" / name), *extra],
            env=env, capture_output=True, text=True, check=False, cwd=REPO,
        )

    def pending(self) -> list[str]:
        return [line for line in self.relay("approvals").stdout.splitlines() if line.strip()]

    def wait_pending(self, box: str) -> str:
        """The id of the first request of `box` waiting for approval (waits for it to appear)."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            for line in self.pending():
                if line.split()[1] == box:
                    return line.split()[0]
            time.sleep(0.05)
        raise AssertionError(f"no request of {box} waits for approval")

    def audit(self) -> list[dict[str, Any]]:
        path = Path(self.home, ".agentbox/relay/audit.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def module(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """The module's own main in a fresh Python under this HOME, as Ansible runs it on the target: the boxes,
        fetches and checkpoints are set-up and reads here (their path through Ansible is proven elsewhere)."""
        return run_module_direct(name, args, env={"HOME": self.home})


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    home = tempfile.mkdtemp(prefix="abr-", dir="/tmp")
    os.chmod(home, 0o755)
    made = Host(home)
    yield made
    made.relay("stop", check=False)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def project(host: Host, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A workspace cloned from a bare origin that lives where no box can see it."""
    root = tmp_path_factory.mktemp("relay")
    for path in (root, *root.parents):
        if str(path) in ("/", "/tmp"):
            break
        path.chmod(path.stat().st_mode | 0o755)
    hidden = root / "hidden"
    hidden.mkdir()
    origin = hidden / "origin.git"
    git(hidden, "init", "-q", "--bare", "-b", "main", str(origin))
    seed = make_repo(root / "seed", {"README.md": "hello\n"})
    git(seed, "push", "-q", str(origin), "main")
    workspace = root / "ws"
    git(root, "clone", "-q", str(origin), str(workspace))
    other = root / "other"  # someone else pushing to origin
    git(root, "clone", "-q", str(origin), str(other))
    chown_tree(root)
    return {"origin": origin, "workspace": workspace, "other": other}


@pytest.fixture(scope="module")
def make_box(host: Host, project: dict[str, Path], engine: docker.DockerClient) -> Iterator[Callable[[], str]]:
    names: list[str] = []

    def make() -> str:
        name = f"rl-{secrets.token_hex(3)}"
        names.append(name)
        created = host.module("agentbox_box", {"name": name, "workspace": str(project["workspace"]), "state": "started"})
        assert not created["failed"], created.get("msg")
        return name

    yield make
    for name in names:
        host.module("agentbox_box", {"name": name, "state": "absent"})


@pytest.fixture(scope="module")
def box(make_box: Callable[[], str]) -> str:
    return make_box()


def in_box(engine: docker.DockerClient, box: str, argv: list[str]) -> tuple[int, str, str]:
    container = engine.containers.get(f"agentbox-{box}")
    result = container.exec_run(argv, user="vscode", workdir="/workspace", demux=True)
    out, err = result.output
    return result.exit_code, (out or b"").decode(), (err or b"").decode()


def commit_in_box(engine: docker.DockerClient, box: str, message: str) -> str:
    rc, _out, err = in_box(engine, box, [*BOX_GIT, "commit", "-q", "--allow-empty", "-m", message])
    assert rc == 0, err
    return in_box(engine, box, ["git", "rev-parse", "HEAD"])[1].strip()


def git_as_owner(repo: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    """git as the repositories' owner (uid 1000): git refuses root in another user's origin over file://."""
    result = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False, user=1000, group=1000,
        env={**os.environ, **GIT_ENV, "HOME": str(repo), **(env or {})}, input=stdin,
    )
    assert result.returncode == 0, f"git {' '.join(args)}: {result.stderr}"
    return result.stdout


def origin_ref(project: dict[str, Path], ref: str) -> str:
    return git(project["origin"], "rev-parse", "--verify", "-q", ref, check=False).strip()


def ctl(engine: docker.DockerClient, box: str, *args: str) -> tuple[int, str, str]:
    return in_box(engine, box, ["agentbox-ctl", *args])


def test_second_start_is_a_no_op(host: Host, box: str) -> None:
    first = host.status()
    assert first.get("ok") and first["boxes"] >= 1  # creating the box started it
    again = json.loads(host.relay("start").stdout)
    assert again == {"changed": False, "pid": first["pid"]}
    played = host.playbook("relay.yml")
    assert played.returncode == 0, played.stdout
    assert f"running, pid {first['pid']}" in played.stdout


def test_push_lands_on_an_origin_the_box_cannot_reach(
    host: Host, box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    head = commit_in_box(engine, box, "work from the box")
    # The box has no route to origin: the path does not exist in it and nothing carries credentials.
    rc, _out, err = in_box(engine, box, ["git", "push", "origin", "HEAD"])
    assert rc != 0 and "does not appear to be a git repository" in err
    rc, out, err = ctl(engine, box, "git", "push")
    assert rc == 0, err
    assert f"agentbox/{box}" in out + err
    assert origin_ref(project, f"refs/heads/agentbox/{box}") == head
    # Host git ran as the repository's owner, never as root.
    assert (project["origin"] / "refs/heads/agentbox" / box).stat().st_uid == 1000
    entry = [e for e in host.audit() if e.get("operation") == "git.push" and e["box"] == box][-1]
    assert entry["decision"] == "allowed" and entry["result"]["rc"] == 0
    assert set(entry) >= {"time", "box", "operation", "arguments", "decision", "result"}


def test_push_as_main_waits_is_denied_then_approved(
    host: Host, box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    head = commit_in_box(engine, box, "for main")
    main_before = origin_ref(project, "refs/heads/main")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ctl, engine, box, "git", "push", "--as", "main")
        approval = host.wait_pending(box)
        assert f"{approval} {box} git.push as=main remote=origin" in host.pending()
        denied = host.playbook("relay_approvals.yml", "-e", f"deny={approval}")
        assert denied.returncode == 0 and f"denied: {approval}" in denied.stdout, denied.stdout
        rc, _out, err = asked.result(timeout=DEADLINE)
    assert rc == 1
    assert "waiting for approval on the host" in err and "denied on the host" in err
    assert origin_ref(project, "refs/heads/main") == main_before

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ctl, engine, box, "git", "push", "--as", "main")
        approval = host.wait_pending(box)
        approved = host.playbook("relay_approvals.yml", "-e", f"approve={approval}")
        assert approved.returncode == 0 and f"approved: {approval}" in approved.stdout, approved.stdout
        rc, _out, err = asked.result(timeout=DEADLINE)
    assert rc == 0, err
    assert origin_ref(project, "refs/heads/main") == head
    decisions = [e["decision"] for e in host.audit() if e.get("arguments", {}).get("as") == "main"]
    assert decisions[-2:] == ["denied", "approved"]


def test_a_push_that_adds_ci_configuration_waits_for_approval_then_later_pushes_do_not(
    host: Host, make_box: Callable[[], str], project: dict[str, Path], engine: docker.DockerClient
) -> None:
    """CI runs what a pushed branch says, with the repository's secrets: a workflow the box adds waits for the
    user even on the box's own branch. Once pushed, the box's next commits go alone."""
    box = make_box()
    rc, _out, err = in_box(engine, box, ["sh", "-c", "mkdir -p .github/workflows && echo 'on: push' > "
                                                     ".github/workflows/exfiltrate.yml && git add .github"])
    assert rc == 0, err
    rc, _out, err = in_box(engine, box, [*BOX_GIT, "commit", "-q", "-m", "a workflow"])
    assert rc == 0, err
    head = in_box(engine, box, ["git", "rev-parse", "HEAD"])[1].strip()
    reason = "adds or changes CI configuration (.github/workflows/exfiltrate.yml)"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ctl, engine, box, "git", "push")
        try:
            approval = host.wait_pending(box)
            assert not origin_ref(project, f"refs/heads/agentbox/{box}")  # nothing reached the remote meanwhile
        finally:  # whatever failed, the box's client is answered, so the pool can end
            for line in host.pending():
                if line.split()[1] == box:
                    host.relay("approvals", "--approve", line.split()[0])
        rc, _out, err = asked.result(timeout=DEADLINE)
    assert rc == 0, err
    assert f"waiting for approval on the host: request {approval} ({reason})" in err, err
    assert origin_ref(project, f"refs/heads/agentbox/{box}") == head
    entry = [e for e in host.audit() if e.get("operation") == "git.push" and e["box"] == box][-1]
    assert (entry["decision"], entry["reason"], entry["approval"]) == ("approved", reason, approval), entry
    after = commit_in_box(engine, box, "code after the workflow")
    rc, _out, err = ctl(engine, box, "git", "push")  # the workflow is on the remote now: nothing to ask
    assert rc == 0, err
    assert origin_ref(project, f"refs/heads/agentbox/{box}") == after


def test_unanswered_request_is_denied_after_its_timeout(host: Host, box: str, engine: docker.DockerClient) -> None:
    rc, _out, err = ctl(engine, box, "git", "push", "--force", "--timeout", "1")
    assert rc == 1 and "no answer on the host in time" in err
    assert not [line for line in host.pending() if line.split()[1] == box]


def test_a_box_cannot_push_another_box_branch(
    host: Host, box: str, make_box: Callable[[], str], project: dict[str, Path], engine: docker.DockerClient
) -> None:
    first_tip = commit_in_box(engine, box, "first box")
    assert ctl(engine, box, "git", "push")[0] == 0
    second = make_box()
    commit_in_box(engine, second, "second box")
    # Its own push writes only its own branch.
    assert ctl(engine, second, "git", "push")[0] == 0
    assert origin_ref(project, f"refs/heads/agentbox/{box}") == first_tip
    # Naming the first box's branch is a push to someone else's branch: it waits, and is refused here.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ctl, engine, second, "git", "push", "--as", f"agentbox/{box}", "--force")
        approval = host.wait_pending(second)
        assert host.relay("approvals", "--deny", approval).returncode == 0
        assert asked.result(timeout=DEADLINE)[0] == 1
    assert origin_ref(project, f"refs/heads/agentbox/{box}") == first_tip
    # The second box sees only its own socket: no other box's channel is in it.
    rc, out, _err = in_box(engine, second, ["ls", "-A", "/run/agentbox/relay"])
    assert rc == 0 and out.split() == ["relay.sock"]
    # And cannot replace it: the directory is bound read-only.
    rc, _out, _err = in_box(engine, second, ["sh", "-c", "rm -f /run/agentbox/relay/relay.sock"])
    assert rc != 0


def test_fetch_and_pull_bring_a_new_origin_main_commit(
    box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    other = project["other"]
    git_as_owner(other, "pull", "-q", "--ff-only", "origin", "main")
    (other / "upstream.txt").write_text("from upstream\n")
    git_as_owner(other, "add", "upstream.txt")
    git_as_owner(other, "commit", "-q", "-m", "upstream change")
    git_as_owner(other, "push", "-q", "origin", "HEAD:main")
    upstream = git_as_owner(other, "rev-parse", "HEAD").strip()
    rc, _out, err = ctl(engine, box, "git", "fetch")
    assert rc == 0, err
    assert in_box(engine, box, ["git", "rev-parse", "origin/main"])[1].strip() == upstream
    rc, out, err = in_box(
        engine, box,
        ["env", "GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@b.invalid", "GIT_COMMITTER_NAME=a",
         "GIT_COMMITTER_EMAIL=a@b.invalid", "agentbox-ctl", "git", "pull"],
    )
    assert rc == 0, out + err
    assert in_box(engine, box, ["git", "merge-base", "--is-ancestor", upstream, "HEAD"])[0] == 0
    assert in_box(engine, box, ["cat", "upstream.txt"])[1] == "from upstream\n"


def _object_dirs_seen_by_box(engine: docker.DockerClient, box: str, names: list[str]) -> set[str]:
    """Which of the two-hex objects/XX directories the box's git finds (a lookup of each, in the box)."""
    script = 'o="$(git rev-parse --git-common-dir)/objects"; for d in "$@"; do [ -d "$o/$d" ] && echo "$d"; done; true'
    rc, out, err = in_box(engine, box, ["sh", "-c", script, "dirs", *names])
    assert rc == 0, err
    return set(out.split())


def test_fetch_brings_objects_the_box_view_of_the_host_git_does_not_show(
    box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    """The box's .git is an overlay over the host's: a directory the box looked up and missed stays
    missing in the box after the host creates it (overlayfs keeps the negative lookup). A host fetch
    that puts a new object in a new objects/XX directory must still reach the box.

    Made deterministic: the new commit and tree land in directories the box already sees (so a
    box-side `git fetch` believes it has everything, as its connectivity check never reads blobs),
    the blob in a directory the box has looked up while it did not exist."""
    other, objects = project["other"], project["workspace"] / ".git/objects"
    host_dirs = {entry.name for entry in objects.iterdir() if len(entry.name) == 2}
    seen = _object_dirs_seen_by_box(engine, box, sorted(host_dirs))
    fresh = next(f"{n:02x}" for n in range(256) if f"{n:02x}" not in host_dirs)
    assert not _object_dirs_seen_by_box(engine, box, [fresh])  # the box looks it up, and misses
    git_as_owner(other, "pull", "-q", "--ff-only", "origin", "main")
    nonce = next(n for n in range(1 << 20) if _blob_id(f"new dir {n}\n").startswith(fresh))
    (other / "newdir.txt").write_text(f"new dir {nonce}\n")
    blob = git_as_owner(other, "hash-object", "-w", "newdir.txt").strip()
    listing = git_as_owner(other, "ls-tree", "HEAD")
    for tree_nonce in range(1 << 12):
        entry = f"100644 blob {blob}\tnewdir-{tree_nonce}.txt\n"
        tree = git_as_owner(other, "mktree", stdin=listing + entry).strip()
        if tree[:2] in seen:
            break
    dated = {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
             for what, value in (("NAME", "up"), ("EMAIL", "up@up.invalid"), ("DATE", "2026-01-01T00:00:00Z"))}
    parent = git_as_owner(other, "rev-parse", "HEAD").strip()
    for n in range(1 << 12):
        commit = git_as_owner(other, "commit-tree", tree, "-p", parent, "-m", f"new dir {n}", env=dated).strip()
        if commit[:2] in seen:
            break
    assert blob.startswith(fresh) and tree[:2] in seen and commit[:2] in seen
    git_as_owner(other, "push", "-q", "origin", f"{commit}:refs/heads/main")
    rc, _out, err = ctl(engine, box, "git", "fetch")
    assert rc == 0, err
    assert (objects / fresh).is_dir()  # the host's fetch made the directory the box had missed
    assert in_box(engine, box, ["git", "rev-parse", "origin/main"])[1].strip() == commit
    rc, out, err = in_box(engine, box, ["git", "cat-file", "-p", blob])
    assert rc == 0 and out == f"new dir {nonce}\n", err
    # The box merges it (reading the blob into its worktree), so later pushes of its branch stay fast-forwards.
    rc, out, err = in_box(
        engine, box,
        ["env", "GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@b.invalid", "GIT_COMMITTER_NAME=a",
         "GIT_COMMITTER_EMAIL=a@b.invalid", "agentbox-ctl", "git", "pull"],
    )
    assert rc == 0, out + err
    assert in_box(engine, box, ["cat", f"newdir-{tree_nonce}.txt"])[1] == f"new dir {nonce}\n"


def _blob_id(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()  # git's object id


FORGE_SEED = """
import json, sys
path = "/etc/agentbox/seed.json"
record = json.load(open(path))
for entry in record["worktrees"]:
    entry["branch"] = sys.argv[1]
open(path, "w").write(json.dumps(record))
"""


def test_a_forged_seed_record_cannot_move_another_host_branch(
    host: Host, make_box: Callable[[], str], project: dict[str, Path], engine: docker.DockerClient
) -> None:
    """Root in the box rewrites its seed record to name another host branch as its own, moved to
    the box's commit in its view: the host refuses the record, and that branch stays where it was."""
    hostile = make_box()
    workspace = project["workspace"]
    target = f"release-{hostile}"  # a host branch that is not checked out (a checked-out one is refused anyway)
    git_as_owner(workspace, "branch", target, "main")
    before = git(workspace, "rev-parse", f"refs/heads/{target}").strip()
    commit = commit_in_box(engine, hostile, "hostile")
    assert in_box(engine, hostile, ["git", "update-ref", f"refs/heads/{target}", commit])[0] == 0
    container = engine.containers.get(f"agentbox-{hostile}")
    original = container.exec_run(["cat", "/etc/agentbox/seed.json"], user="root").output
    forged = container.exec_run(["python3", "-c", FORGE_SEED, target], user="root")
    assert forged.exit_code == 0, forged.output
    try:
        rc, _out, err = ctl(engine, hostile, "git", "push")
        assert rc != 0 and f"names branch '{target}', not the box's own" in err, err
        fetched = host.module("agentbox_worktree", {"box": hostile, "state": "fetched"})
        assert fetched["failed"] and "written by the box" in fetched["msg"], fetched
        assert git(workspace, "rev-parse", f"refs/heads/{target}").strip() == before
        assert not origin_ref(project, f"refs/heads/{target}")
    finally:
        container.exec_run(["sh", "-c", 'printf %s "$1" > /etc/agentbox/seed.json', "put", original.decode()],
                           user="root")


def test_checkpoint_from_the_box_is_listed_on_the_host(
    host: Host, box: str, engine: docker.DockerClient
) -> None:
    name = f"relay-{secrets.token_hex(3)}"
    rc, out, err = ctl(engine, box, "checkpoint", "--name", name)
    try:
        assert rc == 0, err
        assert f"checkpoint {name}" in out
        listed = host.module("agentbox_checkpoint_info", {"box": box})
        found = {c["name"]: c for c in listed["checkpoints"]}
        assert name in found and found[name]["source_box"] == box
    finally:
        host.module("agentbox_checkpoint", {"box": box, "name": name, "state": "absent"})


def test_relay_restart_and_box_stop_start_keep_commands_working(
    host: Host, box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    before = host.status()["pid"]
    host.relay("restart")
    assert host.status()["pid"] != before
    head = commit_in_box(engine, box, "after relay restart")
    rc, _out, err = ctl(engine, box, "git", "push")
    assert rc == 0, err
    assert origin_ref(project, f"refs/heads/agentbox/{box}") == head
    # With the relay down the box says so and how to fix it; started again, it works again.
    host.playbook("relay.yml", "-e", "state=stopped")
    rc, _out, err = ctl(engine, box, "git", "fetch")
    assert rc == 4 and "playbooks/relay.yml" in err
    assert host.playbook("relay.yml").returncode == 0
    assert host.module("agentbox_box", {"name": box, "state": "stopped"})["box"]["state"] == "stopped"
    assert host.module("agentbox_box", {"name": box, "state": "started"})["box"]["state"] == "running"
    assert ctl(engine, box, "git", "fetch")[0] == 0


def test_a_pending_approval_survives_a_relay_restart(
    host: Host, box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    head = commit_in_box(engine, box, "across a relay restart")
    target = f"restarted-{box}"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ctl, engine, box, "git", "push", "--as", target)
        approval = host.wait_pending(box)
        host.relay("restart")
        rc, _out, err = asked.result(timeout=DEADLINE)
    assert rc != 0 and ("relay on the host stopped" in err or "closed the connection" in err), err
    # The new relay lists it again under the same id, and the user answers it with no box waiting.
    assert [line for line in host.pending() if line.split()[0] == approval and f"as={target}" in line]
    approved = host.playbook("relay_approvals.yml", "-e", f"approve={approval}")
    assert approved.returncode == 0 and f"approved: {approval}" in approved.stdout, approved.stdout
    assert not [line for line in host.pending() if line.split()[0] == approval]
    # The box sends the same request again: the answer given meanwhile applies, with no second wait.
    rc, _out, err = ctl(engine, box, "git", "push", "--as", target)
    assert rc == 0 and "waiting for approval" not in err, err
    assert origin_ref(project, f"refs/heads/{target}") == head
    # An approval is used once: the same request again waits (and is refused here by its timeout).
    rc, _out, err = ctl(engine, box, "git", "push", "--as", target, "--timeout", "1")
    assert rc == 1 and "waiting for approval on the host" in err


def test_gh_pr_runs_on_the_host_or_says_how_to_get_gh(box: str, engine: docker.DockerClient) -> None:
    rc, _out, err = ctl(engine, box, "gh", "pr", "list")
    if shutil.which("gh") is None:
        assert rc == 1 and "gh is not installed on the host" in err
    else:  # the host's own gh answered (signed in or not); the relay did not refuse it
        assert "gh is not installed" not in err
    # A merge is outside the box's own branch: it waits (and is refused here by its timeout).
    rc, _out, err = ctl(engine, box, "gh", "pr", "merge", "7", "--timeout", "1")
    assert rc == 1 and "waiting for approval on the host" in err


def test_registrations_of_removed_boxes_are_pruned(
    host: Host, box: str, engine: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_server, _relay_state

    monkeypatch.setenv("HOME", host.home)
    gone_id = secrets.token_hex(4)
    _relay_state.register_box("removed-by-hand", gone_id, "docker", "local")
    registrations = _relay_state.registered_boxes()
    registrations[gone_id]["registered_at"] = 0  # made long ago (not a create in progress)
    live_id = engine.containers.get(f"agentbox-{box}").labels["io.agentbox.id"]
    registrations[live_id]["registered_at"] = 0
    assert _relay_server.prune_registrations(registrations) == [gone_id]
    assert gone_id not in _relay_state.registered_boxes()
    assert not Path(_relay_state.box_socket_dir(gone_id)).exists()
    assert live_id in _relay_state.registered_boxes()


def test_relay_ends_by_itself_when_its_home_is_removed() -> None:
    home = tempfile.mkdtemp(prefix="abr-", dir="/tmp")
    started = subprocess.run([RELAY, "start"], env={**os.environ, "HOME": home}, capture_output=True, text=True,
                             check=True)
    pid = json.loads(started.stdout)["pid"]
    shutil.rmtree(home)  # as a test's temporary HOME goes at its end
    deadline = time.monotonic() + DEADLINE
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"relay {pid} still runs without its directory"
        time.sleep(0.1)
