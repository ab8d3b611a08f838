#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_relay
short_description: Start or stop the host relay, and answer the requests that wait for approval
version_added: 0.1.0
description:
  - The relay is a daemon of the host user that carries out what boxes ask through C(agentbox-ctl git push|fetch|pull),
    C(agentbox-ctl checkpoint), C(agentbox-ctl open) and C(agentbox-ctl gh pr), with the host user's credentials.
    Its state, log and audit log are under C(~/.agentbox/relay/). See C(docs/relay.md).
  - Runs on the controller (an action plugin), from the collection's files on disk.
  - Requests outside a box's own branch (another branch, a force push, a delete, a pull request merge) wait for the
    user; this module lists them and answers one.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  state:
    description:
      - V(started) starts the relay unless it runs (a second start is a no-op); V(stopped) stops it;
        V(restarted) stops and starts it. Boxes reconnect by themselves. Without it the relay is left as it is
        (to list or answer requests).
    type: str
    choices: [started, stopped, restarted]
  approve:
    description: The id of a pending request to approve (as listed in RV(lines)).
    type: str
  deny:
    description: The id of a pending request to deny.
    type: str
"""

EXAMPLES = r"""
- name: Make sure the relay runs
  agentbox.box.agentbox_relay:
    state: started

- name: Approve one waiting request
  agentbox.box.agentbox_relay:
    approve: 3fa9c1
"""

RETURN = r"""
running:
  description: Whether the relay runs after the task.
  returned: always
  type: bool
pid:
  description: The relay's process id, when it runs.
  returned: always
  type: int
home:
  description: The relay's directory (state, C(relay.log), C(audit.jsonl)).
  returned: always
  type: str
pending:
  description: Requests waiting for approval, oldest first.
  returned: always
  type: list
  elements: dict
  contains:
    id: {description: The request's id., type: str}
    box: {description: The box that asks., type: str}
    operation: {description: "C(git.push), C(gh.pr), ...", type: str}
    arguments: {description: The request's checked arguments., type: dict}
    reason: {description: Why it needs approval., type: str}
    line: {description: "C(<id> <box> <operation> <arguments>).", type: str}
lines:
  description: "One line per pending request: C(<id> <box> <operation> <arguments>)."
  returned: always
  type: list
  elements: str
answered:
  description: The request answered with O(approve) or O(deny), with its C(decision).
  returned: when O(approve) or O(deny) is given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import run_module
from ansible_collections.agentbox.box.plugins.module_utils.tasks._relay_main import RELAY_ARGUMENT_SPEC, relay_task


def main() -> None:
    module = AnsibleModule(
        argument_spec=RELAY_ARGUMENT_SPEC, supports_check_mode=True, mutually_exclusive=[["approve", "deny"]]
    )
    run_module(module, lambda mod: relay_task(mod.params, mod.check_mode))


if __name__ == "__main__":
    main()
