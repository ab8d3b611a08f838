"""Boxes on remote Docker engines over SSH: two engine hosts (sshd + dockerd in containers,
reached only through 127.0.0.1 ports), one host repo with uncommitted work, boxes on both.

Checks: the image reaches each engine (streamed, then present), the carry-over is
byte-identical file by file (content, mode, symlinks; staged vs unstaged), commands run in both
boxes, a commit made in a remote box comes back to the host repo as agentbox/<box> (resolving
against the host's full history although the box is shallow), a box port is reachable through a
local forward, the module works end to end, a disk filling up during the upload leaves nothing
on the engine, and destroy leaves nothing on either engine.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import docker
import pytest

HERE = Path(__file__).resolve().parent
# The collection from the checkout (.collections/...).
for entry in (str(HERE.parents[3] / ".collections"),):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from ansible_collections.agentbox.box.plugins.module_utils.box import _box  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.git import _ship  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image_transfer  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.ssh import _ssh  # noqa: E402
from tests.conftest import make_repo, run_module_direct  # noqa: E402
from tests.integration.support.engines import FLEET_IMAGE as IMAGE  # noqa: E402
from tests.integration.support.engines import REPO, EngineFleet  # noqa: E402

pytestmark = pytest.mark.integration
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Host User",
    "GIT_AUTHOR_EMAIL": "host@example.invalid",
    "GIT_COMMITTER_NAME": "Host User",
    "GIT_COMMITTER_EMAIL": "host@example.invalid",
}


@pytest.fixture
def fleet(engine_fleet: EngineFleet) -> EngineFleet:
    """The worker's two engines with the box image (as IMAGE), loaded once (tests/integration/conftest.py)."""
    return engine_fleet


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    ).stdout


def make_host_repo(root: Path, commits: int = 6) -> Path:
    """A repo with history, a nested repo, and every kind of uncommitted change."""
    old_umask = os.umask(0o022)
    try:
        repo = root / "workspace"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        (repo / ".gitignore").write_text("*.log\nnested/\n")
        (repo / "run.sh").write_text("#!/bin/sh\necho run\n")
        (repo / "run.sh").chmod(0o755)
        (repo / "data.bin").write_bytes(bytes(range(256)) * 64)
        (repo / "gone.txt").write_text("to be deleted\n")
        (repo / "old name.txt").write_text("renamed content\n")
        (repo / "staged.txt").write_text("v1\n")
        os.symlink("run.sh", repo / "link-to-run")
        for number in range(commits):
            (repo / "history.txt").write_text(f"commit {number}\n")
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", f"commit {number}")
        # Uncommitted: modified (unstaged), staged, staged-then-modified, deleted, renamed, mode change.
        (repo / "history.txt").write_text("changed, not staged\n")
        (repo / "staged.txt").write_text("v2 staged\n")
        git(repo, "add", "staged.txt")
        (repo / "data.bin").write_bytes(bytes(reversed(range(256))) * 64)
        git(repo, "add", "data.bin")
        (repo / "data.bin").write_bytes(bytes(range(256)) * 65)
        git(repo, "rm", "-q", "gone.txt")
        git(repo, "mv", "old name.txt", "new name.txt")
        (repo / "run.sh").chmod(0o644)
        # Untracked: text, executable, binary, in a new directory, odd name; ignored stays home.
        (repo / "notes.md").write_text("untracked notes\n")
        (repo / "tool.py").write_text("print('x')\n")
        (repo / "tool.py").chmod(0o755)
        (repo / "new dir").mkdir()
        (repo / "new dir" / "blob.bin").write_bytes(os.urandom(5000))
        (repo / "ünïcode name.txt").write_text("ü\n")
        (repo / "debug.log").write_text("ignored\n")
        nested = repo / "nested"
        nested.mkdir()
        git(nested, "init", "-q", "-b", "main")
        (nested / "lib.txt").write_text("lib v1\n")
        git(nested, "add", "-A")
        git(nested, "commit", "-q", "-m", "nested init")
        (nested / "lib.txt").write_text("lib v2 uncommitted\n")
        (nested / "extra.txt").write_text("nested untracked\n")
        return repo
    finally:
        os.umask(old_umask)


def host_state(repo: Path) -> dict[str, str]:
    """Everything seeding must not change in a host repo."""
    git_dir = repo / ".git"
    return {
        "status": git(repo, "status", "--porcelain=v1", "-uall"),
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "stash": git(repo, "stash", "list"),
        "index": (git_dir / "index").read_bytes().hex(),
    }


