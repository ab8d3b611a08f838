"""Remote Docker engines over SSH: what a box costs there compared with the local engine.

Starts two engine hosts (containers with sshd + dockerd, reached through 127.0.0.1 ports, see
tests/integration/support/engines.py), then measures:
  1. image transfer to an engine: `docker save | docker load` over SSH, raw and gzip-compressed
     (seconds, bytes), and the 'present' check afterwards;
  2. per-box create time (seeded workspace with uncommitted changes, boot sequence included):
     local engine vs remote engine, median of --runs;
  3. six boxes over the two engines with playbooks/fleet_create.yml: -f 6 (forks) vs -f 1.
Everything it starts is removed at the end, also on failure.

    .venv/bin/python benchmarks/remote.py [--runs 3] [--boxes 6] [--skip-fleet] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
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

from ansible_collections.agentbox.box.plugins.module_utils.box import _box  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image_transfer  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402
from tests.integration.support.engines import EngineFleet  # noqa: E402

IMAGE = "agentbox/box:latest"
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=GIT_ENV)


def make_workspace(root: Path) -> Path:
    """A modest project: 300 files over 30 commits, plus modified, staged and untracked files."""
    repo = root / "bench-workspace"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for commit in range(30):
        for index in range(10):
            path = repo / f"src/pkg{index}/mod{commit}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# module {commit}.{index}\n" + "x = 1\n" * 200)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {commit}")
    (repo / "src/pkg0/mod0.py").write_text("changed\n")
    (repo / "src/pkg1/mod1.py").write_text("staged\n")
    git(repo, "add", "src/pkg1/mod1.py")
    (repo / "notes.md").write_text("untracked\n" * 100)
    return repo


def timed_create(provider: DockerProvider, workspace: Path, boot: bool = True) -> float:
    name = f"bench-{secrets.token_hex(3)}"
    started = time.monotonic()
    created = _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(workspace), boot=boot))
    seconds = time.monotonic() - started
    _box.destroy_box(provider, created.facts, delete_branch=True)
    return seconds


def fleet_run(fleet: EngineFleet, workspace: Path, boxes: int, forks: int, state: str = "started") -> float:
    inventory = Path(fleet.dir) / "engines.yml"
    inventory.write_text("engines:\n  hosts:\n" + "".join(f"    {e.alias}: {{}}\n" for e in fleet.engines))
    started = time.monotonic()
    done = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), "playbooks/fleet_create.yml",
         "-f", str(forks), "-e", f"count={boxes}", "-e", f"workspace={workspace}", "-e", "prefix=bench-fleet",
         "-e", f"state={state}"],
        cwd=REPO, env={**os.environ, **fleet.env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"fleet_create.yml failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="creates per series (median reported)")
    parser.add_argument("--boxes", type=int, default=6, help="boxes in the fleet comparison")
    parser.add_argument("--skip-fleet", action="store_true", help="skip the forks vs one-by-one comparison")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    results: dict = {"runs": args.runs, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="agentbox-bench-") as scratch, EngineFleet(count=2, tmpfs_size="3g") as fleet:
        workspace = make_workspace(Path(scratch))
        engines = [DockerProvider(engine=e.alias, ssh_options={}, isolation="none") for e in fleet.engines]

        print("== image transfer (docker save | docker load over SSH)")
        for provider, compress in ((engines[0], False), (engines[1], True)):
            report = _image_transfer.ensure_image(provider, IMAGE, compress=compress)
            key = "gzip" if compress else "raw"
            results[f"transfer_{key}"] = report.to_dict()
            print(f"  {key:5s}: {report.path}, image {report.image_bytes / 1e6:.0f} MB, sent {report.bytes_sent / 1e6:.0f}"
                  f" MB in {report.seconds:.1f} s ({report.bytes_sent / 1e6 / report.seconds:.1f} MB/s on the link)")  # fmt: skip
        present = _image_transfer.ensure_image(engines[0], IMAGE)
        results["transfer_present_seconds"] = present.seconds
        print(f"  present check: {present.seconds * 1000:.0f} ms")

        print(f"== per-box create, median of {args.runs} (seeded with carry-over, boot included)")
        local = DockerProvider(engine="local")
        series = {
            "local": [timed_create(local, workspace) for _round in range(args.runs)],
            "remote": [timed_create(engines[0], workspace) for _round in range(args.runs)],
            "local_no_boot": [timed_create(local, workspace, boot=False) for _round in range(args.runs)],
            "remote_no_boot": [timed_create(engines[0], workspace, boot=False) for _round in range(args.runs)],
        }
        medians = {name: statistics.median(values) for name, values in series.items()}
        results["create_seconds"] = series
        results["create_median"] = medians
        for name, value in medians.items():
            print(f"  {name:15s} {value:6.2f} s   (runs: {', '.join(f'{v:.2f}' for v in series[name])})")
        print(f"  remote / local: {medians['remote'] / medians['local']:.2f}x with boot, "
              f"{medians['remote_no_boot'] / medians['local_no_boot']:.2f}x without")  # fmt: skip

        if not args.skip_fleet:
            print(f"== {args.boxes} boxes over 2 engines with playbooks/fleet_create.yml")
            fleet_results = {}
            for forks in (args.boxes, 1):
                fleet_results[f"forks_{forks}"] = fleet_run(fleet, workspace, args.boxes, forks)
                fleet_run(fleet, workspace, args.boxes, args.boxes, state="absent")
                print(f"  -f {forks}: {fleet_results[f'forks_{forks}']:.1f} s")
            ratio = fleet_results["forks_1"] / fleet_results[f"forks_{args.boxes}"]
            fleet_results["speedup"] = ratio
            results["fleet"] = fleet_results
            print(f"  one by one / forks: {ratio:.2f}x")
        for engine in fleet.engines:
            left = engine.agentbox_objects()
            if left:
                print(f"  warning: {engine.alias} still has {left}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
