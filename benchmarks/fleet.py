"""Fleet benchmark: the agentbox.box.box connection plugin against community.docker's `docker`
and `docker_api` connection plugins and the `local` floor, on the same containers; and
`ansible-inventory --list` of the boxes inventory over 100 boxes (cold and warm cache) against an
empty inventory. The inventory runs under a HOME of its own whose relay record
(~/.agentbox/relay/agents.json) holds a fresh read of every box, as a relay serving them would keep it.

    .venv/bin/python benchmarks/fleet.py [--sizes 10 30] [--runs 3] [--inventory-boxes 100]
        [--modes defaults pipelining] [--ops command copy] [--skip-connection] [--skip-inventory]

The containers are plain labelled containers (`sleep infinity` from agentbox/box:latest with the
io.agentbox.* labels) on the box engine, where boxes live (AGENTBOX_ENGINE, default
unix:///run/agentbox-engine/docker.sock; every plugin and the docker CLI reach it through DOCKER_HOST), not
seeded boxes: creating 30-100 full boxes is heavy on a small machine,
and neither the connection plugins nor the inventory look at the workspace. community.docker
comes from PyPI's `ansible` package, installed into benchmarks/.venv-community (used only here);
every run uses the checkout's own ansible-core, so only the plugins differ.

Prints median wall times and ratios; writes them to benchmarks/results/fleet-<time>.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
COMMUNITY_VENV = REPO / "benchmarks" / ".venv-community"
ANSIBLE_PACKAGE = "ansible==12.3.0"  # ships community.docker 4.x/5.x for ansible-core 2.19
IMAGE = "agentbox/box:latest"
BOX_ENGINE = os.environ.get("AGENTBOX_ENGINE") or "unix:///run/agentbox-engine/docker.sock"
PREFIX = "benchfleet"
FORKS = "10"
# label -> connection plugin; "agentbox" goes through the boxes inventory plugin (how it is used),
# "agentbox-ini" through the same static INI file as the others.
PLUGINS = {
    "agentbox": "agentbox.box.box",
    "agentbox-ini": "agentbox.box.box",
    "docker": "community.docker.docker",
    "docker_api": "community.docker.docker_api",
    "local": "local",
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def community_collections() -> Path:
    """site-packages of the benchmark venv (its ansible_collections holds community.docker)."""
    python = COMMUNITY_VENV / "bin" / "python"
    if not python.exists():
        log(f"creating {COMMUNITY_VENV} with {ANSIBLE_PACKAGE} (once)")
        subprocess.run([sys.executable, "-m", "venv", str(COMMUNITY_VENV)], check=True)
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip())
    if not (site / "ansible_collections" / "community" / "docker").is_dir():
        log(f"installing {ANSIBLE_PACKAGE} into {COMMUNITY_VENV}")
        subprocess.run([str(python), "-m", "pip", "install", "-q", ANSIBLE_PACKAGE], check=True)
    return site


def run_env(community_site: Path, pipelining: bool | None) -> dict[str, str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    env["ANSIBLE_COLLECTIONS_PATH"] = f"{REPO / '.collections'}:{community_site}"
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env.pop("ANSIBLE_PIPELINING", None)
    if pipelining is not None:
        env["ANSIBLE_PIPELINING"] = "true" if pipelining else "false"
    return env


# -- containers ---------------------------------------------------------------------------------
def create_containers(names: list[str], project: str) -> dict[str, str]:
    """Start the containers; {name: box id}."""
    ids = {name: uuid.uuid4().hex[:8] for name in names}

    def one(name: str) -> None:
        labels = {
            "kind": "box", "box": name, "id": ids[name], "project": project,
            "workspace": f"/bench/{project}", "branch": f"agentbox/{name}", "created": "2026-11-29T00:00:00Z",
            "image_fingerprint": "bench", "provider": "docker", "engine": "local", "base_branch": "main",
        }  # fmt: skip
        argv = ["docker", "run", "-d", "--name", f"agentbox-{name}", "--hostname", f"agentbox-{name}"]
        for key, value in labels.items():
            argv += ["--label", f"io.agentbox.{key}={value}"]
        argv += ["--entrypoint", "sleep", IMAGE, "infinity"]
        subprocess.run(argv, capture_output=True, check=True)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, names))
    return ids


def remove_containers(names: list[str]) -> None:
    for start in range(0, len(names), 20):
        batch = [f"agentbox-{name}" for name in names[start : start + 20]]
        subprocess.run(["docker", "rm", "-f", "-v", *batch], capture_output=True, check=False)


# -- connection benchmark -----------------------------------------------------------------------
def write_inventory(work: Path, label: str, names: list[str], plugin: str) -> Path:
    if label == "agentbox":
        path = work / f"{label}-{len(names)}.agentbox.yml"
        config = {
            "plugin": "agentbox.box.boxes",
            "include": names,
            "compose": {"ansible_python_interpreter": "'/usr/bin/python3'"},
        }
        path.write_text(json.dumps(config))
        return path
    path = work / f"{label}-{len(names)}.ini"
    lines = ["[fleet]"]
    for name in names:
        if plugin == "agentbox.box.box":
            lines.append(f"{name} agentbox_box={name}")
        elif plugin == "local":
            lines.append(f"{name} ansible_python_interpreter={VENV_BIN / 'python'}")
        elif plugin == "community.docker.docker_api":
            # This plugin takes the engine from its own variable, not DOCKER_HOST.
            lines.append(f"{name} ansible_host=agentbox-{name} ansible_docker_docker_host={os.environ['DOCKER_HOST']}")
        else:
            lines.append(f"{name} ansible_host=agentbox-{name}")
    lines += ["", "[fleet:vars]", f"ansible_connection={plugin}"]
    if plugin != "local":
        # No interpreter discovery for anyone: the floor has none either.
        lines.append("ansible_python_interpreter=/usr/bin/python3")
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and controller CPU seconds (user+sys, children included) of one run; a failed
    run is tried once more, then counted as NaN (and said)."""
    for attempt in range(2):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if result.returncode == 0:
            return elapsed, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        failed = [line.strip() for line in result.stdout.splitlines()
                  if "FAILED" in line or "UNREACHABLE" in line or '"msg"' in line or "msg:" in line]  # fmt: skip
        log(f"run {attempt + 1} of {' '.join(argv[1:4])} failed (rc {result.returncode}): {failed[:4]}")
    return float("nan"), float("nan")


