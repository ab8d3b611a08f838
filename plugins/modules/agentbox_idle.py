#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_idle
short_description: The idle policy for every provider - a running cap, pause the longest-idle first, stop after hours
version_added: 0.1.0
description:
  - While more than O(max_running) boxes of a project run (O(scope)), pauses the boxes whose agent has been V(idle) longest (idle at least
    O(idle_minutes)). Never pauses a box whose agent is V(working) or V(waiting), nor a box with no agent (or whose
    agent stopped) unless O(include_agentless).
  - An agent V(working) with no progress (its transcript or state file unchanged) for O(stalled_minutes) is
    V(stalled), and counts as idle since its last progress (an agent looping on a connection error is paused too).
  - Stops boxes paused longer than O(stop_after_hours), through the collection's stop (the box's commits reach the
    host first). The engine keeps no pause time, so the host records it in O(state_file) when this policy pauses a
    box, or when it first sees a box paused some other way; the box cannot write that file.
  - Activity is the agent's state as its hooks record it in the box (C(agentbox-ctl agent-state)), the last
    terminal input in the box, open C(ssh agentbox-<box>) sessions and open connections to the web port, all read
    in one exec per running box and checked on the host; see docs/idle.md.
  - The same policy runs in the relay every 30 seconds (docs/idle.md). On Daytona a pause stops and archives the
    sandbox, as before. An ephemeral Daytona box (deleted as soon as it stops) is kept and not counted toward
    O(max_running); Daytona's own auto-stop ends it.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.provider
  - agentbox.box.attributes
options:
  workspace:
    description: Only the boxes of the project of this workspace directory. Default every box of the engine.
    type: path
  project:
    description: Only the boxes of this project (16 hex digits).
    type: str
  max_running:
    description: How many boxes may run at once before idle ones are paused.
    type: int
    default: 5
  idle_minutes:
    description: An agent idle for less than this is never paused.
    type: float
    default: 5
  stop_after_hours:
    description: A box paused longer than this is stopped.
    type: float
    default: 12
  include_agentless:
    description: Also pause boxes with no agent (or a stopped one), after every idle one.
    type: bool
    default: false
  stalled_minutes:
    description: An agent V(working) with no progress for this long is V(stalled), idle since its last progress.
    type: float
    default: 10
  scope:
    description:
      - What O(max_running) counts. V(project) (the default) counts each project's running boxes apart, so one
        project's boxes never pause another's; V(all) counts every box looked at together (one cap for the machine).
    type: str
    choices: [project, all]
    default: project
  state_file:
    description: The host's record of when each box was paused. Default C(~/.agentbox/idle/paused.json).
    type: path
  now:
    description:
      - "For tests only: the current time, in epoch seconds, so that a test can place itself hours later without
        waiting. Never set it in production."
    type: float
attributes:
  check_mode:
    support: full
    details:
      - Lists what would be paused and stopped; reads the agents' states and activity (one exec per running box),
        changes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: At most 5 running boxes of this project
  agentbox.box.agentbox_idle:
    workspace: /home/me/src/app
    max_running: 5

- name: What the policy would do on Daytona
  agentbox.box.agentbox_idle:
    provider: daytona
  check_mode: true
"""

RETURN = r"""
boxes:
  description: One entry per box looked at, in name order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Box name.
      type: str
    state:
      description: The box's state after the run.
      type: str
    action:
      description: V(pause), V(stop), V(keep) or V(error) (in check mode, what would be done).
      type: str
    done:
      description: Whether the action was carried out (false in check mode and for V(keep)).
      type: bool
    reason:
      description: Why.
      type: str
    agent_state:
      description: The agent's state (null without an agent); V(stalled) for one working without progress.
      type: str
    idle_seconds:
      description: How long the agent has been idle (null unless idle).
      type: float
    paused_seconds:
      description: How long the box has been paused, by the host's record (null unless paused).
      type: float
paused:
  description: Names of the boxes paused (or that would be), longest idle first.
  returned: always
  type: list
  elements: str
stopped:
  description: Names of the boxes stopped (or that would be).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from ansible_collections.agentbox.box.plugins.module_utils.idle import _idle
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    fail_on_errors,
    provider_from_params,
    run_provider_module,
)


def _run(module: AnsibleModule) -> dict:
    params = module.params
    try:
        settings = _idle.validate({key: params[key] for key in _idle.DEFAULTS})
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    project = _naming.project_of(params["project"], params["workspace"])
    provider = provider_from_params(params)
    result = _idle.run_pass(provider, settings, project=project, now=params["now"],
                            state_file=params["state_file"], check_mode=module.check_mode)  # fmt: skip
    errors = result.pop("errors")
    result.pop("now")
    result.pop("agents")
    return fail_on_errors(module, "the idle policy", errors, result)


def main() -> None:
    options = {
        "workspace": {"type": "path"},
        "project": {"type": "str"},
        "max_running": {"type": "int", "default": 5},
        "idle_minutes": {"type": "float", "default": 5},
        "stop_after_hours": {"type": "float", "default": 12},
        "include_agentless": {"type": "bool", "default": False},
        "stalled_minutes": {"type": "float", "default": _idle.DEFAULTS["stalled_minutes"]},
        "scope": {"type": "str", "default": "project", "choices": list(_idle.SCOPES)},
        "state_file": {"type": "path"},
        "now": {"type": "float"},
    }
    run_provider_module(options, _run, mutually_exclusive=[("workspace", "project")])


if __name__ == "__main__":
    main()
