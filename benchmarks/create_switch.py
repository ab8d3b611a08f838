"""Create and switch, measured side by side in one run (issue 3's targets).

  .venv/bin/python benchmarks/create_switch.py [--runs N]

Workload: an ~8 MB repository with staged, unstaged and untracked changes, warm box image.
  (a) the raw docker CLI sequence doing the same work: run, worktree add, stash apply, untracked tar
  (b) the agentbox_box task itself inside a playbook (task time from a callback; Ansible's start-up
      excluded), with the in-box start sequence off (same work as (a)) and on (what users get)
  (c) wall time of `ansible-playbook playbooks/create_box.yml` minus a trivial one-task playbook
  switch: pause one box and resume another through the module-level logic of switch_box.yml
      (_box.set_state) vs the raw docker API pair
Prints medians and ratios. Targets: (b)/(a) <= 1.3, (c) <= 1.5 s, switch <= 2x raw.
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
sys.path.insert(0, str(REPO / ".collections"))
sys.path.insert(0, str(REPO))

# Read before tests.conftest points DOCKER_HOST at the box engine: the raw yardstick's engine (RAW_DOCKER).
USER_DOCKER_HOST = os.environ.get("DOCKER_HOST", "")
# tests.conftest first: it installs Ansible's collection loader, which the collection's lazy imports need.
from tests.conftest import chown_tree, git, make_repo  # noqa: E402, I001

from ansible_collections.agentbox.box.plugins.module_utils.box import _box  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.git import _git  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _box_engine, _docker  # noqa: E402

IMAGE = "agentbox/box:latest"
# The yardstick runs where a plain `docker run` of the user's would: the user's own engine (no user
# namespace; on the box engine host root's .git, bind-mounted, is nobody's in the box, which is the point).
RAW_DOCKER = ["docker", "-H", _box_engine.user_engine_host({"DOCKER_HOST": USER_DOCKER_HOST})]
VENV = REPO / ".venv/bin"
ENV = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
TIMER_CALLBACK = '''
import json, os, time
from ansible.plugins.callback import CallbackBase
class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_timer"
    CALLBACK_NEEDS_ENABLED = True
    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start = (task.get_name(), time.monotonic())
    def _done(self, result):
        name, start = self._start
        with open(os.environ["TASK_TIMES"], "a") as out:
            out.write(json.dumps({"task": name, "seconds": time.monotonic() - start}) + "\\n")
    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_skipped = _done
'''


def workspace(root: Path) -> Path:
    """~8 MB: 200 text files and some binaries committed, then every kind of change on top."""
    files: dict[str, str | bytes] = {f"src/mod{i:03d}.py": f"# module {i}\n" + "x = 1\n" * 400 for i in range(200)}
    files.update({f"assets/blob{i}.bin": os.urandom(1024 * 1024) for i in range(6)})
    repo = make_repo(root / "ws", files)
    for i in range(0, 40):
        (repo / f"src/mod{i:03d}.py").write_text(f"# staged {i}\n")
    git(repo, "add", "src")
    for i in range(40, 80):
        (repo / f"src/mod{i:03d}.py").write_text(f"# unstaged {i}\n")
    (repo / "untracked").mkdir()
    for i in range(30):
        (repo / f"untracked/new{i}.txt").write_text("new\n" * 100)
    (repo / "untracked/big.bin").write_bytes(os.urandom(1024 * 1024))
    chown_tree(repo)
    return repo


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, **kwargs)


def raw_run(container: str, git_dir: str | None = None) -> None:
    """The raw yardstick's `docker run -d` of a box (with the host's .git bound at its path, when given)."""
    binds = ["-v", f"{git_dir}:{git_dir}"] if git_dir else []
    run([
        *RAW_DOCKER, "run", "-d", "--name", container, "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN",
        "--device", "/dev/fuse", "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        *binds, "-p", "127.0.0.1::80", IMAGE, "sleep", "infinity",
    ])


def raw_create(repo: Path, name: str) -> float:
    """The docker CLI doing the same work by hand."""
    started = time.monotonic()
    git_dir = str(repo / ".git")
    # Host git as the repo's owner (as a developer would run it), so the box user can write the .git.
    stash = _git.git_out(str(repo), "stash", "create")
    _git.git(str(repo), "update-ref", f"refs/heads/raw/{name}", "HEAD", "")
    raw_run(f"raw-{name}", git_dir)
    wt = f"/home/vscode/wt-{name}"
    run([*RAW_DOCKER, "exec", "-u", "vscode", f"raw-{name}", "git", f"--git-dir={git_dir}", "worktree", "add", "-q", wt, f"raw/{name}"])
    run([*RAW_DOCKER, "exec", "-u", "vscode", "-w", wt, f"raw-{name}", "git", "stash", "apply", "-q", "--index", stash])
    untracked = _git.git(str(repo), "ls-files", "--others", "--exclude-standard", "-z").stdout.decode()
    tar = subprocess.Popen(["tar", "-C", str(repo), "--null", "-T", "-", "-cf", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    extract = subprocess.Popen([*RAW_DOCKER, "exec", "-i", "-u", "vscode", f"raw-{name}", "tar", "-C", wt, "-xf", "-"], stdin=tar.stdout)
    tar.stdin.write(untracked.encode())
    tar.stdin.close()
    extract.wait()
    tar.wait()
    elapsed = time.monotonic() - started
    run([*RAW_DOCKER, "rm", "-f", f"raw-{name}"])
    _git.git(str(repo), "worktree", "remove", "-f", "-f", wt)
    _git.git(str(repo), "update-ref", "-d", f"refs/heads/raw/{name}")
    return elapsed


def playbook_task_time(repo: Path, name: str, boot: bool, scratch: Path, extra_env: dict | None = None) -> float:
    """The agentbox_box task's own time, from a callback, inside a one-task playbook."""
    book = scratch / "create_only.yml"
    book.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
        "    - name: create\n      agentbox.box.agentbox_box:\n"
        f"        name: {name}\n        workspace: {repo}\n        boot: {str(boot).lower()}\n"
    )
    times = scratch / "times.jsonl"
    times.unlink(missing_ok=True)
    env = {**ENV, "ANSIBLE_CALLBACK_PLUGINS": str(scratch), "ANSIBLE_CALLBACKS_ENABLED": "task_timer", "TASK_TIMES": str(times),
           **(extra_env or {})}
    run([str(VENV / "ansible-playbook"), str(book)], env=env)
    return json.loads(times.read_text().splitlines()[-1])["seconds"]


