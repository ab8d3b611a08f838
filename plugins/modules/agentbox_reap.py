#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_reap
short_description: Pause running boxes whose agent has been idle longer than their idle timeout
version_added: 0.1.0
description:
  - The host-enforced idle timeout. Daytona's own auto-stop counts any API request as activity, including the
    requests this collection makes, so it cannot tell an idle agent from a watched one; this module measures the
    agent's own activity in the box and pauses the boxes that have been idle too long. Run it from cron
    (C(playbooks/reap_idle.yml)). Daytona's auto-stop stays set on every box as a backstop.
  - "The idle signal, read in the box as the box user: the modification time of C(~/.agentbox/last-activity) (an
    agent or its hooks touch it), and the newest C(window_activity) of the user's tmux windows. The last activity is
    the newest of the two; a file under C(/workspace) changed within the timeout also counts as activity."
  - A box with neither a heartbeat file nor a tmux window has B(no idle signal) and is never paused (an attached
    shell with no agent must not be stopped under its user).
  - An ephemeral box (Daytona deletes it as soon as it stops) is skipped, never paused; Daytona's own auto-stop
    ends it.
  - A box's timeout is its C(io.agentbox.idle_timeout) label (minutes; set at create from C(AGENTBOX_IDLE_TIMEOUT)
    on Daytona), unless O(idle_timeout) overrides it. A box with neither is left alone unless
    O(default_idle_timeout) is given.
  - Works on every provider (it uses only exec and pause); pausing a Daytona box stops and archives it.
  - For a cap on running boxes decided by the agents' states (pause the longest-idle first, stop after hours), see
    M(agentbox.box.agentbox_idle) and C(playbooks/autopause.yml).
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.provider
  - agentbox.box.attributes
options:
  name:
    description: Only this box. Without it, every running box of the engine (of O(project) or O(workspace) when given).
    type: str
  project:
    description: Only boxes of this project (16 hex digits).
    type: str
  workspace:
    description: Only boxes of the project of this workspace directory.
    type: path
  idle_timeout:
    description: Minutes of agent idleness after which a box is paused, for every box (overrides their labels).
    type: float
  default_idle_timeout:
    description: Minutes for boxes that carry no C(io.agentbox.idle_timeout) label. Without it they are skipped.
    type: float
attributes:
  check_mode:
    support: full
    details:
      - Reports which boxes would be paused; the idle probe still runs in each box (it changes nothing).
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Pause Daytona boxes idle longer than their timeout
  agentbox.box.agentbox_reap:
    provider: daytona

- name: What would be paused with a 10 minute timeout
  agentbox.box.agentbox_reap:
    provider: daytona
    idle_timeout: 10
  check_mode: true
"""

RETURN = r"""
box:
  description: "The box's facts with O(name) (after any pause); empty otherwise."
  returned: always
  type: dict
boxes:
  description: "One entry per box looked at."
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Box name.
      type: str
    state:
      description: State after the run.
      type: str
    action:
      description: "V(paused), V(would_pause), V(kept), V(skipped) or V(error)."
      type: str
    reason:
      description: Why.
      type: str
    idle_seconds:
      description: Seconds since the agent's last activity (null without an idle signal).
      type: float
    idle_timeout:
      description: The timeout applied, in minutes (null when none).
      type: float
paused:
  description: Names of the boxes paused (or that would be, in check mode).
  returned: always
  type: list
  elements: str
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils import _naming
from ansible_collections.agentbox.box.plugins.module_utils._daytona_idle import (
    IDLE_LABEL,
    IDLE_PROBE_SCRIPT,
    idle_decision,
)
from ansible_collections.agentbox.box.plugins.module_utils._idle import EPHEMERAL_REASON
from ansible_collections.agentbox.box.plugins.module_utils._module import (
    fail_on_errors,
    provider_from_params,
    run_provider_module,
)
from ansible_collections.agentbox.box.plugins.module_utils._provider import BoxFacts, Provider, ProviderError


