# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Best of N: one task, N boxes, N agents; the check judges, the best branch is adopted.

Each run goes through the normal paths (agentbox_box's create, agentbox_agent's start and query) in a
thread of its own with its own provider, so a run that fails (its agent crashes, its box dies, its
engine goes away) is reported with the reason while the others go on. A box `waiting` for the user is
reported as such and never answered. The result is written as it goes (result.json), so an interrupted
run still leaves every box listed with the command that removes it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from typing import Any

from ..agent import _agent
from ..core import _host_files
from ..core._provider import Provider
from ..providers._module import PROVIDER_ARGUMENT_SPEC, provider_from_params
from . import _best_of_report as report
from ._agent_task import AGENT_ARGUMENT_SPEC, run_agent_task
from ._box_task import BOX_ARGUMENT_SPEC, run_box_task

BEST_OF_ARGUMENT_SPEC: dict[str, Any] = {
    "workspace": {"type": "path", "required": True},
    "task": {"type": "str"},
    "task_file": {"type": "path"},
    "agents": {"type": "raw"},
    "n": {"type": "int"},
    "check": {"type": "str"},
    "check_timeout": {"type": "float", "default": 900},
    "timeout": {"type": "float", "default": 1800},
    "from": {"type": "str", "aliases": ["checkpoint"]},
    "adopt": {"type": "str"},
    "keep": {"type": "str", "default": "all", "choices": ["all", "winner", "none"]},
    "max_runs": {"type": "int", "default": report.MAX_RUNS},
    "poll": {"type": "float", "default": 2.0},
    "env": {"type": "dict", "default": {}, "no_log": True},
    **PROVIDER_ARGUMENT_SPEC,
}
DIFF_LIMIT = 400_000  # bytes of each run's diff kept for the page
CHECK_TAIL = 4000  # characters of the check's output kept in the result
# Claude Code's own token counts, summed from its transcripts in the box (numbers only are read).
CLAUDE_USAGE = r"""
import glob, json, os
total = 0
for path in glob.glob(os.path.expanduser("~/.claude/projects/*/*.jsonl")):
    for line in open(path, errors="replace"):
        try:
            usage = json.loads(line).get("message", {}).get("usage") or {}
        except Exception:
            continue
        if isinstance(usage, dict):
            total += sum(v for k, v in usage.items() if k.endswith("_tokens") and isinstance(v, int))
print(total)
"""


def _defaults(spec: dict[str, Any], **given: Any) -> dict[str, Any]:
    """A task's params as AnsibleModule would fill them: every option, its default where not given."""
    return {**{key: option.get("default") for key, option in spec.items()}, **given}


def _read_task(params: dict[str, Any]) -> str:
    if params.get("task_file"):
        text = _host_files.read_text(params["task_file"])
        if text is None:
            raise ValueError(f"cannot read task_file {params['task_file']}: give a readable file, or -e task='...'")
        return text
    return params.get("task") or ""


def _project_check(workspace: str) -> str | None:
    text = _host_files.read_text(os.path.join(workspace, "agentbox.yaml"))
    if not text:
        return None
    import yaml  # ansible-core's own dependency

    try:
        return report.default_check(yaml.safe_load(text))
    except yaml.YAMLError:
        return None