MODES = {"defaults": None, "pipelining": True}
OPS = ("command", "copy")


def bench_connections(
    sizes: list[int], runs: int, names: list[str], site: Path, work: Path,
    modes: tuple[str, ...] = tuple(MODES), ops: tuple[str, ...] = OPS,
) -> list[dict]:
    """Runs are interleaved (run 1 of every plugin, then run 2...), so a change in the machine's
    load during the benchmark lands on all plugins alike instead of on whichever ran then."""
    payload = work / "payload-1mb.bin"
    payload.write_bytes(os.urandom(1 << 20))
    results = []
    for size in sizes:
        hosts = names[:size]
        for mode in modes:
            pipelining = MODES[mode]
            env = run_env(site, pipelining)
            commands = {
                label: [str(VENV_BIN / "ansible"), "-i", str(write_inventory(work, label, hosts, plugin)), "all", "-f", FORKS]
                for label, plugin in PLUGINS.items()
            }  # fmt: skip
            for ansible in commands.values():
                # One warm-up run each: page cache, first exec in each container.
                timed([*ansible, "-m", "command", "-a", "true"], env)
            measured: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
            for attempt in range(runs):
                for label, ansible in commands.items():
                    dest = f"/tmp/bench-copy-{uuid.uuid4().hex[:6]}-{attempt}-{{{{ inventory_hostname }}}}.bin"
                    cases = {
                        "command": ("command true", ["-m", "command", "-a", "true"]),
                        "copy": ("copy 1 MB", ["-m", "copy", "-a", f"src={payload} dest={dest} mode=0644"]),
                    }
                    for op, args in (cases[name] for name in ops):
                        wall, cpu_seconds = timed([*ansible, *args], env)
                        times, cpu = measured.setdefault((label, op), ([], []))
                        times.append(wall)
                        cpu.append(cpu_seconds)
            for (label, op), (times, cpu) in measured.items():
                results.append(
                    {"boxes": size, "mode": mode, "plugin": label, "op": op,
                     "median_s": round(statistics.median(times), 3), "runs_s": [round(t, 3) for t in times],
                     "median_cpu_s": round(statistics.median(cpu), 3)}
                )  # fmt: skip
                log(
                    f"{size:3d} boxes  {mode:10s}  {op:12s}  {label:12s}  {statistics.median(times):6.2f} s wall"
                    f"  {statistics.median(cpu):6.2f} s cpu"
                )
        subprocess.run(["sh", "-c", "rm -f /tmp/bench-copy-*"], check=False)
    return results