def wall(argv: list[str], cwd: Path, extra_env: dict | None = None) -> float:
    started = time.monotonic()
    run(argv, cwd=cwd, env={**ENV, **(extra_env or {})})
    return time.monotonic() - started


def destroy(name: str) -> None:
    provider = _docker.DockerProvider()
    facts = provider.find(name)
    if facts:
        _box.destroy_box(provider, facts, delete_branch=True)


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="agentbox-bench-", dir="/tmp"))
    scratch.chmod(0o755)
    (scratch / "task_timer.py").write_text(TIMER_CALLBACK)
    trivial = scratch / "trivial.yml"
    trivial.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug: msg=hi\n")
    repo = workspace(scratch)
    size = sum(f.stat().st_size for f in repo.rglob("*") if f.is_file() and ".git" not in f.parts)
    print(f"workspace: {size / 1e6:.1f} MB of files, runs: {args.runs}")
    results: dict[str, list[float]] = {k: [] for k in ("raw", "task_noboot", "task_boot", "create_play", "trivial_play")}
    for _round in range(args.runs):
        tag = secrets.token_hex(3)
        results["raw"].append(raw_create(repo, tag))
        for key, boot in (("task_noboot", False), ("task_boot", True)):
            name = f"bench-{key.split('_')[1]}-{tag}"
            results[key].append(playbook_task_time(repo, name, boot, scratch))
            destroy(name)
        name = f"bench-play-{tag}"
        results["create_play"].append(
            wall([str(VENV / "ansible-playbook"), str(REPO / "playbooks/create_box.yml"), "-e", f"box={name}"], repo, {"PWD": str(repo)})
        )
        destroy(name)
        results["trivial_play"].append(wall([str(VENV / "ansible-playbook"), str(trivial)], repo))

    # switch: two running boxes, alternate which one runs
    provider = _docker.DockerProvider()
    names = [f"bench-sw{i}-{secrets.token_hex(2)}" for i in range(2)]
    for name in names:
        _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(repo), boot=False))
    client = provider.client
    switch_module, switch_raw = [], []
    try:
        provider.pause(names[1])
        running, paused = names
        for _round in range(args.runs * 2):
            started = time.monotonic()
            _box.set_state(provider, provider.find(running), "paused")
            _box.set_state(provider, provider.find(paused), "started")
            switch_module.append(time.monotonic() - started)
            running, paused = paused, running
            started = time.monotonic()
            client.containers.get(f"agentbox-{running}").pause()
            client.containers.get(f"agentbox-{paused}").unpause()
            switch_raw.append(time.monotonic() - started)
            running, paused = paused, running
    finally:
        for name in names:
            destroy(name)

    m = {key: median(values) for key, values in results.items()}
    c = m["create_play"] - m["trivial_play"]
    print(f"(a) raw docker CLI sequence          median {m['raw']:.3f} s")
    print(f"(b) agentbox_box task, boot off       median {m['task_noboot']:.3f} s   (b)/(a) = {m['task_noboot'] / m['raw']:.2f}  target <= 1.3")
    print(f"    agentbox_box task, boot on        median {m['task_boot']:.3f} s   (dockerd + supervisor started in the box)")
    print(f"(c) create_box.yml                    median {m['create_play']:.3f} s")
    print(f"    trivial one-task playbook         median {m['trivial_play']:.3f} s   (c) = {c:.3f} s  target <= 1.5 s")
    print(f"switch via _box.set_state             median {median(switch_module) * 1000:.1f} ms")
    ratio = median(switch_module) / median(switch_raw)
    print(f"switch via raw docker API pair        median {median(switch_raw) * 1000:.1f} ms   ratio = {ratio:.2f}  target <= 2")
    subprocess.run(["rm", "-rf", str(scratch)], check=False)


if __name__ == "__main__":
    main()
