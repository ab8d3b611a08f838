"""boxd against Daytona, each through its own provider and SDK on its local emulator: what a box costs.

Both emulators run every machine/sandbox as a local container from agentbox/box:latest, so the figures
compare the providers' own work (API round trips, polling, the exec transport: boxd's gRPC stream
against Daytona's session launcher and waiter), not the clouds. Measured, medians of --runs:
  1. create: provider.create() until the box runs commands (no seeding, no boot sequence);
  2. exec round trip: `true` as the box user, --execs times on one box;
  3. checkpoint capture: provider.commit() of a running box to a new snapshot (boxd: a live snapshot;
     Daytona: stop, snapshot, start and the in-box start sequence, as its provider does).
Everything it starts is removed at the end, also on failure.

    .venv/bin/python benchmarks/cloud_providers.py [--runs 3] [--execs 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")
REPO = Path(__file__).resolve().parents[1]
for entry in (str(REPO), str(REPO / ".collections")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from ansible.plugins.loader import init_plugin_loader  # noqa: E402

init_plugin_loader([str(REPO / ".collections")])

from ansible_collections.agentbox.box.plugins.module_utils.core._naming import box_labels  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec, Provider  # noqa: E402
from tests import boxd_emulator, daytona_emulator  # noqa: E402

IMAGE = "agentbox/box:latest"


def spec(provider: Provider, name: str) -> BoxSpec:
    box_id = secrets.token_hex(8)
    labels = box_labels(box=name, box_id=box_id, project="b" * 16, workspace="/tmp/bench", branch="",
                        image_fingerprint="", provider=provider.name, engine=provider.engine, checkpoint=None)
    return BoxSpec(name=name, box_id=box_id, project="b" * 16, workspace="/tmp/bench", image=IMAGE, labels=labels)


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(provider: Provider, runs: int, execs: int, snapshot_name: Callable[[int], str]) -> dict[str, Any]:
    names = [f"bench-{provider.name}-{secrets.token_hex(3)}" for _run in range(runs)]
    made: list[str] = []
    result: dict[str, Any] = {"create": [], "exec": [], "checkpoint": []}
    try:
        for name in names:
            result["create"].append(timed(lambda name=name: provider.create(spec(provider, name))))
            made.append(name)
        for _exec in range(execs):
            result["exec"].append(timed(lambda: provider.exec(made[0], ["true"]).check("true")))
        for index in range(runs):
            result["checkpoint"].append(timed(lambda index=index: provider.commit(made[0], snapshot_name(index), {})))
    finally:
        for name in made:
            provider.destroy(name)
    return {key: {"median": statistics.median(values), "n": len(values)} for key, values in result.items() if values}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--execs", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    figures: dict[str, Any] = {"load_before": os.getloadavg()[0]}

    from ansible_collections.agentbox.box.plugins.module_utils.providers._snapshot_store import snapshot_name
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

    with boxd_emulator.running_emulator(image=IMAGE) as emu:
        provider = BoxdProvider(token=emu.token, base_url=emu.base_url)
        tag = secrets.token_hex(3)
        figures["boxd"] = measure(provider, args.runs, args.execs, lambda i: f"bench-{tag}-{i}")
    # The emulator's desired-state and list lags (on by default, as on Daytona) are fixed waits, not client
    # cost: off here, as for the figures in docs/performance.md.
    quick = {"desired_state_seconds": 0, "list_lag_seconds": 0}
    with daytona_emulator.running_emulator(image=IMAGE, **quick) as (api_url, api_key, _admin):
        provider = DaytonaProvider(api_key=api_key, api_url=api_url)
        figures["daytona"] = measure(provider, args.runs, args.execs,
                                     lambda i: snapshot_name("b" * 16, f"bench{i}", secrets.token_hex(4)))
    figures["load_after"] = os.getloadavg()[0]
    print(f"{'step':<12}{'boxd (s)':>10}{'daytona (s)':>13}{'boxd/daytona':>14}   (medians; load "
          f"{figures['load_before']:.1f} -> {figures['load_after']:.1f})")
    for step in ("create", "exec", "checkpoint"):
        b, d = figures["boxd"].get(step), figures["daytona"].get(step)
        if b and d:
            print(f"{step:<12}{b['median']:>10.3f}{d['median']:>13.3f}{b['median'] / d['median']:>14.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
