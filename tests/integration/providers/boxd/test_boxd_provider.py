"""The boxd provider end to end, through the local boxd emulator and the real SDK (nothing patched).

Every machine is a real container from agentbox/box:latest, so create_box.yml's shipped seeding, the in-box
start sequence, the inventory and the connection plugin run for real. The playbook tests share one
emulator and one box (`created`); the provider tests make their own boxes and remove them. HOME is a temp
dir, so nothing touches the real ~/.agentbox. A module call a test is not about the path through Ansible
for runs the module's own main in this process (`World.module`).
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.boxd_emulator import running_emulator
from tests.conftest import REPO, chown_tree, git
from tests.integration.providers.daytona.test_daytona_provider import _box_tree, _tree, module_in_env
from tests.unit.git.test_workflows_seed import torture_workspace

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
VENV_BIN = REPO / ".venv" / "bin"


class World:
    def __init__(self, emu, root: Path) -> None:
        self.emu = emu
        self.base_url = emu.base_url
        self.token = emu.token
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        (self.home / ".gitconfig").write_text("[safe]\n\tdirectory = *\n")  # root fetches a uid-1000 repo
        self.workspace = root / "ws"
        self.box = f"bx-{secrets.token_hex(3)}"

    def env(self) -> dict[str, str]:
        env = {**os.environ, "HOME": str(self.home), "BOXD_BASE_URL": self.base_url, "BOXD_TOKEN": self.token,
               "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
               "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "GIT_CONFIG_COUNT": "1",
               "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}  # fmt: skip
        for key in ("BOXD_API_KEY", "BOXD_ORG"):
            env.pop(key, None)
        return env

    def playbook(self, name: str, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                f"playbooks/{name}", "-e", "provider=boxd"]  # fmt: skip
        for item in extra:
            argv += ["-e", item]
        done = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{name} {extra} exited {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}")
        return done

    def module(self, module: str, args: dict[str, Any]) -> dict[str, Any]:
        """The collection module's own main, in this process, under this world's environment; a failure fails the test."""
        return module_in_env(module, {"provider": "boxd", **args}, self.env())

    def provider(self, **overrides):
        from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

        return BoxdProvider(**{"token": self.token, "base_url": self.base_url, **overrides})

    def machines(self) -> list[dict]:
        return self.emu.control.state()["machines"]


@pytest.fixture(scope="module")
def world(box_image: str) -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-bx-", dir="/tmp"))
    root.chmod(0o755)
    try:
        with running_emulator(image=box_image) as emu:
            made = World(emu, root)
            try:
                yield made
            finally:
                made.provider().destroy(made.box)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# The carried git state, compared byte for byte: staged (with renames), unstaged, and the status of every path.
GIT_STATE = {
    "staged": ("diff", "--cached", "--binary", "-M"),
    "unstaged": ("diff", "--binary"),
    "status": ("status", "--porcelain=v1", "-z", "-uall"),
}


def _git_state(run) -> dict[str, str]:
    return {key: run(*argv) for key, argv in GIT_STATE.items()}


@pytest.fixture(scope="module")
def created(world: World) -> dict:
    ws = torture_workspace(world.root)  # the seed tests' workspace: odd names, links, staged vs unstaged
    chown_tree(ws)
    host_git = _git_state(lambda *argv: git(ws, *argv))
    done = world.playbook("create_box.yml", f"workspace={ws}", f"box={world.box}")
    host = _tree(ws)
    box = _box_tree(world, world.box, world.root / "box-tree")
    provider = world.provider()
    box_git = _git_state(lambda *argv: provider.exec(world.box, ["git", "-C", "/workspace", *argv]).check(argv[0]).text)
    return {"workspace": ws, "stdout": done.stdout, "host_tree": host, "box_tree": box, "host_git": host_git,
            "box_git": box_git}  # fmt: skip


def _spec(world: World, name: str, **extra):
    from ansible_collections.agentbox.box.plugins.module_utils.core._naming import box_labels
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec

    box_id = secrets.token_hex(8)
    labels = box_labels(box=name, box_id=box_id, project="0" * 16, workspace=str(world.root), branch="",
                        image_fingerprint="", provider="boxd", engine=world.base_url, checkpoint=None)
    return BoxSpec(name=name, box_id=box_id, project="0" * 16, workspace=str(world.root), image=IMAGE,
                   labels=labels, **extra)


def test_create_box_playbook_seeds_a_machine_byte_identically(world: World, created: dict) -> None:
    assert f"agentbox/{world.box}" in created["stdout"], created["stdout"][-3000:]
    mine = [m for m in world.machines() if m["labels"].get("io.agentbox.box") == world.box]
    assert len(mine) == 1 and mine[0]["status"] == "running", mine
    assert mine[0]["labels"]["io.agentbox.branch"] == f"agentbox/{world.box}"
    host = dict(created["host_tree"])
    host.pop("ignored.log")  # ignored by git: never carried
    box = created["box_tree"]
    assert sorted(box) == sorted(host)
    for rel, (kind, mode, content) in host.items():
        assert box[rel][0] == kind and box[rel][2] == content, rel
        if kind == "file":
            assert oct(box[rel][1]) == oct(mode), rel
    for key in GIT_STATE:
        assert created["box_git"][key] == created["host_git"][key], key
    status = created["host_git"]["status"]
    assert "R  new_name.txt\x00old_name.txt" in status and "MM staged.txt" in status and "?? new/dangling" in status, status


def test_box_state_and_inventory_connection(world: World, created: dict) -> None:
    world.playbook("box_state.yml", f"box={world.box}", "state=paused")
    assert world.provider().find(world.box).state == "paused"
    world.playbook("box_state.yml", f"box={world.box}", "state=started")
    assert world.provider().find(world.box).state == "running"
    inventory = world.root / "boxd.agentbox.yml"
    inventory.write_text(textwrap.dedent(f"""\
        plugin: agentbox.box.boxes
        local: false
        boxd:
          base_url: {world.base_url}
        """))
    # One play through the connection: a command, then become (root only with -b, the box's user without it)
    # with the module copied in and piped; each task's result saved to a file on the host.
    results = world.root / "connection-results.json"
    combos = [(pipelining, become) for pipelining in (False, True) for become in (True, False)]
    tasks = [{"ansible.builtin.command": "git -C /workspace rev-parse --abbrev-ref HEAD", "register": "branch"}]
    for index, (pipelining, become) in enumerate(combos):
        tasks.append({"ansible.builtin.command": "id -un", "become": become, "register": f"id{index}",
                      "vars": {"ansible_pipelining": pipelining}})  # fmt: skip
    # A second play, on this machine, saves what the box answered and the inventory's boxd group.
    answered = ("{{ {'branch': box.branch.stdout, 'ids': [box.id0.stdout, box.id1.stdout, box.id2.stdout, "
                "box.id3.stdout], 'boxd': groups['boxd']} | to_json }}")
    save = {"hosts": "localhost", "connection": "local", "gather_facts": False,
            "vars": {"ansible_python_interpreter": sys.executable, "box": f"{{{{ hostvars['{world.box}'] }}}}"},
            "tasks": [{"ansible.builtin.copy": {"content": answered, "dest": str(results), "mode": "0600"}}]}  # fmt: skip
    play = world.root / "connection.yml"
    play.write_text(json.dumps([{"hosts": world.box, "gather_facts": False, "tasks": tasks}, save]))
    # That play, then fleet_status.yml on the same inventory: one ansible-playbook run, the plays as written.
    ran = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(play), "playbooks/fleet_status.yml",
                          "-e", f"fleet_status_html={world.root / 'fleet.html'}"],
                         cwd=REPO, env=world.env(), capture_output=True, text=True, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    answers = json.loads(results.read_text())
    assert world.box in answers["boxd"], answers  # the inventory lists the box in its boxd group
    assert answers["branch"] == f"agentbox/{world.box}", answers
    for (pipelining, become), user in zip(combos, answers["ids"], strict=True):
        assert user == ("root" if become else "vscode"), (pipelining, become, answers)
    fleet = ran.stdout.partition("Read each box's git state")[2]  # what fleet_status.yml printed
    assert world.box in fleet and f"agentbox/{world.box}" in fleet, ran.stdout[-3000:]


def test_exec_files_lifecycle_and_destroy(world: World) -> None:
    provider = world.provider()
    name = f"bp-{secrets.token_hex(3)}"
    facts = provider.create(_spec(world, name, secrets={"TOKEN": "s3cret"}))
    try:
        assert facts.state == "running" and facts.provider == "boxd"
        assert provider.exec(name, ["id", "-un"]).stdout == b"vscode\n"
        assert provider.exec(name, ["id", "-un"], user="root").stdout == b"root\n"
        assert provider.exec(name, ["cat", "/run/agentbox/secrets/TOKEN"]).stdout == b"s3cret"
        machine = next(m for m in world.machines() if m["id"] == facts.container)
        assert "s3cret" not in repr(machine)  # never in labels or env
        result = provider.exec(name, ["sh", "-c", "echo out; echo err >&2; exit 7"])
        assert (result.rc, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
        assert provider.exec(name, ["sleep", "30"], timeout=1).rc == 124
        big = provider.exec(name, ["head", "-c", str(20 << 20), "/dev/zero"], limit=None)  # read whole, as asked
        assert big.rc == 0 and len(big.stdout) == 20 << 20
        from ansible_collections.agentbox.box.plugins.module_utils.core._provider import OutputTooLarge

        with pytest.raises(OutputTooLarge, match="the box's output of head is over 1048576 bytes"):
            provider.exec(name, ["head", "-c", str(20 << 20), "/dev/zero"], limit=1 << 20)  # the stream is cut
        assert provider.exec(name, ["echo", "after"]).stdout == b"after\n"
        assert provider.exec(name, ["wc", "-c"], stdin=b"x" * 3_000_000).stdout.strip() == b"3000000"

        data = os.urandom(10 << 20)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo("ñame dir/東京 файл.bin")
            info.size, info.uid, info.gid = len(data), 1000, 1000
            archive.addfile(info, io.BytesIO(data))
        buffer.seek(0)
        provider.put_archive(name, "/tmp/up", buffer)
        back = io.BytesIO(b"".join(provider.get_archive(name, "/tmp/up")))
        with tarfile.open(fileobj=back) as archive:
            member = archive.getmember("up/ñame dir/東京 файл.bin")
            assert member.uid == 1000 and archive.extractfile(member).read() == data

        assert provider.pause(name).state == "paused"
        assert provider.exec(name, ["echo", "woke"]).stdout == b"woke\n"  # wakes on exec
        assert provider.find(name).state == "running"
        assert provider.stop(name).state == "stopped"
        # The one retried exec error: a conflict naming the stopped machine, before anything ran.
        assert provider.exec(name, ["echo", "started"]).stdout == b"started\n"
        assert [b.name for b in provider.list_boxes() if b.name == name] == [name]
        # agentbox_box's destroy, by its main (destroy_box.yml on boxd: test_checkpoint_restored_into_a_new_box).
        assert world.module("agentbox_box", {"name": name, "state": "absent"})["changed"]
    finally:
        provider.destroy(name)  # a no-op after the module; the clean-up when the test failed before it
    assert provider.find(name) is None
    assert not [m for m in world.machines() if m["id"] == facts.container]


def test_faults_never_duplicate_a_machine(world: World) -> None:
    provider = world.provider()
    control = world.emu.control
    name = f"bf-{secrets.token_hex(3)}"
    spec = _spec(world, name)
    # The create is done, its answer lost: the machine is adopted by its id label, not made twice.
    control.add_fault(method="CreateVm", action="error_after", code="UNAVAILABLE")
    control.configure(start_seconds=2.0)  # a slow start as well
    try:
        facts = provider.create(spec)
        assert facts.id == spec.box_id
        mine = [m for m in world.machines() if m["labels"].get("io.agentbox.id") == spec.box_id]
        assert len(mine) == 1
        calls = [r["method"] for r in control.requests()].count("CreateVm")
        # An injected conflict naming a stopped machine: retried once, the command runs once.
        control.add_fault(method="Exec", action="error", code="FAILED_PRECONDITION",
                          message=f"machine {facts.container} is stopped")
        assert provider.exec(name, ["sh", "-c", "echo x >> /tmp/count; wc -l < /tmp/count"]).stdout == b"1\n"
        # A stream dropped mid-exec is never re-sent: the command may have run.
        control.add_fault(method="Exec", action="drop", after=1)
        from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

        with pytest.raises(ProviderError, match="may have run"):
            provider.exec(name, ["sh", "-c", "echo x >> /tmp/count; head -c 8388608 /dev/zero"])
        assert provider.exec(name, ["wc", "-l", "/tmp/count"]).stdout.split()[0] == b"2"
        assert [r["method"] for r in control.requests()].count("CreateVm") == calls
    finally:
        control.clear_faults()
        control.configure(start_seconds=0.3)
        provider.destroy(name)
    assert not [m for m in world.machines() if m["labels"].get("io.agentbox.id") == spec.box_id]


class _NotBoxd(SimpleHTTPRequestHandler):
    """A plain HTTP/1 web server: what a wrong base URL may point at."""

    seen: list[str] = []

    def log_message(self, format: str, *args: object) -> None:
        self.seen.append(format % args)


def test_bad_input_says_what_to_do_and_makes_nothing(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from boxd import Boxd

    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import EngineUnreachable, ProviderError
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    before = len(world.machines())
    for key in ("BOXD_API_KEY", "BOXD_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ProviderError, match="BOXD_API_KEY"):
        BoxdProvider(base_url=world.base_url)
    with pytest.raises(ProviderError, match="refused the credential"):
        world.provider(token="not-the-token").create(_spec(world, f"bk-{secrets.token_hex(3)}"))
    with pytest.raises(EngineUnreachable, match="did not answer"):
        BoxdProvider(token=world.token, base_url="http://127.0.0.1:9").list_boxes()
    # A base URL whose host never resolves, and one where a web server that is not boxd answers.
    with pytest.raises(EngineUnreachable, match=r"does not resolve.*check BOXD_BASE_URL"):
        BoxdProvider(token=world.token, base_url="https://nosuch.invalid").create(_spec(world, "bu-nohost"))
    web = ThreadingHTTPServer(("127.0.0.1", 0), _NotBoxd)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EngineUnreachable, match=r"not boxd's API.*check BOXD_BASE_URL"):
            BoxdProvider(token=world.token, base_url=f"http://127.0.0.1:{web.server_address[1]}").create(
                _spec(world, "bu-web"))  # fmt: skip
    finally:
        web.shutdown()
        web.server_close()
    assert _NotBoxd.seen, "the web server was never asked"
    # A create refused for another reason than the name (FAILED_PRECONDITION): boxd's reason, not "name taken".
    world.emu.control.add_fault(method="CreateVm", action="error", code="FAILED_PRECONDITION",
                                message="org machine quota reached")  # fmt: skip
    try:
        with pytest.raises(ProviderError, match="org machine quota reached") as refused:
            world.provider().create(_spec(world, f"bq-{secrets.token_hex(3)}"))
    finally:
        world.emu.control.clear_faults()
    assert "taken" not in str(refused.value), refused.value
    assert len(world.machines()) == before

    # A machine deleted behind our back: the cached id is not trusted, the box is reported missing.
    provider = world.provider()
    name = f"bd-{secrets.token_hex(3)}"
    facts = provider.create(_spec(world, name))
    sdk = Boxd(token=world.token, base_url=world.base_url, max_retries=0)
    sdk.machines.delete(facts.container)
    with pytest.raises(ProviderError, match="no box called"):
        provider.exec(name, ["true"])
    assert provider.find(name) is None

    # The machine name taken by a machine without our labels: refused, that machine untouched.
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd_state import machine_name

    taken = f"bt-{secrets.token_hex(3)}"
    foreign = sdk.machines.create(machine_name(taken), image=IMAGE)
    try:
        with pytest.raises(ProviderError, match="taken by a machine that is not this box"):
            provider.create(_spec(world, taken))
        assert sdk.machines.get(foreign.id).labels == {}
        assert len(world.machines()) == before + 1
    finally:
        sdk.machines.delete(foreign.id)
        sdk.close()
    deadline = time.monotonic() + 30
    while len(world.machines()) != before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(world.machines()) == before


def test_checkpoint_restored_into_a_new_box(world: World, created: dict) -> None:
    """checkpoint.yml takes a live boxd snapshot of the shared box; create_box.yml makes a new box from it,
    with the warm files and the host's later work; removing the box and the checkpoint leaves nothing."""
    provider = world.provider()
    provider.exec(world.box, ["sh", "-c", "echo warm > /workspace/warm.txt && mkdir -p ~/.cache/x && "
                              "echo c > ~/.cache/x/c"]).check("warming")
    name = f"warm-{secrets.token_hex(2)}"
    done = world.playbook("checkpoint.yml", f"box={world.box}", f"checkpoint={name}")
    assert f"checkpoint: {name}" in done.stdout, done.stdout[-3000:]
    assert provider.find(world.box).state == "running"  # a live snapshot: the box was never stopped
    snapshots = [s for s in world.emu.control.state()["snapshots"] if f"-{name}-" in s]
    assert len(snapshots) == 1
    (created["workspace"] / "new/after-checkpoint.md").write_text("later\n")
    os.chown(created["workspace"] / "new/after-checkpoint.md", 1000, 1000)
    restored = f"{world.box}-r"
    try:
        world.playbook("create_box.yml", f"workspace={created['workspace']}", f"box={restored}", f"checkpoint={name}")
        facts = provider.find(restored)
        assert facts is not None and facts.checkpoint == name and facts.state == "running"
        assert provider.exec(restored, ["cat", "/workspace/warm.txt"]).stdout == b"warm\n"
        assert provider.exec(restored, ["cat", "/home/vscode/.cache/x/c"]).stdout == b"c\n"
        assert provider.exec(restored, ["cat", "/workspace/new/after-checkpoint.md"]).stdout == b"later\n"
        head = provider.exec(restored, ["git", "-C", "/workspace", "symbolic-ref", "--short", "HEAD"]).text.strip()
        assert head == f"agentbox/{restored}"
    finally:
        world.playbook("destroy_box.yml", f"box={restored}", check=False)
        (created["workspace"] / "new/after-checkpoint.md").unlink()
    assert provider.find(restored) is None
    store = provider.checkpoint_store()
    found = store.find(facts.project, name)
    store.remove(found)
    assert not [s for s in world.emu.control.state()["snapshots"] if f"-{name}-" in s]