def expected_files(repo: Path) -> dict[str, tuple[str, bytes, int]]:
    """Host files a box must hold: tracked (as in the working tree) and untracked, not ignored."""
    listing = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    files = {}
    for rel in filter(None, listing.split("\0")):
        path = repo / rel
        if not os.path.lexists(path):
            continue  # deleted in the working tree
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            files[rel] = ("link", os.readlink(path).encode(), 0)
        else:
            files[rel] = ("file", path.read_bytes(), stat.S_IMODE(info.st_mode))
    return files


def box_files(provider: DockerProvider, box: str, path: str) -> dict[str, tuple[str, bytes, int]]:
    data = b"".join(provider.get_archive(box, path))
    files = {}
    prefix = os.path.basename(path) + "/"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            name = member.name.removeprefix(prefix)
            if ".git" in name.split("/") or member.isdir():
                continue
            if member.issym():
                files[name] = ("link", member.linkname.encode(), 0)
            elif member.isfile():
                files[name] = ("file", tar.extractfile(member).read(), stat.S_IMODE(member.mode))
    return files


def run(provider: DockerProvider, box: str, *argv: str, user: str = "vscode") -> str:
    result = provider.exec(box, list(argv), user=user)
    assert result.rc == 0, result.stderr.decode()
    return result.text


def test_image_streamed_then_present(fleet):
    for engine in fleet.engines:
        report = fleet.image_reports[engine.alias]
        assert report.path == "streamed"
        assert report.image_bytes > 100_000_000 and report.bytes_sent == report.image_bytes
        local_id = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", IMAGE], check=True, capture_output=True, text=True
        ).stdout.strip()
        assert report.image_id == local_id
        again = _image_transfer.ensure_image(DockerProvider(engine=engine.alias, ssh_options={}, isolation="none"), IMAGE)
        assert again.path == "present" and again.bytes_sent == 0  # found on the engine: nothing crosses the link


def test_two_engines_carry_over_commands_fetch_back_destroy(fleet, tmp_path, monkeypatch):
    monkeypatch.setenv(_ship.DEPTH_ENV, "3")  # the box gets 3 of 6 commits: fetch must still resolve
    repo = make_host_repo(tmp_path)
    before = host_state(repo)
    nested_before = host_state(repo / "nested")
    expected_root = {k: v for k, v in expected_files(repo).items() if not k.startswith("nested/")}
    expected_nested = expected_files(repo / "nested")
    # One engine by alias (~/.ssh/config style), the other by user@host:port.
    targets = [fleet.engines[0].alias, fleet.engines[1].destination]
    boxes = []
    try:
        for index, engine in enumerate(targets):
            provider = DockerProvider(engine=engine, ssh_options={"strict_host_key_checking": True}, isolation="none")
            name = f"abx-ssh-{index}-{secrets.token_hex(2)}"
            # Nothing started in the box (boot=False): carry-over, commands and fetch need none; a booted remote box:
            # test_module_end_to_end_with_user_at_host_port.
            created = _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(repo), image=IMAGE, boot=False))
            boxes.append((provider, created.facts))
            assert created.facts.provider == "docker_ssh" and created.facts.engine == engine
            assert created.seed.mode == "shipped" and created.seed.branch == f"agentbox/{name}"
            assert created.seed.modified >= 4 and (created.seed.deleted, created.seed.renamed) == (1, 1)
            assert created.seed.warnings == []
            # Byte-identical carry-over, file by file (content, mode, symlink target).
            assert box_files(provider, name, "/workspace") == dict(expected_root) | {
                f"nested/{k}": v for k, v in expected_nested.items()
            }
            # Staged and unstaged states survive (git status in the box reads like the host's).
            assert run(provider, name, "git", "-C", "/workspace", "status", "--porcelain=v1", "-uall") == before[
                "status"
            ].replace("?? nested/extra.txt\n", "").replace("?? nested/lib.txt\n", "")
            assert (
                run(provider, name, "git", "-C", "/workspace/nested", "status", "--porcelain=v1")
                == (nested_before["status"])
            )
            assert run(provider, name, "git", "-C", "/workspace", "rev-parse", "--abbrev-ref", "HEAD").strip() == (
                f"agentbox/{name}"
            )
            assert run(provider, name, "git", "-C", "/workspace", "rev-parse", "--is-shallow-repository").strip() == (
                "true"
            )
            assert run(provider, name, "hostname").strip() == f"agentbox-{name}"
        # The host repo was only read.
        assert host_state(repo) == before and host_state(repo / "nested") == nested_before
        assert "agentbox/" not in before["refs"] and "agentbox/" not in host_state(repo)["refs"]

        # A commit in the remote box on the second engine comes back to the host.
        provider, facts = boxes[1]
        run(provider, facts.name, "sh", "-c",
            "cd /workspace && git add -A . && git -c user.name=Agent -c user.email=agent@example.invalid "
            "commit -q -m 'work from the box' && echo more >> notes.md && git -c user.name=Agent "
            "-c user.email=agent@example.invalid commit -qam 'second box commit'")  # fmt: skip
        box_tip = run(provider, facts.name, "git", "-C", "/workspace", "rev-parse", "HEAD").strip()
        fetched = _ship.fetch_box_branch(provider, facts, str(repo))
        root_result = fetched["repos"][0]
        assert root_result["changed"] and root_result["commit"] == box_tip and root_result["new_commits"] == 2
        branch = f"agentbox/{facts.name}"
        assert git(repo, "rev-parse", branch).strip() == box_tip
        assert git(repo, "log", "-1", "--format=%s", branch).strip() == "second box commit"
        # Shallow in the box, whole on the host: 6 host commits + 2 from the box.
        assert int(git(repo, "rev-list", "--count", branch)) == 8
        assert git(repo, "show", f"{branch}:notes.md") == "untracked notes\nmore\n"
        assert git(repo, "show", f"{branch}~1:new name.txt") == "renamed content\n"
        # The host's working tree and index are still untouched; a second fetch changes nothing.
        assert host_state(repo)["status"] == before["status"] and host_state(repo)["index"] == before["index"]
        assert _ship.fetch_box_branch(provider, facts, str(repo))["changed"] is False
    finally:
        for provider, facts in boxes:
            _box.destroy_box(provider, facts)
    names = [facts.name for _provider, facts in boxes]
    assert len(names) == 2
    for engine in fleet.engines:
        assert engine.agentbox_objects(*names) == []


