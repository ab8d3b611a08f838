"""Checkpoint benchmark, on one box with 100 MB of added files (2,000 incompressible files of 50 KiB
under /workspace/node_modules), on the real engine:

  1. layered capture (our capture, cleanup excluded) vs a raw `docker commit` of the same container;
     the in-box cleanup is timed on its own;
  2. flattened capture vs a raw `docker export | docker import` of the same container;
  3. restore-to-ready (a new box from the layered checkpoint, seeded and merged) vs a fresh create.

    .venv/bin/python benchmarks/checkpoint.py [--runs 3] [--megabytes 100]

Runs alternate (ours, raw, ours, raw...) so drift hits both sides alike. Prints medians and ratios
and writes them to benchmarks/results/checkpoint-<time>.json. HOME is a temp dir for the run, and
every box, image and temp dir made is removed at the end.
"""

from __future__ import annotations

import argparse
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
from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402

IMAGE = "agentbox/box:latest"
GIT = ["git", "-c", "safe.directory=*", "-c", "user.name=Bench", "-c", "user.email=bench@example.invalid"]
FILL = """
import os, sys
total, size = int(sys.argv[1]) * 1024 * 1024, 50 * 1024
for index in range(total // size):
    directory = f"/workspace/node_modules/pkg{index // 100:03d}"
    os.makedirs(directory, exist_ok=True)
    with open(f"{directory}/f{index:05d}.bin", "wb") as handle:
        handle.write(os.urandom(size))
"""


def timed(action) -> tuple[float, Any]:
    started = time.perf_counter()
    value = action()
    return time.perf_counter() - started, value


def docker_cli(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True)


def workspace(root: Path) -> Path:
    path = root / "ws"
    path.mkdir()
    for args in (("init", "-q", "-b", "main"),):
        subprocess.run([*GIT, "-C", str(path), *args], check=True)
    (path / ".gitignore").write_text("node_modules/\n")
    (path / "app.js").write_text("console.log(1)\n")
    subprocess.run([*GIT, "-C", str(path), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-q", "-m", "init"], check=True)
    # A tracked edit in progress (also works around `git stash create` exiting 1 on a clean tree).
    (path / "app.js").write_text("console.log(2)\n")
    subprocess.run(["chown", "-R", "1000:1000", str(path)], check=True)
    return path


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(samples), 3),
        "min": round(min(samples), 3),
        "samples": [round(s, 3) for s in samples],
    }


def paired(ours: list[float], theirs: list[float]) -> float:
    """Median of per-run ratios: each pair ran back to back, so load swings hit both sides."""
    return round(statistics.median(a / b for a, b in zip(ours, theirs, strict=True)), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=100)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="agentbox-bench-ckpt-"))
    root.chmod(0o755)
    os.environ["HOME"] = str(root / "home")
    provider = DockerProvider()
    client = provider.client
    tag = secrets.token_hex(3)
    boxes: list[str] = []
    images: list[str] = []
    project = ""
    results: dict[str, Any] = {"megabytes": args.megabytes, "runs": args.runs, "cpus": os.cpu_count()}
    results["load_before"] = [round(x, 2) for x in os.getloadavg()]
    try:
        ws = workspace(root)
        project = _naming.project_id(str(ws))
        source = f"bench-{tag}-src"
        boxes.append(source)
        _box.create_box(provider, _box.CreateRequest(name=source, workspace=str(ws), image=IMAGE))
        provider.exec(source, ["python3", "-c", FILL, str(args.megabytes)]).check("filling the box", source)
        container = client.containers.get(_naming.container_name(source))

        layered, raw_commit, cleanup = [], [], []
        flattened, raw_export_import = [], []
        for run in range(args.runs):
            seconds, _result = timed(lambda: _checkpoint.run_cleanup(provider, source))
            cleanup.append(seconds)
            plan = _checkpoint.plan_capture(provider, provider.find(source), f"layered-{run}")
            seconds, made = timed(lambda plan=plan: _checkpoint.capture(provider, plan, cleanup=False))
            layered.append(seconds)
            images.append(made["image"])
            raw = f"agentbox-bench-raw-{tag}:commit-{run}"
            seconds, _result = timed(lambda raw=raw: docker_cli("commit", container.name, raw))
            raw_commit.append(seconds)
            images.append(raw)

        for run in range(args.runs):
            plan = _checkpoint.plan_capture(provider, provider.find(source), f"flat-{run}", merged=True)
            seconds, made = timed(lambda plan=plan: _checkpoint.capture(provider, plan, cleanup=False))
            flattened.append(seconds)
            images.append(made["image"])
            raw = f"agentbox-bench-raw-{tag}:flat-{run}"
            pipeline = f"docker export {container.name} | docker import - {raw} >/dev/null"
            seconds, _result = timed(lambda pipeline=pipeline: subprocess.run(["sh", "-c", pipeline], check=True))
            raw_export_import.append(seconds)
            images.append(raw)

        restore, fresh = [], []
        for run in range(args.runs):
            name = f"bench-{tag}-r{run}"
            boxes.append(name)
            request = _box.CreateRequest(name=name, workspace=str(ws), image=IMAGE, checkpoint="layered-0")
            seconds, _result = timed(lambda request=request: _box.create_box(provider, request))
            restore.append(seconds)
            check = provider.exec(name, ["sh", "-c", "ls /workspace/node_modules/pkg000 | wc -l"]).text.strip()
            assert check == "100", f"restored box lacks the warm tree: {check}"
            name = f"bench-{tag}-f{run}"
            boxes.append(name)
            request = _box.CreateRequest(name=name, workspace=str(ws), image=IMAGE)
            seconds, _result = timed(lambda request=request: _box.create_box(provider, request))
            fresh.append(seconds)

        results.update(
            cleanup=summary(cleanup),
            layered=summary(layered),
            raw_commit=summary(raw_commit),
            flattened=summary(flattened),
            raw_export_import=summary(raw_export_import),
            restore_to_ready=summary(restore),
            fresh_create=summary(fresh),
        )
        results["load_after"] = [round(x, 2) for x in os.getloadavg()]
        results["ratios"] = {
            "layered_vs_raw_commit": paired(layered, raw_commit),
            "flattened_vs_raw_export_import": paired(flattened, raw_export_import),
            "restore_vs_fresh_create": paired(restore, fresh),
        }
        out_dir = REPO / "benchmarks" / "results"
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"checkpoint-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps(results, indent=2))
        print(f"| measurement ({args.megabytes} MB added, {args.runs} runs) | median s | min s |")
        print("|---|---|---|")
        for key in ("cleanup", "layered", "raw_commit", "flattened", "raw_export_import"):
            print(f"| {key} | {results[key]['median']} | {results[key]['min']} |")
        for key in ("restore_to_ready", "fresh_create"):
            print(f"| {key} | {results[key]['median']} | {results[key]['min']} |")
        for key, value in results["ratios"].items():
            print(f"| ratio {key} (median of paired runs) | {value}x | |")
        print(f"load average before/after: {results['load_before']} / {results['load_after']}")
        print(f"written to {out}")
        return 0
    finally:
        for box in boxes:
            facts = provider.find(box)
            if facts is not None:
                _box.destroy_box(provider, facts, delete_branch=True)
        for image in images:
            try:
                client.images.remove(image, force=True)
            except Exception:  # noqa: BLE001 - best effort: the rest must still go
                pass
        if project:
            for image in client.images.list(filters={"label": f"io.agentbox.project={project}"}):
                try:
                    client.images.remove(image.id, force=True)
                except Exception:  # noqa: BLE001
                    pass
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
