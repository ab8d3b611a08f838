#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_box
short_description: Create, start, stop, pause and destroy an agent's box
version_added: 0.1.0
description:
  - Gives an AI coding agent its own disposable Linux box against a host git workspace.
  - On creation the box gets its own branch C(agentbox/<name>) and C(/workspace) with the host's uncommitted
    work carried over byte for byte (staged, unstaged, deleted, renamed and untracked files), Docker inside
    the box, and the in-box supervisor started.
  - On the local engine the workspace's C(.git) reaches the box at its host path as an overlay whose writes
    stay in the box's own volumes, so nothing the box writes there (hooks, config, refs) reaches the host. The
    box's branch is fetched into the host repository (git verifies every object) when the box is stopped or
    destroyed, at a checkpoint, and with M(agentbox.box.agentbox_worktree) O(agentbox.box.agentbox_worktree#module:state=fetched).
    The host's working tree, index and stash list are never modified.
  - Anything that fails half-way is undone; no container, volume, branch or worktree entry is left behind.
    A create that was killed (Ctrl-C, SIGTERM, SIGKILL) is rolled back by the next create or destroy of that
    name (see RV(recovered)); a box whose create never finished is never reported as created.
  - Bad input fails before anything is made, saying what to do; see docs/modules.md.
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
  name:
    description:
      - The box name, C([a-z0-9][a-z0-9_.-]{0,62}). The container is C(agentbox-<name>).
      - On a Docker engine the container's hostname is C(agentbox-<name>) too, and Linux takes at most 64
        characters there, so a name of 56 to 63 characters is refused before anything is made.
      - Required unless O(state=present) or O(state=started), where it defaults to
        C(<workspace basename>-<short id>) (a new box each run). An empty string is an error, not a request
        for that default.
    type: str
  state:
    description:
      - V(present) makes sure the box exists (created and started when missing), whatever its run state.
      - V(started) makes sure it exists and runs (a paused box is resumed; a stopped one is started and its
        in-box services relaunched).
      - V(stopped) and V(paused) change an existing box; V(absent) destroys it.
    type: str
    choices: [present, started, stopped, paused, absent]
    default: started
  workspace:
    description:
      - The host directory the box works on. Default the current directory.
      - Used when creating, and to check that an existing box of that name belongs to this workspace.
      - With O(state=absent) and O(delete_branch=true) for a box that no longer exists, the repository whose
        C(agentbox/<name>) branch is deleted. Default the workspace that box's destroy recorded when it kept the
        branch (C(~/.agentbox/kept_branches.json)), else the current directory.
      - With O(state=absent), the workspace's new path when it moved after the box was made; the box's worktree
        registration is found there by the box's id.
    type: path
  image:
    description:
      - The box image. Default the image the C(agentbox.box.box_image) role built last (C(agentbox/box:latest)).
    type: str
    default: agentbox/box:latest
  checkpoint:
    description:
      - Start the new box from this checkpoint of the project (see M(agentbox.box.agentbox_checkpoint)).
    type: str
  resources:
    description: Resource limits for the box.
    type: dict
    suboptions:
      memory:
        description: Memory limit, for example V(2g).
        type: str
      cpus:
        description: CPUs, for example V(1.5).
        type: float
      pids_limit:
        description: Maximum number of processes.
        type: int
  env:
    description:
      - Extra environment variables of the box's processes. Checkpoints do not keep them (a box restored from
        one gets its own); still, keep secrets in O(secrets), which never reach the container's config.
    type: dict
    default: {}
  secrets:
    description:
      - Per-box secrets, written to files under C(/run/agentbox/secrets/) on a tmpfs (never in the container's
        environment, labels or layers, so no checkpoint captures them).
    type: dict
    default: {}
  ports:
    description:
      - Container ports to publish, each on an ephemeral port of the engine's 127.0.0.1. Port 80 (the box's web
        port) is always published.
    type: list
    elements: int
    default: []
  seed:
    description: Seed C(/workspace) from the workspace when creating. V(false) makes an empty box.
    type: bool
    default: true
  boot:
    description:
      - Run the in-box start sequence (dockerd, the supervisor and its services, VNC, sshd) when the box is
        created or started. V(false) gives a box with nothing started in it.
    type: bool
    default: true
  ship_depth:
    description:
      - Commits of history shipped into boxes on engines that cannot see the host repository
        (O(provider=docker_ssh), O(provider=daytona)). Default 200, or 100 when that packs over 20 MiB.
      - V(0) ships the whole history.
    type: int
  with_env:
    description:
      - Also carry the workspace's ignored C(.env*) files (at any depth, as its C(.gitignore) rules ignore them)
        into the new box, which seeding never does.
      - They are written to a tmpfs in the box (C(/run/agentbox/carried)) and linked from C(/workspace), so no
        checkpoint ever captures them; a box restored from a checkpoint gets them only when carried again.
      - Untracked files named like secrets (C(.env*), C(*.pem), C(*.key), C(id_*) private keys, C(.npmrc) with a
        token, C(.netrc)...) go the same way whatever C(.gitignore) says, with or without this option, never in a
        layer of the box or a checkpoint (see RV(carried_secret)). In the box's own repository they are excluded
        (C(info/exclude)), so C(git add -A) there does not commit the link.
    type: bool
    default: false
  carry_ignored:
    description:
      - More ignored files to carry the same way as O(with_env), as globs (C(config/*.local); a bare name
        matches at any depth). At most 16 MiB in all (they live in memory).
    type: list
    elements: str
    default: []
  egress:
    description:
      - The new box's egress policy (see C(docs/egress.md)). Given (or O(egress_allow) given), the box's only way
        out is the host's egress gateway, which lets it reach what the policy allows and logs each connection in
        C(~/.agentbox/gateway/audit.jsonl); its direct traffic is dropped outside the box.
      - V(allowlist) (the default list of package registries, source hosts and agent APIs, plus O(egress_allow)),
        V(open) (any public host, logged), V(none) (nothing).
      - Left out, the C(egress) key of the workspace's C(agentbox.yaml) is used; left out there too (and
        O(egress_allow) in neither), the box keeps the open network of boxes made before the gateway (for now).
      - On O(provider=daytona) and O(provider=boxd) the policy is the provider's own allow list instead, with no
        gateway and no audit. V(none) is Daytona's V(block_all) and a boxd list that lets nothing out; V(allowlist)
        is boxd's list of the policy's hosts, refused on Daytona (its list takes IPv4 CIDRs; use O(network) there);
        V(open) is their open network. Refused together with O(network); O(network) wins over the file's keys
        (docs/egress.md).
      - Refused on a remote engine (O(provider=docker_ssh)) and with O(isolation=none) (the file's keys there are
        checked, then left unapplied with a warning).
    type: str
  egress_allow:
    description:
      - Host names, IP addresses and C(*.) wildcards the box may reach besides the default list (O(egress=allowlist)),
        or at a private address (any O(egress)). Implies O(egress=allowlist) when O(egress) is left out.
      - C(-) and a host of the default list (C(-registry.npmjs.org)) takes that host off it (refused in any O(egress)).
      - Left out, the C(egress_allow) key of the workspace's C(agentbox.yaml) is used.
    type: list
    elements: str
  vnc:
    description:
      - The box's screen (docs/screen.md) - a desktop with Chromium in the box, which C(playbooks/screen.yml) shows in a
        browser on this machine through noVNC. The box runs the screen image (C(agentbox/box-screen:latest) in place of
        the default O(image); built by the C(agentbox.box.box_image) role with C(box_image_screen=true)), publishes its
        noVNC port 6080 on the engine's 127.0.0.1, and gets a VNC password made on this machine, kept on the box's
        tmpfs only (written again at every start).
      - Docker engines only (local and O(provider=docker_ssh)); refused on Daytona and boxd (not available there yet).
    type: bool
    default: false
  ssh_include:
    description:
      - The user's answer about C(Include ~/.agentbox/ssh_config) at the top of C(~/.ssh/config) (plain
        C(ssh agentbox-<name>)), remembered in C(~/.agentbox/access.json) for every later task. V(true) adds the line
        once and every later create, start and attach keeps it; V(false) takes it out. Unset, the remembered answer
        holds; with none, C(~/.ssh/config) is never touched. Applied once the task succeeded.
    type: bool
  disk:
    description:
      - Disk of a new Daytona box in GiB (Daytona's default is 3; Docker in the box wants more), only for a box
        made from a registry image (a Daytona snapshot fixes its own disk). Default C(AGENTBOX_DAYTONA_DISK).
      - Disk of a new boxd machine in GiB (O(provider=boxd)). Default C(AGENTBOX_BOXD_DISK), else boxd's.
      - Other providers refuse it.
    type: int
  network:
    description:
      - Outbound network of a new Daytona box. V(block_all) seals it (loopback only); an IPv4 CIDR or a list of
        up to 10 (V(10.0.0.0/8)) is an allow list; an empty string leaves it open. Default
        C(AGENTBOX_DAYTONA_NETWORK), else open.
      - On O(provider=boxd), the machine's egress allow list of host names and CIDRs (V([github.com, 10.0.0.0/8]));
        boxd has no V(block_all). Default C(AGENTBOX_BOXD_EGRESS_ALLOW) (comma-separated), else open.
      - Other providers refuse it. Refused together with O(egress) or O(egress_allow) - one or the other.
    type: raw
  ephemeral:
    description:
      - A Daytona box that Daytona deletes as soon as it stops (auto-delete 0), its own auto-stop included.
        Pausing, stopping or checkpointing such a box is refused (it would delete it). O(provider=daytona) only.
    type: bool
  auto_delete:
    description:
      - Minutes a Daytona box may stay stopped before Daytona deletes it; V(-1) never (Daytona's default), V(0) as
        soon as it stops (as O(ephemeral)). O(provider=daytona) only.
    type: int
  delete_branch:
    description:
      - With O(state=absent), also delete the box's branch in the host repository (kept by default).
      - When the box is already gone, its branch (and any worktree registration it left) is still deleted, in
        the repositories of O(workspace) (default the current directory); local engine only.
    type: bool
    default: false
  fetch:
    description:
      - With O(state=absent), first bring the box's last commits into its branch on the host (local engine, where
        they live in the box's own layer of the C(.git)). V(false) skips it, and what the box committed since its
        branch was last fetched goes with the box. Either way, what was not fetched is returned under
        RV(destroyed.not_fetched) and warned about.
    type: bool
    default: true
  fetch_timeout:
    description:
      - Seconds the box gets to hand its last commits over at O(state=absent) (all of the fetch's commands in the
        box together). Root in a box can replace its C(git) with one that never answers; past the time the box is
        destroyed anyway, and what was not fetched is reported.
    type: float
    default: 120
  keep_checkpoints:
    description:
      - With O(state=absent), keep the checkpoints the box took itself (C(agentbox-ctl checkpoint), through the
        relay). By default they are removed with the box, except those the user kept
        (M(agentbox.box.agentbox_checkpoint) O(agentbox.box.agentbox_checkpoint#module:keep=true)) and the
        project's default.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: A box for the current repository
  agentbox.box.agentbox_box:
    name: fix-login
    workspace: "{{ playbook_dir }}/.."
  register: created

- name: Pause it while the agent waits
  agentbox.box.agentbox_box:
    name: fix-login
    state: paused

- name: Destroy it and its branch
  agentbox.box.agentbox_box:
    name: fix-login
    state: absent
    delete_branch: true
"""

RETURN = r"""
box:
  description: "The box's facts after the task (before it, in check mode). Empty when the box is absent."
  returned: always
  type: dict
  contains:
    name:
      description: "Box name."
      type: str
      sample: fix-login
    id:
      description: "Box id."
      type: str
      sample: 5b0a6d52
    provider:
      description: "Provider."
      type: str
      sample: docker
    engine:
      description: "Engine (V(local), an SSH destination or an API URL)."
      type: str
      sample: local
    state:
      description: "V(running), V(paused), V(stopped) or V(missing)."
      type: str
      sample: running
    container:
      description: "Container (or sandbox) name."
      type: str
      sample: agentbox-fix-login
    image:
      description: "Image the box runs."
      type: str
      sample: agentbox/box:latest
    project:
      description: "First 16 hex of sha1 of the workspace path."
      type: str
      sample: 5292fc5e2d99be21
    workspace:
      description: "Host workspace path."
      type: str
      sample: /home/me/src/app
    branch:
      description: "The box's branch in the host repository."
      type: str
      sample: agentbox/fix-login
    created:
      description: "Creation time (UTC, ISO 8601)."
      type: str
      sample: "2026-11-29T09:03:33Z"
    ports:
      description: "Container port to published 127.0.0.1 port."
      type: dict
      sample: {"80": 32769}
    labels:
      description: "The io.agentbox.* labels without their prefix."
      type: dict
    checkpoint:
      description: "Checkpoint the box was restored from."
      type: str
    web_url:
      description: "URL of the box's web port on the controller."
      type: str
      sample: "http://127.0.0.1:32769/"
seed:
  description: "What seeding carried over, when the box was created."
  returned: when created
  type: dict
  contains:
    mode:
      description: "V(worktree) or V(copy)."
      type: str
    branch:
      description: "Branch of /workspace."
      type: str
    base_commit:
      description: "Host HEAD the branch starts at."
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
      description: "Untracked, not ignored files carried."
      type: int
    warnings:
      description: "What could not be carried exactly."
      type: list
      elements: str
pool:
  description:
    - "The warm pool (docs/pool.md), when a pool is set for the box's engine: C(claimed <pooled box>) when the
      create took a pooled box, else C(made, not claimed:) and the reason in one line (the request fixes what a
      pooled box cannot change, no box was ready, the pooled box was gone or damaged)."
  returned: when created on an engine with a pool
  type: str
  sample: claimed agentbox-pool-3f2a9c1e-k2j4h5g6
access:
  description:
    - "How to get into the box: its SSH alias (C(ssh agentbox-<name>)), the file holding the alias
      (C(~/.agentbox/ssh_config)), the host key files authorised in the box, whether C(~/.ssh/config) includes the
      aliases (C(included)), and what is missing."
    - "C(key_made): the key made for the boxes by this create, C(~/.agentbox/ssh/id_ed25519), when the user had none
      (none of C(~/.ssh/id_ed25519), C(id_ecdsa), C(id_rsa) with its C(.pub), and no C(AGENTBOX_SSH_KEY)); else null."
    - "For a Daytona box also C(expires_at): when the SSH access token behind the alias runs out."
  returned: when created
  type: dict
  sample: {"alias": "agentbox-fix-login", "ssh_config": "/home/me/.agentbox/ssh_config",
           "keys": ["/home/me/.ssh/id_ed25519"], "warnings": [], "included": false, "key_made": null}
ssh_command:
  description:
    - "The line that opens a shell in the box, the one form every playbook prints: C(ssh agentbox-<name>) when
      C(~/.ssh/config) includes the aliases, else C(ssh -F ~/.agentbox/ssh_config agentbox-<name>)."
  returned: when the box is running after the task
  type: str
  sample: ssh -F ~/.agentbox/ssh_config agentbox-fix-login
include_hint:
  description: "How to turn the short form on; said once per user (on a create) while it is off and unanswered, else
    empty."
  returned: when created
  type: str
carried_ignored:
  description: >-
    Ignored files carried by O(with_env) and O(carry_ignored): C(files) (paths) and C(bytes) (all that went onto the
    box's tmpfs, with RV(carried_secret)).
  returned: when O(with_env) or O(carry_ignored) was given and the box was created
  type: dict
egress:
  description: >-
    The new box's egress policy (docs/egress.md), from the create options and the workspace's agentbox.yaml
    (each option wins over the file's same key); null when the box has the open network.
  returned: when the box was created (and in check mode)
  type: dict
  sample: {"egress": "allowlist", "egress_allow": ["pkg.corp.example"]}
carried_secret:
  description: >-
    The workspace's untracked, not ignored files named like secrets, carried onto the box's tmpfs only (never a layer
    or a checkpoint) and left out of the seed's untracked files; paths from the workspace.
  returned: when the box was created
  type: list
  elements: str
  sample: [".env", "certs/dev.pem"]
boot:
  description: "What the in-box start sequence reported (dockerd storage driver, supervisor), when it ran."
  returned: when the box was created or started
  type: dict
destroyed:
  description:
    - "Worktree registrations removed and branches deleted, with O(state=absent)."
    - "C(worktrees_not_found) lists registrations that could not be found (a workspace moved; pass its new path
      as O(workspace))."
    - "For a box whose container was removed by hand, C(volumes_removed) and C(branches_kept) (branches with
      commits stay unless O(delete_branch))."
  returned: when destroyed, or when O(delete_branch=true) looked for what a box already gone left behind
  type: dict
  contains:
    box_removed:
      description: "Whether a box was removed (V(false): it was gone already)."
      type: bool
    worktrees_removed:
      description: "Worktree paths unregistered from the host repository."
      type: list
      elements: str
    branches_deleted:
      description: "C(<repository>:<branch>) of each branch deleted."
      type: list
      elements: str
    not_fetched:
      description:
        - "When the box's last commits could not be brought to the host (O(fetch=false), the box did not answer
          within O(fetch_timeout), or its answer was refused): per repository, where the host's branch stayed
          (C(repo), C(branch), C(commit), empty when the host has no such branch). Commits the box made after that
          went with it."
      type: list
      elements: dict
    checkpoints_removed:
      description: "Names of the checkpoints the box took itself, removed with it."
      type: list
      elements: str
    checkpoints_kept:
      description: "Checkpoints the box took that stay: the project's default, or one another box runs on."
      type: list
      elements: str
recovered:
  description:
    - "What an earlier, interrupted create of this name had made and this task rolled back: C(stage) it stopped at,
      C(pid), C(box_id), C(container_removed), C(worktrees_removed), C(branches_deleted)."
  returned: when an interrupted create of the name was found
  type: dict
"""

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import run_task_module
from ansible_collections.agentbox.box.plugins.module_utils.tasks._box_task import BOX_ARGUMENT_SPEC, run_box_task


def main() -> None:
    run_task_module(BOX_ARGUMENT_SPEC, run_box_task)


if __name__ == "__main__":
    main()