def run_best_of(params: dict[str, Any], check_mode: bool) -> tuple[dict[str, Any], list[str]]:
    """The whole best-of task: (result, warnings). Raises ValueError before any box is made for bad input."""
    workspace = os.path.abspath(params["workspace"])
    if not os.path.isdir(os.path.join(workspace, ".git")) and not os.path.isfile(os.path.join(workspace, ".git")):
        raise ValueError(f"workspace {workspace} is not a git repository: give one with -e workspace=PATH")
    task = _read_task(params)
    default_check = None if params.get("check") else _project_check(workspace)
    runs = report.plan({**params, "task": task}, default_check, params["max_runs"])
    check = (params.get("check") or default_check or "").strip()
    if params["adopt"] and params["adopt"] != "auto":
        report.pick([{**r, "box": None} for r in runs], params["adopt"])  # names one run, or says why not
    if params["keep"] == "winner" and not params["adopt"]:
        raise ValueError("keep=winner needs a winner: add -e adopt=auto (or adopt=RUN)")
    if params["timeout"] <= 0:
        raise ValueError("timeout (seconds per agent) must be more than 0")
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
    short = secrets.token_hex(3)
    for run in runs:
        run.update(box=f"bo-{short}-{run['index']}", state="pending", check_rc=None, tests_passed=None,
                   tests_failed=None, diff_stat=None, files=[], seconds=None, tokens=None)  # fmt: skip
    result: dict[str, Any] = {"changed": not check_mode, "id": run_id, "workspace": workspace, "check": check,
                              "runs": runs, "winner": None, "winner_box": None}  # fmt: skip
    if check_mode:
        return result, []
    folder = _host_files.ensure_private_dir(os.path.join(_host_files.agentbox_dir(), "best_of", run_id))
    result["result_file"] = os.path.join(folder, "result.json")
    result["page"] = os.path.join(folder, "best_of.html")
    lock = threading.Lock()

    def save() -> None:
        with lock:
            _host_files.write_atomic(result["result_file"], json.dumps(_public(result), indent=2), 0o644)

    save()
    threads = [threading.Thread(target=_guarded, args=(run, params, workspace, task, check, save), daemon=True)
               for run in runs]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    warnings: list[str] = []
    winner = report.pick(runs, params["adopt"])
    if params["adopt"] and winner is None:
        warnings.append("no run passed its check: nothing adopted, every branch kept")
    if winner is not None:
        result["winner"], result["winner_box"] = winner["agent"], winner["box"]
        result["adopted"] = _adopt(params, winner)
    result["removed"] = _clean_up(params, runs, winner)
    save()
    _host_files.write_atomic(result["page"], report.page(result), 0o644)
    result["table"] = report.table(runs, winner)
    return _public(result), warnings


def _public(result: dict[str, Any]) -> dict[str, Any]:
    """The result without the diffs' text (those go to the page) and without the agents' env."""
    out = dict(result)
    # dict(run) first: one copy under the GIL, while the run's thread may be adding keys to it.
    out["runs"] = [{k: v for k, v in dict(run).items() if k not in ("diff", "env")} for run in result["runs"]]
    return out


def _provider(params: dict[str, Any]) -> Provider:
    return provider_from_params(params)


def _guarded(run: dict[str, Any], params: dict[str, Any], workspace: str, task: str, check: str, save: Any) -> None:
    try:
        _one_run(run, params, workspace, task, check, save)
    except Exception as exc:  # noqa: BLE001 - one run's failure, whatever it is, is that run's result
        run["state"], run["reason"] = "failed", str(exc)[:500] or type(exc).__name__
    save()


def _one_run(run: dict[str, Any], params: dict[str, Any], workspace: str, task: str, check: str, save: Any) -> None:
    provider_options = {key: params.get(key) for key in PROVIDER_ARGUMENT_SPEC}
    run["state"] = "creating"
    save()
    created = run_box_task(
        _defaults(
            BOX_ARGUMENT_SPEC, **provider_options, name=run["box"], workspace=workspace, checkpoint=params.get("from")
        ),
        False,
    )[0]
    run["branch"] = created["box"].get("branch")
    provider = _provider(params)
    facts = provider.find(run["box"])
    if facts is None:
        raise RuntimeError("the box was gone right after its create")
    base = _commit_carried(provider, run["box"], workspace)
    session = run["agent"] if run["command"] is None else "task"
    env = {**params.get("env", {}), **run["env"], "AGENTBOX_TASK": task}
    started = time.monotonic()
    run["state"] = "working"
    save()
    run_agent_task(
        _defaults(
            AGENT_ARGUMENT_SPEC,
            **provider_options,
            box=run["box"],
            agent=run["agent"],
            command=run["command"],
            prompt=None if run["command"] else task,
            session=session,
            env=env,
        ),
        provider,
        False,
    )
    state, reason = _follow(provider, run["box"], session, started + params["timeout"], params["poll"])
    run["seconds"] = round(time.monotonic() - started, 1)
    if state == "timeout":
        reason = f"no end after {params['timeout']:g} s (timeout): stopped"
        run_agent_task(_defaults(AGENT_ARGUMENT_SPEC, **provider_options, box=run["box"], agent=run["agent"],
                                 command=run["command"], session=session, state="stopped"), provider, False)  # fmt: skip
    run["state"] = state
    if reason:
        run["reason"] = reason
    if state == "failed":
        return
    _collect(provider, run, base, check, params["check_timeout"], _git_identity_env(workspace))


