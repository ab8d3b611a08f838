"""The daytona provider end to end, through the local Daytona emulator and the real SDK (nothing patched).

Every sandbox is a real container from agentbox/box:latest, so seeding (shipped clone + carry-over),
the in-box start sequence, checkpoints (sandbox snapshots) and the inventory/connection run for real.
The tests of this module share one emulator and, through module fixtures, one box (`created`) and one
checkpoint restored into a second box (`checkpointed`); each test leaves the shared box running, so they
pass in any order. The destroy test makes its own box. HOME is a temp dir, so checkpoint manifests never
touch the real ~/.agentbox.

The playbooks a test is about run through ansible-playbook, and the inventory and the connection through
Ansible; set-up and module calls a test is not about the path through Ansible for run the module's own main
in this process (`World.module`): an Ansible start costs more than most of what the emulator does.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import docker
import pytest

from tests.conftest import REPO, chown_tree, git, make_repo
from tests.daytona_emulator import running_emulator
from tests.unit.support.inprocess import run_module_inprocess

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
VENV_BIN = REPO / ".venv" / "bin"


class World:
    def __init__(self, api_url: str, api_key: str, admin, root: Path, image: str = IMAGE):
        self.image = image
        self.api_url = api_url
        self.api_key = api_key
        self.admin = admin
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        # The shipped seeding fetches over file:// as root from a repo owned by uid 1000; git drops -c and
        # GIT_CONFIG_* for the upload-pack side, so only a global safe.directory lets it read the repo.
        (self.home / ".gitconfig").write_text("[safe]\n\tdirectory = *\n")
        self.workspace = root / "ws"
        self.box = f"dt-{uuid.uuid4().hex[:6]}"
        self.restored = f"{self.box}-r"

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "HOME": str(self.home),
            "DAYTONA_API_URL": self.api_url,
            "DAYTONA_API_KEY": self.api_key,
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
            # Host git as root on a workspace owned by the box user.
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
        }
        env.pop("DAYTONA_TARGET", None)
        return env

    def playbook(self, name: str, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,",
                "-e", f"ansible_python_interpreter={sys.executable}", f"playbooks/{name}", "-e", "provider=daytona"]  # fmt: skip
        for item in extra:
            argv += ["-e", item]
        done = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, check=False)
        if check and done.returncode != 0:
            raise AssertionError(
                f"{name} {extra} exited {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def module(self, module: str, args: dict[str, Any]) -> dict[str, Any]:
        """The collection module's own main, in this process, under this world's environment (the one its
        playbooks get); a failure fails the test."""
        return module_in_env(module, {"provider": "daytona", **args}, self.env())

    def provider(self):
        from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

        return DaytonaProvider(api_key=self.api_key, api_url=self.api_url)


def module_in_env(module: str, args: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """run_module_inprocess with os.environ exactly `env` for the call (what a process started with `env`
    would see); the module's failure fails the test."""
    with mock.patch.dict(os.environ, env, clear=True):
        done = run_module_inprocess(module, args)
    assert not done["failed"], done
    return done


@pytest.fixture(scope="module")
def world(box_image: str) -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-dt-", dir="/tmp"))
    root.chmod(0o755)
    try:
        with running_emulator(image=box_image) as (api_url, api_key, admin):
            made = World(api_url, api_key, admin, root, box_image)
            try:
                yield made
            finally:
                provider = made.provider()
                for name in (made.restored, made.box):
                    provider.destroy(name)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def created(world: World) -> dict:
    """The shared box, made by create_box.yml from a workspace with every kind of uncommitted work."""
    ws = _make_workspace(world)
    started = time.monotonic()
    done = world.playbook("create_box.yml", f"workspace={ws}", f"box={world.box}")
    seconds = time.monotonic() - started
    # Both trees and the box's git status as seeded, before any test works in the box or on the host.
    host = _tree(ws)
    box = _box_tree(world, world.box, world.root / "box-tree")
    status = world.provider().exec(world.box, ["git", "-C", "/workspace", "status", "--porcelain"]).check("status")
    return {"workspace": ws, "stdout": done.stdout, "seconds": seconds, "host_tree": host, "box_tree": box,
            "status": status.text}  # fmt: skip


