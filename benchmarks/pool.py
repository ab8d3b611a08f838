"""The warm pool's engine side, measured side by side in one run (issue 37; docs/pool.md).

  .venv/bin/python benchmarks/pool.py [--runs N]

What a claim costs on the engine once it is wired into create, against what a create costs today:
  (a) the raw docker CLI sequence of a full create (benchmarks/create_switch.raw_create: run, worktree add,
      stash apply, untracked tar), ~8 MB workspace
  (b) `docker run -d` of the box image alone (the user's engine)
  (c) _box.create_box in-process, boot on (a normal create, what users get today, without Ansible's start)
  (d) a claim's engine floor: _pool.take (the rename only one caller wins) + unpause + one exec that answers,
      on a box the pool booted before: what a claim adds before the workspace is attached
  and the memory a paused pooled box holds (its cgroup's memory.current just before the pause).
The pool is filled between rounds, outside the timed part (as the host daemon does it). Medians.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from create_switch import RAW_DOCKER, destroy, raw_create, run, workspace

from ansible_collections.agentbox.box.plugins.module_utils.box import _box, _pool
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _docker

IMAGE = "agentbox/box:latest"


def docker_run_alone(tag: str) -> float:
    started = time.monotonic()
    run([*RAW_DOCKER, "run", "-d", "--name", f"rawrun-{tag}", "--cap-add", "SYS_ADMIN", "--device", "/dev/fuse",
         "--security-opt", "seccomp=unconfined", "-p", "127.0.0.1::80", IMAGE, "sleep", "infinity"])
    elapsed = time.monotonic() - started
    run([*RAW_DOCKER, "rm", "-f", f"rawrun-{tag}"])
    return elapsed


def claim_floor(provider: _docker.DockerProvider, key: str, tag: str) -> float:
    started = time.monotonic()
    taken = _pool.take(provider, key, f"agentbox-claimed-{tag}")
    assert taken, "the pool had no box"
    provider.resume(f"claimed-{tag}")
    provider.exec(f"claimed-{tag}", ["true"]).check("a claimed box answering", tag)
    elapsed = time.monotonic() - started
    provider.pool_store().remove(taken["container"], taken["labels"]["pool_box"])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="agentbox-bench-pool-", dir="/tmp"))
    scratch.chmod(0o755)
    repo = workspace(scratch)
    pools = str(scratch / "pools.json")
    provider = _docker.DockerProvider()
    key = _pool.set_pool(provider, IMAGE, None, _pool.PoolSettings(size=1), pools)
    results: dict[str, list[float]] = {k: [] for k in ("raw", "run", "create", "claim")}
    memory: list[int] = []
    try:
        for _round in range(args.runs):
            tag = secrets.token_hex(3)
            _pool.refill(provider, pools)  # untimed: the daemon's work
            memory.append(int(_pool.configured(pools)[key].get("box_memory") or 0))
            results["claim"].append(claim_floor(provider, key, tag))
            results["raw"].append(raw_create(repo, tag))
            results["run"].append(docker_run_alone(tag))
            name = f"bench-pool-{tag}"
            started = time.monotonic()
            _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(repo)))
            results["create"].append(time.monotonic() - started)
            destroy(name)
    finally:
        _pool.drain(provider, key, pools)
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    m = {key: statistics.median(values) for key, values in results.items()}
    print(f"runs: {args.runs}")
    print(f"(a) raw docker CLI full create        median {m['raw']:.3f} s")
    print(f"(b) docker run -d alone               median {m['run']:.3f} s")
    print(f"(c) _box.create_box, boot on          median {m['create']:.3f} s   (c)/(a) = {m['create'] / m['raw']:.2f}")
    print(f"(d) claim floor: take+unpause+exec    median {m['claim']:.3f} s   (d)/(a) = {m['claim'] / m['raw']:.2f}"
          f"   (d)/(b) = {m['claim'] / m['run']:.2f}")
    print(f"paused pooled box memory              median {statistics.median(memory) / 2**20:.0f} MiB")


if __name__ == "__main__":
    os.umask(0o022)
    main()
