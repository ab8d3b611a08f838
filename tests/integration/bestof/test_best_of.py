"""best_of.yml on the local engine, end to end, in one playbook run of five boxes (the runs share it: each
assertion reads the one result).

- Three runs of the real Claude Code CLI, each against a stand-in Messages API on the box's loopback
  (tests/fixtures/messages_standin.py, started as services of the workspace's agentbox.yaml): one writes a
  solution that passes the workspace's tests, one a solution that breaks them, one talks to a port where
  nothing answers and so never finishes (stopped at its own timeout, shorter than the task's).
- Two custom agent commands: one writes a passing but longer solution (it loses on diff size), one works
  until the test kills its box (the run fails with the reason, the others go on).
- The check is agentbox.yaml's test task (Python's unittest); the table, result.json and best_of.html are
  checked field by field (the page in headless Chromium, with a screenshot); adopt=auto brings exactly the
  winner's commit into the host repository, its working tree, index and stash untouched; keep=winner leaves
  nothing of the losers (no container, no branch).
"""

from __future__ import annotations

import html as html_module
import json
import os
import re
import secrets
import subprocess
import time
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo
from tests.integration.agent.world import REPO, STANDIN, World
from tests.integration.support.fleet_page import CHROMIUM_FLAGS, chromium_binary

pytestmark = pytest.mark.integration

GOOD = "def add(a, b):\n    return a + b\n"
BAD = "def add(a, b):\n    return a - b\n"
LONG = 'def add(a, b):\n    """The sum."""\n    total = a\n    total += b\n    return total\n'
TESTS = (
    "import unittest\n\nfrom solution import add\n\n\nclass T(unittest.TestCase):\n"
    "    def test_small(self):\n        self.assertEqual(add(1, 2), 3)\n\n"
    "    def test_zero(self):\n        self.assertEqual(add(0, 5), 5)\n\n\nif __name__ == '__main__':\n    unittest.main()\n"
)
TIMEOUT = 300  # every agent's but the one that never finishes
HUNG_TIMEOUT = 10  # that one's own (an agent entry's timeout): the test waits for it, so it is short


def _project(root: Path) -> Path:
    project = {
        "tasks": {"test": {"command": "python3 -m unittest -v test_calc"}},
        "services": {
            name: {
                "command": ["python3", "standin.py", str(port), f"/tmp/{name}.jsonl", "/workspace/solution.py", body]
            }
            for name, port, body in (("api-good", 8101, GOOD), ("api-bad", 8102, BAD))
        },
    }
    repo = make_repo(root, {"README.md": "add two numbers\n", "test_calc.py": TESTS, ".gitignore": "__pycache__/\n", "standin.py": STANDIN.read_text(),
                            "agentbox.yaml": json.dumps(project, indent=2) + "\n"})  # fmt: skip
    git(repo, "config", "user.name", "Host Person")
    git(repo, "config", "user.email", "host.person@example.invalid")
    (repo / "notes.txt").write_text("uncommitted host work\n")  # must stay exactly as it is
    chown_tree(repo)
    return repo


def _kill_when_working(world: World, run_index: int, deadline: float) -> str:
    """Kill the box of run `run_index` once its agent works (result.json says so, and its state history)."""
    while time.monotonic() < deadline:
        for result in (world.home / ".agentbox" / "best_of").glob("*/result.json"):
            runs = json.loads(result.read_text())["runs"]
            box = runs[run_index - 1]["box"]
            if runs[run_index - 1]["state"] == "working":
                if world.sh(box, "grep -q working /run/agentbox/agents/task.history", user="root")[0] == 0:
                    world.client.containers.get(f"agentbox-{box}").kill()
                    return box
        time.sleep(0.5)
    raise AssertionError("run 5 never started working")