def _make_workspace(world: World) -> Path:
    """A repo with every kind of uncommitted work: edits, a delete, a staged rename, a mode change,
    untracked text and binary files, and an ignored file (which is not carried)."""
    ws = make_repo(
        world.workspace,
        {
            "README.md": "hello\n",
            "src/app.py": "print('app')\n",
            "bin/run.sh": "#!/bin/sh\necho run\n",
            "data/blob.bin": bytes(range(256)) * 64,
            "old.txt": "to be deleted\n",
            "before.txt": "to be renamed\n",
            ".gitignore": "*.log\n",
        },
    )
    (ws / "bin/run.sh").chmod(0o755)
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "second")
    (ws / "README.md").write_text("hello\nedited on the host\n")
    (ws / "old.txt").unlink()
    git(ws, "mv", "before.txt", "after.txt")
    (ws / "src/app.py").chmod(0o755)
    (ws / "notes").mkdir()
    (ws / "notes/new.md").write_text("untracked note\n")
    (ws / "notes/raw.bin").write_bytes(os.urandom(4096))
    (ws / "debug.log").write_text("ignored\n")
    chown_tree(ws)
    return ws


def _tree(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """{relative path: (kind, permission bits, content or link target)} without .git."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            found[rel] = ("link", 0, os.readlink(path).encode())
        elif stat.S_ISDIR(info.st_mode):
            found[rel] = ("dir", 0, b"")
        else:
            found[rel] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes())
    return found


def _box_tree(world: World, box: str, into: Path) -> dict[str, tuple[str, int, bytes]]:
    provider = world.provider()
    into.mkdir(parents=True, exist_ok=True)
    reader = _ChunkReader(provider.get_archive(box, "/workspace"))
    with tarfile.open(fileobj=reader, mode="r|") as archive:
        archive.extractall(into, filter="tar")
    return _tree(into / "workspace")


class _ChunkReader:
    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            try:
                self._buffer += next(self._chunks)
            except StopIteration:
                break
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data


def _sandbox(world: World, name: str) -> dict | None:
    for entry in world.admin.state()["sandboxes"]:
        if entry["name"] == name and entry.get("state") != "destroyed":
            return entry
    return None


def test_create_box_playbook_seeds_a_sandbox_byte_identically(world: World, created: dict) -> None:
    assert "daytona" in created["stdout"] and f"agentbox/{world.box}" in created["stdout"], created["stdout"][-3000:]

    sandbox = _sandbox(world, world.box)
    assert sandbox is not None and sandbox["state"] == "started", sandbox
    container_id = world.admin.sandbox_internal(sandbox["id"])["_emulator"]["containerId"]
    container = docker.from_env().containers.get(container_id)
    assert container.status == "running"
    assert container.labels["io.agentbox.emulator.sandbox"] == sandbox["id"]
    assert sandbox["labels"]["io.agentbox.box"] == world.box
    assert sandbox["labels"]["io.agentbox.branch"] == f"agentbox/{world.box}"
    # The idle timeout (30 min by default) and Daytona's auto-stop as its backstop (twice that).
    assert sandbox["labels"]["io.agentbox.idle_timeout"] == "30" and sandbox["autoStopInterval"] == 60
    assert sandbox["user"] == "vscode"
    assert "DAYTONA_API_KEY" not in " ".join(container.attrs["Config"]["Env"])

    host = dict(created["host_tree"])
    host.pop("debug.log")  # ignored by git: never carried
    box = created["box_tree"]
    assert sorted(box) == sorted(host)
    for rel, (kind, mode, content) in host.items():
        assert box[rel][0] == kind, rel
        assert box[rel][2] == content, f"{rel} differs"
        if kind == "file":
            assert oct(box[rel][1]) == oct(mode), f"{rel}: mode {oct(box[rel][1])} in the box, {oct(mode)} on the host"
    status = created["status"]
    assert " M README.md" in status and "old.txt" in status and "after.txt" in status and "?? notes/" in status
    print(f"create_box.yml through the emulator: {created['seconds']:.1f} s")


def _inventory(world: World) -> Path:
    inventory = world.root / "fleet.agentbox.yml"
    inventory.write_text(
        textwrap.dedent(
            f"""\
            plugin: agentbox.box.boxes
            local: false
            daytona:
              api_url: {world.api_url}
            """
        )
    )
    return inventory


def test_inventory_and_connection_run_git_status(world: World, created: dict) -> None:
    # What git says in the box, read directly through the provider: the connection must show the same.
    in_box = world.provider().exec(world.box, ["git", "-C", "/workspace", "status"]).check("git status").text
    assert f"On branch agentbox/{world.box}" in in_box
    # One ansible-playbook run on the inventory's daytona group: git status with the module file copied in,
    # then fed as stdin (pipelining), then become (sudo in the box); a second play saves what came back.
    results = world.root / "connection-results.json"
    tasks = [{"ansible.builtin.command": "git -C /workspace status", "register": f"status_{pipelining}",
              "vars": {"ansible_pipelining": pipelining}} for pipelining in (False, True)]  # fmt: skip
    tasks.append({"ansible.builtin.command": "id -un", "become": True, "register": "become"})
    answered = (
        "{{ {'status_False': box.status_False, 'status_True': box.status_True, 'become': box.become} | to_json }}"
    )
    save = {"hosts": "localhost", "connection": "local", "gather_facts": False,
            "vars": {"ansible_python_interpreter": sys.executable, "box": f"{{{{ hostvars['{world.box}'] }}}}"},
            "tasks": [{"ansible.builtin.copy": {"content": answered, "dest": str(results), "mode": "0600"}}]}  # fmt: skip
    play = world.root / "connection.yml"
    play.write_text(json.dumps([{"hosts": "daytona", "gather_facts": False, "tasks": tasks}, save]))
    done = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(_inventory(world)), str(play)], cwd=REPO,
                          env=world.env(), capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answers = json.loads(results.read_text())
    for pipelining in (False, True):
        status = answers[f"status_{pipelining}"]
        assert (status["rc"], status["changed"], status["stdout"]) == (0, True, in_box.rstrip()), (pipelining, status)
    assert (answers["become"]["rc"], answers["become"]["stdout"]) == (0, "root"), answers["become"]


SERVICE = """\
services:
  web:
    command: exec python3 -m http.server 8000 --directory /tmp/www
    expose: {port: 8000}
    ready_when: {port: 8000}
"""


def _serve_web(world: World) -> None:
    """A service exposed on the box's web port (80, served by the supervisor) through agentbox.yaml."""
    provider = world.provider()
    provider.exec(world.box, ["sh", "-c", 'mkdir -p /tmp/www && echo served > /tmp/www/index.html && cat > "$1"',
                              "serve", "/workspace/agentbox.yaml"], stdin=SERVICE.encode()).check("agentbox.yaml")  # fmt: skip
    provider.exec(world.box, ["sh", "-c", "agentbox-ctl reload && agentbox-ctl wait-ready"]).check("reload")


def _fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=20) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_pause_and_resume(world: World, created: dict) -> None:
    _serve_web(world)
    before = world.provider().find(world.box).web_url
    assert _fetch(before.rstrip("/") + "/index.html") == (200, b"served\n")  # the signed URL reaches port 80, no header

    world.playbook("box_state.yml", f"box={world.box}", "state=paused")
    assert _sandbox(world, world.box)["state"] == "archived"
    facts = world.provider().find(world.box)
    assert facts is not None and facts.state == "paused" and facts.web_url is None

    # The connection resumes a paused box by itself (auto_resume), through the inventory.
    done = subprocess.run([str(VENV_BIN / "ansible"), "-i", str(_inventory(world)), world.box, "-m", "command",
                           "-a", "true"], cwd=REPO, env=world.env(), capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert _sandbox(world, world.box)["state"] == "started"

    # Paused again (agentbox_box's main: box_state.yml's pause ran above), then box_state.yml starts it.
    assert world.module("agentbox_box", {"name": world.box, "state": "paused"})["box"]["state"] == "paused"
    assert _sandbox(world, world.box)["state"] == "archived"
    world.playbook("box_state.yml", f"box={world.box}", "state=started")
    assert _sandbox(world, world.box)["state"] == "started"
    provider = world.provider()
    _serve_web(world)
    after = provider.find(world.box).web_url
    # Each find mints a new signed URL; an older one stays valid until it expires (one hour).
    assert after != before and _fetch(after.rstrip("/") + "/index.html") == (200, b"served\n")
    # The stop ended every process: resume ran the in-box start sequence again.
    alive = provider.exec(world.box, ["sh", "-c", "test -S /run/agentbox/ctl.sock && pgrep -f agentbox-ctl"])
    assert alive.rc == 0, alive
    readme = provider.exec(world.box, ["cat", "/workspace/README.md"]).check("cat").stdout
    assert readme == b"hello\nedited on the host\n"


def test_fetch_brings_the_box_branch_back(world: World, created: dict) -> None:
    provider = world.provider()
    commit = ["sh", "-c", "cd /workspace && echo fetched > fetched.txt && git add -A && "
              "git -c user.name=agent -c user.email=a@b.invalid commit -q -m 'work in the box' && git rev-parse HEAD"]  # fmt: skip
    tip = provider.exec(world.box, commit).check("commit in the box").text.strip()
    fetched = world.module("agentbox_worktree", {"box": world.box, "state": "fetched"})
    assert fetched["changed"] and fetched["fetched"]["repos"][0]["commit"] == tip
    assert git(world.workspace, "rev-parse", f"agentbox/{world.box}").strip() == tip
    assert git(world.workspace, "show", f"{tip}:README.md") == "hello\nedited on the host\n"


@pytest.fixture(scope="module")
def checkpointed(world: World, created: dict) -> dict:
    """Checkpoint warm1 of the shared box (warmed first), restored into a second box."""
    provider = world.provider()
    provider.exec(
        world.box, ["sh", "-c", "echo warm > /workspace/warm.txt && mkdir -p ~/.cache/x && echo c > ~/.cache/x/c"]
    ).check("warming")
    done = world.playbook("checkpoint.yml", f"box={world.box}", "checkpoint=warm1")
    snapshots = [s["name"] for s in world.admin.state()["snapshots"]]
    source_state = _sandbox(world, world.box)["state"]
    source_ctl_socket = provider.exec(world.box, ["test", "-S", "/run/agentbox/ctl.sock"]).rc
    # New uncommitted work on the host after the checkpoint must reach the restored box too.
    (world.workspace / "notes/after-checkpoint.md").write_text("later\n")
    chown_tree(world.workspace)
    # The restore by agentbox_box's main, the task create_box.yml runs (that playbook is `created`'s).
    world.module("agentbox_box", {"name": world.restored, "workspace": str(world.workspace), "checkpoint": "warm1"})
    return {"stdout": done.stdout, "snapshots": snapshots, "source_state": source_state,
            "source_ctl_socket": source_ctl_socket}  # fmt: skip


def test_checkpoint_and_restore_into_a_new_box(world: World, checkpointed: dict) -> None:
    assert "checkpoint: warm1" in checkpointed["stdout"], checkpointed["stdout"][-3000:]
    snapshots = checkpointed["snapshots"]
    made = [s for s in snapshots if s.startswith("agentbox-ckpt-") and "-warm1-" in s]
    assert len(made) == 1, snapshots
    # The source box was running again with its services right after the checkpoint.
    assert checkpointed["source_state"] == "started" and checkpointed["source_ctl_socket"] == 0

    restored = world.provider()
    facts = restored.find(world.restored)
    assert facts is not None and facts.checkpoint == "warm1" and facts.state == "running"
    assert restored.exec(world.restored, ["cat", "/workspace/warm.txt"]).stdout == b"warm\n"
    assert restored.exec(world.restored, ["cat", "/home/vscode/.cache/x/c"]).stdout == b"c\n"
    assert restored.exec(world.restored, ["cat", "/workspace/notes/after-checkpoint.md"]).stdout == b"later\n"
    head = restored.exec(world.restored, ["git", "-C", "/workspace", "symbolic-ref", "--short", "HEAD"]).text.strip()
    assert head == f"agentbox/{world.restored}"


def test_checkpoint_info_and_prune(world: World, checkpointed: dict) -> None:
    from daytona import CreateSnapshotParams

    from ansible_collections.agentbox.box.plugins.module_utils.providers._snapshot_store import snapshot_name

    provider = world.provider()
    project = provider.find(world.box).project
    # A snapshot in the project's names that no manifest refers to; made from the box image, which the
    # emulator keeps when the snapshot goes (a capture of the box would stop, snapshot and boot it again).
    orphan = snapshot_name(project, "orphan")
    provider.sdk.snapshot.create(CreateSnapshotParams(name=orphan, image=world.image))
    listed = world.module("agentbox_checkpoint_info", {"workspace": str(world.workspace)})
    by_name = {c["name"]: c for c in listed["checkpoints"]}
    assert by_name["warm1"]["manifest"] and not by_name["warm1"]["broken"]
    assert by_name["orphan"]["image"] == orphan and not by_name["orphan"]["manifest"]
    pruned = world.module("agentbox_checkpoint", {"prune": True, "workspace": str(world.workspace)})
    assert [r["image"] for r in pruned["removed"]["removed"]] == [orphan]
    assert not provider.image_exists(orphan) and provider.image_exists(by_name["warm1"]["image"])


def test_destroy_leaves_no_sandbox_snapshot_or_container(world: World) -> None:
    # A box and a checkpoint of its own: the shared ones stay for the other tests.
    ws = make_repo(world.root / "ws-destroy", {"README.md": "to be destroyed\n"})
    chown_tree(ws)
    box = f"{world.box}-d"
    # Made and checkpointed by the modules' main (create_box.yml and checkpoint.yml are the other tests');
    # nothing in the box needs to run, so it is not booted.
    world.module("agentbox_box", {"name": box, "workspace": str(ws), "boot": False})
    world.module("agentbox_checkpoint", {"box": box, "name": "gone1"})
    sandbox_id = _sandbox(world, box)["id"]
    container_id = world.admin.sandbox_internal(sandbox_id)["_emulator"]["containerId"]
    project = world.provider().find(box).project
    assert [s["name"] for s in world.admin.state()["snapshots"] if "-gone1-" in s["name"]], "no snapshot was made"
    manifests = world.home / ".agentbox/daytona/checkpoints" / project
    assert any(manifests.rglob("manifest.json")), "no manifest was written"

    world.playbook("destroy_box.yml", f"box={box}")
    world.module("agentbox_checkpoint", {"workspace": str(ws), "name": "gone1", "state": "absent"})
    assert _sandbox(world, box) is None
    assert [s["name"] for s in world.admin.state()["snapshots"] if "-gone1-" in s["name"]] == []
    assert docker.from_env().containers.list(all=True, filters={"id": container_id}) == []
    assert not any(manifests.rglob("manifest.json"))
