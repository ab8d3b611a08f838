#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_screen
short_description: The URL on this machine of a box's screen (noVNC), connecting at once
version_added: 0.2.0
description:
  - A box made with O(agentbox.box.agentbox_box#module:vnc=true) runs a desktop (Xvnc, openbox) with Chromium
    (C(agentbox-browser URL) in the box) and noVNC on its port 6080 (docs/screen.md). This module writes a page
    on this machine, C(~/.agentbox/screen/<box>.html) (mode 0600, in a 0700 folder), that takes the browser to
    noVNC's page on this machine's C(127.0.0.1) with the box's VNC password in the URL's fragment, so noVNC
    connects as it opens, and returns the page's C(file://) URL. The password is made on this machine from the
    box's id; it is in the page only, never in what the module returns (so in no Ansible output or log_path),
    and the fragment never reaches the box's web server (nor its log).
  - Local engine - the port the engine published on C(127.0.0.1) at create (it changes when the box is stopped
    and started, so ask again after a start).
  - Remote engines (O(provider=docker_ssh)) - a forward on this machine through the engine's SSH connection,
    as M(agentbox.box.agentbox_forward) makes (it ends at stop and destroy).
  - Before answering, noVNC's page is fetched through that URL, so a URL returned is one that answers.
  - A box made without O(agentbox.box.agentbox_box#module:vnc) fails with what to do (create it with vnc).
    Daytona and boxd boxes have no screen yet, and say so.
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
"""

EXAMPLES = r"""
- name: The screen of box fix-login
  agentbox.box.agentbox_screen:
    name: fix-login
  register: screen

- name: Open it
  ansible.builtin.debug:
    msg: "{{ screen.url }}"  # file:///home/me/.agentbox/screen/fix-login.html
"""

RETURN = r"""
url:
  description: "The C(file://) URL of the box's page on this machine: open it in a browser here and noVNC connects
    at once (the page holds the password). None in check mode when a forward would have to be started."
  returned: always
  type: str
  sample: "file:///home/me/.agentbox/screen/fix-login.html"
page:
  description: "The path of that page (mode 0600); in check mode, where it would be written."
  returned: when a URL was made
  type: str
novnc:
  description: "noVNC's page on this machine's C(127.0.0.1), without the password (it asks for it)."
  returned: when a URL was made
  type: str
  sample: "http://127.0.0.1:32771/vnc.html#autoconnect=1&resize=scale"
local_port:
  description: "The port on this machine's 127.0.0.1."
  returned: when a URL was made
  type: int
pid:
  description: "The forwarding process on this machine (docker_ssh; it ends at stop and destroy of the box)."
  returned: for a forward
  type: int
box:
  description: "The box's facts (see M(agentbox.box.agentbox_box))."
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.access import _screen
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    provider_from_params,
    run_provider_module,
)


def _task(module: AnsibleModule) -> dict:
    name = _naming.validate_box_name(module.params["name"])
    return _screen.screen(provider_from_params(module.params), name, module.check_mode)


def main() -> None:
    run_provider_module({"name": {"type": "str", "required": True}}, _task)


if __name__ == "__main__":
    main()
