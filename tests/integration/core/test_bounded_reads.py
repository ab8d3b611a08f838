"""Reads of what a box wrote stay bounded on the real local engine, whatever root in the box plants:
a 2 GiB sparse agent-state file, a 2 GiB sparse seed record. The host's reads (the idle pass, the
relay's idle pass, `autopause.yml --check`, a fetch of the box's branch) each run in a child process
whose peak RSS is measured (getrusage) under an address-space limit, so a read that is not bounded
fails the test instead of eating the machine. The planted box gets its own error and one line in the
host's log; the other box is planned for as usual."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, chown_tree, make_repo, run_module

pytestmark = pytest.mark.integration

RSS_BOUND_KIB = 200 * 1024  # 200 MiB: the host's reads of one box are a few MiB at most
ADDRESS_SPACE = 4 << 30  # a child that tries to hold the 2 GiB file fails fast instead of eating the machine
COLLECTION = str(REPO / ".collections")


# Runs argv (its arguments after the limit) with the address-space limit, then reports.
MEASURE = """
import json, resource, subprocess, sys
limit = int(sys.argv[1])
done = subprocess.run(sys.argv[2:], capture_output=True, text=True,
                      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
print(json.dumps({"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                  "maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, int]:
    """Run argv in a child (and its children) under ADDRESS_SPACE; its result and the peak RSS in KiB of
    the largest process it ran (the child, or a module process ansible started)."""
    ran = subprocess.run([sys.executable, "-c", MEASURE, str(ADDRESS_SPACE), *argv], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, **(env or {})}, check=True)  # fmt: skip
    answer = json.loads(ran.stdout)
    return subprocess.CompletedProcess(argv, answer["rc"], answer["stdout"], answer["stderr"]), answer["maxrss"]


# The collection, as a child script imports it: its path is the script's first argument.
PREAMBLE = """
import sys
sys.path.insert(0, sys.argv.pop(1))
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.path[0]])
"""
# The relay's own pass, as the relay runs it every 30 s (its log set up as relay.log's is).
RELAY_PASS = PREAMBLE + """
import json, logging
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_idle
registrations = json.loads(sys.argv[1])
settings = {"max_running": 0, "idle_minutes": 0, "stop_after_hours": 12, "include_agentless": False}
[result] = _relay_idle.one_pass(registrations, settings)
print(json.dumps({"boxes": result["boxes"], "errors": result["errors"]}))
"""
# Both Docker clients run a command that prints 1 GiB with a cap of 1 MiB, then one more command.
CAPPED_EXECS = PREAMBLE + """
import json
import docker
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._engine_api import local_engine
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._engine_sdk import SDKEngine
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import OutputTooLarge
said = []
for client in (local_engine(30.0), SDKEngine(docker.from_env().api, "local")):
    try:
        client.exec(sys.argv[1], ["head", "-c", "1G", "/dev/zero"], user="vscode", max_output=1 << 20)
    except OutputTooLarge as exc:
        said.append(str(exc))
    said.append(client.exec(sys.argv[1], ["echo", "still"], user="vscode", max_output=1 << 20)[1].decode())
print(json.dumps(said))
"""


def in_box(client: docker.DockerClient, name: str, script: str, user: str = "root") -> None:
    done = client.containers.get(f"agentbox-{name}").exec_run(["sh", "-c", script], user=user)
    assert done.exit_code == 0, done.output


@pytest.fixture(scope="module")
def pair(docker_client: docker.DockerClient, box_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Two boxes of one workspace, both with an idle agent: `hostile` plants files, `calm` does not."""
    root = tmp_path_factory.mktemp("reads")
    for path in (root, *root.parents):  # the box user's git reads the workspace's .git
        if str(path) in ("/", "/tmp"):
            break
        path.chmod(path.stat().st_mode | 0o755)
    repo = make_repo(root / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    token = secrets.token_hex(3)
    names = {"hostile": f"rd-hostile-{token}", "calm": f"rd-calm-{token}"}
    try:
        for name in names.values():
            made = run_module("agentbox_box", {"name": name, "workspace": str(repo), "image": box_image, "boot": False})
            assert made.get("failed") is not True, made
            in_box(docker_client, name, "agentbox-ctl agent-state idle --session claude", user="vscode")
        ids = {role: docker_client.containers.get(f"agentbox-{name}").labels["io.agentbox.id"]
               for role, name in names.items()}  # fmt: skip
        yield {"names": names, "ids": ids, "workspace": str(repo), "client": docker_client}
    finally:
        for name in names.values():
            run_module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})


def test_a_2gib_agent_state_file_is_refused_and_the_idle_passes_stay_bounded(pair: dict, tmp_path: Path) -> None:
    names, client = pair["names"], pair["client"]
    in_box(client, names["hostile"], "truncate -s 2G /run/agentbox/agents/claude.state.json")

    # The relay's pass: the hostile box is its own error with one line in the log; the calm one is paused.
    registrations = {pair["ids"][role]: {"name": name, "id": pair["ids"][role], "provider": "docker",
                                         "engine": "local", "options": {}} for role, name in names.items()}  # fmt: skip
    # Its own HOME: the pass keeps its paused-since record there.
    ran, peak = measured([sys.executable, "-c", RELAY_PASS, COLLECTION, json.dumps(registrations)],
                         env={"HOME": str(tmp_path)})
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout)
    by_name = {entry["name"]: entry for entry in result["boxes"]}
    hostile = by_name[names["hostile"]]
    assert hostile["action"] == "error" and "agent state file" in hostile["reason"], hostile
    assert "is over 4096 bytes: refused" in hostile["reason"]
    assert result["errors"] == [f"{names['hostile']}: {hostile['reason']}"]
    assert by_name[names["calm"]]["action"] == "pause" and by_name[names["calm"]]["done"] is True
    logged = [line for line in ran.stderr.splitlines() if line.startswith("WARNING ")]
    assert logged == [f"WARNING box {names['hostile']}: {hostile['reason']}"], ran.stderr[-3000:]
    assert peak < RSS_BOUND_KIB, f"the relay's idle pass peaked at {peak} KiB"
    assert client.containers.get(f"agentbox-{names['hostile']}").status == "running"
    client.containers.get(f"agentbox-{names['calm']}").unpause()

    # autopause.yml --check: the task fails naming the hostile box's refusal, still listing both boxes.
    checked, peak = measured(
        [str(REPO / ".venv/bin/ansible-playbook"), "playbooks/autopause.yml", "-e", f"workspace={pair['workspace']}",
         "-e", "max_running=0", "-e", "idle_minutes=0", "--check"],
        env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    assert checked.returncode != 0, checked.stdout
    assert f"the idle policy failed for {names['hostile']}: the box's agent state file" in checked.stdout
    assert "is over 4096 bytes: refused" in checked.stdout
    assert peak < RSS_BOUND_KIB, f"autopause.yml --check peaked at {peak} KiB (its largest process)"
    assert {box: client.containers.get(f"agentbox-{box}").status for box in names.values()} == \
        dict.fromkeys(names.values(), "running")  # check mode changed nothing
    in_box(client, names["hostile"], "rm -f /run/agentbox/agents/claude.state.json")


def test_a_2gib_seed_record_is_refused_and_the_fetch_stays_bounded(pair: dict) -> None:
    names, client = pair["names"], pair["client"]
    plant = "cp /etc/agentbox/seed.json /tmp/seed.json && truncate -s 2G /etc/agentbox/seed.json"
    in_box(client, names["hostile"], plant)
    try:
        args = json.dumps({"box": names["hostile"], "state": "fetched"})
        fetched, peak = measured(
            [str(REPO / ".venv/bin/ansible"), "localhost", "-m", "agentbox.box.agentbox_worktree", "-a", args],
            env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        )
        assert fetched.returncode != 0, fetched.stdout
        assert "the box's seed record (/etc/agentbox/seed.json) is over 4194304 bytes: refused" in fetched.stdout
        assert peak < RSS_BOUND_KIB, f"the fetch peaked at {peak} KiB (its largest process)"
        # The other box's own record is read as before.
        calm = run_module("agentbox_worktree", {"box": names["calm"], "state": "fetched"})
        assert calm.get("failed") is not True, calm
    finally:
        in_box(client, names["hostile"], "cp /tmp/seed.json /etc/agentbox/seed.json")
    assert run_module("agentbox_worktree", {"box": names["hostile"], "state": "fetched"}).get("failed") is not True


def test_the_local_engine_stops_reading_an_exec_at_its_cap(pair: dict) -> None:
    """Both Docker clients (the standard-library one of the local engine, and the SDK's, which a remote
    engine uses) read no more than the cap of a command that prints 1 GiB, and end its stream."""
    ran, peak = measured([sys.executable, "-c", CAPPED_EXECS, COLLECTION, f"agentbox-{pair['names']['calm']}"])
    assert ran.returncode == 0, ran.stderr[-3000:]
    said = json.loads(ran.stdout)
    assert said == ["head printed more than the 1048576 bytes the host reads: refused", "still\n"] * 2
    assert peak < RSS_BOUND_KIB, f"reading past the cap peaked at {peak} KiB"
