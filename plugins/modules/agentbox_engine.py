#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_engine
short_description: Set up the box engine on a remote Docker engine, over SSH
version_added: 0.1.0
description:
  - Boxes on a remote engine (O(agentbox.box.agentbox_box#module:provider=docker_ssh)) are isolated the way local
    ones are, by a box engine there (a Docker daemon with user-namespace remapping at
    C(unix:///run/agentbox-engine/docker.sock)); without one, creating a box there is refused unless
    O(agentbox.box.agentbox_box#module:isolation=none) is given.
  - This module sends C(scripts/ensure-box-engine.sh) and C(scripts/agentbox-runc) over the engine's SSH connection
    (the one boxes use, with C(~/.ssh/config) or C(AGENTBOX_SSH_CONFIG), its key and host key checks) and runs the script
    as root there (directly as root, else with C(sudo -n)). The engine needs Debian's or Ubuntu's C(docker.io),
    C(iproute2) and C(iptables); the engine's own Docker daemon is left alone.
  - Nothing is done when a box engine that remaps already answers there. Check mode says whether it would run.
  - Runs on the controller.
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
  engine:
    description: The engine's SSH destination, an C(~/.ssh/config) alias or C(user@host[:port]).
    type: str
    required: true
  scripts_dir:
    description:
      - The directory on the controller holding C(ensure-box-engine.sh) and C(agentbox-runc) (the collection's
        C(scripts/); C(playbooks/box_engine.yml) passes it).
    type: path
    required: true
  ssh_strict_host_key_checking:
    description: Check the engine's host key against C(~/.ssh/known_hosts).
    type: bool
    default: true
  ssh_private_key_file:
    description: Private key used to reach O(engine); default the SSH agent and C(~/.ssh/config).
    type: path
"""

EXAMPLES = r"""
- name: Isolate the boxes of builder1
  agentbox.box.agentbox_engine:
    engine: builder1
    scripts_dir: "{{ playbook_dir }}/../scripts"
"""

RETURN = r"""
engine:
  description: What answers on the engine after the task (before it, in check mode).
  returned: always
  type: dict
  contains:
    engine: {description: The engine as given., type: str}
    user: {description: The SSH user., type: str}
    box_engine: {description: Whether a Docker daemon answers that user at the box engine's socket., type: bool}
    box_engine_remaps: {description: Whether that daemon remaps user namespaces., type: bool}
    default_engine: {description: Whether the engine's default Docker daemon answers that user., type: bool}
    default_remaps: {description: Whether the engine's default Docker daemon remaps user namespaces., type: bool}
    isolated: {description: Whether boxes created there without isolation none are isolated (and made at all)., type: bool}
    socket: {description: "The box engine's address there, C(unix:///run/agentbox-engine/docker.sock).", type: str}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import run_module
from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import ssh_engine_options
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._engine_setup import set_up


def _run(module: AnsibleModule) -> dict:
    params = module.params
    ssh_options = ssh_engine_options(params["ssh_private_key_file"], params["ssh_strict_host_key_checking"])
    changed, status = set_up(params["engine"], params["scripts_dir"], ssh_options, module.check_mode)
    return {"changed": changed, "engine": status.to_dict()}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "engine": {"type": "str", "required": True},
            "scripts_dir": {"type": "path", "required": True},
            "ssh_strict_host_key_checking": {"type": "bool", "default": True},
            "ssh_private_key_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    run_module(module, _run)


if __name__ == "__main__":
    main()
