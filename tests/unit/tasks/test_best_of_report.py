"""Best of N, the pure part (plugins/module_utils/tasks/_best_of_report.py), and the module's refusals before
any box is made (agentbox_best_of run in-process: bad input fails with what to do, and no box, no folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from plugins.module_utils.tasks import _best_of_report as report
from tests.unit.support.inprocess import run_module_inprocess

PYTEST_OUT = "collected 5 items\n\ntest_a.py ..F.s\n\n=========== 1 failed, 3 passed, 1 skipped in 0.12s ===========\n"
JEST_OUT = "PASS src/a.test.js\nFAIL src/b.test.js\n\nTest Suites: 1 failed, 1 passed, 2 total\nTests:       2 failed, 7 passed, 9 total\n"
GO_OUT = (
    "=== RUN   TestA\n--- PASS: TestA (0.00s)\n=== RUN   TestB\n--- FAIL: TestB (0.00s)\n"
    "    --- PASS: TestB/sub (0.00s)\nFAIL\nFAIL\texample.com/x\t0.01s\n"
)


def test_test_counts_read_pytest_jest_go_test_and_unittest_output() -> None:
    assert report.test_counts(PYTEST_OUT) == (3, 1)
    assert report.test_counts("== 2 failed, 4 passed, 1 error in 1.0s ==\n") == (4, 3)
    assert report.test_counts("============ 12 passed in 3.40s ============\n") == (12, 0)
    assert report.test_counts(JEST_OUT) == (7, 2)
    assert report.test_counts(GO_OUT) == (2, 1)
    assert report.test_counts("ok  \texample.com/x\t0.01s\nok  \texample.com/y\t0.02s\n") == (2, 0)
    assert report.test_counts("..\n------\nRan 3 tests in 0.001s\n\nFAILED (failures=1, errors=1)\n") == (1, 2)
    assert report.test_counts("test_add ... ok\n\n------\nRan 2 tests in 0.000s\n\nOK\n") == (2, 0)
    assert report.test_counts("make: all good\n") == (None, None)


def test_plan_expands_n_and_keeps_custom_commands() -> None:
    runs = report.plan({"task": "t", "agents": ["claude"], "n": 3, "check": "true"}, None)
    assert [r["agent"] for r in runs] == ["claude"] * 3 and [r["index"] for r in runs] == [1, 2, 3]
    mixed = report.plan({"task": "t", "agents": ["claude", {"name": "mine", "command": "echo hi"}]}, "pytest -q")
    assert mixed[1] == {"index": 2, "agent": "mine", "command": "echo hi", "env": {}, "timeout": None}
    own = report.plan({"task": "t", "agents": [{"name": "claude", "timeout": 20}, "codex"]}, "true")
    assert [r["timeout"] for r in own] == [20, None]  # an agent's own timeout; the others take the task's


def test_check_programs_reads_the_programs_a_check_line_starts_and_where() -> None:
    assert report.check_programs("python3 -m unittest -v test_calc") == [("python3", "")]
    assert report.check_programs("cd 'app dir' && pytest -q") == [("pytest", "app dir")]
    assert report.check_programs("FOO=1 make test 2>&1 | tee log.txt") == [("make", ""), ("tee", "")]
    assert report.check_programs("./run.sh; cd sub && ../x.sh") == [("./run.sh", ""), ("../x.sh", "sub")]
    assert report.check_programs("if test -f a; then nosuch; fi") == [("test", ""), ("nosuch", "")]
    assert report.check_programs("cd /workspace/a/b && ./t") == [("./t", "a/b")]
    assert report.check_programs("cd /tmp && ./t") == [("./t", None)]  # outside /workspace: not followed
    # What the shell expands, or an unclosed quote, is not a name known before the run.
    assert report.check_programs('$TOOL x; "$(which y)" z') == []
    assert report.check_programs('echo "unclosed') == []


def test_spread_takes_the_engines_in_turn_and_refuses_bad_entries() -> None:
    runs = report.plan({"task": "t", "agents": ["claude"], "n": 5}, "true")
    report.spread(runs, ["a@h1", {"engine": "h2", "ssh_strict_host_key_checking": False, "isolation": None}])
    assert [r["engine"] for r in runs] == ["a@h1", "h2", "a@h1", "h2", "a@h1"]
    assert runs[1]["where"] == {"engine": "h2", "ssh_strict_host_key_checking": False}
    report.spread(runs, None)
    assert all(r["where"] == {} for r in runs)
    for engines, message in (({"engine": "h"}, "must be a list"), ([{"isolation": "none"}], "engine 1 of engines names no engine"),
                             ([{"engine": "h", "port": 22}], "unknown keys port")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            report.spread(runs, engines)


@pytest.mark.parametrize(
    ("params", "default_check", "message"),
    [
        ({"task": "  ", "check": "true"}, None, "the task is empty"),
        ({"task": "t", "agents": ["claude"], "n": 0, "check": "true"}, None, "n must be 1 or more"),
        ({"task": "t", "agents": ["claude"], "n": 9, "check": "true"}, None, "9 runs asked for: between 1 and 8"),
        ({"task": "t", "agents": ["claude", "codex"], "n": 2, "check": "true"}, None, "give a single agent"),
        ({"task": "t", "agents": ["cursor"], "check": "true"}, None, "unknown agent 'cursor'"),
        ({"task": "t", "agents": [{"name": "x", "command": " "}], "check": "true"}, None, "its command is empty"),
        ({"task": "t", "agents": ["claude"]}, None, "no check to judge the runs"),
        ({"task": "t", "agents": [{"name": "claude", "timeout": 0}], "check": "true"}, None, "its timeout must be"),
    ],
)
def test_plan_refuses_bad_input(params: dict, default_check: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        report.plan(params, default_check)


def test_default_check_is_the_test_task_of_agentbox_yaml() -> None:
    assert (
        report.default_check({"tasks": {"test": {"command": "pytest -q", "cwd": "app dir"}}})
        == "cd 'app dir' && pytest -q"
    )
    assert report.default_check({"tasks": {"test": {"command": ["go", "test", "./..."]}}}) == "go test ./..."
    assert report.default_check({"tasks": {"build": {"command": "make"}}}) is None
    assert report.default_check(None) is None


def _run(
    index: int, agent: str, rc: int | None, passed: int | None, failed: int | None, churn: int, state: str = "done"
):
    return {"index": index, "agent": agent, "box": f"bo-x-{index}", "state": state, "check_rc": rc,
            "tests_passed": passed, "tests_failed": failed, "seconds": 10.0 + index,
            "diff_stat": {"files": 1, "insertions": churn, "deletions": 0}, "files": ["a.py"]}  # fmt: skip


def test_auto_picks_a_passing_check_then_fewest_failures_then_smallest_diff() -> None:
    runs = [_run(1, "claude", 1, 2, 1, 1), _run(2, "claude", 0, 3, 0, 40), _run(3, "codex", 0, 3, 0, 5),
            _run(4, "mine", 0, 9, 0, 1, state="timeout")]  # fmt: skip
    assert report.pick(runs, "auto")["index"] == 3
    assert report.pick(runs[:1], "auto") is None
    assert report.pick(runs, "codex")["index"] == 3 and report.pick(runs, "2")["index"] == 2
    assert report.pick(runs, "bo-x-1")["index"] == 1
    with pytest.raises(ValueError, match="names 2 runs"):
        report.pick(runs, "claude")
    with pytest.raises(ValueError, match="names no run"):
        report.pick(runs, "gemini")


def test_table_and_page_show_every_field_and_escape_what_boxes_wrote() -> None:
    runs = [_run(1, "claude", 0, 3, 0, 2), {**_run(2, "<b>x</b>", None, None, None, 0, state="failed"),
                                            "reason": "the box is gone", "diff_stat": None}]  # fmt: skip
    runs[0]["diff"] = "diff --git a/a.py b/a.py\n+<script>alert(1)</script>\n-old\n"
    text = report.table(runs, runs[0])
    lines = text.splitlines()
    assert lines[0].split() == ["#", "agent", "box", "state", "check", "passed", "failed", "diff", "files", "seconds",
                                "tokens", "note"]  # fmt: skip
    assert lines[1].split() == ["1*", "claude", "bo-x-1", "done", "0", "3", "0", "+2", "-0", "1", "11.0", "-", "-"]
    assert lines[2].split()[:4] == ["2", "<b>x</b>", "bo-x-2", "failed"] and lines[2].endswith("the box is gone")
    html = report.page({"id": "r1", "check": "pytest -q", "runs": runs, "winner_box": "bo-x-1"})
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and '<tr class="run winner" data-box="bo-x-1">' in html
    assert '<span data-field="winner">winner: bo-x-1</span>' in html
    assert '<td class="num" data-field="diff">+2 -0</td>' in html and '<td class="num" data-field="diff">-</td>' in html


def test_the_module_refuses_bad_input_before_any_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    cases = [
        ({"task": ""}, "the task is empty"),
        ({"task": "t", "agents": ["nope"], "check": "true"}, "unknown agent 'nope'"),
        ({"task": "t"}, "no check to judge the runs"),
        ({"task": "t", "check": "true", "agents": ["claude"], "n": 20}, "between 1 and 8"),
        ({"task": "t", "check": "true", "adopt": "codex"}, "adopt='codex' names no run"),
        ({"task": "t", "check": "true", "keep": "winner"}, "keep=winner needs a winner"),
        ({"task_file": str(tmp_path / "missing.txt"), "check": "true"}, "cannot read task_file"),
        ({"task": "t", "check": "true", "engines": ["h1"]}, "add -e provider=docker_ssh"),
        ({"task": "t", "check": "true", "push": True}, "push (and pr) send the adopted run's branch"),
        ({"task": "t", "check": "true", "adopt": "auto", "push": True}, "has no remote 'origin' (its remotes: none): add it (git remote add)"),
        ({"task": "t", "check": "true", "adopt": "auto", "push": True, "remote": "--upload-pack=x"},
         "is not a remote name"),
        # A relative program is looked for in the workspace (after the line's own cd), on the host.
        ({"task": "t", "check": "cd sub && ./run-tests.sh -q"}, "./run-tests.sh (of check 'cd sub && ./run-tests.sh -q') not found in"),
    ]
    for given, message in cases:
        result = run_module_inprocess("agentbox_best_of", {"workspace": str(workspace), **given})
        assert result["failed"] and message in result["msg"], (given, result["msg"])
    assert not os.path.exists(tmp_path / "home" / ".agentbox" / "best_of")
    not_git = run_module_inprocess("agentbox_best_of", {"workspace": str(tmp_path), "task": "t", "check": "true"})
    assert "is not a git repository" in not_git["msg"]


def test_check_mode_lists_the_runs_and_makes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    (workspace / "agentbox.yaml").write_text("tasks:\n  test:\n    command: pytest -q\n")
    result = run_module_inprocess("agentbox_best_of", {"workspace": str(workspace), "task": "t", "agents": ["claude"],
                                                       "n": 2}, check_mode=True)  # fmt: skip
    assert not result.get("failed") and result["check"] == "pytest -q"
    assert [(r["index"], r["agent"], r["state"]) for r in result["runs"]] == [
        (1, "claude", "pending"),
        (2, "claude", "pending"),
    ]
    assert not os.path.exists(tmp_path / "home" / ".agentbox")


def test_check_mode_takes_a_relative_check_program_only_when_the_workspace_has_it_executable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    workspace = tmp_path / "ws"
    (workspace / "ci").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    script = workspace / "ci" / "test.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    args = {"workspace": str(workspace), "task": "t", "check": "cd ci && ./test.sh"}
    refused = run_module_inprocess("agentbox_best_of", args, check_mode=True)
    assert refused["failed"] and "./test.sh (of check 'cd ci && ./test.sh') not found in the workspace" in refused["msg"]
    script.chmod(0o755)
    assert not run_module_inprocess("agentbox_best_of", args, check_mode=True)["failed"]
    # pr needs gh on this machine (refused before any box when it is missing) and a remote to push to.
    subprocess.run(["git", "-C", str(workspace), "remote", "add", "origin", str(tmp_path / "remote.git")], check=True)
    with_pr = run_module_inprocess("agentbox_best_of", {**args, "adopt": "auto", "pr": True}, check_mode=True)
    if shutil.which("gh") is None:
        assert with_pr["failed"] and "gh CLI, which is not installed" in with_pr["msg"]
    else:
        assert not with_pr["failed"], with_pr["msg"]
    assert not os.path.exists(tmp_path / "home" / ".agentbox")