def test_port_forward_to_a_box_port(fleet, tmp_path):
    provider = DockerProvider(engine=fleet.engines[0].alias, ssh_options={}, isolation="none")
    name = f"abx-port-{secrets.token_hex(2)}"
    token = secrets.token_hex(8)
    created = _box.create_box(
        provider, _box.CreateRequest(name=name, workspace=str(tmp_path), ports=[8123], seed=False, image=IMAGE,
                                     boot=False)  # the test serves the port itself: nothing need be started
    )
    try:
        engine_port = created.facts.ports["8123"]
        run(provider, name, "sh", "-c",
            f"mkdir -p /tmp/www && echo {token} > /tmp/www/token && cd /tmp/www && "
            "nohup python3 -m http.server 8123 >/dev/null 2>&1 &")  # fmt: skip
        with _ssh.open_local_forward(fleet.engines[0].alias, engine_port) as forward:
            deadline = time.monotonic() + 15
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{forward.local_port}/token", timeout=5) as answer:
                        assert answer.read().decode().strip() == token
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.3)
        # A forward that outlives its caller (what agentbox_forward leaves for the user), as the module asks it.
        assert provider.port_urls == "forwarded"
        pid, local_port = provider.forward_port(name, engine_port, None)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{local_port}/token", timeout=10) as answer:
                assert answer.read().decode().strip() == token
        finally:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _pid_alive(pid)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{local_port}/token", timeout=3)
    finally:
        _box.destroy_box(provider, created.facts)
    assert fleet.engines[0].agentbox_objects(name) == []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not reaped: it is not our child) counts as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_forked_child_never_closes_the_parents_ssh_clients(fleet):
    """Ansible forks workers (and start_forward_daemon forks) from a process that holds clients over
    SSH. The child must set them aside: closing an inherited channel waits forever on a transport
    whose reader thread stayed in the parent (this hung a test run once)."""
    from ansible_collections.agentbox.box.plugins.plugin_utils._providers import provider_for

    provider = provider_for("docker_ssh", fleet.engines[0].alias, {})
    # The parent now holds a pooled dial-stdio channel. The engine is shared with the other worker, which
    # may have boxes there: the listings answer (a list), whatever is on it.
    assert isinstance(provider.list_boxes(), list)
    # Fork while the send lock is held, as when paramiko's reader thread is mid-packet: the child's
    # copy of the lock is held for good, so any close of an inherited channel there would block.
    send_lock = _ssh.connection_for(fleet.engines[0].alias).transport().clear_to_send_lock
    send_lock.acquire()
    pid = os.fork()
    if pid != 0:
        send_lock.release()
    if pid == 0:  # child: collect everything it inherited, then use the engine with its own client
        code = 1
        try:
            import gc

            gc.collect()
            child = provider_for("docker_ssh", fleet.engines[0].alias, {})
            code = 0 if child is not provider and isinstance(child.list_boxes(), list) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the clients it inherited")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert isinstance(provider.list_boxes(), list)  # the parent's client still works


