# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agentbox_agent task, shared by the module and its action plugin.

Above both _agent (agents in a box) and _box (a stopped box is started before its agent), so
neither of those imports the other's caller: _box resumes agents through _agent, this starts boxes
through _box.
"""

from __future__ import annotations

import time
from typing import Any

from ..agent import _agent
from ..box import _box
from ..core import _naming
from ..core._provider import BoxFacts, Provider

AGENT_ARGUMENT_SPEC: dict[str, Any] = {
    "box": {"type": "str", "required": True},
    "agent": {"type": "str", "default": "claude"},
    "command": {"type": "str"},
    "state": {"type": "str", "default": "started", "choices": ["started", "stopped", "query"]},
    "prompt": {"type": "str"},
    "session": {"type": "str"},
    "args": {"type": "list", "elements": "str", "default": []},
    "skip_permissions": {"type": "bool", "default": True},
    "env": {"type": "dict", "default": {}, "no_log": True},
    "transcript": {"type": "int", "default": 0},
    "stalled_minutes": {"type": "float", "default": _agent.STALLED_MINUTES},
}


def run_agent_task(params: dict[str, Any], provider: Provider, check_mode: bool) -> tuple[dict[str, Any], list[str]]:
    """The whole agentbox_agent task: (result, warnings). Raises ProviderError or ValueError."""
    agent, session = _agent.validate(params["agent"], params["command"], params["session"])
    name = _naming.validate_box_name(params["box"])
    if params["transcript"] < 0 or params["stalled_minutes"] < 0:
        raise ValueError("transcript (a number of lines) and stalled_minutes must be 0 or more")
    facts = provider.find(name)
    if facts is None:
        raise ValueError(
            f"no box called {name!r} on engine {provider.engine}: create it first "
            f"(ansible-playbook playbooks/create_box.yml -e box={name})"
        )
    result: dict[str, Any] = {"changed": False, "session": session, "attach": _agent.attach_command(provider, facts, session)}
    result, warnings = _act(params, provider, facts, session, agent, result, check_mode)
    box = result.get("box") or {}
    if box.get("agent"):
        box["agent"] = _agent.judged(box["agent"], params["stalled_minutes"], time.time())
    if params["transcript"]:
        state = box.get("state", facts.state)
        shown = _agent.transcript(provider, facts, session, params["transcript"]) if state == "running" else None
        result["transcript"] = shown or []
        if shown is None:
            why = f"no tmux session {session!r} runs in it" if state == "running" else f"it is {state}"
            warnings.append(f"no transcript to show for box {name}: {why}")
    return result, warnings


def _act(params: dict[str, Any], provider: Provider, facts: BoxFacts, session: str, agent: str, result: dict[str, Any],
         check_mode: bool) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """What the state asks for: (result with `box`, warnings)."""
    warnings: list[str] = []
    name = facts.name
    if params["state"] in ("stopped", "query"):
        states = _agent.read_states(provider, name) if facts.state == "running" else []
        mine = next((s for s in states if s["session"] == session), None)
        if params["state"] == "stopped" and mine and mine["state"] != "stopped":
            result["changed"] = True
            if not check_mode:
                answer = _agent.stop(provider, facts, session)
                result["changed"] = bool(answer.get("changed"))
                states = [s for s in map(_agent.sanitize_state, answer.get("agents") or []) if s]
        result["box"] = {**facts.to_dict(), "agent": mine if params["state"] == "query" else _agent.current(states)}
        return result, warnings

    if facts.state != "running":
        # A stopped box is started (with its boot sequence), a paused one resumed, before the agent.
        result["changed"] = True
        if check_mode:
            result["box"] = {**facts.to_dict(), "state": "running", "agent": None}
            return result, warnings
        facts = _box.set_state(provider, facts, "started")
    known = agent in _agent.AGENTS
    credentials = _agent.collect_credentials(agent if known else "", params["env"])
    if known and not params["command"] and not credentials.found:
        warnings.append(
            f"no credentials for {agent} found (looked in: {'; '.join(credentials.looked)}): the agent starts "
            f"anyway, sign in inside it ({result['attach']}) or once for every box with "
            f"ansible-playbook playbooks/agent_login.yml -e agent={agent}"
        )
    result["credentials"] = credentials.found
    if check_mode:
        states = _agent.read_states(provider, name)
        mine = next((s for s in states if s["session"] == session), None)
        result["changed"] = result["changed"] or mine is None or mine["state"] == "stopped" or bool(params["prompt"])
        result["box"] = {**facts.to_dict(), "agent": _agent.current(states)}
        return result, warnings
    answer = _agent.start(
        provider,
        facts,
        agent=agent,
        session=session,
        command=params["command"],
        prompt=params["prompt"],
        args=list(params["args"]),
        skip_permissions=params["skip_permissions"],
        credentials=credentials,
    )
    result["changed"] = result["changed"] or bool(answer.get("changed"))
    states = [s for s in map(_agent.sanitize_state, answer.get("agents") or []) if s]
    mine = next((s for s in states if s["session"] == session), None)
    if params["prompt"] and (not answer.get("changed") or params["command"]):
        # The session was running already, or runs a command line of the user's (no place in it for a prompt):
        # the prompt goes to it, typed in as a person would.
        _agent.send_prompt(provider, facts, session, params["prompt"])
        result["changed"] = result["sent"] = True
    result["box"] = {**facts.to_dict(), "agent": mine or _agent.current(states)}
    return result, warnings
