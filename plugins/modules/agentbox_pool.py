#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_pool
short_description: Set, fill, show or remove a warm pool of paused boxes
version_added: 0.1.0
description:
  - "A warm pool keeps boxes created, booted to ready and paused, without a workspace, per (provider, engine, image
    fingerprint, checkpoint); see docs/pool.md. Pooled boxes carry the label C(io.agentbox.pool) and no
    C(io.agentbox.box): listings, the inventory, destroy and prune of users' boxes never see them."
  - O(state=present) records the pool's settings in C(~/.agentbox/pool/pools.json) and brings the pool to its size
    (one refill pass); the host daemon refills it afterwards. O(state=absent) removes the pool and its boxes.
    O(state=show) changes nothing and reports the pools and the pooled boxes of the engine.
  - Available on the C(docker) and C(docker_ssh) providers. On Daytona and boxd a warm pool is not available; the
    module says so and changes nothing.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.provider
  - agentbox.box.attributes
options:
  state:
    description: V(present) sets and fills the pool, V(absent) removes it and its boxes, V(show) only reports.
    type: str
    choices: [present, absent, show]
    default: present
  size:
    description: Boxes kept ready (0 turns the pool off and removes its boxes).
    type: int
    default: 0
  image:
    description: The image the pooled boxes run.
    type: str
    default: agentbox/box:latest
  checkpoint:
    description: The checkpoint the pooled boxes start from (recorded in the key).
    type: str
  max_memory:
    description: The most memory the pool's paused boxes may hold together (e.g. V(2g)); fewer boxes than O(size) when
      it cannot hold that many.
    type: str
  ttl_minutes:
    description: Minutes after which a pooled box is replaced by a fresh one.
    type: int
    default: 60
attributes:
  check_mode:
    support: partial
    details:
      - Reports the pool without changing it.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Keep two boxes ready on the local engine
  agentbox.box.agentbox_pool:
    size: 2
    max_memory: 1g

- name: What the pool holds
  agentbox.box.agentbox_pool:
    state: show
"""

RETURN = r"""
box:
  description: Always empty (a pool is not a box); present because every module returns it.
  returned: always
  type: dict
key:
  description: The pool's key (16 hex digits), for O(state=present).
  returned: when state is present
  type: str
pools:
  description: The pools set for this engine, by key.
  returned: always
  type: dict
boxes:
  description: The pooled boxes on the engine (container, key, id, state, created).
  returned: always
  type: list
  elements: dict
refill:
  description: What the refill pass did (made, removed, problems).
  returned: when state is present
  type: dict
removed:
  description: The pooled boxes removed, for O(state=absent).
  returned: when state is absent
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.box import _pool
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    provider_from_params,
    run_provider_module,
)
from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import ENGINE_PROVIDERS


def _run(module: AnsibleModule) -> dict:
    params = module.params
    result: dict = {"changed": False, "box": {}}
    if params["provider"] not in ENGINE_PROVIDERS:  # before the provider is made: no credential needed to be told
        if params["state"] == "show":
            return {**result, "pools": {}, "boxes": [], "available": False}
        module.fail_json(msg=f"a warm pool is not available on provider {params['provider']}: it keeps no paused "
                             "boxes there (docs/pool.md); creates there go on as before", box={})
    provider = provider_from_params(params)
    if params["state"] == "show" or module.check_mode:
        return {**result, **_pool.show(provider)}
    if params["state"] == "absent":
        key = _pool.set_pool(provider, params["image"], params["checkpoint"], _pool.PoolSettings(size=0))
        removed = _pool.drain(provider, key)
        refill = _pool.refill(provider)  # the other keys' leftovers too
        return {**result, "changed": bool(removed or refill["removed"]), "removed": removed, **_pool.show(provider)}
    settings = _pool.PoolSettings(params["size"], params["max_memory"] or "", params["ttl_minutes"])
    key = _pool.set_pool(provider, params["image"], params["checkpoint"], settings)
    refill = _pool.refill(provider)
    if refill["problems"]:
        module.fail_json(msg="; ".join(refill["problems"]), box={}, key=key, refill=refill)
    changed = bool(refill["made"] or refill["removed"])
    return {**result, "changed": changed, "key": key, "refill": refill, **_pool.show(provider)}


def main() -> None:
    options = {
        "state": {"type": "str", "choices": ["present", "absent", "show"], "default": "present"},
        "size": {"type": "int", "default": 0},
        "image": {"type": "str", "default": "agentbox/box:latest"},
        "checkpoint": {"type": "str"},
        "max_memory": {"type": "str"},
        "ttl_minutes": {"type": "int", "default": 60},
    }
    run_provider_module(options, _run)


if __name__ == "__main__":
    main()
