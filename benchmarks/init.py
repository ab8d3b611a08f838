"""`ansible-playbook playbooks/init.yml` on the four real projects of tests/integration/project/test_init_projects.py
(a Vite app from npm, iniconfig's sdist from PyPI, Debian's Go uuid module, awesome-compose's flask-redis), each
run from a fresh copy with no agentbox.yaml, as a user would. No engine is used.

Prints the median wall time per project, the load average before and after, and issue 39's figure (each
<= 5 s) as met or not.

    .venv/bin/python benchmarks/init.py [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for entry in (str(REPO), str(REPO / ".collections")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from tests.integration.project.test_init_projects import PROJECTS  # noqa: E402

TARGET_S = 5.0  # issue 39: init.yml on each project


def timed_init(workspace: Path) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PWD": str(workspace)}
    argv = [str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/init.yml")]
    began = time.perf_counter()
    subprocess.run(argv, cwd=workspace, env=env, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    load_before = os.getloadavg()
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="agentbox-bench-init-") as temp:
        for kind, source in PROJECTS.items():
            times = []
            for run in range(args.runs):
                workspace = Path(shutil.copytree(source(), Path(temp) / f"{kind}-{run}",
                                                 ignore=shutil.ignore_patterns(".complete", "agentbox.yaml")))
                times.append(timed_init(workspace))
            figures[kind] = {"median_s": statistics.median(times), "max_s": max(times), "runs": len(times)}
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}")
    for kind, figure in figures.items():
        verdict = "met" if figure["median_s"] <= TARGET_S else "NOT met"
        print(f"{kind:8} median {figure['median_s']:.2f} s, max {figure['max_s']:.2f} s over {figure['runs']} runs "
              f"(<= {TARGET_S:g} s: {verdict})")
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "load": [load_before[0], load_after[0]]}, indent=2))
    return 0 if all(figure["median_s"] <= TARGET_S for figure in figures.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
