#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_forward
short_description: A URL on this machine for a port of a box
version_added: 0.2.0
description:
  - Local engine - the box's port is published on C(127.0.0.1); the URL is returned as it is now (ports change
    when a box is stopped and started, so ask again after a start).
  - Remote engines (O(provider=docker_ssh)) - box ports are published on the engine's C(127.0.0.1); a detached
    process on this machine listens on C(127.0.0.1:<local_port>) and carries each connection over the engine's SSH
    connection to that port, until it is killed (C(kill <pid>)) or the engine goes away.
  - Daytona - a signed preview URL for the port, valid for O(ttl) seconds.
  - boxd - the public URL of the port, for a port the box exposed when it was created (the web port 80 and the
    ports given at create, at most 3 in all); any other port fails and says which ports the box exposes.
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
      The port in the box. Boxes on Docker engines publish port 80 always and the ports given at create; boxd
      boxes expose the same ports.
    type: int
    default: 80
  local_port:
    description: The port on this machine's C(127.0.0.1) for a remote engine's forward; V(0) picks a free one.
    type: int
    default: 0
  ttl:
    description: Seconds a Daytona signed preview URL stays valid (at most one day).
    type: int
    default: 3600
"""

EXAMPLES = r"""
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
  returned: always
  type: str
  sample: http://127.0.0.1:41235/
pid:
  description: "The forwarding process, for a remote engine (stop it with C(kill <pid>))."
  returned: when a forward was started
  type: int
local_port:
  description: "The port on this machine's 127.0.0.1."
  returned: for local and remote engines
  type: int
nothing_listens:
  description: >-
    Why the URL answers nothing useful yet, asked in the box before the URL is made: C(nothing listens on port N in
    the box) (for the web port 80, with the reason its forwarder gives, such as no service in C(agentbox.yaml) setting
    C(expose)); empty when something listens there, or when the box cannot tell (an image without C(python3)).
  returned: always
  type: str
  sample: nothing listens on port 8000 in the box
expires_in:
  description: "Seconds the Daytona URL stays valid."
  returned: for Daytona
  type: int
box:
  description: "The box's facts (see M(agentbox.box.agentbox_box))."
  returned: always
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
        return {"changed": bool(live), "removed": [live] if live else []}
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
    published = facts.ports.get(str(port))
    if published and provider.port_urls == "published":  # on this machine's 127.0.0.1 already
        result.update(url=f"http://127.0.0.1:{published}/", local_port=published)
        return result
    live = _forwards.live_forward(provider, name, port)
    if live and params["local_port"] in (0, live["local_port"]):
        result.update(url=live["url"], local_port=live["local_port"], pid=live["pid"])
        return result
    result["changed"] = True
    if module.check_mode:
        result["url"] = None
        return result
    if live:  # asked on another local port: the new one replaces it
        _forwards.remove(provider.name, provider.engine, name, port)
    # A port published on a remote engine: the SSH forward to it; any other: a relay into the box per connection.
    record = _forwards.start(provider, name, port, params["local_port"], published or None)
    result.update(url=record["url"], local_port=record["local_port"], pid=record["pid"])
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
