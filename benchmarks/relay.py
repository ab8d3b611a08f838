"""Relay benchmark on the real engine: a push through the relay against the same push on the host.

  1. push of 1 and of 50 new commits: `agentbox-ctl git push` timed inside the box (the agent's
     wall time: client start, relay, host git) against `git push` of the same shape of commits
     from a host clone of the same repository, to the same local bare origin; and the same push
     through `agentbox-relay-client` directly (what agentbox-ctl's own start costs);
  2. approval round trip: from the box's request until it is listed by the relay (what
     relay_approvals.yml shows), and from the user's approve until the box's command returns;
     plus the relay_approvals.yml playbook's own wall time, for reference.

    .venv/bin/python benchmarks/relay.py [--runs 7]

Pairs alternate (ours, host, ours, host...) so drift hits both sides alike; the ratio is the
median of the per-pair ratios. HOME is a short temp dir for the run (its relay is stopped at the
end) and the box is destroyed. Results: benchmarks/results/relay-<time>.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.box import _box  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_state  # noqa: E402

GIT = ["git", "-c", "safe.directory=*", "-c", "user.name=Bench", "-c", "user.email=bench@example.invalid"]
# N commits, each changing one small file, then the timed push; prints the push's nanoseconds.
IN_BOX = r"""
set -e
n=$1 token=$2 client=$3
for i in $(seq "$n"); do echo "$token $i" > "f$((i % 10))"; git add -A; git commit -q -m "c$i"; done
start=$(date +%s%N)
"$client" git push >/dev/null 2>&1
end=$(date +%s%N)
echo $((end - start))
"""


def as_owner(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run as uid 1000, the repositories' owner (as the host user would)."""
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, user=1000, group=1000,
                          env={**os.environ, "HOME": "/tmp"})


def host_push(clone: Path, commits: int, branch: str) -> float:
    for index in range(commits):
        (clone / f"f{index % 10}").write_text(f"{secrets.token_hex(4)} {index}\n")
        as_owner([*GIT, "-C", str(clone), "add", "-A"])
        as_owner([*GIT, "-C", str(clone), "commit", "-q", "-m", f"c{index}"])
    started = time.perf_counter()
    as_owner([*GIT, "-C", str(clone), "push", "-q", "origin", f"HEAD:refs/heads/{branch}"])
    return time.perf_counter() - started


def box_push(provider: DockerProvider, box: str, commits: int, client: str = "agentbox-ctl") -> float:
    run = provider.exec(box, ["sh", "-c", IN_BOX, "sh", str(commits), secrets.token_hex(4), client], workdir="/workspace",
                        env={"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x.invalid",
                             "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x.invalid"})
    run.check("the in-box push", box)
    return int(run.stdout.decode().strip().splitlines()[-1]) / 1e9


def approval_round(provider: DockerProvider, box: str) -> tuple[float, float]:
    """(ask → listed, approve → the box's command returned), in seconds."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked_at = time.perf_counter()
        asked = pool.submit(provider.exec, box, ["agentbox-ctl", "git", "push", "--as", f"bench-{secrets.token_hex(3)}"])
        while True:
            pending = _relay_state.control("list")["pending"]
            if pending:
                listed = time.perf_counter() - asked_at
                break
            time.sleep(0.002)
        approved_at = time.perf_counter()
        _relay_state.control("approve", id=pending[0]["id"])
        asked.result().check("the approved push", box)
        returned = time.perf_counter() - approved_at
    return listed, returned


def summary(samples: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(samples), 4), "min": round(min(samples), 4),
            "samples": [round(s, 4) for s in samples]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--image", default=_box.DEFAULT_IMAGE,
                        help="the box image (its in-box client): to compare trees, each with the image built from it")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="abr-b", dir="/tmp")
    os.environ["HOME"] = home
    root = Path(tempfile.mkdtemp(prefix="agentbox-relay-bench-"))
    provider = DockerProvider()
    box = f"bench-relay-{secrets.token_hex(3)}"
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False)
    results: dict[str, Any] = {"runs": args.runs, "cpus": os.cpu_count(), "load_before": list(os.getloadavg()),
                               "image": args.image, "tree": commit.stdout.strip()}
    try:
        origin = root / "hidden" / "origin.git"
        subprocess.run([*GIT, "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
        workspace = root / "ws"
        subprocess.run([*GIT, "init", "-q", "-b", "main", str(workspace)], check=True)
        (workspace / "README.md").write_text("bench\n")
        subprocess.run([*GIT, "-C", str(workspace), "add", "."], check=True)
        subprocess.run([*GIT, "-C", str(workspace), "commit", "-q", "-m", "init"], check=True)
        subprocess.run([*GIT, "-C", str(workspace), "remote", "add", "origin", str(origin)], check=True)
        subprocess.run([*GIT, "-C", str(workspace), "push", "-q", "origin", "main"], check=True)
        clone = root / "host-clone"
        subprocess.run([*GIT, "clone", "-q", str(origin), str(clone)], check=True, capture_output=True)
        subprocess.run(["chown", "-R", "1000:1000", str(root)], check=True)
        os.chmod(root, 0o755)
        _box.create_box(provider, _box.CreateRequest(name=box, workspace=str(workspace), image=args.image))
        box_push(provider, box, 1)  # warm-up: the branch exists on origin from here on
        host_push(clone, 1, "host-bench")
        for commits in (1, 50):
            ours: list[float] = []
            direct: list[float] = []
            host: list[float] = []
            for _run in range(args.runs):
                ours.append(box_push(provider, box, commits))
                # The same through the relay's client program itself, without agentbox-ctl's own start.
                direct.append(box_push(provider, box, commits, "agentbox-relay-client"))
                host.append(host_push(clone, commits, "host-bench"))
            results[f"push_{commits}"] = {
                "relay": summary(ours),
                "relay_client_direct": summary(direct),
                "host": summary(host),
                "ratio": round(statistics.median(o / h for o, h in zip(ours, host, strict=True)), 3),
                "ratio_client_direct": round(statistics.median(d / h for d, h in zip(direct, host, strict=True)), 3),
            }
        listed: list[float] = []
        returned: list[float] = []
        for _run in range(args.runs):
            seen, back = approval_round(provider, box)
            listed.append(seen)
            returned.append(back)
        results["approval_listed"] = summary(listed)
        results["approval_returned"] = summary(returned)
        env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
        started = time.perf_counter()
        subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/relay_approvals.yml")],
                       env=env, check=True, capture_output=True)
        results["relay_approvals_playbook"] = round(time.perf_counter() - started, 3)
        results["load_after"] = list(os.getloadavg())
    finally:
        provider.destroy(box)
        _relay_state.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"relay-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
