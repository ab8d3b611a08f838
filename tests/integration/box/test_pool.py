"""The warm pool on the real engine (docs/pool.md): pooled boxes made, booted and paused, invisible to users'
listings and to destroy; a claim only one of two racing callers wins; a refill removes what a killed refill
or a hand left behind, and says so when the pool's image is gone. The claims of creates are in
test_pool_claim.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _pool
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.conftest import REPO, run_module_direct
from tests.integration.box.conftest import box_task
from tests.integration.box.test_create_crash import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def client(docker_client: docker.DockerClient, box_image: str) -> docker.DockerClient:
    """The engine, with the box image on it (the shared fixtures)."""
    return docker_client


@pytest.fixture
def pools(tmp_path: Path, client: docker.DockerClient) -> Any:
    """This test's pool settings file (its own owner on the engine); every pooled box of it goes at the end."""
    path = str(tmp_path / "pools.json")
    yield path
    for container in client.containers.list(all=True, filters={"label": f"io.agentbox.pool_owner={_pool.owner(path)}"}):
        container.remove(force=True, v=True)
    for volume in client.volumes.list(filters={"label": f"io.agentbox.pool_owner={_pool.owner(path)}"}):
        volume.remove(force=True)


def pooled(client: docker.DockerClient, path: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"io.agentbox.pool_owner={_pool.owner(path)}"})


