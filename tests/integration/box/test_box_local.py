"""Boxes on the local engine: agentbox_box and agentbox_worktree against real git and Docker.

Through Ansible (`run_module`): a create and a failure while seeding (agentbox_box's action plugin, its result
and its failure as Ansible reports them), check mode of a create (`--check`), and a fetch (agentbox_worktree as
a module Ansible ships to the target); the playbooks' test runs the playbooks. Every other run is the same task
in-process (`box_task`, check mode included: the same `_ansible_check_mode` Ansible sends) or the module's main
in a fresh Python (`run_module_direct`, where a test needs processes of their own: the race). Boxes a test
drives with git and the shell alone are made with `boot=False` (the git layer and the seed are the create's,
not the boot's); the create through Ansible and the lifecycle's box are booted."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import os
import secrets
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo, run_module, run_module_direct
from tests.integration.box.conftest import box_task

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    client = docker.from_env()
    if not any(IMAGE in image.tags for image in client.images.list(name="agentbox/box")):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    return client


@pytest.fixture
def boxes(engine: docker.DockerClient) -> Iterator[list[str]]:
    """Names of boxes a test makes; whatever is left is destroyed (in-process: a clean-up, not a check)."""
    names: list[str] = []
    yield names
    for name in names:
        box_task({"name": name, "state": "absent"})


def box_name(prefix: str = "t") -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def dirty_workspace(tmp_path: Path) -> Path:
    """A repo with every kind of uncommitted change the carry-over must reproduce."""
    repo = make_repo(
        tmp_path / "ws",
        {
            "README.md": "hello\n",
            "src/app.py": "print('v1')\n",
            "src/old name.txt": "rename me\n",
            "gone.txt": "delete me\n",
            "unstaged-gone.txt": "delete me too\n",
            "script.sh": "#!/bin/sh\necho hi\n",
            ".gitignore": "*.log\nbuild/\n",
        },
    )
    (repo / "script.sh").chmod(0o755)
    git(repo, "add", "script.sh")
    git(repo, "commit", "-q", "-m", "exec bit")
    # staged, then more unstaged on top of the same file
    (repo / "src/app.py").write_text("print('v2 staged')\n")
    git(repo, "add", "src/app.py")
    with open(repo / "src/app.py", "a") as handle:
        handle.write("print('v3 unstaged')\n")
    (repo / "README.md").write_text("hello, unstaged edit\n")
    git(repo, "rm", "-q", "gone.txt")
    (repo / "unstaged-gone.txt").unlink()
    git(repo, "mv", "src/old name.txt", "src/new «name» 'q'.txt")
    # untracked: nested dirs, unicode, spaces, quotes, empty file, exec bit, symlink, large binary
    (repo / "notes/deep/er").mkdir(parents=True)
    (repo / "notes/deep/er/idea ü.md").write_text("untracked idea\n")
    (repo / 'quote"d.txt').write_text("q\n")
    (repo / "empty").write_bytes(b"")
    (repo / "tool").write_text("#!/bin/sh\nexit 0\n")
    (repo / "tool").chmod(0o755)
    os.symlink("README.md", repo / "link-to-readme")
    (repo / "blob.bin").write_bytes(os.urandom(12 * 1024 * 1024))
    # ignored: must not be carried
    (repo / "debug.log").write_text("noise\n")
    (repo / "build").mkdir()
    (repo / "build/out.o").write_bytes(b"\0\1")
    chown_tree(repo)
    return repo


def host_snapshot(repo: Path) -> dict:
    """What must never change on the host: index bytes, stash list, status, working tree files."""
    index = (repo / ".git/index").read_bytes()
    return {
        "index": hashlib.sha256(index).hexdigest(),
        "stash": git(repo, "stash", "list"),
        "status": git(repo, "status", "--porcelain=v1", "-uall"),
        "tree": tree_manifest(repo),
    }


def tree_manifest(root: Path) -> dict[str, tuple]:
    """Every path under root except .git: (kind, mode bits, content hash or link target)."""
    entries: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                entries[rel] = ("link", os.readlink(full))
            else:
                with open(full, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
                entries[rel] = ("file", info.st_mode & 0o111 != 0, digest)
    return entries


def box_manifest(engine: docker.DockerClient, box: str, path: str = "/workspace/") -> dict[str, tuple]:
    """The same manifest for /workspace in the box, read through a tar of it."""
    container = engine.containers.get(f"agentbox-{box}")
    stream, _stat = container.get_archive(path)
    data = io.BytesIO(b"".join(stream))
    entries: dict[str, tuple] = {}
    with tarfile.open(fileobj=data) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not parts[1] or parts[1] == ".git" or parts[1].startswith(".git/"):
                continue
            rel = parts[1]
            if member.issym():
                entries[rel] = ("link", member.linkname)
            elif member.isfile():
                content = tar.extractfile(member).read()
                entries[rel] = ("file", member.mode & 0o111 != 0, hashlib.sha256(content).hexdigest())
    return entries


def carried_paths(repo: Path) -> set[str]:
    """Tracked (as they are now) plus untracked-not-ignored files of the host workspace."""
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return {path for path in listed if path and os.path.lexists(repo / path)}


def exec_in(engine: docker.DockerClient, box: str, command: str, user: str = "vscode") -> tuple[int, str]:
    result = engine.containers.get(f"agentbox-{box}").exec_run(["bash", "-lc", command], user=user)
    return result.exit_code, result.output.decode()


def test_create_carries_everything_and_leaves_host_untouched(engine, boxes, tmp_path):
    repo = dirty_workspace(tmp_path)
    before = host_snapshot(repo)
    name = box_name()
    boxes.append(name)

    result = run_module("agentbox_box", {"name": name, "workspace": str(repo)})

    assert result.get("failed") is not True, result
    assert result["changed"] is True, result
    assert result["box"]["state"] == "running"
    assert result["box"]["branch"] == f"agentbox/{name}"
    assert result["box"]["labels"]["project"] == result["box"]["project"] == hashlib.sha1(str(repo).encode()).hexdigest()[:16]
    assert set(result["box"]["ports"]) == {"80"}
    seed = result["seed"]
    assert (seed["modified"], seed["deleted"], seed["renamed"]) == (2, 2, 1)
    assert seed["untracked"] == 6
    expected = {path: entry for path, entry in tree_manifest(repo).items() if path in carried_paths(repo)}
    assert box_manifest(engine, name) == expected
    assert "debug.log" not in box_manifest(engine, name)
    rc, status_in_box = exec_in(engine, name, "cd /workspace && git status --porcelain=v1 -uall")
    assert rc == 0
    assert sorted(status_in_box.splitlines()) == sorted(before["status"].splitlines())
    assert host_snapshot(repo) == before


def test_commit_in_box_reaches_host_branch_when_fetched(engine, boxes, tmp_path):
    repo = make_repo(tmp_path / "ws")
    chown_tree(repo)
    name = box_name()
    boxes.append(name)
    assert box_task({"name": name, "workspace": str(repo), "boot": False})["changed"]

    rc, out = exec_in(
        engine,
        name,
        "cd /workspace && echo from-box > boxfile && git add boxfile && "
        "git -c user.email=a@b -c user.name=agent commit -q -m 'made in the box' && git rev-parse HEAD",
    )
    assert rc == 0, out
    made = out.strip().splitlines()[-1]
    # The box's writes stay in its git layer until the host fetches them (docs/architecture.md).
    assert git(repo, "rev-parse", f"agentbox/{name}").strip() != made
    fetched = run_module("agentbox_worktree", {"box": name, "state": "fetched"})
    assert fetched["changed"] and fetched["fetched"]["repos"][0]["new_commits"] == 1
    assert git(repo, "rev-parse", f"agentbox/{name}").strip() == made
    assert git(repo, "log", "-1", "--format=%s", f"agentbox/{name}").strip() == "made in the box"
    assert not (repo / "boxfile").exists()  # the host's own tree is not the box's


def test_idempotent_check_mode_and_lifecycle(engine, boxes, tmp_path):
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    (repo / "wip.txt").write_text("untracked\n")
    chown_tree(repo)
    name = box_name()

    planned = run_module("agentbox_box", {"name": name, "workspace": str(repo)}, check_mode=True)
    assert planned["changed"] is True and planned["box"]["name"] == name
    assert not engine.containers.list(all=True, filters={"name": f"agentbox-{name}"})
    assert git(repo, "branch", "--list", f"agentbox/{name}") == ""

    boxes.append(name)
    first = box_task({"name": name, "workspace": str(repo)})
    assert first["changed"] is True
    again = box_task({"name": name, "workspace": str(repo)})
    assert again["changed"] is False and again["box"]["state"] == "running"

    paused = box_task({"name": name, "state": "paused"})
    assert paused["changed"] is True and paused["box"]["state"] == "paused"
    assert engine.containers.get(f"agentbox-{name}").status == "paused"
    from ansible_collections.agentbox.box.plugins.module_utils.core import _provider
    from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _docker

    with pytest.raises(_provider.ProviderError, match="paused: resume it"):
        _docker.DockerProvider().exec(name, ["true"])
    assert box_task({"name": name, "state": "paused"})["changed"] is False

    resumed = box_task({"name": name, "state": "started"})
    assert resumed["changed"] is True and resumed["box"]["state"] == "running"

    stopped = box_task({"name": name, "state": "stopped"})
    assert stopped["box"]["state"] == "stopped"
    started = box_task({"name": name, "state": "started"})
    assert started["box"]["state"] == "running"
    assert set(started["box"]["ports"]) == {"80"}  # re-read after the start
    rc, out = exec_in(engine, name, "cd /workspace && git branch --show-current && cat wip.txt")
    assert rc == 0 and out.split() == [f"agentbox/{name}", "untracked"]

    check_destroy = box_task({"name": name, "state": "absent"}, check_mode=True)
    assert check_destroy["changed"] is True
    assert engine.containers.get(f"agentbox-{name}")

    gone = box_task({"name": name, "state": "absent"})
    assert gone["changed"] is True
    assert not engine.containers.list(all=True, filters={"name": f"agentbox-{name}"})
    assert not [v for v in engine.volumes.list() if v.name.startswith(f"agentbox-{name}")]
    assert f"agentbox-worktrees/{name}" not in git(repo, "worktree", "list", "--porcelain")
    assert git(repo, "branch", "--list", f"agentbox/{name}").strip() == f"agentbox/{name}"  # kept
    assert box_task({"name": name, "state": "absent"})["changed"] is False


def test_two_boxes_racing_for_one_branch_name_get_distinct_branches(engine, boxes, tmp_path):
    """Box `c` finds agentbox/c taken and wants agentbox/c-2, which box `c-2` wants too, at the same time:
    exactly one of them gets it, the other moves on, and each box works on the branch it reports."""
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    base = box_name("c")
    names = [base, f"{base}-2"]
    git(repo, "branch", f"agentbox/{base}")  # left by an earlier box of the same name
    chown_tree(repo)
    boxes.extend(names)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        # Two processes, as two ansible runs would be (the module's main each: no ansible start to skew the race).
        results = list(pool.map(lambda n: run_module_direct("agentbox_box", {"name": n, "workspace": str(repo), "boot": False}),
                                names))

    branches = [result["box"]["branch"] for result in results]
    c_won = [f"agentbox/{base}-2", f"agentbox/{base}-2-2"]
    c2_won = [f"agentbox/{base}-3", f"agentbox/{base}-2"]
    assert branches in (c_won, c2_won), branches
    assert sorted(git(repo, "branch", "--list", f"agentbox/{base}*", "--format=%(refname:short)").split()) == sorted(
        [f"agentbox/{base}", *branches]
    )
    for name, branch in zip(names, branches, strict=True):
        rc, out = exec_in(engine, name, "cd /workspace && git branch --show-current && cat a.txt")
        assert rc == 0 and out.split() == [branch, "a"]


def test_nested_repos_worktree_workspace_and_plain_copy(engine, boxes, tmp_path):
    outer = make_repo(tmp_path / "outer", {".gitignore": "lib/\n", "top.txt": "top\n"})
    make_repo(outer / "lib", {"inner.txt": "inner\n"})
    (outer / "lib/inner-wip.txt").write_text("nested untracked\n")
    plain = tmp_path / "plain"
    (plain / "sub").mkdir(parents=True)
    (plain / "sub/file.txt").write_text("plain copy\n")
    git(outer, "worktree", "add", "-q", str(tmp_path / "linked"), "-b", "feature")
    (tmp_path / "linked/linked-wip.txt").write_text("in a linked worktree\n")
    for path in (outer, plain, tmp_path / "linked"):
        chown_tree(path)
    nested, copied, linked = box_name("n"), box_name("p"), box_name("l")
    boxes.extend([nested, copied, linked])

    result = run_module_direct("agentbox_box", {"name": nested, "workspace": str(outer), "boot": False})
    assert result["seed"]["mode"] == "worktree" and len(result["seed"]["worktrees"]) == 2
    rc, out = exec_in(engine, nested, "cd /workspace/lib && git branch --show-current && cat inner.txt inner-wip.txt")
    assert rc == 0 and out.split("\n")[:3] == [f"agentbox/{nested}", "inner", "nested untracked"]
    assert git(outer / "lib", "rev-parse", "--abbrev-ref", f"agentbox/{nested}").strip() == f"agentbox/{nested}"

    result = box_task({"name": copied, "workspace": str(plain), "boot": False})
    assert result["seed"]["mode"] == "copy" and result["box"]["branch"] == ""
    assert box_manifest(engine, copied) == tree_manifest(plain)

    result = box_task({"name": linked, "workspace": str(tmp_path / "linked"), "boot": False})
    assert result.get("failed") is not True, result
    rc, out = exec_in(engine, linked, "cd /workspace && git log -1 --format=%s && cat linked-wip.txt")
    assert rc == 0 and out.split("\n")[:2] == ["initial", "in a linked worktree"]


@pytest.mark.parametrize("bad", ["../x", "a;rm -rf", "UPPER", "x" * 70, "-lead"])
def test_invalid_box_names_fail_before_anything(engine, tmp_path, bad):
    repo = make_repo(tmp_path / "ws")
    chown_tree(repo)
    # The task checks the name (not Ansible's argument spec): in-process, as every refusal of the task here.
    result = box_task({"name": bad, "workspace": str(repo)})
    assert result["failed"] is True
    assert "invalid box name" in result["msg"] and "a-z, 0-9" in result["msg"]
    # The listing alone (the SDK's list inspects each container, and other tests' boxes come and go meanwhile).
    assert not [name for c in engine.api.containers(all=True) for name in c["Names"] if bad in name]
    assert "agentbox/" not in git(repo, "branch", "--list")


def test_bad_input_leaves_nothing_behind(engine, boxes, tmp_path):
    repo = make_repo(tmp_path / "ws")
    other = make_repo(tmp_path / "other")
    empty_repo = tmp_path / "norepo"
    empty_repo.mkdir()
    git(empty_repo, "init", "-q")
    for path in (repo, other, empty_repo):
        chown_tree(path)
    name = box_name("b")

    missing = box_task({"name": name, "workspace": str(tmp_path / "nope")})
    assert missing["failed"] and "is not a directory" in missing["msg"]

    no_commits = box_task({"name": name, "workspace": str(empty_repo)})
    assert no_commits["failed"] and "no commits yet" in no_commits["msg"]

    down = box_task({"name": name, "workspace": str(repo)}, env={"AGENTBOX_ENGINE": "unix:///nonexistent.sock"})
    assert down["failed"] and "box engine at unix:///nonexistent.sock does not answer" in down["msg"]
    assert "ensure-box-engine.sh" in down["msg"] and "isolation=none" in down["msg"]
    user_engine_down = box_task({"name": name, "workspace": str(repo), "isolation": "none"},
                                env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert user_engine_down["failed"] and "does not answer" in user_engine_down["msg"]
    assert "DOCKER_HOST" in user_engine_down["msg"]

    no_image = box_task({"name": name, "workspace": str(repo), "image": "agentbox/none:missing"})
    assert no_image["failed"] and "is not on engine" in no_image["msg"] and "box_image" in no_image["msg"]

    assert not engine.containers.list(all=True, filters={"name": f"agentbox-{name}"})
    assert not [v for v in engine.volumes.list() if v.name.startswith(f"agentbox-{name}")]
    assert "agentbox/" not in git(repo, "branch", "--list")

    boxes.append(name)
    assert box_task({"name": name, "workspace": str(repo), "boot": False})["changed"]
    taken = box_task({"name": name, "workspace": str(other)})
    assert taken["failed"] and "already used by another project" in taken["msg"]
    assert "agentbox/" not in git(other, "branch", "--list")


def test_failure_while_seeding_removes_the_half_made_box(engine, tmp_path):
    """An image without git makes `git worktree add` fail after the container exists."""
    broken_image = f"agentbox-test/nogit:{secrets.token_hex(3)}"
    helper = engine.containers.run(IMAGE, ["sh", "-c", "rm -f /usr/bin/git"], user="root", detach=True)
    try:
        helper.wait()
        helper.commit(*broken_image.split(":"))
    finally:
        helper.remove(force=True)
    repo = make_repo(tmp_path / "ws")
    (repo / "wip.txt").write_text("x\n")
    chown_tree(repo)
    name = box_name("f")
    try:
        result = run_module("agentbox_box", {"name": name, "workspace": str(repo), "image": broken_image})
        assert result["failed"] is True
        assert "git worktree add" in result["msg"]
        assert not engine.containers.list(all=True, filters={"name": f"agentbox-{name}"})
        assert not [v for v in engine.volumes.list() if v.name.startswith(f"agentbox-{name}")]
        assert "agentbox/" not in git(repo, "branch", "--list")
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    finally:
        engine.images.remove(broken_image, force=True)


def test_empty_box_seeded_later_by_agentbox_worktree(engine, boxes, tmp_path):
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    (repo / "a.txt").write_text("changed\n")
    chown_tree(repo)
    name = box_name("w")
    boxes.append(name)
    made = box_task({"name": name, "workspace": str(repo), "seed": False, "boot": False})
    assert made["changed"] and made.get("seed") is None

    planned = run_module_direct("agentbox_worktree", {"box": name}, check_mode=True)
    assert planned["changed"] is True
    seeded = run_module_direct("agentbox_worktree", {"box": name})
    assert seeded["changed"] is True and seeded["seed"]["modified"] == 1
    assert run_module_direct("agentbox_worktree", {"box": name})["changed"] is False
    rc, out = exec_in(engine, name, "cat /workspace/a.txt")
    assert rc == 0 and out == "changed\n"
    fetched = run_module_direct("agentbox_worktree", {"box": name, "state": "fetched"})
    assert fetched["changed"] is False and fetched["fetched"]["repos"][0]["branch"] == f"agentbox/{name}"


def test_playbooks_create_list_switch_destroy(engine, tmp_path):
    repo = make_repo(tmp_path / "ws")
    chown_tree(repo)
    first, second = box_name("s"), box_name("s")
    playbook = Path(__file__).resolve().parents[3] / "playbooks"
    env = {**os.environ, "ANSIBLE_CONFIG": str(playbook.parent / "ansible.cfg")}

    def play(name: str, *extra: str) -> str:
        result = subprocess.run(
            [str(playbook.parent / ".venv/bin/ansible-playbook"), str(playbook / name), *extra],
            capture_output=True,
            text=True,
            cwd=repo,
            env={**env, "PWD": str(repo)},  # as a shell would set it
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    try:
        out = play("create_box.yml", "-e", f"box={first}")
        shell = f"docker -H {os.environ['DOCKER_HOST']} exec -it -u vscode -w /workspace agentbox-{first} bash -l"
        assert shell in " ".join(out.split())  # the output callback wraps long lines
        play("create_box.yml", "-e", f"box={second}", "-e", f"workspace={repo}")
        table = play("list_boxes.yml", "-e", f"workspace={repo}")
        assert first in table and second in table and "running" in table
        play("switch_box.yml", "-e", f"box={first}")
        assert engine.containers.get(f"agentbox-{second}").status == "paused"
        assert engine.containers.get(f"agentbox-{first}").status == "running"
        play("box_state.yml", "-e", f"box={second}", "-e", "state=stopped")
        assert engine.containers.get(f"agentbox-{second}").status == "exited"
    finally:
        play("destroy_box.yml", "-e", f"box={first}", "-e", "delete_branch=true")
        play("destroy_box.yml", "-e", f"box={second}")
    assert git(repo, "branch", "--list", f"agentbox/{first}") == ""
    assert git(repo, "branch", "--list", f"agentbox/{second}").strip() == f"agentbox/{second}"


def test_root_owned_repository_is_made_writable_for_the_box(engine, boxes, tmp_path):
    """A checkout owned by root (as on a CI machine): the box still commits, in its own git layer."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to own the test repository")
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    (repo / "wip.txt").write_text("root's untracked work\n")
    mode_before = (repo / "a.txt").stat().st_mode
    name = box_name("r")
    boxes.append(name)
    result = box_task({"name": name, "workspace": str(repo), "boot": False})
    assert result.get("failed") is not True, result
    assert not result["seed"]["warnings"], result["seed"]["warnings"]
    rc, out = exec_in(
        engine,
        name,
        "cd /workspace && cat wip.txt && git add wip.txt && git -c user.email=a@b -c user.name=agent commit -q -m boxed",
    )
    assert rc == 0, out
    assert run_module_direct("agentbox_worktree", {"box": name, "state": "fetched"})["changed"]
    assert git(repo, "log", "-1", "--format=%s", f"agentbox/{name}").strip() == "boxed"
    assert (repo / "a.txt").stat().st_mode == mode_before  # the working tree is not touched
    assert (repo / "a.txt").stat().st_uid == 0
