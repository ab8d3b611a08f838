"""A create claims a box from the warm pool (docs/pool.md, "The claim"), on the real engine: the claimed box
passes the same byte-identical carry-over check as a normal create and is then a box like any other (found,
listed, in the inventory, stopped with its commits fetched, started with its workspace back, destroyed with
nothing left); a create that cannot claim says why in one line and makes the box as usual, leaving no half box;
a create killed after its claim leaks nothing after the next refill pass.

One pool (size 1) in a HOME of its own for the module: each test takes its box and refills it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import inventory_loader

from ansible_collections.agentbox.box.plugins.module_utils.box import _pool
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.conftest import REPO, chown_tree, git, make_repo
from tests.integration.box.conftest import box_task
from tests.integration.box.test_box_local import (
    box_manifest,
    box_name,
    carried_paths,
    dirty_workspace,
    exec_in,
    host_snapshot,
    tree_manifest,
)
from tests.integration.box.test_create_crash import make_home, wait_until

pytestmark = pytest.mark.integration


class Pool:
    def __init__(self, home: Path, client: docker.DockerClient, image: str):
        self.home = home
        self.client = client
        self.path = str(home / ".agentbox" / "pool" / "pools.json")
        self.env = {"HOME": str(home)}
        self.provider = DockerProvider()
        self.key = _pool.set_pool(self.provider, image, None, _pool.PoolSettings(size=1), self.path)

    def owned(self, **labels: str) -> list[Any]:
        wanted = [f"io.agentbox.pool_owner={_pool.owner(self.path)}", *(f"io.agentbox.{k}={v}" for k, v in labels.items())]
        return self.client.containers.list(all=True, filters={"label": wanted})

    def ready(self) -> str:
        """The pool's one pooled box, paused (made by a refill when it has none): its container."""
        report = self.refill()
        assert not report["problems"], report
        [box] = [c for c in self.owned() if c.name.startswith("agentbox-pool-")]
        assert box.status == "paused"
        return box.name

    def refill(self) -> dict[str, Any]:
        """One refill pass with this pool's HOME (where the creates' journals are)."""
        saved = os.environ.get("HOME", "")
        os.environ["HOME"] = str(self.home)
        try:
            return _pool.refill(self.provider, self.path)
        finally:
            os.environ["HOME"] = saved

    def create(self, name: str, workspace: Path, **more: Any) -> dict[str, Any]:
        return box_task({"name": name, "workspace": str(workspace), **more}, env=self.env)

    def volumes_of(self, box: str) -> list[str]:
        return [v.name for v in self.client.volumes.list(filters={"label": f"io.agentbox.box={box}"})]


@pytest.fixture(scope="module")
def pool(request: pytest.FixtureRequest, docker_client: docker.DockerClient, box_image: str) -> Iterator[Pool]:
    made = Pool(make_home(request), docker_client, box_image)
    yield made
    _pool.set_pool(made.provider, box_image, None, _pool.PoolSettings(size=0), made.path)
    _pool.drain(made.provider, made.key, made.path)
    for container in made.owned():
        container.remove(force=True, v=True)
    for volume in docker_client.volumes.list(filters={"label": f"io.agentbox.pool_owner={_pool.owner(made.path)}"}):
        volume.remove(force=True)


