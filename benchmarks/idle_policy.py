"""What one pass of the idle policy costs (docs/idle.md), in two parts measured side by side:

  plan    _idle.plan over N synthetic boxes (pure: no engine), the decision itself
  pass    _idle.run_pass in check mode over the boxes already on the local engine: one listing plus
          one exec per running box (reading the agent states); it changes nothing

Prints medians (and the box count the pass saw). Creates nothing; reads only.

    .venv/bin/python benchmarks/idle_policy.py [--boxes 50] [--runs 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.idle import _idle  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402


def synthetic(count: int, now: float) -> tuple[list[dict], dict]:
    boxes, agents = [], {}
    states = ("working", "waiting", "idle", "idle", None)
    for index in range(count):
        name = f"b{index:03d}"
        boxes.append({"name": name, "id": name, "provider": "docker", "engine": "local", "state": "running"})
        state = states[index % len(states)]
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60 * (index + 1)))
        agents[name] = {"state": state, "since": since} if state else None
    return boxes, agents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=50)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    now = time.time()
    boxes, agents = synthetic(args.boxes, now)
    provider = DockerProvider()
    plan_times, pass_times, seen = [], [], 0
    with tempfile.TemporaryDirectory() as scratch:
        for _run in range(args.runs):  # interleaved, so load drift hits both alike
            started = time.perf_counter()
            _idle.plan(boxes, agents, {}, now, {"max_running": 5, "idle_minutes": 5})
            plan_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            result = _idle.run_pass(provider, {}, state_file=f"{scratch}/paused.json", check_mode=True)
            pass_times.append(time.perf_counter() - started)
            seen = len(result["boxes"])
    provider.close()
    figures = {"plan_boxes": args.boxes, "plan_median_ms": statistics.median(plan_times) * 1000,
               "pass_boxes": seen, "pass_median_s": statistics.median(pass_times), "runs": args.runs}  # fmt: skip
    print(f"plan over {args.boxes} boxes: {figures['plan_median_ms']:.2f} ms (median of {args.runs})")
    print(f"check-mode pass over the engine's {seen} boxes: {figures['pass_median_s']:.2f} s (median of {args.runs})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