def connection_table(results: list[dict], key: str = "median_s") -> list[str]:
    lines = [f"{'boxes':>5}  {'mode':10}  {'op':12}  {'agentbox':>8}  {'(ini)':>6}  {'docker':>7}  {'docker_api':>10}  "
             f"{'local':>6}  {'vs best community':>17}  {'vs local':>8}"]  # fmt: skip
    keys = sorted({(r["boxes"], r["mode"], r["op"]) for r in results})
    for size, mode, op in keys:
        by = {r["plugin"]: r[key] for r in results if (r["boxes"], r["mode"], r["op"]) == (size, mode, op)}
        best = min(by["docker"], by["docker_api"])
        lines.append(
            f"{size:>5}  {mode:10}  {op:12}  {by['agentbox']:>8.2f}  {by['agentbox-ini']:>6.2f}  {by['docker']:>7.2f}  "
            f"{by['docker_api']:>10.2f}  "
            f"{by['local']:>6.2f}  {by['agentbox'] / best:>16.3f}x  {by['agentbox'] / by['local']:>7.3f}x"
        )
    return lines


# -- inventory benchmark ------------------------------------------------------------------------
def write_relay_record(home: Path, ids: dict[str, str]) -> None:
    """What a relay serving these boxes keeps after a pass: each box read just now, its agent idle."""
    boxes = {
        box_id: {"name": name, "provider": "docker", "engine": "local", "read": time.time(),
                 "agent": {"name": "claude", "session": "claude", "state": "idle", "since": "2026-11-29T00:00:00Z",
                           "quiet_seconds": 5}}
        for name, box_id in ids.items()
    }  # fmt: skip
    record = home / ".agentbox" / "relay" / "agents.json"
    record.parent.mkdir(parents=True, mode=0o700)
    record.write_text(json.dumps({"version": 1, "written": time.time(), "interval": 3600, "boxes": boxes}))


