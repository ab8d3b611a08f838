#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_checkpoint
short_description: Save a box's warm state as a checkpoint, remove checkpoints, prune unused checkpoint images
version_added: 0.1.0
description:
  - A checkpoint captures everything a box has written (its C(/workspace) with C(node_modules), build caches and
    in-box C(.env) files, C(~/.npm), C(~/.cache), installed packages) as the image
    C(agentbox-ckpt-<project>:<name>), so that new boxes of the same workspace start warm
    (M(agentbox.box.agentbox_box) with O(agentbox.box.agentbox_box#module:checkpoint)).
  - The in-box cleanup C(/usr/local/bin/agentbox-checkpoint-cleanup) runs first, as root (apt caches, C(/tmp),
    C(/var/tmp), log contents and shell histories go; C(~/.npm), C(~/.cache) and the workspace stay).
  - A V(layered) checkpoint is one image layer over the box's image (fast). A V(flattened) one is a single layer
    over scratch with the box's Env, Cmd, Entrypoint, WorkingDir, User, ExposedPorts and Labels replayed; it is
    made when O(merged=true), or automatically when the box's image already stacks O(max_layers) checkpoint layers.
  - With O(provider=daytona) a checkpoint is a sandbox snapshot (the box is stopped, captured and started again,
    and its services restarted); O(merged) and O(max_layers) do not apply there.
  - Per-box secrets (the box's C(secrets), on a tmpfs under C(/run/agentbox)) are never captured; a box whose
    environment holds the value of one of its secrets is refused.
  - The facts are kept twice, in C(~/.agentbox/checkpoints/<project>/<name>/manifest.json) and in the image's
    C(io.agentbox.*) labels, so a checkpoint is recognised from the engine alone.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.provider
  - agentbox.box.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  box:
    description:
      - The box to checkpoint (required with O(state=present)). With O(state=absent) it only tells the project.
    type: str
  name:
    description:
      - The checkpoint's name, C([a-z0-9][a-z0-9_.-]{0,62}), or its full image reference
        C(agentbox-ckpt-<project>:<name>).
      - With O(state=present) it defaults to C(<box>-<n>), where C(n) is one more than any number handed out
        before for that box name in this project (numbers are never reused, even after a removal).
      - Required with O(state=absent).
    type: str
  state:
    description:
      - V(present) captures a new checkpoint (an existing name fails unless O(replace=true)).
      - V(absent) removes the checkpoint's image, manifest and commit refs.
    type: str
    choices: [present, absent]
    default: present
  workspace:
    description:
      - The workspace whose checkpoints are meant, when O(box) is not given (default the current directory).
      - With O(box), it must be the box's workspace.
    type: path
  merged:
    description: Make a flattened checkpoint (a single layer) whatever the chain's depth.
    type: bool
    default: false
  replace:
    description: Overwrite a checkpoint of the same name. The old one stays until the new one is complete.
    type: bool
    default: false
  set_default:
    description:
      - Make this checkpoint the project's default, used by new boxes of the workspace unless they are given
        C(checkpoint=none). Stored in C(~/.agentbox/projects/<project>/config.json).
    type: bool
    default: false
  max_layers:
    description:
      - Flatten automatically when the box's image already has this many checkpoint layers over its base.
    type: int
    default: 3
  cleanup:
    description: Run the in-box cleanup before capturing (only a running box can run it).
    type: bool
    default: true
  prune:
    description:
      - Instead of capturing or removing, remove every C(agentbox-ckpt-*) image that no box (container) and no
        manifest on this host refers to, plus dangling checkpoint images. In check mode they are only listed.
      - Only the project of O(workspace) (default the current directory) is pruned, unless O(all_projects=true).
        An engine may hold other projects' checkpoints, and other users', whose manifests this host does not have.
    type: bool
    default: false
  keep:
    description:
      - With O(name) (and without O(box)), make that existing checkpoint yours. A checkpoint a box took itself
        (C(agentbox-ctl checkpoint), through the relay) counts against that box's quota and is removed when the
        box is destroyed; a kept one is not. The project's default is always kept.
    type: bool
    default: false
  all_projects:
    description:
      - With O(prune=true), prune the checkpoint images of every project on the engine, not only the workspace's.
    type: bool
    default: false
  copy_to:
    description:
      - Copy the checkpoint to another remote engine (C(user@host[:port]) or an alias of C(~/.ssh/config)), where new
        boxes of the project can then start from it (C(checkpoint=NAME) with that O(engine)). With O(box), the
        checkpoint this task captures is copied; without it, the existing checkpoint O(name).
      - Remote engines only (O(provider=docker_ssh) here and there), since a local engine's checkpoint holds a worktree
        of this machine's repository. An image already there with the same id is not sent again.
      - The manifest stays with the engine the checkpoint was taken on; the copy is found by its image's labels.
        Removing the copy (O(state=absent) with that O(engine)) removes only its image.
    type: str
  copy_compress:
    description: Gzip the image on its way (through this machine) to O(copy_to); V(false) on a fast link saves CPU.
    type: bool
    default: true
notes:
  - Capture, removal and prune need the V(docker) or V(docker_ssh) provider. A checkpoint lives on the engine it
    was taken on; new boxes start from it there (see M(agentbox.box.agentbox_box)), and on the remote engines
    it was copied to with O(copy_to).
"""

EXAMPLES = r"""
- name: Save the box's warm state and make it the project's default
  agentbox.box.agentbox_checkpoint:
    box: fix-login
    set_default: true
  register: saved

- name: A flattened checkpoint under a chosen name
  agentbox.box.agentbox_checkpoint:
    box: fix-login
    name: after-install
    merged: true

- name: Start a new box from it
  agentbox.box.agentbox_box:
    name: fix-login-2
    checkpoint: after-install

- name: Remove a checkpoint
  agentbox.box.agentbox_checkpoint:
    name: after-install
    state: absent

- name: List what prune would remove
  agentbox.box.agentbox_checkpoint:
    prune: true
  check_mode: true
"""

RETURN = r"""
box:
  description: The facts of O(box) (see M(agentbox.box.agentbox_box)); empty when no box was given.
  returned: always
  type: dict
checkpoint:
  description: The checkpoint after the task (the planned one in check mode; the removed one with O(state=absent)).
  returned: unless O(prune=true)
  type: dict
  contains:
    name: {description: Checkpoint name., type: str, sample: fix-login-1}
    type: {description: V(layered) or V(flattened)., type: str}
    image: {description: Image reference., type: str, sample: "agentbox-ckpt-5292fc5e2d99be21:fix-login-1"}
    image_id: {description: Image id., type: str}
    parents: {description: 'The checkpoints it descends from (nearest first).', type: list, elements: str}
    layers: {description: Checkpoint layers over the last base (0 for a flattened one)., type: int}
    source_box: {description: The box it was taken of., type: str}
    branch: {description: That box's branch., type: str}
    commit: {description: That branch's commit at capture time., type: str}
    worktrees: {description: "Each repository's worktree path, branch and commit.", type: list, elements: dict}
    base_image: {description: The image the chain started from., type: str}
    base_fingerprint: {description: Fingerprint of that image when the chain started., type: str}
    created: {description: Creation time (UTC)., type: str}
    size: {description: Image size in bytes., type: int}
    default: {description: Whether it is the project's default., type: bool}
    timings: {description: Seconds spent in the cleanup and in the capture itself., type: dict}
copied:
  description:
    - "What O(copy_to) did: C(path) (V(copied), or V(present) when the engine already had it), C(engine), C(image),
      C(image_id), C(image_bytes), C(bytes_sent), C(seconds)."
    - In check mode only C(engine) and C(image).
  returned: with O(copy_to)
  type: dict
removed:
  description: What was removed (O(state=absent)) or what prune removed / would remove (O(prune=true)).
  returned: when something was removed
  type: dict
"""


from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint, _checkpoint_records
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    provider_from_params,
    run_provider_module,
)
from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import SSH_ENGINE_PROVIDERS


def _summary(checkpoint: dict | None) -> dict:
    """What the diff shows: the facts that identify a checkpoint, not its timings."""
    if not checkpoint:
        return {}
    keys = ("name", "type", "image", "parents", "layers", "source_box", "branch", "commit", "default")
    return {key: checkpoint.get(key) for key in keys if key in checkpoint}


def _project(params: dict, facts) -> str:
    if facts is not None:
        if params["workspace"]:
            wanted = _naming.project_id(_naming.workspace_path(params["workspace"]))
            if wanted != facts.project:
                raise _checkpoint.CheckpointError(
                    f"box {facts.name!r} belongs to workspace {facts.workspace}, not {params['workspace']}"
                )
        return facts.project
    return _naming.project_id(_naming.workspace_path(params["workspace"]))


def _run(module: AnsibleModule) -> dict:
    params = module.params
    provider = provider_from_params(params)
    facts = None
    if params["box"]:
        _naming.validate_box_name(params["box"])
        facts = provider.find(params["box"])
        if facts is None:
            raise _checkpoint.CheckpointError(
                f"no box called {params['box']!r} on engine {provider.engine}: create it with "
                "agentbox.box.agentbox_box first (agentbox_box_info lists the boxes)"
            )
    result: dict = {"changed": False, "box": facts.to_dict() if facts else {}}
    if params["copy_to"] and (params["provider"] not in SSH_ENGINE_PROVIDERS or params["state"] != "present" or params["prune"]):
        module.fail_json(msg="copy_to copies a checkpoint between remote engines: give provider=docker_ssh with the "
                             "engine it is on, state=present, and box (capture, then copy) or name (copy an existing one)")

    if params["prune"]:
        if params["all_projects"] and params["workspace"]:
            module.fail_json(msg="all_projects and workspace do not go together: give one, the project or every project")
        project = None if params["all_projects"] else _project(params, None)
        outcome = _checkpoint.prune(provider, check_mode=module.check_mode, project=project)
        result["removed"] = outcome
        result["changed"] = bool(outcome["removed"])
        if outcome["failed"]:
            module.warn(f"{len(outcome['failed'])} image(s) could not be removed; see removed.failed")
        return result

    project = _project(params, facts)
    default = _checkpoint.project_default(provider, project)

    if params["keep"]:
        if not params["name"] or facts is not None:
            module.fail_json(msg="keep: true takes the checkpoint's name (and workspace), not a box: "
                                 "name=NAME keep=true")
        name = _checkpoint_records.parse_reference(params["name"], project)
        found = _checkpoint.find_checkpoint(provider, project, name)
        if found is None:
            raise _checkpoint.CheckpointError(f"no checkpoint {name!r} in this project (on engine {provider.engine}): "
                                              "agentbox.box.agentbox_checkpoint_info lists them")
        result["checkpoint"] = found.to_dict()
        result["changed"] = name not in _checkpoint.kept_checkpoints(provider, project)
        if result["changed"] and not module.check_mode:
            _checkpoint.keep(provider, project, name)
        result["checkpoint"]["kept"] = True
        return result

    if params["state"] == "absent":
        if not params["name"]:
            module.fail_json(msg="'name' is required with state=absent: the checkpoint to remove")
        name = _checkpoint_records.parse_reference(params["name"], project)
        found = _checkpoint.find_checkpoint(provider, project, name)
        before = found.to_dict() if found else {}
        if before:
            before["default"] = default == name
        result["checkpoint"] = before
        result["diff"] = {"before": _summary(before), "after": {}}
        if found is None:
            return result
        result["changed"] = True
        if not module.check_mode:
            result["removed"] = _checkpoint.remove(provider, found)
        return result

    if facts is None and params["copy_to"] and params["name"]:
        return _copy(module, provider, project, result)
    if facts is None:
        module.fail_json(msg="'box' is required with state=present: the box to checkpoint (or name with copy_to, "
                             "to copy an existing checkpoint)")
    plan = _checkpoint.plan_capture(
        provider,
        facts,
        params["name"],
        merged=params["merged"],
        replace=params["replace"],
        max_layers=params["max_layers"],
    )
    before = plan.replaces.to_dict() if plan.replaces else {}
    if before:
        before["default"] = default == plan.name
    result["changed"] = True
    if module.check_mode:
        result["checkpoint"] = {
            "name": plan.name,
            "type": plan.type,
            "image": plan.image,
            "parents": plan.parents,
            "layers": plan.layers,
            "source_box": facts.name,
            "branch": facts.branch,
            "default": params["set_default"] or default == plan.name,
        }
    else:
        checkpoint = _checkpoint.capture(provider, plan, cleanup=params["cleanup"])
        if params["set_default"]:
            _checkpoint_records.set_project_default(project, plan.name, facts.workspace, provider=provider)
        checkpoint["default"] = _checkpoint.project_default(provider, project) == plan.name
        for warning in checkpoint.pop("warnings", []):
            module.warn(warning)
        result["checkpoint"] = checkpoint
        result["box"] = (provider.find(facts.name) or facts).to_dict()
    result["diff"] = {"before": _summary(before), "after": _summary(result["checkpoint"])}
    if params["copy_to"]:
        if module.check_mode:
            result["copied"] = {"engine": params["copy_to"], "image": plan.image}
        else:
            result["copied"] = _checkpoint.copy_to(
                provider, _checkpoint.find_checkpoint(provider, project, plan.name), _destination(params),
                compress=params["copy_compress"],
            )  # fmt: skip
    return result


def _destination(params: dict) -> Any:
    """The provider of the engine O(copy_to) names, with the task's SSH settings."""
    return provider_from_params({**params, "engine": params["copy_to"]})  # the same provider: a remote engine


def _copy(module: AnsibleModule, provider: Any, project: str, result: dict) -> dict:
    """copy_to without a box: the existing checkpoint O(name) goes to another engine."""
    params = module.params
    name = _checkpoint_records.parse_reference(params["name"], project)
    found = _checkpoint.find_checkpoint(provider, project, name)
    if found is None:
        raise _checkpoint.CheckpointError(f"no checkpoint {name!r} in this project (on engine {provider.engine}) to "
                                          "copy: agentbox.box.agentbox_checkpoint_info lists them")
    destination = _destination(params)
    result["checkpoint"] = found.to_dict()
    if module.check_mode:
        result["copied"] = {"engine": destination.engine, "image": found.image}
        result["changed"] = not destination.image_exists(found.image)
        return result
    result["copied"] = _checkpoint.copy_to(provider, found, destination, compress=params["copy_compress"])
    result["changed"] = result["copied"]["path"] == "copied"
    return result


def main() -> None:
    options = {
        "box": {"type": "str"},
        "name": {"type": "str"},
        "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        "workspace": {"type": "path"},
        "merged": {"type": "bool", "default": False},
        "replace": {"type": "bool", "default": False},
        "set_default": {"type": "bool", "default": False},
        "max_layers": {"type": "int", "default": _checkpoint.DEFAULT_MAX_LAYERS},
        "cleanup": {"type": "bool", "default": True},
        "prune": {"type": "bool", "default": False},
        "all_projects": {"type": "bool", "default": False},
        "keep": {"type": "bool", "default": False},
        "copy_to": {"type": "str"},
        "copy_compress": {"type": "bool", "default": True},
    }
    run_provider_module(options, _run, mutually_exclusive=[("prune", "name"), ("prune", "box")])


if __name__ == "__main__":
    main()
