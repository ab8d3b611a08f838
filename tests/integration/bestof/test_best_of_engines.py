"""best_of.yml over an inventory of docker_ssh engines (-i engines.yml), on the engine fleet the suite makes once
per run (tests/integration/conftest.py): the runs go to the group's engines in turn, through the engine list
fleet_create.yml uses (playbooks/tasks/fleet_engines.yml), each run's result says its engine, each engine's own
dockerd saw its run's box made there, and the winner's branch comes home from its remote box. The inventory
names the fleet's two engines in two ways (the first by its ~/.ssh/config alias, the second by its
user@host:port). The second engine's disk is filled by a docker_ssh test now and then: the run holds it
(EngineFleet.holding). Custom agent commands only."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from plugins.module_utils.providers.docker._docker import DockerProvider
from tests.conftest import REPO, chown_tree, git, make_repo
from tests.integration.support.engines import FLEET_IMAGE, Engine, EngineFleet

pytestmark = pytest.mark.integration


def test_best_of_spreads_its_runs_over_the_inventory_engines_and_adopts_from_a_remote_box(
    engine_fleet: EngineFleet, tmp_path: Path
) -> None:
    first, second = engine_fleet.engines
    workspace = make_repo(tmp_path / "ws", {"README.md": "base\n"})
    chown_tree(workspace)
    inventory = tmp_path / "engines.yml"
    inventory.write_text("engines:\n  hosts:\n"
                         f"    {first.alias}: {{agentbox_isolation: none}}\n"
                         f"    by-address: {{agentbox_engine: '{second.destination}', agentbox_isolation: none}}\n")  # fmt: skip
    home = tmp_path / "home"
    home.mkdir()
    extra = {"workspace": str(workspace), "task": "Write out.txt.", "image": FLEET_IMAGE, "provider": "docker_ssh",
             "agents": [{"name": "writes", "command": "echo one > out.txt"}, {"name": "idles", "command": "true"}],
             "check": "test -s out.txt", "adopt": "auto", "keep": "none"}  # fmt: skip
    env = {**os.environ, **engine_fleet.env, "HOME": str(home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_DEPRECATION_WARNINGS": "0"}  # fmt: skip
    began = int(time.time()) - 1
    with engine_fleet.holding(second):
        played = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), "playbooks/best_of.yml",
                                 "-e", json.dumps(extra)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                                check=False)  # fmt: skip
    ended = int(time.time()) + 1
    result_files = list((home / ".agentbox" / "best_of").glob("*/result.json"))
    runs_made = [run for f in result_files for run in json.loads(f.read_text())["runs"]]
    boxes = [run["box"] for run in runs_made]
    providers = {run["box"]: DockerProvider(engine=run["engine"], ssh_options={}, isolation="none") for run in runs_made}
    try:
        assert played.returncode == 0, played.stdout[-4000:] + played.stderr[-2000:]
        result = json.loads(result_files[0].read_text())
        runs = result["runs"]
        assert [r["engine"] for r in runs] == [first.alias, second.destination]  # the group's engines in turn
        # And there indeed: each engine's own dockerd made its run's box, and the other's none.
        for run, (here, there) in zip(runs, ((first, second), (second, first)), strict=True):
            assert created_on(here, run["box"], began, ended) == [f"agentbox-{run['box']}"], run
            assert created_on(there, run["box"], began, ended) == [], run
        assert [(r["agent"], r["state"], r["check_rc"]) for r in runs] == [("writes", "done", 0), ("idles", "done", 1)]
        assert result["winner_box"] == runs[0]["box"]
        branch = result["adopted"]["branch"]
        assert git(workspace, "show", f"{branch}:out.txt") == "one\n"  # fetched home from the remote box
        assert result["adopted"]["commit"] == git(workspace, "rev-parse", branch).strip()
        assert sorted(result["removed"]) == sorted(boxes)  # keep=none
        for engine in (first, second):
            assert engine.agentbox_objects(*boxes) == []
    finally:
        for box, provider in providers.items():
            if provider.find(box) is not None:
                provider.destroy(box)


def created_on(engine: Engine, box: str, since: int, until: int) -> list[str]:
    """The containers of `box` that the engine's dockerd created between `since` and `until` (its event log)."""
    return engine.shell(f"docker events --since {since} --until {until} --filter type=container --filter event=create "
                        f"--filter label=io.agentbox.box={box} --format '{{{{.Actor.Attributes.name}}}}'").stdout.split()