def test_best_of_five_runs_the_check_judges_adopt_brings_the_winner_and_keep_winner_removes_the_rest(
    docker_client: docker.DockerClient, box_image: str, tmp_path: Path
) -> None:
    world = World(docker_client, tmp_path)
    (world.home / ".agentbox" / "idle" / "policy.json").unlink()  # no idle policy pausing the runs' boxes
    workspace = _project(tmp_path / "ws")
    base = git(workspace, "rev-parse", "HEAD").strip()
    status_before = git(workspace, "status", "--porcelain=v1").strip()
    key = f"sk-ant-test-{secrets.token_hex(8)}"
    agents = [
        {"name": "claude", "env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8101"}},
        {"name": "claude", "env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8102"}},
        {"name": "claude", "env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8109", "CLAUDE_CODE_MAX_RETRIES": "1000"},
         "timeout": HUNG_TIMEOUT},
        {"name": "verbose", "command": f"printf %b {json.dumps(LONG)} > solution.py"},
        {"name": "dies", "command": "agentbox-ctl agent-state working; sleep 600"},
    ]
    extra = {"workspace": str(workspace), "task": "Write solution.py with add(a, b).", "agents": agents,
             "timeout": TIMEOUT, "adopt": "auto", "keep": "winner"}  # fmt: skip
    env = {"ANTHROPIC_API_KEY": key, "AGENTBOX_IDLE_INTERVAL": "0"}
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_CODE_"))}
    full_env.update(
        {"HOME": str(world.home), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **env}
    )
    log = (tmp_path / "best_of.log").open("w")  # a file, not a pipe: nothing blocks while the test watches
    play = subprocess.Popen([str(REPO / ".venv" / "bin" / "ansible-playbook"), "playbooks/best_of.yml", "-e",
                             json.dumps(extra)], cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        killed = _kill_when_working(world, 5, time.monotonic() + 300)
        play.wait(timeout=900)
        out = (tmp_path / "best_of.log").read_text()
        assert play.returncode == 0, out[-6000:]
        assert key not in out

        folder = next((world.home / ".agentbox" / "best_of").iterdir())
        result = json.loads((folder / "result.json").read_text())
        runs = {run["index"]: run for run in result["runs"]}
        boxes = [runs[i]["box"] for i in range(1, 6)]
        assert killed == boxes[4]
        assert result["check"] == "python3 -m unittest -v test_calc"

        good, bad, hung, verbose, dies = (runs[i] for i in range(1, 6))
        assert (good["agent"], good["state"], good["check_rc"], good["tests_passed"], good["tests_failed"]) == (
            "claude", "done", 0, 2, 0)  # fmt: skip
        assert good["diff_stat"] == {"files": 1, "insertions": 2, "deletions": 0} and good["files"] == ["solution.py"]
        assert good["branch"] == f"agentbox/{good['box']}" and good["seconds"] > 0 and good["tokens"] > 0
        assert (bad["state"], bad["check_rc"], bad["tests_passed"], bad["tests_failed"]) == ("done", 1, 0, 2)
        assert bad["files"] == ["solution.py"]
        assert hung["state"] == "timeout" and f"no end after {HUNG_TIMEOUT} s (timeout)" in hung["reason"]
        assert hung["files"] == [] and hung["check_rc"] == 1 and hung["tests_failed"] == 1  # the import fails
        assert (verbose["agent"], verbose["state"], verbose["check_rc"], verbose["tests_passed"]) == (
            "verbose",
            "done",
            0,
            2,
        )
        assert verbose["diff_stat"]["insertions"] == 5 and verbose["tokens"] is None
        assert dies["state"] == "failed" and "it died while the agent worked" in dies["reason"]
        assert dies["check_rc"] is None
        assert result["winner"] == "claude" and result["winner_box"] == good["box"]

        # The table: one line per run, the winner starred.
        lines = [line.strip() for line in out.splitlines()]
        table = next(i for i, line in enumerate(lines) if re.match(r"#\s+agent\s+box\s+state\s+check\s", line))
        rows = [line.split() for line in lines[table + 1 : table + 6]]
        assert [row[:5] for row in rows] == [
            ["1*", "claude", good["box"], "done", "0"], ["2", "claude", bad["box"], "done", "1"],
            ["3", "claude", hung["box"], "timeout", "1"], ["4", "verbose", verbose["box"], "done", "0"],
            ["5", "dies", dies["box"], "failed", "-"]]  # fmt: skip
        assert f"winner:  {good['box']} (claude), branch agentbox/{good['box']}" in out

        # Adopted: exactly the winner's one commit, on its branch; the host's tree, index and stash as they were.
        log = git(workspace, "log", "--format=%s", f"{base}..agentbox/{good['box']}").splitlines()
        assert log == ["best_of: run 1 (claude)", "best_of: the workspace's uncommitted work at the start"]
        assert git(workspace, "show", f"agentbox/{good['box']}:solution.py") == GOOD
        # The adopted commit in the result is the host repository's, read there after the fetch.
        assert result["adopted"]["commit"] == git(workspace, "rev-parse", f"agentbox/{good['box']}").strip()
        assert git(workspace, "diff", "--name-only", base, f"agentbox/{good['box']}").split() == [
            "notes.txt",
            "solution.py",
        ]
        assert git(workspace, "status", "--porcelain=v1").strip() == status_before
        assert git(workspace, "stash", "list").strip() == "" and not (workspace / "solution.py").exists()

        # keep=winner: nothing of the losers, the winner's box still there.
        assert sorted(result["removed"]) == sorted(boxes[1:])
        branches = git(workspace, "branch", "--list", "agentbox/*", "--format=%(refname:short)").split()
        assert branches == [f"agentbox/{good['box']}"]
        left = {
            c.name
            for c in docker_client.containers.list(all=True, filters={"label": f"io.agentbox.workspace={workspace}"})
        }
        assert left == {f"agentbox-{good['box']}"}

        _page_in_chromium(folder / "best_of.html", result, tmp_path)
    finally:
        # Every box the run made (result.json lists them from the start) is removed whatever happened.
        for listed in (world.home / ".agentbox" / "best_of").glob("*/result.json"):
            world.boxes.extend(run["box"] for run in json.loads(listed.read_text())["runs"])
        if play.poll() is None:
            play.kill()
        world.cleanup()


MEASURE = """<script>
window.addEventListener('load', () => {
  const rows = [...document.querySelectorAll('tr.run')].map(row => Object.fromEntries(
    [...row.querySelectorAll('[data-field]')].map(cell => [cell.dataset.field, cell.textContent.trim()])));
  const diffs = [...document.querySelectorAll('section.diff')].map(s => ({box: s.dataset.box,
    left: Math.round(s.getBoundingClientRect().left), top: Math.round(s.getBoundingClientRect().top),
    added: [...s.querySelectorAll('.a')].map(a => a.textContent)}));
  document.body.setAttribute('data-measure', JSON.stringify({rows, diffs,
    winner: document.querySelector('[data-field=winner]').textContent,
    wide: document.documentElement.scrollWidth > document.documentElement.clientWidth}));
});
</script>"""


def _page_in_chromium(page: Path, result: dict, tmp_path: Path) -> None:
    """The page laid out by Chromium: every run's row field by field, the diffs side by side; a screenshot."""
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", MEASURE + "\n</body>"))
    assert "<script" not in page.read_text()  # the page itself runs nothing
    profile = tmp_path / "chromium-profile"
    dom = subprocess.run([chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,900",
                          "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    measured = json.loads(html_module.unescape(re.search(r'data-measure="([^"]*)"', dom.stdout).group(1)))
    for row, run in zip(measured["rows"], result["runs"], strict=True):
        stat = run.get("diff_stat") or {}
        assert row == {
            "index": f"{run['index']}" + (" ★" if run["box"] == result["winner_box"] else ""),
            "agent": run["agent"], "box": run["box"], "state": run["state"],
            "check": "-" if run["check_rc"] is None else str(run["check_rc"]),
            "passed": "-" if run["tests_passed"] is None else str(run["tests_passed"]),
            "failed": "-" if run["tests_failed"] is None else str(run["tests_failed"]),
            "diff": f"+{stat['insertions']} -{stat['deletions']}" if stat else "-", "files": str(len(run["files"])),
            "seconds": str(run["seconds"]), "tokens": "-" if run["tokens"] is None else str(run["tokens"]),
            "reason": run.get("reason") or "-",
        }, (row, run)  # fmt: skip
    assert measured["winner"] == f"winner: {result['winner_box']}"
    diffs = measured["diffs"]
    assert [d["box"] for d in diffs] == [run["box"] for run in result["runs"]]
    assert len({d["top"] for d in diffs}) == 1 and diffs == sorted(diffs, key=lambda d: d["left"])  # side by side
    assert diffs[0]["added"][-2:] == ["+def add(a, b):", "+    return a + b"]
    assert diffs[1]["added"][-1] == "+    return a - b"
    shot = tmp_path / "best_of.png"
    taken = subprocess.run([chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
                            "--window-size=1400,900", page.as_uri()], capture_output=True, timeout=120, check=False)  # fmt: skip
    assert taken.returncode == 0 and shot.stat().st_size > 10_000
    keep = os.environ.get("AGENTBOX_BEST_OF_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(shot.read_bytes())
