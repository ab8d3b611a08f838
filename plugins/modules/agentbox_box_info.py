#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_box_info
short_description: Facts about one box, or every box of an engine or project
version_added: 0.1.0
description:
  - Reads boxes from their C(io.agentbox.*) labels on the engine; nothing is read from local state files, so every
    machine that reaches the engine sees the same boxes.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.provider
  - agentbox.box.attributes
  - agentbox.box.attributes.info_module
options:
  name:
    description: One box. Without it, every box (of O(project) or O(workspace) when given).
    type: str
  project:
    description: Only boxes of this project (16 hex digits, see O(workspace)).
    type: str
  workspace:
    description: Only boxes of the project of this workspace directory.
    type: path
  agent_state:
    description:
      - Also read each running box's coding agent (one exec per box, side by side on the local engine) into
        C(agent) of its facts, C({name, session, state, since}), or null when none ever ran (or the box is not
        running).
    type: bool
    default: false
  stalled_minutes:
    description:
      - With O(agent_state), an agent V(working) with no progress (its transcript or state file unchanged) for this
        many minutes is shown as V(stalled), since its last progress.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: Every box of this repository
  agentbox.box.agentbox_box_info:
    workspace: "{{ playbook_dir }}/.."
  register: found

- name: One box
  agentbox.box.agentbox_box_info:
    name: fix-login
"""

RETURN = r"""
box:
  description: "The box's facts with O(name); empty when there is no such box."
  returned: always
  type: dict
boxes:
  description: >-
    Facts of every matching box, sorted by name (see M(agentbox.box.agentbox_box) for the keys), each with
    C(forwards): the live forwards M(agentbox.box.agentbox_forward) started on this machine (C(port), C(local_port),
    C(pid), C(url)).
  returned: always
  type: list
  elements: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.access import _forwards
from ansible_collections.agentbox.box.plugins.module_utils.agent._agent import STALLED_MINUTES, agents_of, judged
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    PROVIDER_ARGUMENT_SPEC,
    provider_from_params,
    run_module,
)


def _run(params: dict) -> dict:
    provider = provider_from_params(params)
    if params["name"]:
        facts = provider.find(_naming.validate_box_name(params["name"]))
        found = [facts] if facts else []
    else:
        found = provider.list_boxes(project=_naming.project_of(params["project"], params["workspace"]))
    boxes = [facts.to_dict() for facts in found]
    for box in boxes:  # the forwards agentbox_forward started on this machine, still alive
        box["forwards"] = [{key: record[key] for key in ("port", "local_port", "pid", "url")}
                           for record in _forwards.forwards_of(provider.name, provider.engine, box["name"])]  # fmt: skip
    if params["agent_state"]:
        agents = agents_of(provider, [box["name"] for box in boxes if box["state"] == "running"])
        now = time.time()
        for box in boxes:
            box["agent"] = judged(agents.get(box["name"]), params["stalled_minutes"], now)
    return {"changed": False, "box": boxes[0] if params["name"] and boxes else {}, "boxes": boxes}


def main() -> None:
    argument_spec = {
        "name": {"type": "str"},
        "project": {"type": "str"},
        "workspace": {"type": "path"},
        "agent_state": {"type": "bool", "default": False},
        "stalled_minutes": {"type": "float", "default": STALLED_MINUTES},
        **PROVIDER_ARGUMENT_SPEC,
    }
    module = AnsibleModule(
        argument_spec=argument_spec, supports_check_mode=True, mutually_exclusive=[["project", "workspace"]]
    )
    run_module(module, lambda mod: _run(mod.params))


if __name__ == "__main__":
    main()
