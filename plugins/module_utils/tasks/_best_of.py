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
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from ..agent import _agent
from ..box import _box
from ..core import _host_files, _naming
from ..core._provider import BoxFacts, OutputTooLarge, Provider, ProviderError
from ..providers._module import PROVIDER_ARGUMENT_SPEC, provider_from_params
from ..providers._registry import SSH_ENGINE_PROVIDERS
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
    "keep_from": {"type": "bool", "default": False},
    "image": {"type": "str", "default": _box.DEFAULT_IMAGE},
    "adopt": {"type": "str"},
    "keep": {"type": "str", "default": "all", "choices": ["all", "winner", "none"]},
    "max_runs": {"type": "int", "default": report.MAX_RUNS},
    "poll": {"type": "float", "default": 0.25},
    "env": {"type": "dict", "default": {}, "no_log": True},
    "engines": {"type": "list", "elements": "raw"},
    "push": {"type": "bool", "default": False},
    "pr": {"type": "bool", "default": False},
    "remote": {"type": "str", "default": "origin"},
    **PROVIDER_ARGUMENT_SPEC,
}
DIFF_LIMIT = 400_000  # bytes of each run's diff kept for the page
_COUNT = re.compile(r"[0-9]{1,12}")  # a size or count as a box prints it: ASCII digits, bounded
CHECK_TAIL = 4000  # characters of the check's output kept in the result
# Which of the programs given as (directory, program) pairs a login shell in /workspace does not find: one a line.
PROBE = (
    'while [ "$#" -gt 1 ]; do (cd "/workspace/$1" 2>/dev/null || cd /workspace 2>/dev/null; '
    'command -v -- "$2" >/dev/null 2>&1) || printf "%s\\n" "$2"; shift 2; done'
)
# In the box, as root: wait until the agent's state history ($1) is no longer $2 bytes long, looking at most $3
# times, every $4 seconds; then print its size (first line) and its text. The host never waits a fixed poll
# after the agent's end, and makes one exec per change instead of one per look.
WAIT_HISTORY = r"""
size() { s=$(wc -c 2>/dev/null < "$1") || s=0; echo $((s + 0)); }
looks=0 now=$(size "$1")
while [ "$now" = "$2" ] && [ "$looks" -lt "$3" ]; do sleep "$4"; looks=$((looks + 1)); now=$(size "$1"); done
echo "$now"
cat "$1" 2>/dev/null
exit 0
"""
# In /workspace, in one exec: commit what the agent left ($1 the message), then print the commit's exit, HEAD, the
# count of `git diff --numstat` lines against the base ($2), those lines, and the diff itself (its first $3 bytes).
COLLECT = r"""
if git add -A && { git diff --cached --quiet || git commit -q --no-verify -m "$1"; }; then echo 0; else echo "$?"; fi
git rev-parse HEAD 2>/dev/null || echo -
mapfile -t stat < <(git diff --numstat "$2" HEAD)
echo "${#stat[@]}"
[ "${#stat[@]}" -eq 0 ] || printf '%s\n' "${stat[@]}"
git diff "$2" HEAD | head -c "$3"
"""
WAIT_MAX = 20.0  # seconds one wait in the box lasts at most: the host looks at the box's own state that often
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
    if params.get("engines") and params["provider"] not in SSH_ENGINE_PROVIDERS:
        raise ValueError(f"engines spreads the runs over SSH engines: add -e provider={SSH_ENGINE_PROVIDERS[0]} (not "
                         f"{params['provider']}), or leave engines out")  # fmt: skip
    report.spread(runs, params.get("engines"))
    _check_push(params, workspace)
    warnings: list[str] = []
    source = _fork_source(params, runs, workspace)
    _refuse_missing_programs(_provider(_at(params, runs[0])), params, workspace, check, source, warnings, check_mode)
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
    short = secrets.token_hex(3)
    for run in runs:
        run.update(box=f"bo-{short}-{run['index']}", state="pending", check_rc=None, tests_passed=None,
                   tests_failed=None, diff_stat=None, files=[], seconds=None, tokens=None)  # fmt: skip
    result: dict[str, Any] = {"changed": not check_mode, "id": run_id, "workspace": workspace, "check": check,
                              "runs": runs, "winner": None, "winner_box": None}  # fmt: skip
    if source is not None:
        result["fork"] = {"box": source.name, "checkpoint": f"bo-{short}-from"}
    if check_mode:
        return result, warnings
    if source is not None:
        params = {**params, "from": _fork(_at(params, runs[0]), source, result["fork"]["checkpoint"])}
    folder = _host_files.ensure_private_dir(os.path.join(_host_files.agentbox_dir(), "best_of", run_id))
    result["result_file"] = os.path.join(folder, "result.json")
    result["page"] = os.path.join(folder, "best_of.html")
    lock = threading.Lock()

    def save() -> None:
        with lock:
            _host_files.write_atomic(result["result_file"], json.dumps(_public(result), indent=2), 0o644)

    save()
    threads = [threading.Thread(target=_guarded, args=(run, _at(params, run), workspace, task, check, save),
                                daemon=True) for run in runs]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winner = report.pick(runs, params["adopt"])
    if params["adopt"] and winner is None:
        warnings.append("no run passed its check: nothing adopted, every branch kept")
    if winner is not None:
        result["winner"], result["winner_box"] = winner["agent"], winner["box"]

    def adopt() -> None:
        if winner is not None:
            result["adopted"] = _adopt(_at(params, winner), winner)
            if params["push"] or params["pr"]:
                result["pushed"] = _push(_at(params, winner), winner, task, warnings)

    result["removed"] = _clean_up(params, runs, winner, adopt)
    if source is not None and not params["keep_from"]:
        _drop_fork(_at(params, runs[0]), result["fork"], warnings)  # a fork's runs are on one engine
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


