#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_best_of
short_description: Give one task to N coding agents in N boxes, let a check judge, adopt the best branch
version_added: 0.2.0
description:
  - Creates one box per run through the normal create path (O(from) a checkpoint), starts each agent with the
    task, follows its state until it is idle or stopped, waits for the user (reported, never answered), or
    runs past O(timeout); commits what it left on its own branch C(agentbox/<box>), runs O(check) in
    C(/workspace) and reads the tests passed and failed from pytest, jest or go test output.
  - The runs go at once, each on its own; a run whose agent crashes or whose box dies is reported as
    C(failed) with the reason and the others go on.
  - Writes C(~/.agentbox/best_of/<id>/result.json) (as it goes) and C(best_of.html) beside it.
  - Everything is checked before any box is made - an empty task, no check, an unknown agent, a count
    below 1 or above O(max_runs), an O(adopt) naming no run, a program of the check that the boxes would not
    find (looked for in the image or checkpoint the boxes start from, with a throwaway container, or in the
    box a fork starts from; a relative path in the workspace).
  - See docs/best_of.md.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.provider
  - agentbox.box.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  workspace:
    description: The git workspace every box is made from.
    type: path
    required: true
  task:
    description: The prompt every agent gets (a custom command gets it in C($AGENTBOX_TASK)).
    type: str
  task_file:
    description: A file on the host holding the task, instead of O(task).
    type: path
  agents:
    description:
      - A list; each a known agent (V(claude), V(codex), V(opencode)) or a mapping C({name, command, env}) for a
        custom command, run by C(bash -lc) in C(/workspace), done when it exits or reports V(idle). Repeats
        allowed. Default V([claude]).
      - An entry's C(timeout) (seconds) is that agent's own, instead of O(timeout).
    type: raw
  n:
    description: Repeat a single agent this many times.
    type: int
  check:
    description: The command that judges a run, in C(/workspace); default the test task of C(agentbox.yaml).
    type: str
  check_timeout:
    description: Seconds the check may run.
    type: float
    default: 900
  timeout:
    description: Seconds each agent may work; past it the agent is stopped and the run is V(timeout).
    type: float
    default: 1800
  from:
    description:
      - A checkpoint every box starts from, or a running box of the workspace to fork - every box starts from its
        exact state, its uncommitted work included (through a checkpoint of it, C(bo-<id>-from), removed after the
        runs unless O(keep_from) or boxes of the run still start from it).
    type: str
    aliases: [checkpoint]
  image:
    description: The box image the boxes start from (without O(from)), as for C(agentbox_box).
    type: str
    default: agentbox/box:latest
  keep_from:
    description: Keep the checkpoint a fork (O(from) a box) was made through.
    type: bool
    default: false
  engines:
    description:
      - Spread the runs over these docker_ssh engines, taken in turn as C(fleet_create.yml) does - each
        C(user@host[:port]), an C(~/.ssh/config) alias, or a mapping C({engine, ssh_private_key_file,
        ssh_strict_host_key_checking, isolation}). C(best_of.yml) makes the list from an inventory's C(engines)
        group (C(-i engines.yml)).
    type: list
    elements: raw
  push:
    description: Push the adopted run's branch to O(remote) from the host repository, as the relay pushes for a box.
    type: bool
    default: false
  pr:
    description: Push (as O(push)) and open the pull request with C(gh pr create), as the relay does for a box.
    type: bool
    default: false
  remote:
    description: The host repository's remote that O(push) and O(pr) go to.
    type: str
    default: origin
  adopt:
    description:
      - V(auto) (of the runs whose check passed, the fewest failed tests, the most passed, then the smallest
        diff), or a run's number, box or agent name (used once). Its branch is fetched into the host repository.
    type: str
  keep:
    description: V(all) boxes, only the V(winner) (the others and their branches removed), or V(none).
    type: str
    choices: [all, winner, none]
    default: all
  max_runs:
    description: The most runs allowed at once.
    type: int
    default: 8
  poll:
    description:
      - Seconds between two looks at an agent's state history, made inside its box; the module hears of a change
        at once (one exec per change, or per 20 s).
    type: float
    default: 0.25
  env:
    description: Extra variables for every agent's process (never logged).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Three agents on one task, the best adopted, the others removed
  agentbox.box.agentbox_best_of:
    workspace: /src/app
    task: Fix the failing date parser test
    agents: [claude, claude, codex]
    adopt: auto
    keep: winner
"""

RETURN = r"""
id:
  description: The run's id (its folder under C(~/.agentbox/best_of/)).
  returned: always
  type: str
runs:
  description: One per run - agent, box, branch, state (done, waiting, timeout, failed), check_rc, tests_passed,
    tests_failed, diff_stat, files, seconds, tokens, reason; create_seconds and check_seconds (the time of its
    create and of its check); engine (with O(engines)).
  returned: always
  type: list
  elements: dict
winner:
  description: The adopted run's agent, or null.
  returned: always
  type: str
fork:
  description: With O(from) a box - the box, the checkpoint its runs started from, and whether it was removed.
  returned: when O(from) names a box
  type: dict
pushed:
  description: With O(push) or O(pr) - the push's exit, output, remote, branch and commit; C(pr) the same for the PR.
  returned: when pushed
  type: dict
result_file:
  description: The JSON result.
  returned: unless check mode
  type: str
page:
  description: The HTML page.
  returned: unless check mode
  type: str
table:
  description: The result as a text table.
  returned: unless check mode
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import run_module
from ansible_collections.agentbox.box.plugins.module_utils.tasks._best_of import BEST_OF_ARGUMENT_SPEC, run_best_of


def _run(module: AnsibleModule) -> dict:
    result, warnings = run_best_of(module.params, module.check_mode)
    for warning in warnings:
        module.warn(warning)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=BEST_OF_ARGUMENT_SPEC, supports_check_mode=True, mutually_exclusive=[("task", "task_file")]
    )
    run_module(module, _run)


if __name__ == "__main__":
    main()
