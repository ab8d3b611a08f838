"""best_of.yml's own cost: its wall time for N local boxes above the slowest agent's run and the slowest check
(issue 38; docs/best_of.md, "Figures").

  .venv/bin/python benchmarks/best_of.py [--n 4] [--agent-seconds 5] [--check-seconds 1] [--runs 1]

Each run is `ansible-playbook playbooks/best_of.yml` on a small workspace with N custom agents that each work
exactly --agent-seconds (`sleep`, then a file written) and a check that takes --check-seconds (`sleep`, then a
test), keep=none, in a private HOME on the box engine. Overhead = the playbook's wall time - the agent's own
time - the check's own time: everything best-of adds (Ansible's start, the check of the check's programs, N
creates at once, starting the agents, following their states, committing, the diff, adopting, removing the
boxes, the page). Printed with the slowest of each run's phases from result.json: its create, its agent as
best-of saw it (its own time plus the state polling's delay), its check; and the wall time of the same playbook
in check mode (Ansible's start and the module's checks, no box made).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def workspace(root: Path) -> Path:
    repo = root / "ws"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README.md").write_text("best-of benchmark\n")
    (repo / "src").mkdir()
    for i in range(50):
        (repo / "src" / f"m{i}.py").write_text(f"VALUE = {i}\n" * 20)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-qm",
                    "base"], check=True)  # fmt: skip
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "1000:1000", str(repo)], check=True)  # a developer's checkout, as in the tests
    return repo


def one_run(n: int, agent_seconds: float, check_seconds: float) -> dict[str, float]:
    scratch = Path(tempfile.mkdtemp(prefix="agentbox-bench-bo-", dir="/tmp"))
    scratch.chmod(0o755)
    home = scratch / "home"
    home.mkdir()
    repo = workspace(scratch)
    agents = [{"name": f"a{i}", "command": f"sleep {agent_seconds:g}; echo {i} > out{i}.txt"} for i in range(1, n + 1)]
    extra = {"workspace": str(repo), "task": "Write a file.", "agents": agents, "adopt": "auto", "keep": "none",
             "check": f"sleep {check_seconds:g}; test -n \"$(ls out*.txt)\""}  # fmt: skip
    env = {**os.environ, "HOME": str(home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    env.setdefault("DOCKER_HOST", "unix:///run/agentbox-engine/docker.sock")
    playbook = [str(REPO / ".venv/bin/ansible-playbook"), "playbooks/best_of.yml", "-e", json.dumps(extra)]
    try:
        # Check mode: Ansible's start and the module's checks before any box, no box made (not even the look-up's).
        started = time.monotonic()
        subprocess.run([*playbook, "--check"], cwd=REPO, env=env, capture_output=True, check=True)
        start = time.monotonic() - started
        started = time.monotonic()
        done = subprocess.run(playbook, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"best_of.yml failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
        result = json.loads(next((home / ".agentbox" / "best_of").glob("*/result.json")).read_text())
        if [r["check_rc"] for r in result["runs"]] != [0] * n:
            raise SystemExit(f"a run did not pass: {result['runs']}")
        runs = result["runs"]
        return {"wall": wall, "overhead": wall - agent_seconds - check_seconds, "start": start,
                "seen": max(r["seconds"] for r in runs), "create": max(r["create_seconds"] for r in runs),
                "check": max(r["check_seconds"] for r in runs)}  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--agent-seconds", type=float, default=5.0)
    parser.add_argument("--check-seconds", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    results = [one_run(args.n, args.agent_seconds, args.check_seconds) for _run in range(args.runs)]
    m = {key: statistics.median(r[key] for r in results) for key in results[0]}
    print(f"N={args.n} local boxes, agent {args.agent_seconds:g} s, check {args.check_seconds:g} s, runs {args.runs}")
    print(f"best_of.yml wall time                 median {m['wall']:.1f} s")
    print(f"the same playbook in check mode       median {m['start']:.1f} s   (Ansible's start, no box)")
    print(f"slowest create (N at once)            median {m['create']:.1f} s")
    print(f"slowest agent as best-of saw it       median {m['seen']:.1f} s   (its own {args.agent_seconds:g} s + polling)")
    print(f"slowest check as best-of ran it       median {m['check']:.1f} s   (its own {args.check_seconds:g} s)")
    print(f"overhead (wall - agent - check)       median {m['overhead']:.1f} s   (target <= 3 s)")
    rest = m["wall"] - m["start"] - m["create"] - m["seen"] - m["check"]
    print(f"the rest (wall - the four above)      median {rest:.1f} s   (look-up, agents' start, commit, diff, adopt, "
          "removal, page)")


if __name__ == "__main__":
    os.umask(0o022)
    main()