def _at(params: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The task's params for one run: its engine's options (report.spread) over the task's own."""
    return {**params, **run.get("where", {})}


def _check_push(params: dict[str, Any], workspace: str) -> None:
    """push/pr: refused before any box when they cannot happen (no adopt, no such remote, no gh)."""
    if not (params["push"] or params["pr"]):
        return
    from ..relay import _relay_ops, _relay_protocol

    if not params["adopt"]:
        raise ValueError("push (and pr) send the adopted run's branch: add -e adopt=auto (or adopt=RUN)")
    try:
        _relay_protocol.check_remote(params["remote"])
    except _relay_protocol.RequestError as exc:
        raise ValueError(str(exc)) from exc
    missing = _relay_ops.missing_remote(workspace, params["remote"])
    if missing:
        raise ValueError(f"{missing}: add it (git remote add) or pass -e remote=NAME")
    if params["pr"] and shutil.which("gh") is None:
        raise ValueError("pr opens the pull request with GitHub's gh CLI, which is not installed on this machine: "
                         "install it and sign in (gh auth login), or use -e push=true alone")  # fmt: skip


def _fork_source(params: dict[str, Any], runs: list[dict[str, Any]], workspace: str) -> BoxFacts | None:
    """The box `from` names, when it names a box of this workspace (its runs then fork it); None for a checkpoint
    (or no `from`). Refused before any box: a box of another workspace, not running, or runs on several engines."""
    name = params.get("from")
    if not name or name in ("default", "none"):
        return None
    if len({run["where"].get("engine") for run in runs}) > 1:
        raise ValueError(f"from={name} is one engine's box or checkpoint; the runs go to several engines: leave "
                         "engines out (or give one) to start from it")  # fmt: skip
    facts = _provider(_at(params, runs[0])).find(name)
    if facts is None:
        return None
    if facts.project != _naming.project_id(workspace):
        raise ValueError(f"box {name} is of workspace {facts.workspace}, not {workspace}: fork a box of this "
                         f"workspace, or run from its own (-e workspace={facts.workspace})")  # fmt: skip
    if facts.state != "running":
        raise ValueError(f"box {name} is {facts.state}: start it to fork it (box_state.yml -e box={name} "
                         "-e state=started)")  # fmt: skip
    return facts


def _fork(params: dict[str, Any], source: BoxFacts, name: str) -> str:
    """A checkpoint of the box the runs fork (its committed and uncommitted work), which every run's box starts
    from; its name."""
    from ..checkpoint import _checkpoint

    provider = _provider(params)
    _checkpoint.capture(provider, _checkpoint.plan_capture(provider, source, name))
    return name


def _drop_fork(params: dict[str, Any], fork: dict[str, Any], warnings: list[str]) -> None:
    """The fork's checkpoint removed, unless boxes of the run still start from it (the engine keeps the image of
    a box's container): then it stays, said, with the command that removes it after them."""
    from ..checkpoint import _checkpoint
    from ..checkpoint._checkpoint_records import CheckpointError

    provider = _provider(params)
    found = _checkpoint.find_checkpoint(provider, _naming.project_id(params["workspace"]), fork["checkpoint"])
    if found is None:
        return
    try:
        _checkpoint.remove(provider, found)
        fork["removed"] = True
    except CheckpointError:
        fork["removed"] = False
        warnings.append(f"the fork's checkpoint {fork['checkpoint']} stays while boxes of this run start from it: "
                        f"remove it after them with checkpoints.yml -e checkpoint={fork['checkpoint']} -e state=absent")


def _refuse_missing_programs(provider: Provider, params: dict[str, Any], workspace: str, check: str,
                             source: BoxFacts | None, warnings: list[str], check_mode: bool) -> None:  # fmt: skip
    """The programs the check starts, looked for before any box: in the box a fork starts from, or in a throwaway
    container of the image the boxes start from (the checkpoint's, or the box image), as the box user with a login
    shell in /workspace; a relative path in the host's workspace. ValueError naming the missing ones. Where the
    provider cannot look without a box (the clouds), or the project's own tasks may install a program at boot,
    a program not found is left to the check (a warning for the latter). Check mode makes nothing, not even the
    throwaway container: only the workspace is looked at."""
    missing, pairs = [], []
    for program, cwd in report.check_programs(check):
        if source is None and "/" in program and not program.startswith("/"):
            path = os.path.join(workspace, cwd or "", program)
            if cwd is not None and not params.get("from") and not (os.path.isfile(path) and os.stat(path).st_mode & 0o111):
                missing.append(program)
            continue
        pairs += [cwd or "", program]
    where = "the workspace"
    if pairs and not check_mode:
        argv = ["bash", "-lc", PROBE, "probe", *pairs]
        # The checkpoint's image: an unknown, foreign or broken checkpoint is refused here, before any box.
        image = params["image"] if source is not None else _start_image(provider, params, workspace)
        where = f"box {source.name}" if source is not None else f"image {image}"
        try:
            if source is not None:
                done = provider.exec(source.name, argv, timeout=60, limit=1 << 16, what="check's programs")
            else:
                done = provider.probe_image(image, argv)
        except ProviderError as exc:
            warnings.append(f"the check's programs were not looked for before the runs ({exc}): the check finds out")
            done = None
        if done is not None and done.rc == 0:
            asked = set(pairs[1::2])  # only the programs asked about: the image or box says nothing else here
            missing += [line for line in dict.fromkeys(done.text.splitlines()) if line in asked]
    if not missing:
        return
    what = f"{', '.join(missing)} (of check {check!r}) not found in {where} as the box user runs it (bash -lc in /workspace)"
    if source is None and _installs_at_boot(workspace):
        warnings.append(f"{what}: expected from the tasks of agentbox.yaml at each box's start")
        return
    raise ValueError(f"{what}: install it in the image or a checkpoint (-e from=...), give its right path, or fix "
                     f"-e check='...'")  # fmt: skip


def _start_image(provider: Provider, params: dict[str, Any], workspace: str) -> str:
    """The image the runs' boxes start from: `from`'s checkpoint's (the project's default for `default`), else
    the box image. ValueError for a checkpoint that cannot be restored (unknown, another engine's, broken)."""
    name = params.get("from")
    if not name or name == "none":
        return params["image"]
    from ..checkpoint import _checkpoint, _restore

    project = _naming.project_id(workspace)
    if name == "default":
        name = _checkpoint.project_default(provider, project)
        if not name:
            return params["image"]
    try:
        return _restore.plan_restore(provider, project, name).image
    except ProviderError as exc:
        raise ValueError(f"from={name}: {exc}") from exc


def _installs_at_boot(workspace: str) -> bool:
    """The project's agentbox.yaml has units besides its test task, which run as each box starts (a setup task
    may install what the check needs)."""
    text = _host_files.read_text(os.path.join(workspace, "agentbox.yaml"))
    if not text:
        return False
    import yaml  # ansible-core's own dependency

    try:
        project = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    units = [*((project.get("tasks") or {}) if isinstance(project, dict) else {}),
             *((project.get("services") or {}) if isinstance(project, dict) else {})]  # fmt: skip
    return any(unit != "test" for unit in units)


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
    creating = time.monotonic()
    created = run_box_task(
        _defaults(
            BOX_ARGUMENT_SPEC, **provider_options, name=run["box"], workspace=workspace, checkpoint=params.get("from"),
            image=params["image"],
        ),
        False,
    )[0]
    run["branch"] = created["box"].get("branch")
    run["create_seconds"] = round(time.monotonic() - creating, 1)
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
    timeout = run.get("timeout") or params["timeout"]
    state, reason = _follow(provider, run["box"], session, started + timeout, params["poll"])
    run["seconds"] = round(time.monotonic() - started, 1)
    if state == "timeout":
        reason = f"no end after {timeout:g} s (timeout): stopped"
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
    has ended when a later entry says idle, stopped or waiting. The box itself watches the history every
    `poll` seconds (WAIT_HISTORY) and answers as soon as it changes: one exec per change, or per WAIT_MAX
    seconds, instead of one per poll."""
    history = f"/run/agentbox/agents/{session}.history"
    poll = max(poll, 0.05)
    seen = -1  # the history's size as last read: the first look answers at once
    while True:
        facts = provider.find(box)
        if facts is None or facts.state != "running":
            return "failed", f"the box is {'gone' if facts is None else facts.state} (it died while the agent worked)"
        wait = max(0.0, min(WAIT_MAX, deadline - time.monotonic()))
        looks = int(wait / poll)
        argv = ["bash", "-c", WAIT_HISTORY, "wait", history, str(seen), str(looks), f"{poll:.3f}"]
        asked = time.monotonic()
        try:
            read = provider.exec(box, argv, user="root", timeout=wait + 30, limit=1 << 20, what="agent state history")
        except OutputTooLarge as exc:  # the box's answer past its bound: reading it again would not help
            return "failed", str(exc)[:500]
        except ProviderError:
            time.sleep(min(poll, 1.0))  # the box going away mid-wait: the next look says so
            continue
        size, _sep, text = read.text.partition("\n")
        seen = int(size) if _COUNT.fullmatch(size.strip()) else -1
        states = []
        for line in text.splitlines():
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
        if read.rc != 0 or seen < 0 or looks == 0 or time.monotonic() - asked < poll:
            # No answer from the box's side, less than a look left, or an answer sooner than a look (the box
            # decides when it answers): never a busy loop of execs.
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())) or 0.1)


def _collect(
    provider: Provider, run: dict[str, Any], base: str, check: str, check_timeout: float, identity: dict[str, str]
) -> None:
    """Commit what the agent left on its branch, run the check, read the diff against the box's base."""
    box = run["box"]
    message = f"best_of: run {run['index']} ({run['agent']})"
    done = provider.exec(box, ["bash", "-c", COLLECT, "collect", message, base, str(DIFF_LIMIT)], workdir="/workspace",
                         env=identity, timeout=180, limit=DIFF_LIMIT + (4 << 20), what="commit and diff of the run")  # fmt: skip
    status, said, numstat, diff = read_collected(done.text)
    run["diff"] = diff[:DIFF_LIMIT]  # the box's word: bounded here, whatever it printed
    if status != "0":
        status = status if re.fullmatch(r"\d{1,3}", status) else "?"
        run["reason"] = f"commit failed (exit {status}): {done.stderr.decode('utf-8', 'replace')[-300:]}"
    files, insertions, deletions = [], 0, 0
    for line in numstat:
        parts = line.split("\t", 2)
        if len(parts) == 3:
            files.append(parts[2])
            insertions += int(parts[0]) if parts[0].isdigit() else 0
            deletions += int(parts[1]) if parts[1].isdigit() else 0
    run["files"] = files[:500]
    run["diff_stat"] = {"files": len(files), "insertions": insertions, "deletions": deletions}
    run["commit"] = said if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", said) else ""  # the box's word: a hash or nothing
    checking = time.monotonic()
    checked = provider.exec(box, ["bash", "-lc", check], workdir="/workspace", timeout=check_timeout,
                            limit=16 << 20, what="check output")  # fmt: skip
    run["check_seconds"] = round(time.monotonic() - checking, 1)
    output = (checked.stdout + b"\n" + checked.stderr).decode("utf-8", "replace")
    run["check_rc"] = checked.rc
    run["tests_passed"], run["tests_failed"] = report.test_counts(output)
    run["check_tail"] = output[-CHECK_TAIL:]
    if run["agent"] == "claude" and run["command"] is None:
        usage = provider.exec(box, ["python3", "-c", CLAUDE_USAGE], timeout=30, limit=4096)
        run["tokens"] = int(usage.text.strip()) if usage.rc == 0 and usage.text.strip().isdigit() else None


def read_collected(text: str) -> tuple[str, str, list[str], str]:
    """COLLECT's output: (the commit's exit, HEAD as the box said it, the numstat lines, the diff)."""
    status, said, count, rest = ([*text.split("\n", 3), "", "", "", ""])[:4]
    lines = rest.split("\n", int(count) if _COUNT.fullmatch(count) else 0)
    return status, said, lines[:-1], lines[-1]


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


def _push(params: dict[str, Any], winner: dict[str, Any], task: str, warnings: list[str]) -> dict[str, Any]:
    """The adopted branch pushed to `remote`, and with `pr` its pull request opened, by the relay's own
    operations for the winner's box (the host repository's git as its owner, gh there): what each said. A
    failure is the result's and a warning; the runs' results stand."""
    from ..relay import _relay_ops, _relay_protocol

    provider = _provider(params)
    facts = provider.find(winner["box"])
    if facts is None:
        warnings.append(f"the winner's box {winner['box']} is gone: nothing pushed")
        return {"rc": None, "error": "the box is gone"}

    def ask(operation: str, args: dict[str, Any]) -> dict[str, Any]:
        message = {"v": _relay_protocol.PROTOCOL_VERSION, "op": operation, "args": args}
        request = _relay_protocol.parse_request(_relay_protocol.encode(message))
        outcome = _relay_ops.carry_out(provider, facts, request)
        if outcome.rc != 0:
            warnings.append(f"{operation} of {facts.branch} failed (exit {outcome.rc}): {outcome.stderr.strip()[-300:]}")
        return {"rc": outcome.rc, "output": (outcome.stderr or outcome.stdout).strip()[-1000:], **outcome.data}

    pushed = ask("git.push", {"remote": params["remote"]})
    if params["pr"] and pushed["rc"] == 0:
        title = (task.strip().splitlines() or ["best of"])[0][:200]
        body = f"Adopted by best_of.yml: run {winner['index']} ({winner['agent']}) of box {winner['box']}."
        pushed["pr"] = ask("gh.pr", {"action": "create", "title": title, "body": body})
    return pushed


def _clean_up(
    params: dict[str, Any], runs: list[dict[str, Any]], winner: dict[str, Any] | None, adopt: Callable[[], None]
) -> list[str]:
    """keep=winner: every other box and its branch go; keep=none: every box goes, and the losers' branches when
    there is a winner (with none, every branch stays: nothing was chosen, nothing of the work is lost). The boxes
    go at once, each in a thread (the host's branch deletions one after the other: _rollback.remove_branch), the
    losers' while `adopt` brings the winner's branch home; the winner's (keep=none) after it, and not when it
    failed."""
    if params["keep"] == "all" or (params["keep"] == "winner" and winner is None):
        adopt()
        return []
    removed: set[str] = set()

    def remove(run: dict[str, Any]) -> None:
        provider_options = {key: _at(params, run).get(key) for key in PROVIDER_ARGUMENT_SPEC}
        loser = winner is not None and run["box"] != winner["box"]
        try:
            run_box_task(_defaults(BOX_ARGUMENT_SPEC, **provider_options, name=run["box"], state="absent",
                                   workspace=params["workspace"], delete_branch=loser,
                                   fetch=not loser), False)  # fmt: skip
            removed.add(run["box"])
        except Exception as exc:  # noqa: BLE001 - the others are still removed; this one is said
            run["reason"] = f"{run.get('reason') or ''} not removed: {exc}".strip()[:500]

    def start(going: list[dict[str, Any]]) -> list[threading.Thread]:
        threads = [threading.Thread(target=remove, args=(run,), daemon=True) for run in going]
        for thread in threads:
            thread.start()
        return threads

    first = [run for run in runs if winner is None or run["box"] != winner["box"]]
    threads = start(first)
    try:
        adopt()
        if winner is not None and params["keep"] == "none":
            threads += start([winner])
    finally:
        for thread in threads:
            thread.join()  # every removal begun ends before the module does, an adoption's failure or not
    return [run["box"] for run in runs if run["box"] in removed]
