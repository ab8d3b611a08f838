"""Create from the warm pool, measured side by side in one run (issue 37; docs/pool.md).

  .venv/bin/python benchmarks/pool.py [--runs N]

Workload: create_switch.py's ~8 MB repository with staged, unstaged and untracked changes. Medians of:
  (a) the raw docker CLI full create (create_switch.raw_create: docker run, worktree add, stash apply, untracked tar)
  (b) `docker run -d` alone (create_switch.raw_run, the same run as (a)'s)
  (c) the agentbox_box task claiming a pooled box (task time inside a playbook, from a callback; boot on)
  (d) the agentbox_box task with no pool set (the same playbook: a normal create, boot on)
  (e) create_box.yml claiming a pooled box (wall time), and (f) a trivial one-task playbook
  and the memory a paused pooled box holds (its cgroup's memory.current just before the pause).
The pool (size 1) lives in a HOME of its own and is refilled before each claim, untimed (the host daemon's
work); every claimed create is checked to have claimed. Targets (issue 37): (c)/(a) <= 0.5, (e)-(f) <= 0.5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from create_switch import (  # noqa: I001
    RAW_DOCKER, REPO, TIMER_CALLBACK, VENV, destroy, playbook_task_time, raw_create, raw_run, run, wall, workspace,
)

from ansible_collections.agentbox.box.plugins.module_utils.box import _pool
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _docker
from tests.integration.box.test_create_crash import relays_of

IMAGE = "agentbox/box:latest"


def docker_run_alone(tag: str) -> float:
    started = time.monotonic()
    raw_run(f"rawrun-{tag}")
    elapsed = time.monotonic() - started
    run([*RAW_DOCKER, "rm", "-f", f"rawrun-{tag}"])
    return elapsed


@contextlib.contextmanager
def home_of(home: Path):
    """This process's HOME for a while (the in-process refill and destroy read the pool and journals there)."""
    saved = os.environ.get("HOME", "")
    os.environ["HOME"] = str(home)
    try:
        yield
    finally:
        os.environ["HOME"] = saved


def claimed(provider: _docker.DockerProvider, name: str) -> bool:
    """Whether box `name` is a claimed pooled box (its container still carries the pool's kind)."""
    attrs = provider.client.api.inspect_container(f"agentbox-{name}")
    return (attrs["Config"]["Labels"] or {}).get("io.agentbox.kind") == "pool"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="agentbox-bench-pool-", dir="/tmp"))
    scratch.chmod(0o755)  # the workspace belongs to the box user, who must reach it
    (scratch / "task_timer.py").write_text(TIMER_CALLBACK)
    trivial = scratch / "trivial.yml"
    trivial.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug: msg=hi\n")
    repo = workspace(scratch)
    # HOMEs of their own, beside the workspace (the settings file's directory is made private: never the workspace's).
    pool_home, plain_home = scratch / "home-pool", scratch / "home-plain"
    pool_home.mkdir()
    plain_home.mkdir()
    pools = str(pool_home / ".agentbox" / "pool" / "pools.json")
    provider = _docker.DockerProvider()
    key = _pool.set_pool(provider, IMAGE, None, _pool.PoolSettings(size=1), pools)
    results: dict[str, list[float]] = {k: [] for k in ("raw", "run", "task_pool", "task_plain", "play_pool", "trivial")}
    memory: list[int] = []
    try:
        for _round in range(args.runs):
            tag = secrets.token_hex(3)
            results["raw"].append(raw_create(repo, tag))
            results["run"].append(docker_run_alone(tag))
            _pool.refill(provider, pools)  # untimed: the daemon's work
            memory.append(int(_pool.configured(pools)[key].get("box_memory") or 0))
            name = f"bench-pc-{tag}"
            results["task_pool"].append(playbook_task_time(repo, name, True, scratch, {"HOME": str(pool_home)}))
            assert claimed(provider, name), f"{name} was not claimed from the pool"
            with home_of(pool_home):
                destroy(name)
            name = f"bench-pn-{tag}"
            results["task_plain"].append(playbook_task_time(repo, name, True, scratch, {"HOME": str(plain_home)}))
            assert not claimed(provider, name)
            with home_of(plain_home):
                destroy(name)
            _pool.refill(provider, pools)
            name = f"bench-pp-{tag}"
            results["play_pool"].append(wall([str(VENV / "ansible-playbook"), str(REPO / "playbooks/create_box.yml"),
                                              "-e", f"box={name}"], repo, {"PWD": str(repo), "HOME": str(pool_home)}))
            assert claimed(provider, name), f"{name} was not claimed from the pool"
            with home_of(pool_home):
                destroy(name)
            results["trivial"].append(wall([str(VENV / "ansible-playbook"), str(trivial)], repo,
                                           {"HOME": str(pool_home)}))
    finally:
        _pool.drain(provider, key, pools)
        for home in (pool_home, plain_home):
            for pid in relays_of(home):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        shutil.rmtree(scratch, ignore_errors=True)
    m = {name: statistics.median(values) for name, values in results.items()}
    print(f"runs: {args.runs}")
    print(f"(a) raw docker CLI full create              median {m['raw']:.3f} s")
    print(f"(b) docker run -d alone                     median {m['run']:.3f} s")
    print(f"(c) agentbox_box task, claimed from pool    median {m['task_pool']:.3f} s   (c)/(a) = "
          f"{m['task_pool'] / m['raw']:.2f}  target <= 0.5   (c)/(b) = {m['task_pool'] / m['run']:.2f}")
    print(f"(d) agentbox_box task, no pool              median {m['task_plain']:.3f} s   (d)/(a) = "
          f"{m['task_plain'] / m['raw']:.2f}")
    print(f"(e) create_box.yml, claimed from pool       median {m['play_pool']:.3f} s")
    print(f"(f) trivial one-task playbook               median {m['trivial']:.3f} s   (e)-(f) = "
          f"{m['play_pool'] - m['trivial']:.3f} s  target <= 0.5 s")
    print(f"paused pooled box memory                    median {statistics.median(memory) / 2**20:.0f} MiB")


if __name__ == "__main__":
    os.umask(0o022)
    main()
