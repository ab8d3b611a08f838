#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_worktree
short_description: Seed a box's /workspace from the host workspace, or bring its branch back
version_added: 0.1.0
description:
  - O(state=present) seeds C(/workspace) of a box made with O(agentbox.box.agentbox_box#module:seed=false).
    On the local engine the box registers its own C(git worktree) on the branch C(agentbox/<box>) (suffix
    C(-2), C(-3)... when taken) against its own overlay of the host's C(.git) (its writes never reach the
    host's); first-level nested repositories and submodules get their own worktree on the same branch name.
    The host's uncommitted state is then carried over byte for byte - staged and unstaged changes,
    deletions, renames and untracked, not ignored files, with modes, symlinks, empty files
    and any file name. A workspace that is not a git repository is copied.
    A box that is already seeded is left alone (V(changed=false)).
  - The host's working tree, index and stash list are never modified.
  - O(state=fetched) brings the box's branch into the host repository as C(agentbox/<box>); the box bundles it,
    the host fetches the bundle (git verifies every object) and moves only that branch. On the local engine it
    also brings the host's current branches, tags and remote-tracking refs into the box's view of the C(.git),
    which otherwise shows them as they were when the box started.
  - O(state=downloaded) copies the box's working tree - uncommitted work included, ignored files left out by
    the box's C(.gitignore) rules - to O(dest) on the controller, without committing anything, on every
    provider. The box's archive is streamed and unpacked as untrusted into a temporary directory renamed into
    place. An absolute or C(..) name, a hard link, a device or fifo, or an entry through a symbolic link
    fails the task naming the entry, with nothing written; symbolic links leaving the tree are left out and
    listed. No setuid bits or owners are kept; the host workspace is never written. See the architecture
    document, section "Trees copied out of a box".
  - M(agentbox.box.agentbox_box) seeds by itself when it creates a box; this module is for boxes made empty,
    and for bringing work back.
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
  box:
    description: The box's name.
    type: str
    required: true
  state:
    description:
      - V(present) seeds, V(fetched) brings the box's branch back to the host repository, V(downloaded) copies
        the box's working tree to O(dest).
    type: str
    choices: [present, fetched, downloaded]
    default: present
  dest:
    description:
      - With O(state=downloaded), the controller directory to copy the tree to (default
        C(~/.agentbox/export/<box>/)). It must be new, empty, or an earlier export (which is replaced), and
        outside the box's host workspace.
    type: path
  force:
    description:
      - With O(state=fetched), move the host's C(agentbox/<box>) branch even when that is not a fast-forward.
        A branch checked out on the host is never moved.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Make an empty box, then seed it
  agentbox.box.agentbox_box:
    name: scratch
    workspace: /src/app
    seed: false

- name: Seed it from the host workspace
  agentbox.box.agentbox_worktree:
    box: scratch
  register: seeded

- name: Bring its work back
  agentbox.box.agentbox_worktree:
    box: scratch
    state: fetched

- name: Copy its working tree (uncommitted work included) to ~/.agentbox/export/scratch/
  agentbox.box.agentbox_worktree:
    box: scratch
    state: downloaded
"""

RETURN = r"""
box:
  description: "The box's facts (see M(agentbox.box.agentbox_box))."
  returned: always
  type: dict
seed:
  description: "What was carried over."
  returned: with O(state=present)
  type: dict
  contains:
    mode:
      description: "V(worktree), V(shipped) or V(copy)."
      type: str
    branch:
      description: "Branch of /workspace."
      type: str
      sample: agentbox/fix-login
    base_commit:
      description: "Host commit the branch started at."
      type: str
    modified:
      description: "Modified or added tracked files carried."
      type: int
    deleted:
      description: "Deleted tracked files carried."
      type: int
    renamed:
      description: "Renamed files carried."
      type: int
    untracked:
      description: "Untracked files carried."
      type: int
    warnings:
      description: "What could not be carried exactly."
      type: list
      elements: str
fetched:
  description:
    - "Per repository (C(repos)): the branch brought back, its commit, the previous one, the number of new
      commits and whether it moved. C(view_refreshed): how many host refs were brought into a local box's view."
  returned: with O(state=fetched)
  type: dict
downloaded:
  description: "Where the tree went (C(dest)), C(files) and C(bytes) copied, C(seconds), C(uncommitted) (the
    box's C(git status --porcelain) lines) and C(skipped) (entries left out, each with the reason)."
  returned: with O(state=downloaded)
  type: dict
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from ansible_collections.agentbox.box.plugins.module_utils.git import _git, _gitlayer
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    provider_from_params,
    run_provider_module,
)


def _run(module: AnsibleModule) -> dict:
    box = _naming.validate_box_name(module.params["box"])
    provider = provider_from_params(module.params)
    facts = provider.find(box)
    if facts is None:
        module.fail_json(msg=f"no box called {box!r} on engine {provider.engine}: create it with agentbox_box first")
    if facts.state != "running":
        module.fail_json(msg=f"box {box!r} is {facts.state}: start it first (agentbox_box state=started)")
    result: dict = {"changed": False, "box": facts.to_dict()}
    if module.params["state"] == "present":
        if module.check_mode:
            from ansible_collections.agentbox.box.plugins.module_utils.git import _seed

            record = _seed.read_seed_record(provider, box)
            result["changed"] = record is None
            result["seed"] = record or {}
            return result
        changed, record = _box.seed_existing(provider, facts)
        result["changed"] = changed
        result["seed"] = record
        for warning in record.get("warnings", []) if changed else []:
            module.warn(warning)
        return result
    if module.params["state"] == "downloaded":
        from ansible_collections.agentbox.box.plugins.module_utils.git import _export

        result["downloaded"] = _export.download(provider, facts, module.params["dest"], module.check_mode)
        result["changed"] = True
        return result
    # fetched
    if provider.shares_host_filesystem and not _gitlayer.has_layers(facts):
        head = _git.git_out(facts.workspace, "rev-parse", f"refs/heads/{facts.branch}") if facts.branch else ""
        result["fetched"] = {"branch": facts.branch, "commit": head, "note": "commits already land in the host repo"}
        return result
    from ansible_collections.agentbox.box.plugins.module_utils.git import _ship

    if module.check_mode:
        result["changed"] = True
        return result
    fetched = _ship.fetch_box_branch(provider, facts, facts.workspace, force=module.params["force"])
    result["changed"] = any(repo.get("changed") for repo in fetched.get("repos", []))
    if _gitlayer.has_layers(facts):
        fetched["view_refreshed"] = _gitlayer.refresh_view(provider, facts)
    result["fetched"] = fetched
    return result


def main() -> None:
    options = {
        "box": {"type": "str", "required": True},
        "state": {"type": "str", "default": "present", "choices": ["present", "fetched", "downloaded"]},
        "dest": {"type": "path"},
        "force": {"type": "bool", "default": False},
    }
    run_provider_module(options, _run)


if __name__ == "__main__":
    main()