def bench_inventory(runs: int, site: Path, work: Path, ids: dict[str, str]) -> list[dict]:
    home = work / "home"
    write_relay_record(home, ids)
    env = {**run_env(site, None), "HOME": str(home)}
    cache_dir = work / "inventory-cache"
    configs = {
        "empty": "plugin: agentbox.box.boxes\nlocal: false\n",
        "100 boxes, no cache": f"plugin: agentbox.box.boxes\ninclude: ['{PREFIX}-*']\n",
        "100 boxes, warm cache": (
            f"plugin: agentbox.box.boxes\ninclude: ['{PREFIX}-*']\ncache: true\n"
            f"cache_plugin: ansible.builtin.jsonfile\ncache_connection: {cache_dir}\ncache_timeout: 3600\n"
        ),
    }
    results = []
    paths = {}
    for index, (label, text) in enumerate(configs.items()):
        path = paths[label] = work / f"case{index}.agentbox.yml"
        path.write_text(text)
        argv = [str(VENV_BIN / "ansible-inventory"), "-i", str(path), "--list"]
        timed(argv, env)  # warm-up, and fills the cache for the warm case
        times = [timed(argv, env)[0] for _run in range(max(runs, 5))]
        results.append(
            {"case": label, "median_s": round(statistics.median(times), 3), "runs_s": [round(t, 3) for t in times]}
        )
        log(f"inventory  {label:24s}  {statistics.median(times):6.2f} s")
    listed = subprocess.run(
        [str(VENV_BIN / "ansible-inventory"), "-i", str(paths["100 boxes, no cache"]), "--list"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    hosts = json.loads(listed.stdout)["_meta"]["hostvars"]
    results.append({"case": "hosts listed", "count": len(hosts)})
    states = sorted({str(host.get("agentbox_agent_state")) for host in hosts.values()})
    results.append({"case": "agent states listed", "states": states})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per case (median reported)")
    parser.add_argument("--inventory-boxes", type=int, default=100)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--ops", nargs="+", choices=list(OPS), default=list(OPS))
    parser.add_argument("--skip-connection", action="store_true")
    parser.add_argument("--skip-inventory", action="store_true")
    args = parser.parse_args()
    # A SIGTERM must still remove the containers (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Boxes live on the box engine: the containers go there, and every plugin reaches them there.
    os.environ["DOCKER_HOST"] = BOX_ENGINE

    site = community_collections()
    total = max([*args.sizes, 0] if args.skip_inventory else [*args.sizes, args.inventory_boxes])
    names = [f"{PREFIX}-{index:03d}" for index in range(total)]
    project = uuid.uuid4().hex[:16]
    report: dict = {"machine": {"cpus": os.cpu_count()}, "containers": "plain labelled containers (sleep infinity)"}
    with tempfile.TemporaryDirectory(prefix="agentbox-bench-") as tmp:
        work = Path(tmp)
        try:
            # Only as many containers as the largest connection case while it runs: the boxes
            # inventory lists every box of the engine, so extra ones would be charged to it.
            made = 0 if args.skip_connection else max(args.sizes)
            ids: dict[str, str] = {}
            if not args.skip_connection:
                log(f"creating {made} containers")
                ids.update(create_containers(names[:made], project))
                report["connection"] = bench_connections(args.sizes, args.runs, names, site, work, tuple(args.modes), tuple(args.ops))
            if not args.skip_inventory:
                # The inventory sees exactly --inventory-boxes of ours.
                remove_containers(names[args.inventory_boxes :])
                if made < args.inventory_boxes:
                    log(f"creating {args.inventory_boxes - made} more containers")
                    ids.update(create_containers(names[made : args.inventory_boxes], project))
                report["inventory"] = bench_inventory(args.runs, site, work, ids)
        finally:
            log("removing the containers")
            remove_containers(names)
    if "connection" in report:
        print("Median wall time (s):")
        print("\n".join(connection_table(report["connection"])))
        print("Median controller CPU time, user+sys (s):")
        print("\n".join(connection_table(report["connection"], "median_cpu_s")))
    if "inventory" in report:
        cases = {r["case"]: r for r in report["inventory"]}
        empty = cases["empty"]["median_s"]
        for case in ("100 boxes, no cache", "100 boxes, warm cache"):
            median = cases[case]["median_s"]
            print(
                f"ansible-inventory --list  {case:22s}  {median:.2f} s  ({median - empty:+.2f} s vs empty {empty:.2f} s)"
            )
        print(f"hosts listed: {cases['hosts listed']['count']}, agent states: {cases['agent states listed']['states']}")
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"fleet-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2))
    log(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