def inventory_hosts(pool: Pool, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The agentbox.box.boxes inventory of the local engine, parsed in this process: {host: its variables}."""
    source = tmp_path / "here.agentbox.yml"
    source.write_text("plugin: agentbox.box.boxes\nlocal: true\nverbose_output: true\n")
    inventory = InventoryData()
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(pool.home)
    try:
        inventory_loader.get("agentbox.box.boxes").parse(inventory, DataLoader(), str(source), cache=False)
    finally:
        os.environ["HOME"] = saved or ""
    return {name: host.vars for name, host in inventory.hosts.items()}


def test_a_claimed_box_carries_over_byte_identically_and_lives_like_any_box(pool: Pool, tmp_path: Path) -> None:
    pooled_box = pool.ready()
    repo = dirty_workspace(tmp_path)
    before = host_snapshot(repo)
    name = box_name("claim")
    try:
        result = pool.create(name, repo)
        assert not result.get("failed"), result
        assert result["pool"] == f"claimed {pooled_box}", result
        container = pool.client.containers.get(f"agentbox-{name}")
        assert container.labels["io.agentbox.pool_box"] == pooled_box.removeprefix("agentbox-")  # the pooled box
        assert not [c for c in pool.owned() if c.name == pooled_box]  # taken: no longer the pool's
        # The create's result is a normal create's: facts, labels, ports, seed counts.
        facts = result["box"]
        assert facts["state"] == "running" and facts["branch"] == f"agentbox/{name}"
        assert facts["labels"]["kind"] == "box" and facts["labels"]["git_layers"] == "1"
        assert facts["project"] == facts["labels"]["project"] and facts["workspace"] == str(repo)
        assert set(facts["ports"]) == {"80"} and facts["container"] == f"agentbox-{name}"
        seed = result["seed"]
        assert (seed["modified"], seed["deleted"], seed["renamed"], seed["untracked"]) == (2, 2, 1, 6)
        # The carry-over check of a normal create (test_box_local), byte for byte.
        expected = {path: entry for path, entry in tree_manifest(repo).items() if path in carried_paths(repo)}
        assert box_manifest(pool.client, name) == expected
        rc, status_in_box = exec_in(pool.client, name, "cd /workspace && git status --porcelain=v1 -uall")
        assert rc == 0 and sorted(status_in_box.splitlines()) == sorted(before["status"].splitlines())
        assert host_snapshot(repo) == before
        rc, identity = exec_in(pool.client, name, "cat /etc/agentbox/box.env")
        assert rc == 0 and f"AGENTBOX_BOX_NAME={name}\n" in identity and f"AGENTBOX_BOX_ID={facts['id']}\n" in identity
        # Found, listed and in the inventory as the box it is.
        found = DockerProvider().find(name)
        assert found is not None and (found.id, found.branch, found.project) == (facts["id"], facts["branch"],
                                                                                 facts["project"])
        assert name in {b.name for b in DockerProvider().list_boxes(facts["project"])}
        hosts = inventory_hosts(pool, tmp_path)
        assert hosts[name]["agentbox_labels"]["branch"] == f"agentbox/{name}", hosts.get(name)
        assert not [h for h in hosts if h.startswith("pool-")]
        # Stopped: its commit is fetched into the host's branch; started again: its workspace is back.
        rc, out = exec_in(pool.client, name, "cd /workspace && git add -A && "
                          "git -c user.email=a@b -c user.name=agent commit -q -m 'from a claimed box' && git rev-parse HEAD")
        assert rc == 0, out
        made = out.strip().splitlines()[-1]
        stopped = box_task({"name": name, "state": "stopped"}, env=pool.env)
        assert not stopped.get("failed") and stopped["box"]["state"] == "stopped", stopped
        assert git(repo, "rev-parse", f"agentbox/{name}").strip() == made
        started = box_task({"name": name, "state": "started"}, env=pool.env)
        assert not started.get("failed") and started["box"]["state"] == "running", started
        rc, log = exec_in(pool.client, name, "cd /workspace && git log -1 --format=%s && git status --porcelain")
        assert rc == 0 and log == "from a claimed box\n", log
    finally:
        gone = box_task({"name": name, "state": "absent"}, env=pool.env)
    assert not gone.get("failed") and gone["changed"], gone
    assert not pool.client.containers.list(all=True, filters={"name": f"agentbox-{name}"})
    assert pool.volumes_of(name) == []
    assert not pool.client.volumes.list(filters={"label": f"io.agentbox.pool_box={pooled_box.removeprefix('agentbox-')}"})


def test_a_create_the_pool_cannot_serve_says_why_in_one_line_and_leaves_no_half_box(pool: Pool,
                                                                                    tmp_path: Path) -> None:
    """A pooled box whose dockerd died (damaged) is removed at the claim and the box is made as usual; a box
    removed by hand leaves the pool empty, and the create says so; a request with an extra port falls back."""
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    names = [box_name("fall"), box_name("fall"), box_name("fall")]
    try:
        damaged = pool.ready()
        box = pool.client.containers.get(damaged)
        box.unpause()
        assert box.exec_run(["sh", "-c", "kill -9 $(cat /var/run/docker.pid)"], user="root").exit_code == 0
        box.pause()
        first = pool.create(names[0], repo)
        assert not first.get("failed"), first
        said = f"made, not claimed: pooled box {damaged} is damaged: its dockerd is not running"
        assert first["pool"].startswith(said), first["pool"]
        assert "\n" not in first["pool"]
        assert first["box"]["labels"]["kind"] == "box" and first["box"]["state"] == "running"
        assert pool.client.containers.get(f"agentbox-{names[0]}").labels["io.agentbox.kind"] == "box"
        assert pool.owned() == []  # the damaged box is gone, not half a box under either name
        assert not pool.client.volumes.list(filters={"label": f"io.agentbox.pool_box={damaged.removeprefix('agentbox-')}"})

        removed = pool.ready()
        pool.client.containers.get(removed).remove(force=True, v=True)
        second = pool.create(names[1], repo)
        assert second["pool"] == f"made, not claimed: no pooled box ready in pool {pool.key[:8]} (the host daemon " \
                                 "refills it)", second
        third = pool.create(names[2], repo, ports=[8080])
        assert third["pool"].startswith("made, not claimed: ports 8080 are published at docker create"), third
    finally:
        for name in names:
            box_task({"name": name, "state": "absent"}, env=pool.env)


def test_a_create_killed_after_its_claim_leaks_nothing_after_the_next_refill(pool: Pool, tmp_path: Path) -> None:
    """kill -9 of agentbox_box (a real process) right after it claimed a pooled box, before seeding (the
    create journal's 'created' wait point): the next refill pass undoes that create: no box, volume or branch."""
    pooled_box = pool.ready()
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    name = box_name("kill")
    report = tmp_path / "paused-at"
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"name": name, "workspace": str(repo)}}))
    pythonpath = os.pathsep.join(p for p in (str(REPO / ".collections"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **pool.env, "PYTHONPATH": pythonpath, "AGENTBOX_TEST_PAUSE_AT": "created",
           "AGENTBOX_TEST_PAUSE_FILE": str(report)}
    proc = subprocess.Popen([sys.executable, "-m", "ansible_collections.agentbox.box.plugins.modules.agentbox_box",
                             str(args)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: report.exists() or proc.poll() is not None, "the create reaching its wait point")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        claimed = pool.client.containers.get(f"agentbox-{name}")
        assert claimed.labels["io.agentbox.pool_box"] == pooled_box.removeprefix("agentbox-")  # the claim was made
        assert git(repo, "branch", "--list", f"agentbox/{name}").strip()
        again = pool.refill()  # as the host daemon runs it: in the HOME whose creates it undoes
        assert {"box": name, "why": f"its create was killed after it claimed {pooled_box}"} in again["removed"], again
        assert not pool.client.containers.list(all=True, filters={"name": f"agentbox-{name}"})
        assert pool.volumes_of(name) == []
        assert git(repo, "branch", "--list", f"agentbox/{name}") == ""
        assert len(again["made"]) == 1  # the pool is whole again
    finally:
        if proc.poll() is None:
            proc.kill()
        box_task({"name": name, "state": "absent"}, env=pool.env)
