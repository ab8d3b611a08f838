#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_forward
short_description: A URL on this machine for a port of a box
version_added: 0.2.0
description:
  - Any port of a running box, without recreating it. Ports published at create (the web port 80 and the box's
    O(agentbox.box.agentbox_box#module:ports)) are used as they are; any other port of a box on a Docker engine gets a forward on this machine.
  - Local engine - a published port's URL is returned as it is now (published ports change when a box is stopped
    and started, so ask again after a start). Any other port - a detached forwarder on this machine's
    C(127.0.0.1:<local_port>) (V(0) picks a free port); each connection runs a small relay in the box
    (C(docker exec -i <box> python3 ...)) that connects to C(127.0.0.1:<port>) inside the box, the box's own
    loopback - no traffic goes to the container's IP, nothing the box sends is run or trusted on this machine,
    and nothing the box sends makes the forwarder connect anywhere.
  - Remote engines (O(provider=docker_ssh)) - a published port gets a detached process on this machine that
    carries each connection over the engine's SSH connection to the port the engine published on its
    C(127.0.0.1); any other port the same forwarder as the local engine's, whose relay runs over the engine's
    SSH connection (the SSH alias's shared connection).
  - A forward (it has a C(pid)) is recorded on this machine in C(~/.agentbox/forwards.json); asking again for
    the same box and port returns the live one (not changed); M(agentbox.box.agentbox_box_info) and
    C(playbooks/list_boxes.yml) list them; a stop or destroy of the box ends them, and O(state=absent) ends one.
  - Daytona - a signed preview URL for any port, valid for O(ttl) seconds.
  - boxd - the public URL of a port the box exposed when it was created (the web port 80 and the ports given
    at create, at most 3 in all - boxd's public forwards are capped at 3 per machine, and each is open to the
    internet without a credential, so none is opened later); any other port fails and says which ports the box
    exposes.
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
  port:
    description: >-
      The port in the box (its own C(127.0.0.1) or any address). Any port on Docker engines and Daytona; on boxd
      the ports the box exposed at create.
    type: int
    default: 80
  local_port:
    description: >-
      The port on this machine's C(127.0.0.1) for a forward; V(0) picks a free one. A live forward of the same
      port on another local port is replaced.
    type: int
    default: 0
  state:
    description: V(absent) ends the forward of O(port) of the box (the box may be gone already).
    type: str
    choices: [present, absent]
    default: present
  ttl:
    description: Seconds a Daytona signed preview URL stays valid (at most one day).
    type: int
    default: 3600
"""

EXAMPLES = r"""
- name: A port the box did not publish at create, on this machine's 127.0.0.1
  agentbox.box.agentbox_forward:
    name: fix-login
    port: 5173
  register: dev_server

- name: End that forward
  agentbox.box.agentbox_forward:
    name: fix-login
    port: 5173
    state: absent

- name: The web port of a box on a remote engine, on this machine
  agentbox.box.agentbox_forward:
    name: fix-login
    provider: docker_ssh
    engine: builder1
  register: forwarded
"""

RETURN = r"""
url:
  description: "The URL on this machine (or the signed preview URL for Daytona, the public URL of the port for boxd)."
  returned: with O(state=present)
  type: str
  sample: http://127.0.0.1:41235/
pid:
  description: "The forwarding process on this machine (it ends at stop and destroy of the box, or with O(state=absent))."
  returned: for a forward
  type: int
removed:
  description: "With O(state=absent), the forward ended (C(port), C(local_port), C(pid), C(url)); empty when there was none."
  returned: with O(state=absent)
  type: list
  elements: dict
local_port:
  description: "The port on this machine's 127.0.0.1."
  returned: for local and remote engines
  type: int
nothing_listens:
  description: >-
    Why the URL answers nothing useful yet, asked in the box before the URL is made: C(nothing listens on port N in
    the box) (for the web port 80, with the reason its forwarder gives, such as no service in C(agentbox.yaml) setting
    C(expose)); empty when something listens there, or when the box cannot tell (an image without C(python3)).
  returned: with O(state=present)
  type: str
  sample: nothing listens on port 8000 in the box
expires_in:
  description: "Seconds the Daytona URL stays valid."
  returned: for Daytona
  type: int
box:
  description: "The box's facts (see M(agentbox.box.agentbox_box))."
  returned: with O(state=present)
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.access import _access, _forwards
from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    provider_from_params,
    run_provider_module,
)

MAX_TTL = 24 * 3600


def _task(module: AnsibleModule) -> dict:
    params = module.params
    name = _naming.validate_box_name(params["name"])
    port = params["port"]
    if not 0 < port < 65536 or not 0 <= params["local_port"] < 65536:
        raise ValueError("port must be 1-65535 and local_port 0-65535")
    if not 0 < params["ttl"] <= MAX_TTL:
        raise ValueError(f"ttl must be 1-{MAX_TTL} seconds")
    provider = provider_from_params(params)
    if params["state"] == "absent":  # the box may be gone already: its forward goes all the same
        live = _forwards.live_forward(provider, name, port)
        if live and not module.check_mode:
            _forwards.remove(provider.name, provider.engine, name, port)
        shown = [{key: live[key] for key in ("port", "local_port", "pid", "url")}] if live else []
        return {"changed": bool(live), "removed": shown}
    facts = provider.find(name)
    if facts is None:
        raise ValueError(
            f"no box called {name!r} on engine {provider.engine}: list boxes with playbooks/list_boxes.yml"
        )
    if facts.state != "running":
        raise ValueError(f"box {name!r} is {facts.state}: start it (playbooks/box_state.yml -e state=started)")
    result: dict = {"changed": False, "box": facts.to_dict()}
    # Asked in the box first: a URL to a port where nothing listens answers 503 (or nothing at all).
    result["nothing_listens"] = _access.nothing_listens(provider, name, port, web=port == _box.WEB_PORT)
    if provider.port_urls == "signed":
        result["expires_in"] = params["ttl"]
        result["url"] = None if module.check_mode else provider.preview_url(name, port, expires_in=params["ttl"])
        return result
    if provider.port_urls == "exposed":
        result["url"] = provider.preview_url(name, port, expires_in=params["ttl"])  # a read: check mode too
        return result
    result.update(_forwards.url_of_port(provider, facts, port, params["local_port"], module.check_mode))
    return result


def main() -> None:
    options = {
        "name": {"type": "str", "required": True},
        "port": {"type": "int", "default": 80},
        "local_port": {"type": "int", "default": 0},
        "ttl": {"type": "int", "default": 3600},
        "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
    }
    run_provider_module(options, _task)


if __name__ == "__main__":
    main()
