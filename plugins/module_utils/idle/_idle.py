# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The idle policy, one for every provider: a running cap, pause the longest-idle first, stop after hours.

`plan()` is pure: box facts, agent states, the paused-since record and `now` in, one decision per box
out. `apply()` carries a plan out through a provider and keeps the paused-since record up to date.
The module `agentbox_idle` (playbooks/autopause.yml) and the relay's loop both call `run_pass()`.

What counts as activity (docs/idle.md): the agent's own state (working, waiting, idle since when) as its
hooks record it in the box, the last terminal input in the box (the newest atime of the box user's
/dev/pts/*), open `ssh agentbox-<box>` sessions, and established outside connections to the web port.
All of it comes back from the one exec that reads the agent states (observe), and is validated here.

"Paused since" is not something the engine records (Docker keeps no pause time), so the host keeps
it: a JSON file the policy writes when it pauses a box, and, for a box paused some other way, when
the policy first sees it paused (so the time is never earlier than the truth: a box is never stopped
early). The box cannot write this file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from typing import Any

from ..agent import _agent
from ..box import _box
from ..core import _naming
from ..core._provider import BoxFacts, OutputTooLarge, Provider, ProviderError

DEFAULTS: dict[str, Any] = {"max_running": 5, "idle_minutes": 5.0, "stop_after_hours": 12.0, "include_agentless": False,
                            "scope": "project", "stalled_minutes": _agent.STALLED_MINUTES}
# What max_running counts: each project's running boxes apart (one relay serves all of a user's projects, and
# one project's boxes must not pause another's), or every box in the pass together.
SCOPES = ("project", "all")
ACTIVE = ("working", "waiting")
EPHEMERAL_REASON = ("ephemeral: the engine deletes it as soon as it stops, so it is left to the engine's own "
                    "auto-stop (never paused or stopped by the idle policy)")  # fmt: skip
WEB_PORT = 80

# Runs in the box after the agent states are read (the same exec); prints one line:
#   agentbox-activity <newest atime of the box user's ptys, epoch s; 0: none> <ssh sessions> <web connections>
# A tty's atime moves when its input is read (the kernel's own record of typing, as `w` uses), its mtime on
# output, so an agent printing does not count. An `ssh agentbox-<box>` session is the box's sshd run by the
# alias's ProxyCommand (`sshd -i`); after login its monitor process is titled "sshd: <user> [priv]"
# ("sshd-session: ..." on OpenSSH 9.8+). Web: ESTABLISHED (st 01) on local port 80 from anything but loopback.
ACTIVITY_SCRIPT = (
    r"""stat -c '%U %X' /dev/pts/[0-9]* 2>/dev/null | awk '$1 == "@USER@" && $2 > m {m = $2} """
    r"""END {printf "agentbox-activity %d ", m}'; """
    r"""printf '%d ' "$(pgrep -c -f '^(sshd|sshd-session): @USER@ \[priv\]' 2>/dev/null)"; """
    r"""awk 'FNR > 1 && $4 == "01" && $2 ~ /:@PORT@$/ && $3 !~ /^(0100007F|0000000000000000FFFF00000100007F|"""
    r"""00000000000000000000000001000000):/ {n++} END {printf "%d\n", n}' /proc/net/tcp /proc/net/tcp6 2>/dev/null;"""
).replace("@USER@", _naming.BOX_USER).replace("@PORT@", f"{WEB_PORT:04X}")
ACTIVITY_LINE = re.compile(r"agentbox-activity (\d{1,12}) (\d{1,6}) (\d{1,6})")


def state_file_default() -> str:
    return os.path.join(os.path.expanduser("~"), ".agentbox", "idle", "paused.json")


def parse_activity(lines: list[str], now: float) -> dict[str, Any] | None:
    """The box's activity line, checked (the box writes it): the input time no later than `now`, counts
    bounded; None when the line is missing or malformed (then only the agent state counts)."""
    matched = ACTIVITY_LINE.fullmatch(lines[-1]) if lines else None
    if not matched:
        return None
    touched, ssh, web = (int(group) for group in matched.groups())
    return {"input": min(float(touched), now) if touched > 0 else None, "ssh": ssh, "web": web}


def observe(provider: Provider, names: list[str], now: float) -> dict[str, tuple[dict[str, Any] | None, Any]]:
    """{box: (its current agent or None, its activity or None)}: one exec per running box."""

    def probe(box: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        try:
            found = _agent.read_states(provider, box, extra_script=ACTIVITY_SCRIPT)
        except OutputTooLarge as exc:  # the box's own error (plan: action "error"); the others go on
            return None, {"refused": str(exc)}
        return _agent.current(found), parse_activity([e["line"] for e in found if "line" in e], now)

    return _agent.each_box(provider, names, probe)


def record_key(facts: dict[str, Any]) -> str:
    """Engine and box id: a box destroyed and made again under its name starts a fresh record."""
    return f"{facts.get('provider')}|{facts.get('engine')}|{facts.get('name')}|{facts.get('id')}"


def validate(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings with defaults filled in; ValueError with what to do on a bad one."""
    merged = {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
    if not isinstance(merged["max_running"], int) or merged["max_running"] < 0:
        raise ValueError(f"max_running must be a whole number of boxes, 0 or more, not {merged['max_running']!r}")
    if merged["scope"] not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {merged['scope']!r}")
    for key in ("idle_minutes", "stop_after_hours", "stalled_minutes"):
        try:
            merged[key] = float(merged[key])
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a number, not {merged[key]!r}") from None
        if merged[key] < 0:
            raise ValueError(f"{key} must be 0 or more, not {merged[key]}")
    return merged


def plan(
    boxes: list[dict[str, Any]],
    agents: dict[str, dict[str, Any] | None],
    paused_since: dict[str, float],
    now: float,
    settings: dict[str, Any],
    activity: dict[str, dict[str, Any] | None] | None = None,
) -> list[dict[str, Any]]:
    """One decision per box: {name, state, action: pause|stop|keep|error, reason, agent_state, idle_seconds,
    paused_seconds}. Pure: the same inputs always give the same plan.

    Running boxes: while more than max_running run, pause the one idle longest (idle at least
    idle_minutes); never one whose agent is working or waiting, nor one with an ssh session open or a
    connection on its web port (`activity`, see parse_activity); idle time runs from the later of the
    agent's idle `since` and the last terminal input. An agentless box (no agent, or its agent stopped)
    only with include_agentless, after every idle one. With scope `project` (the default) the cap counts each
    project's running boxes apart (facts `project`); with `all`, every box of the pass. Paused boxes: stop those paused longer than
    stop_after_hours (by `paused_since`, keyed by record_key). Ephemeral boxes (facts `ephemeral`) are kept
    and not counted: the engine deletes them when they stop, its own auto-stop ends them. A running box
    whose agent states were refused (activity `refused`: over their cap) is left alone as an error.
    """
    activity = activity or {}
    settings = validate(settings)
    idle_floor = settings["idle_minutes"] * 60
    decisions: list[dict[str, Any]] = []
    candidates: list[tuple[float, int, dict[str, Any]]] = []
    running: dict[str, int] = {}  # per project (scope project), or all under "" (scope all)
    group: dict[str, str] = {}  # box name -> its key in `running`
    for facts in sorted(boxes, key=lambda b: b["name"]):
        agent = agents.get(facts["name"])
        entry: dict[str, Any] = {"name": facts["name"], "state": facts["state"], "action": "keep",
                                 "agent_state": agent["state"] if agent else None,
                                 "idle_seconds": None, "paused_seconds": None}  # fmt: skip
        decisions.append(entry)
        if facts.get("ephemeral"):
            # A pause or stop would delete it (the engine deletes it as it stops): outside the policy and its
            # running cap, left to the engine's own auto-stop.
            entry["reason"] = EPHEMERAL_REASON
            continue
        if facts["state"] == "paused":
            since = paused_since.get(record_key(facts))
            paused = max(0.0, now - since) if since is not None else None
            entry["paused_seconds"] = paused
            limit = settings["stop_after_hours"] * 3600
            if paused is not None and paused > limit:
                entry.update(action="stop", reason=f"paused {paused / 3600:.1f} h, longer than stop_after_hours "
                                                   f"({settings['stop_after_hours']:g} h)")  # fmt: skip
            else:
                entry["reason"] = "paused, not yet for stop_after_hours"
            continue
        if facts["state"] != "running":
            entry["reason"] = f"the box is {facts['state']}"
            continue
        key = str(facts.get("project") or "") if settings["scope"] == "project" else ""
        running[key] = running.get(key, 0) + 1
        group[facts["name"]] = key
        seen = activity.get(facts["name"]) or {}
        if seen.get("refused"):
            # What the box wrote about its agent was refused: nothing is known of it, so nothing is done to it.
            entry.update(action="error", reason=seen["refused"])
            continue
        state = agent["state"] if agent else None
        if state in ACTIVE:
            entry["reason"] = f"its agent is {state}"
            continue
        if seen.get("requests"):
            entry["reason"] = "a request to the relay is in flight"
            continue
        if seen.get("ssh"):
            entry["reason"] = f"{seen['ssh']} ssh session(s) open"
            continue
        if seen.get("web"):
            entry["reason"] = f"{seen['web']} connection(s) open on its web port"
            continue
        typed = seen.get("input")
        if state in ("idle", "stalled"):
            # A stalled agent (working, no progress for stalled_minutes) is idle since its last progress.
            started = _naming.parse_iso(agent.get("since"))
            if started is None:
                entry["reason"] = f"its agent is {state}, since an unknown time"
                continue
            idle = max(0.0, now - max(started, typed or started))
            entry["idle_seconds"] = idle
            if idle < idle_floor:
                entry["reason"] = (f"{state} {idle / 60:.1f} min, less than idle_minutes "
                                   f"({settings['idle_minutes']:g})")  # fmt: skip
                if typed is not None and typed > started:
                    entry["reason"] += " (terminal input)"
                continue
            candidates.append((idle, 0, entry))
            continue
        what = "no agent" if agent is None else "its agent stopped"
        if not settings["include_agentless"]:
            entry["reason"] = f"{what} (agentless boxes are left alone unless include_agentless)"
            continue
        if typed is not None and now - typed < idle_floor:
            entry["reason"] = f"{what}, but terminal input {(now - typed) / 60:.1f} min ago (idle_minutes)"
            continue
        candidates.append((0.0 if typed is None else now - typed, 1, entry))  # after every idle agent
    # Longest idle first; agentless boxes last (their idleness is unknown); then by name, for a stable plan.
    candidates.sort(key=lambda item: (item[1], -item[0], item[2]["name"]))
    excess = {key: count - settings["max_running"] for key, count in running.items()}
    for _idle, _kind, entry in candidates:
        key = group[entry["name"]]
        counted = f"{running[key]} running" + (f" in project {key}" if key else "")
        if excess[key] <= 0:
            entry["reason"] = entry.get("reason") or f"{counted} is within max_running ({settings['max_running']})"
            if entry["idle_seconds"] is not None:
                entry["reason"] = (f"{entry['agent_state']} {entry['idle_seconds'] / 60:.1f} min, but {counted} is within "
                                   f"max_running ({settings['max_running']})")  # fmt: skip
            continue
        excess[key] -= 1
        why = (f"{entry['agent_state']} {entry['idle_seconds'] / 60:.1f} min" if entry["idle_seconds"] is not None
               else "agentless (include_agentless)")  # fmt: skip
        entry.update(action="pause", reason=f"{why}; {counted}, more than max_running ({settings['max_running']})")
    return decisions


# -- the host's paused-since record ------------------------------------------------------------------


def load_record(state_file: str) -> dict[str, float]:
    try:
        with open(state_file, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def save_record(state_file: str, record: dict[str, float]) -> None:
    directory = os.path.dirname(state_file)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    temporary = f"{state_file}.{os.getpid()}.tmp"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as handle:
        json.dump(record, handle, sort_keys=True)
    os.replace(temporary, state_file)


def refresh_record(
    boxes: list[dict[str, Any]], record: dict[str, float], now: float, known: set[str] | None = None
) -> dict[str, float]:
    """Paused boxes keep their time (or get `now`, first seen paused); boxes seen not paused drop out.
    `known`: the keys this pass may forget (records of boxes out of scope are kept)."""
    fresh = dict(record)
    seen = set()
    for facts in boxes:
        key = record_key(facts)
        seen.add(key)
        if facts["state"] == "paused":
            fresh.setdefault(key, now)
        else:
            fresh.pop(key, None)
    if known is not None:
        for key in list(fresh):
            if key.startswith(tuple(known)) and key not in seen:
                fresh.pop(key)  # the box is gone
    return fresh


# -- one pass through a provider -------------------------------------------------------------------------


def run_pass(
    provider: Provider,
    settings: dict[str, Any],
    project: str | None = None,
    now: float | None = None,
    state_file: str | None = None,
    check_mode: bool = False,
    box_ids: set[str] | None = None,
    busy_ids: set[str] | None = None,
) -> dict[str, Any]:
    """List, read the agents, plan, carry out. {changed, boxes: decisions with `done`, paused, stopped, errors}.
    `busy_ids`: boxes with a relay request in flight (the relay's own record), kept running."""
    settings = validate(settings)
    now = time.time() if now is None else float(now)
    state_file = state_file or state_file_default()
    found: list[BoxFacts] = provider.list_boxes(project=project)
    if box_ids is not None:
        # The relay's scope: only the boxes registered with it (this user's), never others on a shared engine.
        found = [facts for facts in found if facts.id in box_ids]
    boxes = [facts.to_dict() for facts in found]
    # Not an ephemeral box: the plan leaves it alone, and an exec would reset the engine's auto-stop that ends it.
    observed = observe(provider, [b["name"] for b in boxes if b["state"] == "running" and not b["ephemeral"]], now)
    agents = {name: _agent.judged(agent, settings["stalled_minutes"], now) for name, (agent, _seen) in observed.items()}
    activity = {name: seen for name, (_agent_state, seen) in observed.items()}
    for facts in found:
        if facts.id in (busy_ids or ()) and facts.name in activity:
            activity[facts.name] = {**(activity[facts.name] or {}), "requests": 1}
    prefix = f"{provider.name}|{provider.engine}|"
    record = refresh_record(
        boxes, load_record(state_file), now, {prefix} if project is None and box_ids is None else None
    )
    if box_ids is not None:
        # The relay's scope: a record of this engine whose box is no longer registered is of a box destroyed.
        record = {key: since for key, since in record.items()
                  if not key.startswith(prefix) or key.rsplit("|", 1)[-1] in box_ids}  # fmt: skip
    decisions = plan(boxes, agents, record, now, settings, activity)
    by_name = {facts.name: facts for facts in found}
    errors: list[str] = []

    def pause(box: str) -> BoxFacts | ProviderError:
        try:
            return provider.pause(box)
        except ProviderError as exc:
            return exc

    def stop(box: str) -> BoxFacts | ProviderError:
        try:
            # A stop through the collection's own path: the box's commits reach the host first.
            return _box.set_state(provider, by_name[box], "stopped")
        except ProviderError as exc:
            return exc

    for entry in decisions:
        entry["done"] = False
    errors += [f"{entry['name']}: {entry['reason']}" for entry in decisions if entry["action"] == "error"]
    todo = [] if check_mode else [e for e in decisions if e["action"] in ("pause", "stop")]
    # Pauses go side by side where the engine allows it (as the reads do); stops, which fetch the box's
    # commits into the host repository, one at a time.
    outcome = _agent.each_box(provider, [e["name"] for e in todo if e["action"] == "pause"], pause)
    outcome.update({e["name"]: stop(e["name"]) for e in todo if e["action"] == "stop"})
    for entry in todo:
        facts, after = by_name[entry["name"]], outcome[entry["name"]]
        if isinstance(after, ProviderError):
            # One box that fails must not keep the others running.
            entry.update(action="error", reason=f"{entry['action']} failed: {after}")
            errors.append(f"{facts.name}: {after}")
            continue
        if entry["action"] == "pause":
            record[record_key(facts.to_dict())] = now
        else:
            record.pop(record_key(facts.to_dict()), None)
        entry.update(done=True, state=after.state)
    if not check_mode:
        with contextlib.suppress(OSError):
            save_record(state_file, record)
    order = {e["name"]: -(e["idle_seconds"] or 0.0) for e in decisions}
    paused = sorted((e["name"] for e in decisions if e["action"] == "pause"), key=lambda n: (order[n], n))
    stopped = [e["name"] for e in decisions if e["action"] == "stop"]
    # What was read of each running box's agent, as the box reported it (the relay keeps it for the inventory).
    read = [{"id": facts.id, "name": facts.name, "agent": observed[facts.name][0]} for facts in found
            if facts.name in observed]  # fmt: skip
    return {"changed": bool(paused or stopped), "boxes": decisions, "paused": paused, "stopped": stopped,
            "errors": errors, "now": now, "agents": read}  # fmt: skip
