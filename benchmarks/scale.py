"""Many boxes on the local engine (issue 17): create N with playbooks/fleet_create.yml, measure, destroy.

    .venv/bin/python benchmarks/scale.py [--boxes 50] [--forks 10] [--resumes 5] [--json out.json]

1. `ansible-playbook playbooks/fleet_create.yml -e provider=docker -e count=N -f FORKS` under a fresh
   workspace (its own project, so nothing else on the engine is counted or touched): full boxes, seeded,
   in-box supervisor up. Reports boxes per minute.
2. Memory of each idle running box from the engine's cgroup figures (usage minus inactive file pages, as
   `docker stats` shows it), median over the boxes; the CPU the idle fleet uses together (cgroup CPU time
   over a 10 s window); each box's writable layer on disk (median).
3. One idle-policy pass over the N (scoped to the benchmark's project: a pass over the whole engine would
   pause other people's boxes), in check mode, then for real with `max_running: 0, include_agentless`,
   which pauses all N; then the memory of each paused box, median.
4. Time to resume one paused box (the provider's resume, median over --resumes boxes), and through the
   connection plugin (`ansible -m raw` on a paused box: process start included).
5. Destroys every box with `fleet_create.yml -e state=absent`, also on Ctrl-C or failure, then checks
   none of the project's boxes is left (and removes any that is).

HOME is a temporary directory for the whole run, so the user's ~/.agentbox (ssh aliases, pause record)
is never touched. Prints the figures and the load average before, during and after; writes JSON to
benchmarks/results/scale-<time>.json (or --json).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.agent import _agent  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.idle import _idle  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402

MIB = 1024 * 1024


def load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def mem_available_mib() -> float:
    with open("/proc/meminfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def playbook(env: dict[str, str], forks: int, *extra: str) -> subprocess.CompletedProcess:
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "playbooks/fleet_create.yml", "-e", "provider=docker",
            "-f", str(forks), *extra]  # fmt: skip
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def memory_mib(client: Any, container: str) -> float:
    """usage minus inactive file pages (cgroup v1: total_inactive_file; v2: inactive_file), one-shot."""
    figures = client.api.stats(container, stream=False, one_shot=True)["memory_stats"]
    stats = figures.get("stats", {})
    inactive = stats.get("total_inactive_file", stats.get("inactive_file", 0))
    return (figures["usage"] - inactive) / MIB


def cpu_ns(client: Any, container: str) -> int:
    return int(client.api.stats(container, stream=False, one_shot=True)["cpu_stats"]["cpu_usage"]["total_usage"])


def idle_cpu_percent(client: Any, containers: list[str], window: float) -> float:
    """CPU the idle boxes use together over `window` seconds, in % of one core (cgroup cpu usage)."""
    before = {name: cpu_ns(client, name) for name in containers}
    started = time.monotonic()
    time.sleep(window)  # a measurement window, not a synchronisation
    after = {name: cpu_ns(client, name) for name in containers}
    spent = sum(after[name] - before[name] for name in containers) / 1e9
    return round(100 * spent / (time.monotonic() - started), 1)


def median_memory(client: Any, containers: list[str]) -> float:
    return round(statistics.median(memory_mib(client, name) for name in containers), 1)


def make_workspace(root: Path) -> Path:
    workspace = root / "ws"
    workspace.mkdir()
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "scale benchmark"]):
        if argv[0] == "add":
            (workspace / "README.md").write_text("scale benchmark\n")
        subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *argv],
                       cwd=workspace, check=True)  # fmt: skip
    if os.geteuid() == 0:  # the box user shares .git, as with a developer's checkout
        subprocess.run(["chown", "-R", "1000:1000", str(workspace)], check=True)
    return workspace


def run(args: argparse.Namespace, env: dict[str, str], workspace: Path, prefix: str, figures: dict) -> None:
    import docker

    client = docker.from_env()
    provider = DockerProvider()
    project = _naming.project_id(_naming.workspace_path(str(workspace)))
    figures["project"] = project
    base = ["-e", f"count={args.boxes}", "-e", f"prefix={prefix}", "-e", f"workspace={workspace}"]

    figures["load_before"] = load()
    figures["mem_available_before_mib"] = round(mem_available_mib())
    started = time.monotonic()
    made = playbook(env, args.forks, *base)
    elapsed = time.monotonic() - started
    figures["load_after_create"] = load()
    if made.returncode != 0:
        raise RuntimeError("fleet_create.yml failed:\n" + made.stdout[-3000:] + made.stderr[-2000:])
    boxes = list(provider.list_boxes(project=project))
    running = sorted(facts.container for facts in boxes if facts.state == "running")
    if len(running) != args.boxes:
        raise RuntimeError(f"{len(running)} of {args.boxes} boxes running after fleet_create.yml")
    # Seeded and booted: each box's supervisor answers (one exec each, side by side).
    answers = _agent.each_box(provider, [facts.name for facts in boxes],
                              lambda name: provider.exec(name, ["agentbox-ctl", "status"], timeout=60).rc)  # fmt: skip
    figures["supervisors_up"] = sum(1 for rc in answers.values() if rc == 0)
    if figures["supervisors_up"] != args.boxes:
        raise RuntimeError(f"the supervisor answers in {figures['supervisors_up']} of {args.boxes} boxes: {answers}")
    figures["create_seconds"] = round(elapsed, 1)
    figures["boxes_per_minute"] = round(args.boxes / elapsed * 60, 1)
    print(f"created {args.boxes} boxes in {elapsed:.1f} s: {figures['boxes_per_minute']} boxes/min "
          f"(load {figures['load_after_create']})", flush=True)  # fmt: skip

    figures["idle_running_mib"] = median_memory(client, running)
    figures["mem_available_with_boxes_mib"] = round(mem_available_mib())
    figures["idle_fleet_cpu_percent_of_one_core"] = idle_cpu_percent(client, running, 10.0)
    sized = client.api.containers(all=True, size=True, filters={"label": f"{_naming.label('project')}={project}"})
    figures["disk_rw_mib_median"] = round(statistics.median(entry.get("SizeRw", 0) for entry in sized) / MIB, 1)
    print(f"idle running box: {figures['idle_running_mib']} MiB (median of {len(running)}); "
          f"MemAvailable {figures['mem_available_before_mib']} -> {figures['mem_available_with_boxes_mib']} MiB; "
          f"the idle fleet uses {figures['idle_fleet_cpu_percent_of_one_core']}% of one core; "
          f"writable layer {figures['disk_rw_mib_median']} MiB (median)", flush=True)  # fmt: skip

    state_file = str(Path(env["HOME"]) / "paused.json")
    settings = {"max_running": 0, "idle_minutes": 0, "include_agentless": True}
    started = time.monotonic()
    checked = _idle.run_pass(provider, settings, project=project, state_file=state_file, check_mode=True)
    figures["policy_pass_check_seconds"] = round(time.monotonic() - started, 2)
    if len(checked["paused"]) != args.boxes:
        raise RuntimeError(f"check mode would pause {len(checked['paused'])} of {args.boxes}: {checked['boxes']}")
    started = time.monotonic()
    done = _idle.run_pass(provider, settings, project=project, state_file=state_file)
    figures["policy_pass_real_seconds"] = round(time.monotonic() - started, 2)
    figures["load_after_policy"] = load()
    if len(done["paused"]) != args.boxes or done["errors"]:
        raise RuntimeError(f"the pass paused {len(done['paused'])} of {args.boxes}: {done['errors']}")
    print(f"policy pass over {args.boxes}: check {figures['policy_pass_check_seconds']} s, "
          f"real (pauses all) {figures['policy_pass_real_seconds']} s", flush=True)  # fmt: skip

    figures["paused_mib"] = median_memory(client, running)
    print(f"paused box: {figures['paused_mib']} MiB (median)", flush=True)

    names = sorted(facts.name for facts in boxes)
    resumes = []
    for name in names[: max(1, min(args.resumes, len(names) - 1))]:
        started = time.monotonic()
        provider.resume(name)
        resumes.append(time.monotonic() - started)
    figures["resume_seconds_median"] = round(statistics.median(resumes), 3)
    last = names[-1]  # still paused: a task through the connection plugin wakes it
    started = time.monotonic()
    woke = subprocess.run([str(REPO / ".venv/bin/ansible"), "all", "-i", f"{last},", "-c", "agentbox.box.box",
                           "-m", "raw", "-a", "true"], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip
    figures["resume_via_connection_plugin_seconds"] = round(time.monotonic() - started, 2)
    if woke.returncode != 0:
        raise RuntimeError("the connection plugin did not wake a paused box: " + woke.stdout[-2000:])
    print(f"resume one box: {figures['resume_seconds_median']} s (provider, median of {len(resumes)}); "
          f"a raw task through the connection plugin on a paused box: "
          f"{figures['resume_via_connection_plugin_seconds']} s", flush=True)  # fmt: skip
    provider.close()


def destroy(env: dict[str, str], forks: int, count: int, prefix: str, workspace: Path) -> list[str]:
    """Remove the fleet; whatever is still there afterwards is removed by label. The names left over."""
    playbook(env, forks, "-e", f"count={count}", "-e", f"prefix={prefix}", "-e", f"workspace={workspace}",
             "-e", "state=absent")  # fmt: skip
    import docker

    client = docker.from_env()
    project = _naming.project_id(_naming.workspace_path(str(workspace)))
    left = client.containers.list(all=True, filters={"label": f"{_naming.label('project')}={project}"})
    for container in left:
        container.remove(force=True, v=True)
    return [container.name for container in left]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=50)
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--resumes", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.boxes < 2:
        parser.error("--boxes must be 2 or more")
    # SIGTERM ends the run like Ctrl-C, so the boxes are destroyed either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    scratch = Path(tempfile.mkdtemp(prefix="abscale-", dir="/tmp"))
    scratch.chmod(0o755)  # the workspace is read as the box user too
    home = scratch / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    os.environ["HOME"] = str(home)  # the in-process pass and provider too
    prefix = f"scale-{secrets.token_hex(3)}"
    workspace = make_workspace(scratch)
    figures: dict[str, Any] = {"boxes": args.boxes, "forks": args.forks, "cpus": os.cpu_count(),
                               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    status = 0
    try:
        run(args, env, workspace, prefix, figures)
    except (KeyboardInterrupt, RuntimeError) as exc:
        print(f"stopped: {exc or 'interrupted'}", file=sys.stderr)
        figures["error"] = str(exc) or "interrupted"
        status = 1
    finally:
        started = time.monotonic()
        left = destroy(env, args.forks, args.boxes, prefix, workspace)
        figures["destroy_seconds"] = round(time.monotonic() - started, 1)
        figures["load_after"] = load()
        if left:
            print(f"removed by label after the playbook: {left}", file=sys.stderr)
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    out = Path(args.json) if args.json else REPO / "benchmarks" / "results" / f"scale-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