def _timeout_for(facts: BoxFacts, params: dict) -> float | None:
    if params["idle_timeout"] is not None:
        return float(params["idle_timeout"])
    raw = facts.labels.get(IDLE_LABEL)
    if raw:
        try:
            return float(raw)
        except ValueError:
            pass
    return float(params["default_idle_timeout"]) if params["default_idle_timeout"] is not None else None


def probe(provider: Provider, box: str, timeout_minutes: float) -> dict[str, str]:
    """The box's idle signal as key=value pairs (now, heartbeat, tmux, recent)."""
    window = str(max(1, int(timeout_minutes * 60)))
    run = provider.exec(box, ["sh", "-c", IDLE_PROBE_SCRIPT, "agentbox-idle", window], limit=64 * 1024,
                        what="answer to the idle probe")
    run.check("the idle probe", box)
    values: dict[str, str] = {}
    for line in run.text.splitlines():
        key, sep, value = line.partition("=")
        if sep and value.strip():
            values[key.strip()] = value.strip()
    return values


def _one(provider: Provider, facts: BoxFacts, params: dict, check_mode: bool) -> dict:
    entry = {"name": facts.name, "state": facts.state, "idle_seconds": None, "idle_timeout": None}
    if facts.ephemeral:
        # A pause would delete it (Daytona deletes an ephemeral box as it stops): its own auto-stop ends it.
        return {**entry, "action": "skipped", "reason": EPHEMERAL_REASON}
    if facts.state != "running":
        return {**entry, "action": "skipped", "reason": f"the box is {facts.state}"}
    timeout = _timeout_for(facts, params)
    entry["idle_timeout"] = timeout
    if timeout is None:
        return {
            **entry,
            "action": "skipped",
            "reason": "no idle timeout: the box has no io.agentbox.idle_timeout label and none was given",
        }
    action, reason, idle = idle_decision(probe(provider, facts.name, timeout), timeout)
    entry.update(idle_seconds=idle, reason=reason)
    if action != "pause":
        return {**entry, "action": "kept"}
    if check_mode:
        return {**entry, "action": "would_pause"}
    paused = provider.pause(facts.name)
    return {**entry, "action": "paused", "state": paused.state}


def _run(module: AnsibleModule) -> dict:
    params = module.params
    for key in ("idle_timeout", "default_idle_timeout"):
        if params[key] is not None and params[key] <= 0:
            module.fail_json(msg=f"{key} must be a positive number of minutes, not {params[key]}")
    provider = provider_from_params(params)
    if params["name"]:
        facts = provider.find(_naming.validate_box_name(params["name"]))
        if facts is None:
            module.fail_json(msg=f"no box called {params['name']!r} on engine {provider.engine}")
        found = [facts]
    else:
        found = provider.list_boxes(project=_naming.project_of(params["project"], params["workspace"]))
    boxes = []
    errors = []
    for facts in found:
        try:
            boxes.append(_one(provider, facts, params, module.check_mode))
        except ProviderError as exc:
            # One box that cannot be probed must not keep the others running.
            boxes.append({"name": facts.name, "state": facts.state, "action": "error", "reason": str(exc),
                          "idle_seconds": None, "idle_timeout": None})  # fmt: skip
            errors.append(f"{facts.name}: {exc}")
    paused = [b["name"] for b in boxes if b["action"] in ("paused", "would_pause")]
    result = {"changed": bool(paused), "boxes": boxes, "paused": paused, "box": {}}
    if params["name"]:
        after = provider.find(params["name"])
        result["box"] = after.to_dict() if after else {}
    return fail_on_errors(module, "the idle check", errors, result)


def main() -> None:
    options = {
        "name": {"type": "str"},
        "project": {"type": "str"},
        "workspace": {"type": "path"},
        "idle_timeout": {"type": "float"},
        "default_idle_timeout": {"type": "float"},
    }
    run_provider_module(options, _run)


if __name__ == "__main__":
    main()