def _git_identity_env(workspace: str) -> dict[str, str]:
    """The host user's git identity for the commits made in the box (a fallback name where it has none)."""
    identity = _agent.git_identity(workspace)
    name, email = identity.get("name") or "agentbox", identity.get("email") or "agentbox@localhost"
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


def _commit_carried(provider: Provider, box: str, workspace: str) -> str:
    """The workspace's uncommitted work, carried into the box, committed on the box's branch before the agent
    starts (as the host user), so each run's diff is the agent's alone; the commit the agent starts from."""
    env = _git_identity_env(workspace)
    script = (
        "git add -A && (git diff --cached --quiet || git commit -q --no-verify -m \"best_of: the workspace's "
        'uncommitted work at the start") && git rev-parse HEAD'
    )
    done = provider.exec(box, ["bash", "-c", script], workdir="/workspace", env=env, timeout=120, limit=1 << 20)
    return done.check("committing the carried-over work", box).text.strip()


def _follow(provider: Provider, box: str, session: str, deadline: float, poll: float) -> tuple[str, str]:
    """Wait for the agent's end: (state, reason). Its state history starts with `idle` at launch; the agent
    has ended when a later entry says idle, stopped or waiting."""
    history = f"/run/agentbox/agents/{session}.history"
    while True:
        facts = provider.find(box)
        if facts is None or facts.state != "running":
            return "failed", f"the box is {'gone' if facts is None else facts.state} (it died while the agent worked)"
        read = provider.exec(box, ["cat", history], user="root", timeout=30, limit=1 << 20, what="agent state history")
        states = []
        for line in read.text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("state") in ("working", "idle", "waiting", "stopped"):
                states.append(entry["state"])
        if len(states) >= 2 and states[-1] in ("idle", "stopped"):
            return "done", ""
        if len(states) >= 2 and states[-1] == "waiting":
            return "waiting", "the agent waits for the user (not answered): attach to it to see its question"
        if time.monotonic() >= deadline:
            return "timeout", ""
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())) or 0.1)