def test_pool_yml_fills_paused_boxes_that_users_never_see(tmp_path: Path, client: docker.DockerClient) -> None:
    """pool.yml's module: state=present makes `size` paused, booted boxes labelled io.agentbox.pool and never
    io.agentbox.box; the users' listing and destroy do not see them; show reports them; absent removes them."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    path = str(home / ".agentbox" / "pool" / "pools.json")
    try:
        made = run_module_direct("agentbox_pool", {"size": 2, "max_memory": "4g"}, env=env)
        assert not made["failed"], made
        assert made["changed"] and len(made["refill"]["made"]) == 2
        boxes = pooled(client, path)
        assert len(boxes) == 2
        # What a booted pooled box holds, read in its boot's exec: max_memory is judged by it.
        assert json.loads(Path(path).read_text())["pools"][made["key"]]["box_memory"] > 16 * 2**20
        for box in boxes:
            assert box.status == "paused"
            assert box.labels["io.agentbox.kind"] == "pool" and box.labels["io.agentbox.pool"] == made["key"]
            assert "io.agentbox.box" not in box.labels
        listed = {facts.container for facts in DockerProvider().list_boxes()}
        assert not listed & {box.name for box in boxes}
        # destroy of a pooled box's name refuses: it is not a user's box.
        name = boxes[0].name.removeprefix("agentbox-")
        refused = box_task({"name": name, "state": "absent"})
        assert refused["failed"] and "not made by agentbox" in refused["msg"], refused
        assert len(pooled(client, path)) == 2
        # list_boxes.yml shows them apart, after the users' table.
        played = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "playbooks/list_boxes.yml"], cwd=REPO,
                                env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), **env},
                                capture_output=True, text=True, check=False)
        assert played.returncode == 0, played.stdout[-3000:]
        table, _sep, apart = played.stdout.partition("warm pool (not users")
        assert all(box.name in apart and box.name not in table for box in boxes), played.stdout[-3000:]
        shown = run_module_direct("agentbox_pool", {"state": "show"}, env=env)
        assert not shown["changed"] and set(shown["pools"]) == {made["key"]}
        assert sorted(b["container"] for b in shown["boxes"]) == sorted(b.name for b in boxes)
        again = run_module_direct("agentbox_pool", {"size": 2, "max_memory": "4g"}, env=env)
        assert not again["failed"] and not again["changed"], again
        gone = run_module_direct("agentbox_pool", {"state": "absent"}, env=env)
        assert gone["changed"] and sorted(gone["removed"]) == sorted(b.name for b in boxes)
        assert pooled(client, path) == []
        assert client.volumes.list(filters={"label": f"io.agentbox.pool_owner={_pool.owner(path)}"}) == []
    finally:
        for container in pooled(client, path):
            container.remove(force=True, v=True)


def test_two_concurrent_claims_never_take_the_same_pooled_box(
    pools: str, client: docker.DockerClient, box_image: str
) -> None:
    provider = DockerProvider()
    key = _pool.set_pool(provider, box_image, None, _pool.PoolSettings(size=1), pools)
    assert _pool.refill(provider, pools)["made"]
    won: list[Any] = []
    start = threading.Barrier(2)

    def claim(target: str) -> None:
        start.wait()
        won.append(_pool.take(DockerProvider(), key, target))

    suffix = uuid.uuid4().hex[:8]
    targets = [f"agentbox-claim-a-{suffix}", f"agentbox-claim-b-{suffix}"]
    threads = [threading.Thread(target=claim, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    taken = [w for w in won if w]
    assert len(taken) == 1 and won.count(None) == 1
    names = {c.name: c.status for c in pooled(client, pools)}
    assert names == {taken[0]["container"]: "running"}  # the one box, under the winner's name only, running
    # The taken box is no longer the pool's: the next refill makes a new one and leaves the taken one alone.
    again = _pool.refill(provider, pools)
    assert len(again["made"]) == 1
    assert {c.name for c in pooled(client, pools)} == {taken[0]["container"], again["made"][0]}


def test_refill_replaces_a_damaged_pooled_box_and_removes_leftover_volumes(pools: str, client: docker.DockerClient,
                                                                           box_image: str) -> None:
    """A pooled box found running (a refill killed before its pause, or a hand that unpaused it) and a volume
    whose container is gone (a refill killed mid-create) go at the next refill, which makes a fresh box."""
    provider = DockerProvider()
    _pool.set_pool(provider, box_image, None, _pool.PoolSettings(size=1), pools)
    first = _pool.refill(provider, pools)["made"][0]
    client.containers.get(first).unpause()
    leftover = client.volumes.create(f"agentbox-pool-leftover-{uuid.uuid4().hex[:8]}",
                                     labels={"io.agentbox.pool_owner": _pool.owner(pools)})
    report = _pool.refill(provider, pools)
    removed = {item.get("container") or item.get("volume"): item["why"] for item in report["removed"]}
    assert "not paused" in removed[first]
    assert leftover.name in removed
    assert len(report["made"]) == 1 and report["made"][0] != first
    assert [c.name for c in pooled(client, pools)] == report["made"]
    assert [v.name for v in client.volumes.list(filters={"label": f"io.agentbox.pool_owner={_pool.owner(pools)}"})
            if v.name == leftover.name] == []


def test_a_pool_whose_image_is_gone_keeps_no_box_and_says_why(pools: str, client: docker.DockerClient,
                                                              box_image: str) -> None:
    provider = DockerProvider()
    tag = f"agentbox/pooltest:{uuid.uuid4().hex[:8]}"
    client.images.get(box_image).tag(tag)
    try:
        _pool.set_pool(provider, tag, None, _pool.PoolSettings(size=1), pools)
    finally:
        client.images.remove(tag)
    report = _pool.refill(provider, pools)
    assert report["made"] == [] and pooled(client, pools) == []
    assert len(report["problems"]) == 1 and f"image {tag!r} is not on engine" in report["problems"][0]


def test_a_refill_killed_mid_create_leaks_nothing_after_the_next_refill(
    tmp_path: Path, client: docker.DockerClient
) -> None:
    """kill -9 of pool.yml's module (a real process) once its pooled box exists but before it was paused (while it
    boots): the next refill removes that box and its volumes and makes a fresh one."""
    home = tmp_path / "h"
    home.mkdir()
    path = str(home / ".agentbox" / "pool" / "pools.json")
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"size": 1}}))
    pythonpath = os.pathsep.join(p for p in (str(REPO / ".collections"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": pythonpath}
    proc = subprocess.Popen([sys.executable, "-m", "ansible_collections.agentbox.box.plugins.modules.agentbox_pool",
                             str(args)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # The box exists and is not paused yet: the refill is between its create and its pause (the boot).
        wait_until(lambda: any(c.status != "paused" for c in pooled(client, path)) or proc.poll() is not None,
                   "the refill's pooled box existing, not yet paused")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        [half] = pooled(client, path)
        assert half.status != "paused", half.status  # what the kill left: made, never paused
        volumes = {v.name for v in client.volumes.list(filters={"label": f"io.agentbox.pool_owner={_pool.owner(path)}"})}
        assert volumes
        again = run_module_direct("agentbox_pool", {"size": 1}, env={"HOME": str(home)})
        assert not again["failed"], again
        assert [r["container"] for r in again["refill"]["removed"] if "container" in r] == [half.name]
        [fresh] = pooled(client, path)
        assert fresh.name != half.name and fresh.status == "paused"
        left = {v.name for v in client.volumes.list(filters={"label": f"io.agentbox.pool_owner={_pool.owner(path)}"})}
        assert not left & volumes
    finally:
        if proc.poll() is None:
            proc.kill()
        for container in pooled(client, path):
            container.remove(force=True, v=True)
        for volume in client.volumes.list(filters={"label": f"io.agentbox.pool_owner={_pool.owner(path)}"}):
            volume.remove(force=True)
