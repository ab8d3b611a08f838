#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_doctor
short_description: Check every configured engine and provider, one line per check with the fix
version_added: 0.1.0
description:
  - Reads, never changes. On this machine, the docker, git and ssh programs, the box engine (answers, remaps user
    namespaces), the box image on it, the user's own engine, the unisolated boxes, the relay and the egress gateway
    it runs, the keys for C(ssh) into boxes and each agent's sign-in (present, readable, and not expired where the
    sign-in file records an expiry and holds no refresh token).
  - On each remote engine of O(engines), that SSH answers, Docker answers, its boxes are isolated (a box engine
    there, see M(agentbox.box.agentbox_engine)), the box image is there, and its unisolated boxes.
  - Daytona and boxd, each only when its API key (C(DAYTONA_API_KEY); C(BOXD_API_KEY) or C(BOXD_TOKEN)) is set,
    that the API answers and the box image (O(image)) is there.
  - Each check is V(ok), V(WARN) (works, worth knowing) or V(FAIL) (with the fix). A check that cannot run says
    why and what to install. The task itself fails only on bad options; C(playbooks/doctor.yml) fails when a
    check does.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  engines:
    description: Remote Docker engines (provider docker_ssh) to check.
    type: list
    elements: dict
    default: []
    suboptions:
      engine:
        description: The engine's SSH destination, an C(~/.ssh/config) alias or C(user@host[:port]).
        type: str
        required: true
      ssh_private_key_file:
        description: Private key used to reach it; default the SSH agent and C(~/.ssh/config).
        type: path
      ssh_strict_host_key_checking:
        description: Check its host key against C(~/.ssh/known_hosts).
        type: bool
        default: true
  image:
    description: The box image to look for.
    type: str
    default: agentbox/box:latest
  agents:
    description: Agents whose sign-in is required (a missing one is a V(FAIL), not a V(WARN)).
    type: list
    elements: str
    default: []
  local:
    description: Check this machine (the box engine, the relay, keys, sign-ins).
    type: bool
    default: true
  clouds:
    description: Check Daytona and boxd when their credentials are set.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Check everything
  agentbox.box.agentbox_doctor:
    engines:
      - engine: builder1
  register: doctor
"""

RETURN = r"""
checks:
  description: One entry per check, in order.
  returned: always
  type: list
  elements: dict
  contains:
    where: {description: "What was checked: C(this machine), C(box engine), C(engine builder1), C(daytona)...", type: str}
    name: {description: The check., type: str}
    status: {description: "V(ok), V(WARN) or V(FAIL).", type: str}
    detail: {description: What was found., type: str}
    fix: {description: What to do about it (empty when nothing is to be done)., type: str}
    line: {description: The check as one printed line., type: str}
lines:
  description: The checks' lines.
  returned: always
  type: list
  elements: str
failures:
  description: How many checks failed.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import run_module
from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import ssh_engine_options
from ansible_collections.agentbox.box.plugins.module_utils.tasks._doctor import FAIL, run_all


def _run(module: AnsibleModule) -> dict:
    params = module.params
    engines = [
        {"engine": entry["engine"], "ssh_options": ssh_engine_options(entry.get("ssh_private_key_file"),
                                                                      entry.get("ssh_strict_host_key_checking"))}
        for entry in params["engines"]
    ]  # fmt: skip
    checks = run_all(engines, params["image"], params["agents"], params["local"], params["clouds"])
    return {
        "changed": False,
        "checks": [check.to_dict() for check in checks],
        "lines": [check.line for check in checks],
        "failures": sum(1 for check in checks if check.status == FAIL),
    }


def main() -> None:
    engine_spec = {
        "engine": {"type": "str", "required": True},
        "ssh_private_key_file": {"type": "path"},
        "ssh_strict_host_key_checking": {"type": "bool", "default": True},
    }
    module = AnsibleModule(
        argument_spec={
            "engines": {"type": "list", "elements": "dict", "default": [], "options": engine_spec},
            "image": {"type": "str", "default": "agentbox/box:latest"},
            "agents": {"type": "list", "elements": "str", "default": []},
            "local": {"type": "bool", "default": True},
            "clouds": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    run_module(module, _run)


if __name__ == "__main__":
    main()
