#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_checkpoint_info
short_description: List a workspace's checkpoints
version_added: 0.1.0
description:
  - Lists the checkpoints of one project (workspace) from both places they are known, the manifests under
    C(~/.agentbox/checkpoints/<project>/) and the C(io.agentbox.kind=checkpoint) images on the engine.
  - A checkpoint whose manifest exists but whose image is gone is listed as V(broken) (it is never used to start a
    box); one whose base image has been rebuilt since is V(stale) (it still works, on the old base).
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
    description: The workspace whose checkpoints to list. Default the box's workspace, else the current directory.
    type: path
  box:
    description: A box of the workspace; its project is listed and its facts returned under RV(box).
    type: str
  name:
    description: Only this checkpoint.
    type: str
"""

EXAMPLES = r"""
- name: The current workspace's checkpoints
  agentbox.box.agentbox_checkpoint_info:
  register: listed

- name: Show them
  ansible.builtin.debug:
    msg: "{{ listed.checkpoints | map(attribute='name') | list }} (default {{ listed.default }})"
"""

RETURN = r"""
box:
  description: The facts of O(box); empty when no box was given.
  returned: always
  type: dict
project:
  description: The project listed.
  returned: always
  type: str
default:
  description: The project's default checkpoint, if one is set.
  returned: always
  type: str
checkpoints:
  description: The checkpoints, by name.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: Name., type: str}
    type: {description: V(layered) or V(flattened)., type: str}
    image: {description: Image reference., type: str}
    image_exists: {description: Whether the image is on the engine., type: bool}
    broken: {description: Manifest without image; never used., type: bool}
    stale: {description: The base image was rebuilt since the chain started., type: bool}
    manifest: {description: Whether a manifest exists on this host., type: bool}
    default: {description: Whether it is the project's default., type: bool}
    made_by: {description: V(box) when the box took it itself (C(agentbox-ctl checkpoint)); absent when you did., type: str}
    kept:
      description:
        - Whether it is yours to keep - always for a checkpoint you took, for one a box took itself once kept
          (M(agentbox.box.agentbox_checkpoint) with O(agentbox.box.agentbox_checkpoint#module:keep=true)). One that
          is not goes when the box that took it is destroyed, unless it is the project's default.
      type: bool
    parents: {description: 'Parent checkpoints (nearest first).', type: list, elements: str}
    source_box: {description: The box it was taken of., type: str}
    branch: {description: That box's branch., type: str}
    commit: {description: Its commit., type: str}
    size: {description: Image size in bytes (0 when broken)., type: int}
    created: {description: Creation time (UTC)., type: str}
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils import _checkpoint, _naming
from ansible_collections.agentbox.box.plugins.module_utils._module import provider_from_params, run_provider_module


def _run(module: AnsibleModule) -> dict:
    params = module.params
    provider = provider_from_params(params)
    facts = None
    if params["box"]:
        facts = provider.find(_naming.validate_box_name(params["box"]))
        if facts is None:
            raise _checkpoint.CheckpointError(f"no box called {params['box']!r} on engine {provider.engine}")
    if facts is not None and not params["workspace"]:
        project = facts.project
    else:
        project = _naming.project_id(_naming.workspace_path(params["workspace"]))
    default = _checkpoint.project_default(provider, project)
    kept = _checkpoint.kept_checkpoints(provider, project)
    listed = []
    for checkpoint in _checkpoint.list_checkpoints(provider, project):
        if params["name"] and checkpoint.name != _checkpoint.parse_reference(params["name"], project):
            continue
        entry = checkpoint.to_dict()
        entry["stale"] = checkpoint.image_exists and _checkpoint.is_stale(provider, checkpoint.record)
        entry["default"] = checkpoint.name == default
        entry["kept"] = _checkpoint.is_kept(checkpoint, kept)
        listed.append(entry)
    return {
        "changed": False,
        "box": facts.to_dict() if facts else {},
        "project": project,
        "default": default,
        "checkpoints": listed,
    }


def main() -> None:
    options = {
        "workspace": {"type": "path"},
        "box": {"type": "str"},
        "name": {"type": "str"},
    }
    run_provider_module(options, _run)


if __name__ == "__main__":
    main()