def test_disk_full_during_upload_leaves_nothing(fleet, tmp_path):
    engine = fleet.engines[1]  # only this module uses it: the other worker's boxes on engines[0] keep their disk
    repo = tmp_path / "big"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "random.bin").write_bytes(os.urandom(40 * 1024 * 1024))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "big")
    provider = DockerProvider(engine=engine.alias, ssh_options={}, isolation="none")
    name = f"abx-full-{secrets.token_hex(2)}"
    # Held while full: best_of's test on the other worker makes a box there (test_best_of_engines.py).
    with fleet.holding(engine):
        # Leave about 16 MB free on the engine's Docker storage: the box starts, its upload cannot fit.
        engine.shell(
            "avail=$(df --output=avail -k /var/lib/docker | tail -1); "
            "fallocate -l $(( (avail - 16384) * 1024 )) /var/lib/docker/filler"
        )
        try:
            with pytest.raises(ProviderError) as failure:
                _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(repo), image=IMAGE))
        finally:
            engine.shell("rm -f /var/lib/docker/filler")
    message = str(failure.value)
    assert "uploading the repository" in message and "out of disk space" in message, message
    assert engine.agentbox_objects(name) == []
    assert provider.find(name) is None


def test_module_end_to_end_with_user_at_host_port(fleet, tmp_path):
    engine = fleet.engines[1]
    repo = make_host_repo(tmp_path, commits=2)
    name = f"abx-mod-{secrets.token_hex(2)}"
    env = {
        **os.environ,
        **fleet.env,
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
    }

    def module(args: str) -> dict:
        done = subprocess.run(
            [str(REPO / ".venv/bin/ansible"), "-i", "localhost,", "-c", "local", "localhost",
             "-e", f"ansible_python_interpreter={sys.executable}", "-m", "agentbox.box.agentbox_box", "-a", args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        # "localhost | CHANGED => {...}"
        assert " => " in done.stdout, done.stdout + done.stderr
        result = json.loads(done.stdout.split(" => ", 1)[1])
        assert done.returncode == 0, result.get("msg")
        return result

    common = f"name={name} provider=docker_ssh engine={engine.destination} isolation=none"
    try:
        created = module(f"{common} workspace={repo} image={IMAGE}")
        assert created["changed"] and created["box"]["engine"] == engine.destination
        assert created["box"]["provider"] == "docker_ssh" and created["seed"]["mode"] == "shipped"
        assert created["box"]["state"] == "running" and "80" in created["box"]["ports"]
        again = module(f"{common} workspace={repo} image={IMAGE}")
        assert again["changed"] is False
    finally:
        gone = module(f"{common} state=absent")
        assert gone["box"] == {}
    assert engine.agentbox_objects(name) == []


def test_checkpoint_copied_to_another_engine_starts_boxes_there(fleet, tmp_path):
    """agentbox_checkpoint copy_to: a checkpoint taken on one remote engine is copied to the other (the image
    with its labels and id; a second copy sends nothing), a box there starts from it warm, and removing the
    copy removes only its image: the checkpoint and its manifest stay with the engine it was taken on."""
    first, second = fleet.engines[0], fleet.engines[1]
    home = tmp_path / "home"  # the checkpoint manifests go here, not to the real ~/.agentbox
    home.mkdir()
    env = {**fleet.env, "HOME": str(home)}
    repo = make_repo(tmp_path / "ws", {"app.py": "print('v1')\n"})
    on_first = {"provider": "docker_ssh", "engine": first.alias, "isolation": "none"}
    on_second = {"provider": "docker_ssh", "engine": second.destination, "isolation": "none"}
    tag = secrets.token_hex(2)
    source, restored = f"abx-cps-{tag}", f"abx-cpr-{tag}"
    image = ""
    try:
        created = run_module_direct("agentbox_box", {**on_first, "name": source, "workspace": str(repo), "image": IMAGE,
                                                     "boot": False}, env=env)  # fmt: skip
        assert not created["failed"], created.get("msg")
        warm = secrets.token_hex(16)
        run(DockerProvider(engine=first.alias, ssh_options={}, isolation="none"), source, "sh", "-c",
            f"printf '{warm}' > /home/vscode/warm.txt")  # fmt: skip
        saved = run_module_direct("agentbox_checkpoint", {**on_first, "box": source, "cleanup": False}, env=env)
        assert not saved["failed"], saved.get("msg")
        name, image = saved["checkpoint"]["name"], saved["checkpoint"]["image"]

        copy = {**on_first, "name": name, "workspace": str(repo), "copy_to": second.destination, "copy_compress": False}
        planned = run_module_direct("agentbox_checkpoint", copy, check_mode=True, env=env)
        assert not planned["failed"] and planned["changed"] is True, planned.get("msg")
        assert second.shell(f"docker image inspect {image}", check=False).returncode != 0  # check mode copied nothing
        copied = run_module_direct("agentbox_checkpoint", copy, env=env)
        assert not copied["failed"] and copied["changed"] is True, copied.get("msg")
        report = copied["copied"]
        assert report["path"] == "copied" and report["source"] == first.alias and report["engine"] == second.destination
        assert report["image_id"] == saved["checkpoint"]["image_id"]
        assert report["image_bytes"] >= saved["checkpoint"]["size"] > 0 and report["bytes_sent"] == report["image_bytes"]
        labels = json.loads(second.shell(f"docker image inspect {image}").stdout)[0]["Config"]["Labels"]
        assert labels["io.agentbox.kind"] == "checkpoint" and labels["io.agentbox.checkpoint"] == name
        again = run_module_direct("agentbox_checkpoint", copy, env=env)
        assert not again["failed"] and again["changed"] is False and again["copied"]["path"] == "present"

        from_copy = run_module_direct("agentbox_box", {**on_second, "name": restored, "workspace": str(repo), "image": IMAGE,
                                                       "checkpoint": name, "boot": False}, env=env)  # fmt: skip
        assert not from_copy["failed"], from_copy.get("msg")
        assert from_copy["box"]["checkpoint"] == name
        assert run(DockerProvider(engine=second.destination, ssh_options={}, isolation="none"), restored,
                   "cat", "/home/vscode/warm.txt") == warm  # fmt: skip
        run_module_direct("agentbox_box", {**on_second, "name": restored, "state": "absent", "delete_branch": True}, env=env)

        gone = run_module_direct("agentbox_checkpoint", {**on_second, "name": name, "workspace": str(repo), "state": "absent"},
                                 env=env)  # fmt: skip
        assert not gone["failed"] and gone["removed"]["image"] == image, gone.get("msg")
        assert gone["removed"]["manifest"] is None  # the manifest is the first engine's
        assert second.shell(f"docker image inspect {image}", check=False).returncode != 0
        info = run_module_direct("agentbox_checkpoint_info", {**on_first, "workspace": str(repo)}, env=env)
        assert [(c["name"], c["broken"]) for c in info["checkpoints"]] == [(name, False)], info
        refused = run_module_direct("agentbox_checkpoint", {"name": name, "workspace": str(repo), "copy_to": second.destination},
                                    env=env)  # fmt: skip
        assert refused["failed"] and "between remote engines" in refused["msg"]
    finally:
        for box, where in ((restored, on_second), (source, on_first)):
            run_module_direct("agentbox_box", {**where, "name": box, "state": "absent", "delete_branch": True}, env=env)
        if image:
            run_module_direct("agentbox_checkpoint", {**on_first, "name": image, "workspace": str(repo), "state": "absent"},
                              env=env)  # fmt: skip
            second.shell(f"docker image rm -f {image}", check=False)
    for engine in fleet.engines:
        assert engine.agentbox_objects(source, restored) == []


def test_fleet_playbook_spreads_boxes_over_engines(fleet, tmp_path):
    repo = make_host_repo(tmp_path, commits=2)
    prefix = f"abx-fleet-{secrets.token_hex(2)}"
    inventory = tmp_path / "engines.yml"
    inventory.write_text(
        "engines:\n  hosts:\n"
        f"    {fleet.engines[0].alias}: {{}}\n"
        f"    second: {{agentbox_engine: '{fleet.engines[1].destination}'}}\n"
    )
    env = {**os.environ, **fleet.env, "ANSIBLE_DEPRECATION_WARNINGS": "0"}

    def playbook(*extra: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), "playbooks/fleet_create.yml",
             "-f", "4", "-e", f"workspace={repo}", "-e", f"prefix={prefix}", "-e", "count=4", "-e", f"image={IMAGE}",
             "-e", "isolation=none", *extra],
            cwd=REPO, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return done

    orphan = f"{_naming.checkpoint_image(_naming.project_id(str(repo)), 'orphan-' + secrets.token_hex(2))}"
    try:
        playbook()
        on_first = {b.name for b in DockerProvider(engine=fleet.engines[0].alias, ssh_options={}, isolation="none").list_boxes()}
        on_second = {b.name for b in DockerProvider(engine=fleet.engines[1].destination, ssh_options={}, isolation="none").list_boxes()}
        # Of this test's prefix: the other worker's boxes may be on engines[0] too.
        assert {n for n in on_first if n.startswith(prefix)} == {f"{prefix}-01", f"{prefix}-03"}
        assert {n for n in on_second if n.startswith(prefix)} == {f"{prefix}-02", f"{prefix}-04"}

        # The same inventory prunes each engine: a checkpoint image of this project that nothing refers to,
        # on the second engine only, is listed there with --check, then removed there.
        fleet.engines[1].shell(f"docker tag {IMAGE} {orphan}")
        for check, verb in ((["--check"], "would remove"), ([], "removed")):
            pruned = subprocess.run(
                [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), "playbooks/prune_checkpoints.yml",
                 "-e", f"workspace={repo}", *check],
                cwd=REPO, env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            printed = " ".join(pruned.stdout.split())
            assert pruned.returncode == 0, pruned.stdout[-3000:] + pruned.stderr[-2000:]
            assert f"engine {fleet.engines[0].alias}: {verb}: nothing (this project only" in printed, printed[-2000:]
            assert f"engine second: {verb}: {orphan} (this project only" in printed, printed[-2000:]
        assert fleet.engines[1].shell(f"docker image inspect {orphan}", check=False).returncode != 0
    finally:
        fleet.engines[1].shell(f"docker image rm {orphan}", check=False)
        playbook("-e", "state=absent")
    for engine in fleet.engines:
        assert engine.agentbox_objects(*(f"{prefix}-{n:02d}" for n in range(1, 5))) == []


def _import_tiny_image(tag: str, content: bytes) -> str:
    """A one-file image made with `docker import` (no registry, no network); its id."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    made = subprocess.run(["docker", "import", "-", tag], input=buffer.getvalue(), check=True, capture_output=True)
    return made.stdout.decode().strip()


def test_pull_failure_falls_back_to_streaming_and_stale_copy_is_replaced(fleet):
    engine = fleet.engines[1]
    provider = DockerProvider(engine=engine.destination, ssh_options={}, isolation="none")
    tag = f"agentbox-test-tiny-{secrets.token_hex(3)}:v1"
    local_ids: list[str] = []
    try:
        local_ids.append(_import_tiny_image(tag, b"first\n"))
        # The engine's own loopback port 1: the pull is refused at once, the stream takes over.
        first = _image_transfer.ensure_image(provider, tag, registry="127.0.0.1:1/agentbox/none:v1")
        assert first.path == "streamed" and first.bytes_sent > 0
        assert any("pull of 127.0.0.1:1/agentbox/none:v1" in note for note in first.notes), first.notes
        local_ids.append(_import_tiny_image(tag, b"second, so another image id\n"))
        second = _image_transfer.ensure_image(provider, tag)
        assert second.path == "streamed" and second.image_id != first.image_id
        assert any("differs from the local one" in note for note in second.notes)
        assert engine.shell(f"docker image inspect -f '{{{{.Id}}}}' {tag}").stdout.strip() == second.image_id
    finally:
        # The first import lost its tag to the second: remove it by id, or it stays as <none>.
        subprocess.run(["docker", "rmi", "-f", tag, *local_ids], capture_output=True, check=False)
        engine.shell(f"docker rmi -f {tag} >/dev/null 2>&1; docker image prune -f >/dev/null", check=False)


def test_image_missing_everywhere_is_a_clear_error(fleet):
    provider = DockerProvider(engine=fleet.engines[0].alias, ssh_options={}, isolation="none")
    with pytest.raises(ProviderError) as failure:
        _image_transfer.ensure_image(provider, f"agentbox-test-absent-{secrets.token_hex(3)}:none")
    assert "not on the local engine" in str(failure.value) and "box_image" in str(failure.value)


def test_inventory_engines_and_the_connection_reach_a_box_over_ssh(fleet, tmp_path):
    """The boxes inventory lists a remote engine's boxes (engines:), and the box connection runs modules
    in them over that engine's SSH, with and without pipelining."""
    engine = fleet.engines[0]
    provider = DockerProvider(engine=engine.alias, ssh_options={}, isolation="none")
    name = f"abx-inv-{secrets.token_hex(2)}"
    _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(tmp_path), seed=False, boot=False,
                                                 image=IMAGE))  # fmt: skip
    try:
        inventory = tmp_path / "remote.agentbox.yml"
        inventory.write_text(f"plugin: agentbox.box.boxes\nlocal: false\nengines: ['{engine.alias}']\n"
                             f"include: ['{name}']\n")  # fmt: skip
        env = {**os.environ, **fleet.env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
        listed = subprocess.run([str(REPO / ".venv/bin/ansible-inventory"), "-i", str(inventory), "--host", name],
                                cwd=REPO, env=env, capture_output=True, text=True, check=False)  # fmt: skip
        assert listed.returncode == 0, listed.stdout + listed.stderr
        host = json.loads(listed.stdout)
        assert host["ansible_connection"] == "agentbox.box.box" and host["agentbox_engine"] == engine.alias
        for pipelining in ("true", "false"):
            done = subprocess.run(
                [str(REPO / ".venv/bin/ansible"), "-i", str(inventory), name, "-e", f"ansible_pipelining={pipelining}",
                 "-m", "ansible.builtin.command", "-a", "sh -c 'id -un; hostname'"],
                cwd=REPO, env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
            container_id = engine.shell(f"docker inspect -f '{{{{.Config.Hostname}}}}' agentbox-{name}").stdout.strip()
            assert f"{name} | CHANGED | rc=0 >>\nvscode\n{container_id}" in done.stdout, done.stdout
    finally:
        _box.destroy_box(provider, provider.find(name))
    assert engine.agentbox_objects(name) == []


def test_checkpoint_capture_and_restore_on_a_remote_engine_through_the_modules(fleet, tmp_path, docker_client):
    """agentbox_box and agentbox_checkpoint with provider=docker_ssh: the checkpoint is committed on the
    engine (never on the local one), a new box from it is warm and carries the host's current work on
    its own branch, removal leaves nothing, and the host's status, index and stash never change. The
    modules run by their own main (no ansible start each); test_module_end_to_end_with_user_at_host_port
    goes through ansible."""
    engine = fleet.engines[0]
    provider = DockerProvider(engine=engine.alias, ssh_options={}, isolation="none")
    home = tmp_path / "home"  # the checkpoint manifests go here, not to the real ~/.agentbox
    home.mkdir()
    env = {**fleet.env, "HOME": str(home)}
    committed = {".gitignore": "*.log\n", "app.py": "print('v1')\n", "old.txt": "to be deleted\n",
                 "notes.txt": "committed notes\n"}  # fmt: skip
    repo = make_repo(tmp_path / "ws", committed)
    # The host is mid-work: unstaged edits, a staged file, a deletion, untracked binary bytes.
    (repo / "app.py").write_text("print('v2, not staged')\n")
    (repo / "notes.txt").write_text("notes edited, later reverted\n")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    git(repo, "rm", "-q", "old.txt")
    (repo / "blob.bin").write_bytes(os.urandom(3000))
    before = host_state(repo)
    tag = secrets.token_hex(2)
    source, restored = f"abx-cks-{tag}", f"abx-ckr-{tag}"
    common = {"provider": "docker_ssh", "engine": engine.alias, "isolation": "none"}
    ckpt_name = ""
    try:
        created = run_module_direct("agentbox_box", {**common, "name": source, "workspace": str(repo), "image": IMAGE},
                                    env=env)  # fmt: skip
        assert not created["failed"] and created["seed"]["mode"] == "shipped", created.get("msg")
        warm = secrets.token_hex(16)
        run(provider, source, "sh", "-c", f"printf '{warm}' > /workspace/warm.log && mkdir -p /workspace/deps "
            f"&& printf dep > /workspace/deps/cached.log")  # fmt: skip

        saved = run_module_direct("agentbox_checkpoint", {**common, "box": source}, env=env)
        assert not saved["failed"] and saved["changed"] is True, saved.get("msg")
        ckpt_name = saved["checkpoint"]["name"]
        project = _naming.project_id(str(repo))
        image = _naming.checkpoint_image(project, ckpt_name)
        # Committed on the remote engine, with its labels; the local engine never saw it.
        on_engine = json.loads(engine.shell(f"docker image inspect {image}").stdout)[0]
        assert on_engine["Config"]["Labels"]["io.agentbox.kind"] == "checkpoint"
        assert on_engine["Config"]["Labels"]["io.agentbox.checkpoint"] == ckpt_name
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(image)
        assert host_state(repo)["status"] == before["status"] and host_state(repo)["index"] == before["index"]

        # The host moves on before the restore: more edits, a revert, a new untracked file. The box
        # never touched these files: the host's versions now win over those it was seeded with.
        (repo / "app.py").write_text("print('v3, after the checkpoint')\n")
        git(repo, "checkout", "--", "notes.txt")
        (repo / "later.txt").write_text("untracked, made after the checkpoint\n")
        current = host_state(repo)
        restored_box = run_module_direct(
            "agentbox_box", {**common, "name": restored, "workspace": str(repo), "image": IMAGE, "checkpoint": ckpt_name},
            env=env,
        )  # fmt: skip
        assert not restored_box["failed"], restored_box.get("msg")
        assert restored_box["seed"]["conflicts"] == []
        assert restored_box["seed"]["mode"] == "checkpoint" and restored_box["box"]["checkpoint"] == ckpt_name
        # Warm state from the checkpoint, and the host's work as it is now, byte for byte.
        in_box = box_files(provider, restored, "/workspace")
        warm_in_box = {path: in_box.pop(path, (None, None, None))[1] for path in ("warm.log", "deps/cached.log")}
        assert warm_in_box == {"warm.log": warm.encode(), "deps/cached.log": b"dep"}
        assert in_box == expected_files(repo)
        assert run(provider, restored, "git", "-C", "/workspace", "symbolic-ref", "--short", "HEAD").strip() == (
            f"agentbox/{restored}"
        )
        assert host_state(repo) | {"refs": ""} == current | {"refs": ""}

        for box in (restored, source):
            gone = run_module_direct("agentbox_box", {**common, "name": box, "state": "absent"}, env=env)
            assert not gone["failed"], gone.get("msg")
        removed = run_module_direct("agentbox_checkpoint", {**common, "name": ckpt_name, "workspace": str(repo),
                                                            "state": "absent"}, env=env)  # fmt: skip
        assert not removed["failed"] and removed["changed"] is True, removed.get("msg")
        ckpt_name = ""
        assert engine.shell(f"docker image inspect {image}", check=False).returncode != 0
        labelled = engine.shell(f"docker images -q --filter label=io.agentbox.project={project}").stdout
        assert labelled.strip() == ""
        assert engine.agentbox_objects(source, restored) == []
        assert not (home / ".agentbox" / "checkpoints" / project / saved["checkpoint"]["name"]).exists()
        # The host's working tree, index and stash: as the user left them, through every step.
        after = host_state(repo)
        assert (after["status"], after["index"], after["stash"]) == (current["status"], current["index"], "")
    finally:
        for box in (restored, source):
            if provider.find(box) is not None:
                provider.destroy(box)
        if ckpt_name:
            run_module_direct("agentbox_checkpoint",
                              {**common, "name": ckpt_name, "workspace": str(repo), "state": "absent"}, env=env)


def test_prepare_streams_the_image_to_an_engine_once_and_records_it(fleet, tmp_path):
    """prepare.yml on a remote engine: --check says the image would be streamed and records nothing; the run
    streams it (the engine then holds the local image's id) and records it in ~/.agentbox/prepared.json; a
    second run sends nothing and keeps the first time it was made ready. On the local engine a missing image
    is refused with how to build it, and nothing is recorded for it."""
    engine = fleet.engines[1]
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, **fleet.env, "HOME": str(home), "ANSIBLE_NOCOLOR": "1"}
    tag = f"agentbox-test-prep-{secrets.token_hex(3)}:v1"

    def prepare(*extra: str) -> tuple[int, str]:
        done = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "playbooks/prepare.yml", "-e", f"image={tag}",
                               *extra], cwd=REPO, env=env, capture_output=True, text=True, check=False)  # fmt: skip
        return done.returncode, " ".join((done.stdout + done.stderr).split())

    on_engine = ("-e", "provider=docker_ssh", "-e", f"engine={engine.destination}", "-e", "isolation=none")
    where = f"docker_ssh:{engine.destination}"
    record = home / ".agentbox" / "prepared.json"
    try:
        image_id = _import_tiny_image(tag, b"prepared\n")
        code, printed = prepare(*on_engine, "--check")
        assert code == 0 and f"{where}: image {tag} would be streamed there" in printed, printed[-2000:]
        assert not record.exists() and engine.shell(f"docker image inspect {tag}", check=False).returncode != 0

        code, printed = prepare(*on_engine)
        assert code == 0 and f"{where}: image {tag} streamed there (" in printed, printed[-2000:]
        assert json.loads(engine.shell(f"docker image inspect {tag}").stdout)[0]["Id"] == image_id
        first = json.loads(record.read_text())[where]
        assert first["image"] == tag and first["prepared_at"] == first["checked_at"]
        assert stat.S_IMODE(record.stat().st_mode) == 0o600

        code, printed = prepare(*on_engine)
        assert code == 0 and f"{where}: image {tag} was already there" in printed, printed[-2000:]
        again = json.loads(record.read_text())[where]
        assert again["prepared_at"] == first["prepared_at"]

        missing = f"agentbox-test-none-{secrets.token_hex(3)}:v1"
        code, printed = prepare("-e", f"image={missing}")
        assert code != 0 and f"image {missing} is not on engine local" in printed and "build_image.yml" in printed
        assert set(json.loads(record.read_text())) == {where}
    finally:
        engine.shell(f"docker image rm -f {tag}", check=False)
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)
