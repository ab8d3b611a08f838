"""Starting a coding agent, measured side by side in one run (issue 14's targets).

  .venv/bin/python benchmarks/agent.py [--runs N]

(a) `ansible-playbook playbooks/agent.yml` on a running box, from no session to the tmux session
    running Claude Code, minus a trivial one-task playbook run alternately with it; compared with the
    CLI's own start time measured alone in the box (`claude --version` as vscode, through docker exec).
    Target: (a) <= 0.5 s + the CLI's start time.
(b) `create_box.yml -e agent=claude` minus `create_box.yml` alone, alternated (each box destroyed
    before the next run). Target: <= 0.6 s.
Also the agent task's own time inside each playbook (a callback; Ansible's start-up and the other
tasks excluded), which load on the machine disturbs far less than wall times.
Prints medians. The box's API is never reached: with no credentials the CLI waits for a sign-in.
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
sys.path.insert(0, str(REPO))

from tests.conftest import chown_tree, make_repo  # noqa: E402

PLAYBOOK = str(REPO / ".venv/bin/ansible-playbook")
TRIVIAL = """- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.debug:
        msg: hi
"""


TIMER_CALLBACK = """
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
"""
AGENT_TASKS = ("Start or stop the agent", "Start the agent")


def environment(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_CODE_", "OPENAI_"))}
    callbacks = home / "callbacks"
    callbacks.mkdir(exist_ok=True)
    (callbacks / "task_timer.py").write_text(TIMER_CALLBACK)
    return {**keep, "HOME": str(home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_CALLBACK_PLUGINS": str(callbacks), "ANSIBLE_CALLBACKS_ENABLED": "task_timer",
            "TASK_TIMES": str(home / "task-times.jsonl")}  # fmt: skip


def last_agent_task(env: dict[str, str]) -> float:
    """The agent task's time in the playbook that just ran."""
    with open(env["TASK_TIMES"], encoding="utf-8") as handle:
        times = [json.loads(line) for line in handle]
    return next(entry["seconds"] for entry in reversed(times) if entry["task"] in AGENT_TASKS)


def wall(argv: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-1000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="agentbox-bench-agent-"))
    root.chmod(0o755)
    home = root / "home"
    home.mkdir()
    env = environment(home)
    repo = make_repo(root / "ws", {"README.md": "hello\n"})
    chown_tree(repo)
    trivial = root / "trivial.yml"
    trivial.write_text(TRIVIAL)
    box = f"bench-agent-{secrets.token_hex(3)}"
    made = [box]
    try:
        wall([PLAYBOOK, "playbooks/create_box.yml", "-e", f"workspace={repo}", "-e", f"box={box}", "-e",
              "checkpoint=none"], env)  # fmt: skip
        container = f"agentbox-{box}"
        cli, trivial_runs, agent_runs, agent_tasks, create_agent_tasks = [], [], [], [], []
        for _run in range(args.runs):
            cli.append(wall(["docker", "exec", "-u", "vscode", container, "claude", "--version"], env))
            trivial_runs.append(wall([PLAYBOOK, "-i", "localhost,", str(trivial)], env))
            agent_runs.append(wall([PLAYBOOK, "playbooks/agent.yml", "-e", f"box={box}"], env))
            agent_tasks.append(last_agent_task(env))
            wall([PLAYBOOK, "playbooks/agent.yml", "-e", f"box={box}", "-e", "state=stopped"], env)
        create_alone, create_agent = [], []
        for index in range(args.runs):
            for with_agent in (False, True):
                name = f"bench-agent-{secrets.token_hex(3)}"
                made.append(name)
                extra = ["-e", "agent=claude"] if with_agent else []
                seconds = wall([PLAYBOOK, "playbooks/create_box.yml", "-e", f"workspace={repo}", "-e", f"box={name}",
                                "-e", "checkpoint=none", *extra], env)  # fmt: skip
                (create_agent if with_agent else create_alone).append(seconds)
                if with_agent:
                    create_agent_tasks.append(last_agent_task(env))
                wall([PLAYBOOK, "playbooks/destroy_box.yml", "-e", f"box={name}", "-e", "delete_branch=true"], env)
                made.remove(name)
            print(f"run {index + 1}/{args.runs} done", file=sys.stderr)
        median = statistics.median
        agent_over = median(agent_runs) - median(trivial_runs)
        print(f"claude --version in the box (docker exec):  {median(cli):.3f} s")
        print(f"trivial playbook:                           {median(trivial_runs):.3f} s")
        print(f"agent.yml to the session running:           {median(agent_runs):.3f} s")
        print(f"(a) agent.yml minus trivial:                {agent_over:.3f} s "
              f"(target <= 0.5 + {median(cli):.3f} = {0.5 + median(cli):.3f} s)")  # fmt: skip
        print(f"agent task in agent.yml (callback):         {median(agent_tasks):.3f} s")
        print(f"create_box.yml alone:                       {median(create_alone):.3f} s")
        print(f"create_box.yml -e agent=claude:             {median(create_agent):.3f} s")
        print(f"(b) create+agent minus create:              {median(create_agent) - median(create_alone):.3f} s "
              "(target <= 0.6 s)")  # fmt: skip
        print(f"agent task in create_box.yml (callback):    {median(create_agent_tasks):.3f} s")
    finally:
        for name in made:
            subprocess.run([PLAYBOOK, "playbooks/destroy_box.yml", "-e", f"box={name}", "-e", "delete_branch=true"],
                           cwd=REPO, env=env, capture_output=True, check=False)  # fmt: skip
        subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    main()
