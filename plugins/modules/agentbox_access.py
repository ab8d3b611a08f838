#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_access
short_description: The way into a box - its SSH alias and the editor URI
version_added: 0.2.0
description:
  - Makes C(ssh agentbox-<name>) work for a box (its entry in C(~/.agentbox/ssh_config), the host user's public
    keys authorised in the box) and returns the URI an editor opens it with.
  - A Daytona box is reached through Daytona's SSH gateway with a new SSH access token (see RV(expires_at)).
  - A paused box is resumed and a stopped one started first (O(wake=true)), as opening an editor needs it running.
  - For a box that does not exist, a stale C(agentbox-<name>) entry is removed and the task fails saying so.
  - When the user has no SSH key (none of C(~/.ssh/id_ed25519), C(id_ecdsa), C(id_rsa) with its C(.pub), and no
    C(AGENTBOX_SSH_KEY)), a key for the boxes is made once, C(~/.agentbox/ssh/id_ed25519); C(~/.ssh) is never touched.
  - O(ssh_include) is the user's answer, remembered in C(~/.agentbox/access.json) - V(true) adds
    C(Include ~/.agentbox/ssh_config) at the top of C(~/.ssh/config) once, and every later create, start and attach
    keeps it; V(false) takes that line out. No other line of that file is ever changed, and without a V(true) the
    file is not touched.
  - Runs on the controller; C($HOME) is honoured.
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
  name:
    description: The box.
    type: str
    required: true
  ide:
    description:
      - V(vscode) and V(cursor) get the Dev Containers attach URI for a box on the local engine and the Remote-SSH URI
        for any other box; V(ssh) always the Remote-SSH URI; V(print) the same as V(vscode), for printing only.
    type: str
    choices: [vscode, cursor, ssh, print]
    default: vscode
  wake:
    description: Resume a paused box, start a stopped one (its in-box services relaunched).
    type: bool
    default: true
  ssh_include:
    description:
      - The user's answer about C(Include ~/.agentbox/ssh_config) at the top of C(~/.ssh/config), remembered for every
        later task. V(true) adds it (once) and keeps it, V(false) takes it out; unset, the remembered answer holds.
    type: bool
"""

EXAMPLES = r"""
- name: Open fix-login in VS Code
  agentbox.box.agentbox_access:
    name: fix-login
  register: way_in

- name: SSH alias only, and let plain `ssh agentbox-fix-login` find it
  agentbox.box.agentbox_access:
    name: fix-login
    ide: ssh
    ssh_include: true

- name: Print the way in
  ansible.builtin.debug:
    msg: "{{ way_in.ssh_command }}"
"""

RETURN = r"""
box:
  description: "The box's facts (see M(agentbox.box.agentbox_box))."
  returned: always
  type: dict
alias:
  description: "The SSH alias."
  returned: always
  type: str
  sample: agentbox-fix-login
ssh_config:
  description: "The file holding the alias."
  returned: always
  type: str
  sample: /home/me/.agentbox/ssh_config
uri:
  description: "What the editor opens (C(code --folder-uri URI))."
  returned: always
  type: str
  sample: vscode-remote://ssh-remote+agentbox-fix-login/workspace
editor:
  description: "The editor's command line program when it is installed, else null (print the URI)."
  returned: always
  type: str
  sample: /usr/bin/code
ssh_command:
  description:
    - "The line that opens a shell in the box: C(ssh agentbox-<name>) when C(~/.ssh/config) includes the aliases,
      else C(ssh -F ~/.agentbox/ssh_config agentbox-<name>). Always starts with C(ssh )."
  returned: always
  type: str
  sample: ssh -F ~/.agentbox/ssh_config agentbox-fix-login
include_hint:
  description: "How to turn the short form on, said once per user while it is off and unanswered; else empty."
  returned: always
  type: str
key_made:
  description: "The key made for the boxes by this task (the user had none), else null."
  returned: always
  type: str
  sample: /home/me/.agentbox/ssh/id_ed25519
include_line:
  description: "The line that makes plain C(ssh) read the aliases."
  returned: always
  type: str
  sample: Include ~/.agentbox/ssh_config
included:
  description: "Whether C(~/.ssh/config) has the Include line after the task."
  returned: always
  type: bool
warnings_access:
  description: "What keeps C(ssh agentbox-<name>) from working (no usable SSH key, no docker CLI)."
  returned: always
  type: list
  elements: str
expires_at:
  description:
    - "For a Daytona box, when the SSH access token behind the alias runs out (UTC, ISO 8601): each run of this
      module (and each start of the box) renews it. The token itself is kept in a private file, never returned."
    - "Null for other providers, and in check mode."
  returned: always
  type: str
  sample: "2026-12-01T21:10:06Z"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils import _access, _box, _naming
from ansible_collections.agentbox.box.plugins.module_utils._module import provider_from_params, run_provider_module


def _task(module: AnsibleModule) -> dict:
    params = module.params
    name = _naming.validate_box_name(params["name"])
    provider = provider_from_params(params)
    facts = provider.find(name)
    if facts is None:
        removed = False if module.check_mode else _access.box_removed(name, provider.engine)
        gone = f" (its stale alias {_access.alias(name)} was removed)" if removed else ""
        raise ValueError(
            f"no box called {name!r} on engine {provider.engine}{gone}: list boxes with playbooks/list_boxes.yml, "
            f"or create it with playbooks/create_box.yml -e box={name}"
        )
    changed = False
    if facts.state != "running":
        if not params["wake"]:
            raise ValueError(f"box {name!r} is {facts.state}: start it (playbooks/box_state.yml -e state=started)")
        changed = True
        if not module.check_mode:
            # set_state writes the alias after a start; a resumed box kept its keys.
            facts = _box.set_state(provider, facts, "started")
    answer = params["ssh_include"]
    if answer is not None and answer != _access.include_present():
        changed = True
    if answer is not None and not module.check_mode:
        _access.answer_include(answer)  # before the access, which keeps the line the user agreed to
    access: dict = {"alias": _access.alias(name), "ssh_config": _access.ssh_config_path(), "warnings": []}
    if not module.check_mode:
        before = _access.entry_engine(name)
        access = _box.refresh_access(provider, facts)
        changed = changed or before != facts.engine
    included = answer if answer is not None and module.check_mode else _access.include_present()
    for warning in access.get("warnings", []):
        module.warn(warning)
    return {
        "changed": changed,
        "box": facts.to_dict(),
        "alias": _access.alias(name),
        "ssh_config": _access.ssh_config_path(),
        "uri": _access.attach_uri(provider, facts, params["ide"]),
        "editor": None if params["ide"] == "print" else _access.editor_command(params["ide"]),
        "ssh_command": _access.ssh_command(name),
        "include_hint": "" if included else _access.include_hint(name, record=not module.check_mode),
        "key_made": access.get("key_made"),
        "include_line": _access.include_line(),
        "included": included,
        "warnings_access": access.get("warnings", []),
        "expires_at": access.get("expires_at"),
    }


def main() -> None:
    options = {
        "name": {"type": "str", "required": True},
        "ide": {"type": "str", "default": "vscode", "choices": ["vscode", "cursor", "ssh", "print"]},
        "wake": {"type": "bool", "default": True},
        "ssh_include": {"type": "bool"},
    }
    run_provider_module(options, _task)


if __name__ == "__main__":
    main()