def _collect(
    provider: Provider, run: dict[str, Any], base: str, check: str, check_timeout: float, identity: dict[str, str]
) -> None:
    """Commit what the agent left on its branch, run the check, read the diff against the box's base."""
    box = run["box"]
    commit = (f'git add -A && (git diff --cached --quiet || git commit -q --no-verify -m "best_of: run {run["index"]} '
              f'({run["agent"]})")')  # fmt: skip
    committed = provider.exec(box, ["bash", "-c", commit], workdir="/workspace", env=identity, timeout=120, limit=1 << 20,
                              what="commit of the run")  # fmt: skip
    if committed.rc != 0:
        run["reason"] = f"commit failed (exit {committed.rc}): {committed.stderr.decode('utf-8', 'replace')[-300:]}"
    numstat = provider.exec(box, ["git", "diff", "--numstat", base, "HEAD"], workdir="/workspace", timeout=60,
                            limit=4 << 20, what="diff stat")  # fmt: skip
    files, insertions, deletions = [], 0, 0
    for line in numstat.text.splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3:
            files.append(parts[2])
            insertions += int(parts[0]) if parts[0].isdigit() else 0
            deletions += int(parts[1]) if parts[1].isdigit() else 0
    run["files"] = files[:500]
    run["diff_stat"] = {"files": len(files), "insertions": insertions, "deletions": deletions}
    diff = provider.exec(box, ["bash", "-c", f'git diff {base} HEAD | head -c {DIFF_LIMIT}'], workdir="/workspace",
                         timeout=60, limit=DIFF_LIMIT + 4096, what="diff")  # fmt: skip
    run["diff"] = diff.text
    said = provider.exec(box, ["git", "rev-parse", "HEAD"], workdir="/workspace", timeout=30, limit=4096).text.strip()
    run["commit"] = said if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", said) else ""  # the box's word: a hash or nothing
    checked = provider.exec(box, ["bash", "-lc", check], workdir="/workspace", timeout=check_timeout,
                            limit=16 << 20, what="check output")  # fmt: skip
    output = (checked.stdout + b"\n" + checked.stderr).decode("utf-8", "replace")
    run["check_rc"] = checked.rc
    run["tests_passed"], run["tests_failed"] = report.test_counts(output)
    run["check_tail"] = output[-CHECK_TAIL:]
    if run["agent"] == "claude" and run["command"] is None:
        usage = provider.exec(box, ["python3", "-c", CLAUDE_USAGE], timeout=30, limit=4096)
        run["tokens"] = int(usage.text.strip()) if usage.rc == 0 and usage.text.strip().isdigit() else None


def _adopt(params: dict[str, Any], winner: dict[str, Any]) -> dict[str, Any]:
    """The winner's branch into the host repository (agentbox/<box>); the host's working tree, index and
    stash are not touched: only the branch ref moves."""
    from ..git import _git, _gitlayer, _ship

    provider = _provider(params)
    facts = provider.find(winner["box"])
    if facts is None:
        raise RuntimeError(f"the winner's box {winner['box']} is gone: its branch cannot be fetched")
    fetched: dict[str, Any] = {}
    if not provider.shares_host_filesystem or _gitlayer.has_layers(facts):
        fetched = _ship.fetch_box_branch(provider, facts, facts.workspace, force=True)
    if _gitlayer.has_layers(facts):
        _gitlayer.refresh_view(provider, facts)
    # The adopted commit as the host's repository now has it under the branch, not as the box said it.
    adopted = _git.git(facts.workspace, "rev-parse", "--verify", "--end-of-options", f"refs/heads/{facts.branch}",
                       check=False)  # fmt: skip
    commit = adopted.stdout.decode("ascii", "replace").strip() if adopted.returncode == 0 else ""
    return {"branch": facts.branch, "commit": commit, "repos": fetched.get("repos", [])}


def _clean_up(params: dict[str, Any], runs: list[dict[str, Any]], winner: dict[str, Any] | None) -> list[str]:
    """keep=winner: every other box and its branch go; keep=none: every box goes, and the losers' branches when
    there is a winner (with none, every branch stays: nothing was chosen, nothing of the work is lost)."""
    if params["keep"] == "all" or (params["keep"] == "winner" and winner is None):
        return []
    provider_options = {key: params.get(key) for key in PROVIDER_ARGUMENT_SPEC}
    removed = []
    for run in runs:
        is_winner = winner is not None and run["box"] == winner["box"]
        loser = winner is not None and not is_winner
        if is_winner and params["keep"] == "winner":
            continue
        try:
            run_box_task(_defaults(BOX_ARGUMENT_SPEC, **provider_options, name=run["box"], state="absent",
                                   workspace=params["workspace"], delete_branch=loser,
                                   fetch=not loser), False)  # fmt: skip
            removed.append(run["box"])
        except Exception as exc:  # noqa: BLE001 - the others are still removed; this one is said
            run["reason"] = f"{run.get('reason') or ''} not removed: {exc}".strip()[:500]
    return removed
