#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_init
short_description: Write a project's agentbox.yaml from what its workspace holds
version_added: 0.2.0
description:
  - Inspects the workspace's root and its first-level directories (nothing is executed) - package managers and
    their lock files (npm, pnpm, yarn; pip, Poetry, uv, Pipenv; Cargo; Go modules; Docker Compose files), the dev
    server and its port, the test command - and writes a commented C(agentbox.yaml) with an install task per
    package manager and a service per dev server or compose file.
  - Install tasks are marker-guarded - they run once per box, and again only when their lock files change (the
    marker holds the files' checksum), so a checkpoint taken after them starts new boxes with the install done.
    A tool the box image lacks (pnpm, yarn, uv, Poetry, Go, Cargo, Compose) is installed by the task first.
  - The file is checked with the in-box supervisor's own validator before it is written; a file it would refuse
    is never written.
  - An existing C(agentbox.yaml) is never replaced unless O(force=true); the task then fails and says so. With
    C(--diff) the change is shown; C(--check --diff) shows it without writing.
  - A workspace it cannot classify gets a minimal commented file and a message saying what to fill in.
  - C(playbooks/init.yml) runs it, and with C(-e checkpoint=true) installs in a box and takes the project's
    default checkpoint from it.
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
  workspace:
    description: The project's directory; C(agentbox.yaml) is written at its root.
    type: path
    required: true
  force:
    description: Replace an existing C(agentbox.yaml).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Write agentbox.yaml for the project in ~/src/shop
  agentbox.box.agentbox_init:
    workspace: ~/src/shop
  register: init

- name: Say what it found
  ansible.builtin.debug:
    msg: "{{ init.found }}; tests: {{ init.tests }}"
"""

RETURN = r"""
path:
  description: The file written (or that would be).
  returned: always
  type: str
  sample: /home/me/src/shop/agentbox.yaml
content:
  description: The file's text as proposed.
  returned: always
  type: str
found:
  description: What the inspection found, one entry per package manager, dev server or compose file.
  returned: always
  type: list
  elements: str
  sample: ["npm (package-lock.json)", "vite dev server (port 5173)"]
tasks:
  description: The install tasks written, by name.
  returned: always
  type: list
  elements: str
  sample: [install]
services:
  description: The services written, by name.
  returned: always
  type: list
  elements: str
  sample: [web]
web_port:
  description: The port in the box the box's web port 80 forwards to; V(0) when no service exposes one.
  returned: always
  type: int
  sample: 5173
tests:
  description: How to run the project's tests in a box (a comment in the file; not run).
  returned: always
  type: list
  elements: str
  sample: [npm test]
classified:
  description: Whether the workspace said how to install or run it; V(false) - a minimal file to fill in.
  returned: always
  type: bool
fill_in:
  description: What is left to write by hand, in one sentence; empty when nothing is.
  returned: always
  type: str
issues:
  description: "The validator's warnings on the proposed file, each C(<file>:<line>: warning: ...)."
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import run_module
from ansible_collections.agentbox.box.plugins.module_utils.tasks._init_task import INIT_ARGUMENT_SPEC, run_init_task


def _run(module: AnsibleModule) -> dict:
    result, warnings = run_init_task(module.params, module.check_mode)
    for warning in warnings:
        module.warn(warning)
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=INIT_ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, _run)


if __name__ == "__main__":
    main()
