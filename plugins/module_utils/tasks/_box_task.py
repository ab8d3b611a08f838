# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agentbox_box task, shared by the module and its action plugin.

The action plugin runs it in the controller's own process (no module round trip: most of a
task's time on the local engine); the module runs it wherever Ansible sends it.
"""

from __future__ import annotations

import os
from typing import Any

from ..access import _screen
from ..access._access import answer_include, include_hint, include_present, ssh_command
from ..box import _box, _rollback
from ..core import _journal, _naming, _preflight
from ..core._errors import ProviderError
from ..egress._egress_policy import EgressError, EgressPolicy, parse_policy
from ..git import _git, _gitlayer, _seed
from ..providers import _registry
from ..providers._module import PROVIDER_ARGUMENT_SPEC, provider_from_params

BOX_ARGUMENT_SPEC: dict[str, Any] = {
    "name": {"type": "str"},
    "state": {"type": "str", "default": "started", "choices": ["present", "started", "stopped", "paused", "absent"]},
    "workspace": {"type": "path"},
    "image": {"type": "str", "default": _box.DEFAULT_IMAGE},
    "checkpoint": {"type": "str"},
    "resources": {
        "type": "dict",
        "options": {
            "memory": {"type": "str"},
            "cpus": {"type": "float"},
            "pids_limit": {"type": "int"},
        },
    },
    "env": {"type": "dict", "default": {}},
    "secrets": {"type": "dict", "default": {}, "no_log": True},
    "ports": {"type": "list", "elements": "int", "default": []},
    "seed": {"type": "bool", "default": True},
    "ship_depth": {"type": "int"},
    "boot": {"type": "bool", "default": True},
    "delete_branch": {"type": "bool", "default": False},
    "fetch": {"type": "bool", "default": True},
    "fetch_timeout": {"type": "float", "default": _box.FETCH_TIMEOUT},
    "keep_checkpoints": {"type": "bool", "default": False},
    "with_env": {"type": "bool", "default": False},
    "carry_ignored": {"type": "list", "elements": "str", "default": []},
    "egress": {"type": "str"},
    "egress_allow": {"type": "list", "elements": "str"},
    "ssh_include": {"type": "bool"},
    "vnc": {"type": "bool", "default": False},
    **_registry.PROVIDER_BOX_OPTIONS,
    **PROVIDER_ARGUMENT_SPEC,
}


def _egress(params: dict[str, Any], workspace: str, provider: Any, warnings: list[str]) -> EgressPolicy | None:
    """The new box's egress policy (docs/egress.md): each create option (egress, egress_allow) wins over the same
    key of the workspace's agentbox.yaml. None: the box has the open network (neither given). ValueError
    (EgressError) says what to write instead, naming the file's line when the file's entry is at fault."""
    given = {key: params[key] for key in ("egress", "egress_allow") if params[key] is not None}
    project = _preflight.project_egress(workspace)
    from_file = [key for key in ("egress", "egress_allow") if key in project and key not in given]
    if not given and not from_file:
        return None
    values = {**{key: project[key] for key in from_file}, **given}
    try:
        policy = parse_policy(values.get("egress"), values.get("egress_allow"), environ=os.environ)
    except EgressError as exc:
        raise EgressError(f"{_file_line(project, from_file, exc)}{exc}", exc.setting, exc.entry, exc.names) from None
    if not given and params.get("network") is not None:
        # The create option names this box's network: it wins over the project's file (given with a policy
        # option instead, the provider refuses the two together).
        warnings.append(f"{project['path']} sets {' and '.join(from_file)}, and this box's network option wins "
                        "over it: the box has the network the option gives")
        return None
    if provider.holds_egress:
        return policy
    try:
        mapped = provider.egress_network(policy)  # Daytona's, boxd's own allow list; refused before anything is made
    except ProviderError as exc:
        raise ProviderError(f"{project['path']}: {exc}" if from_file else str(exc), box=params["name"],
                            operation="create") from None
    if not mapped and not given:
        # The file is the project's, whichever provider a box goes to: told, not refused (the option is).
        warnings.append(f"{project['path']} sets {' and '.join(from_file)}, which only boxes on this machine's box "
                        f"engine, Daytona and boxd are held to, not this one ({provider.name} on {provider.engine}: "
                        "a remote engine or isolation none): this box has the open network")
        return None
    return policy


def _file_line(project: dict[str, Any], from_file: list[str], error: EgressError) -> str:
    """'<agentbox.yaml>:<line>: ' of the setting the file gave that parse_policy refused ('' when a create
    option is at fault; the file alone when the policy as a whole is)."""
    if error.setting is None:
        return f"{project['path']}: " if from_file else ""
    if error.setting not in from_file:
        return ""
    lines = project["allow_lines"] if error.setting == "egress_allow" else []
    if error.entry is not None and error.entry < len(lines):
        return f"{project['path']}:{lines[error.entry]}: "
    if error.setting == "egress":
        return f"{project['path']}:{project['lines']['egress']}: "
    return f"{project['path']}: "


def _planned(name: str, workspace: str, image: str, provider: str, engine: str) -> dict:
    """The facts a box would have: what check mode reports for a box it would create."""
    return {
        "name": name,
        "state": "running",
        "provider": provider,
        "engine": engine,
        "container": _naming.container_name(name),
        "image": image,
        "project": _naming.project_id(workspace),
        "workspace": workspace,
        "branch": _naming.box_branch(name),
    }


def run_box_task(params: dict[str, Any], check_mode: bool) -> tuple[dict[str, Any], list[str]]:
    """The whole agentbox_box task: (result, warnings). Raises ProviderError or ValueError."""
    result, warnings = _box_task(params, check_mode)
    # After the task went through: a failed one leaves ~/.ssh/config as it was.
    if params["ssh_include"] is not None and not check_mode and answer_include(params["ssh_include"]):
        result["changed"] = True
    box = result.get("box") or {}
    if box.get("state") == "running":
        # The one way in every output prints (the _access module's ssh_program), and once, how to shorten it.
        result["ssh_command"] = ssh_command(box["name"])
        if "access" in result:
            result["access"]["included"] = include_present()
            result["include_hint"] = include_hint(box["name"], record=not check_mode)
    return result, warnings


def _box_task(params: dict[str, Any], check_mode: bool) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    state = params["state"]
    name = params["name"]
    if name == "":
        # An empty -e box= is a mistake, not a request for a generated name (leave it out for that).
        raise ValueError("the box name is empty: pass one (-e box=NAME), or leave it out for <workspace>-<id>")
    if name:
        _naming.validate_box_name(name)
    elif state not in ("present", "started"):
        raise ValueError(f"'name' is required with state={state}")
    provider = provider_from_params(params, **_registry.box_options(params))
    if name and state in ("present", "started"):
        _box.check_name_fits(provider, name)  # before the journal's lock file: nothing is made for it
    if not name or state in ("stopped", "paused"):
        return _run(provider, params, name, state, check_mode, None, warnings)
    # Create and destroy of a named box hold its journal's lock: a run killed half-way is found
    # (and rolled back) here, and a run that is creating the box right now makes this one stop.
    journal = _journal.Journal(provider.name, provider.engine, name)
    stale = journal.claim("destroy" if state == "absent" else "create")
    try:
        recovered = None
        if stale and not check_mode:
            recovered = _rollback.roll_back(provider, stale)
            journal.forget()
            warnings.append(
                f"an interrupted create of box {name!r} (pid {stale.get('pid')}, stopped at {stale.get('stage')}) "
                "was rolled back"
            )
        result, warnings = _run(provider, params, name, state, check_mode, journal, warnings)
        if recovered is not None:
            result["recovered"] = recovered
            result["changed"] = True
        return result, warnings
    finally:
        journal.release()


def _run(
    provider: Any,
    params: dict[str, Any],
    name: str | None,
    state: str,
    check_mode: bool,
    journal: _journal.Journal | None,
    warnings: list[str],
) -> tuple[dict[str, Any], list[str]]:
    existing = provider.find(name) if name else None
    # The workspace defaults to the current directory only for a box about to be made; an
    # existing box is checked against a workspace only when one was given.
    workspace = None
    if params["workspace"] or (existing is None and state in ("present", "started")):
        workspace = _naming.workspace_path(params["workspace"])
    moved_to = None
    if existing and params["workspace"]:
        record = next(iter(_box.worktree_records(existing)), None)
        moved = state == "absent" and record and (
            _rollback.find_registration_by_id(workspace, record, existing.id)
            or _gitlayer.branch_reserved_for(workspace, existing)
        )
        if moved:
            moved_to = workspace  # the box's workspace, moved since: its registration names the box's id
        else:
            _box.check_owner(existing, _naming.project_id(workspace))
    before = existing.to_dict() if existing else {}
    result: dict = {"changed": False, "box": before}

    if state == "absent":
        if existing:
            result["changed"] = True
            result["box"] = {}
            if not check_mode:
                result["destroyed"] = _box.destroy_box(
                    provider, existing, delete_branch=params["delete_branch"], moved_to=moved_to,
                    fetch=params["fetch"], fetch_timeout=params["fetch_timeout"],
                    keep_checkpoints=params["keep_checkpoints"],
                )
                result["destroyed"]["box_removed"] = True
                warnings.extend(result["destroyed"].pop("warnings", []))
                warnings.extend(result["destroyed"].pop("warnings", []))
        elif name:
            # The container went (docker rm -f) but its volume, registrations and branch may not have.
            leftovers = None if check_mode else _rollback.destroy_leftovers(provider, name, params["delete_branch"])
            if leftovers is None and params["delete_branch"] and provider.shares_host_filesystem:
                # Destroyed earlier without delete_branch: the branch is still deleted when asked now, in
                # the workspace given, else the one its destroy recorded, else the current directory.
                kept = _rollback.kept_branch(provider.name, provider.engine, name)
                if params["workspace"] or not (kept and os.path.isdir(kept["workspace"])):
                    kept = None
                workspace = kept["workspace"] if kept else _naming.workspace_path(params["workspace"])
                leftovers = _forget_missing_box(name, workspace, check_mode, kept["branch"] if kept else None)
                if leftovers["branches_deleted"] and not check_mode:
                    _rollback.forget_kept_branch(provider.name, provider.engine, name)
                if not (leftovers["branches_deleted"] or leftovers["worktrees_removed"]):
                    result["destroyed"] = leftovers
                    leftovers = None
            if leftovers is not None:
                result["changed"] = True
                result["destroyed"] = {**leftovers, "box_removed": False}
    elif existing is None:
        if state in ("stopped", "paused"):
            raise ValueError(f"no box called {name!r} on engine {provider.engine}: create it first (state=started)")
        egress = _egress(params, workspace, provider, warnings)  # refused before anything is made
        no_screen = _screen.supported(provider) if params["vnc"] else ""
        if no_screen:  # here too: a check-mode plan never reaches create_box
            raise ValueError(f"vnc: {no_screen}: create the box without vnc")
        image = _screen.image_for(params["image"]) if params["vnc"] else params["image"]
        result["changed"] = True
        result["egress"] = egress.record() if egress else None  # None: the box's network is open
        if check_mode:
            planned_name = name or _naming.default_box_name(workspace, "0" * 8)
            result["box"] = _planned(planned_name, workspace, image, provider.name, provider.engine)
        else:
            if name:
                # A box removed by hand leaves a locked worktree registration at the path this one needs.
                _rollback.destroy_leftovers(provider, name, delete_branch=False)
            created = _box.create_box(
                provider,
                _box.CreateRequest(
                    name=name,
                    workspace=workspace,
                    image=params["image"],
                    env={k: str(v) for k, v in params["env"].items()},
                    ports=params["ports"],
                    resources={k: v for k, v in (params["resources"] or {}).items() if v is not None},
                    secrets={k: str(v) for k, v in params["secrets"].items()},
                    checkpoint=params["checkpoint"],
                    seed=params["seed"],
                    ship_depth=params["ship_depth"],
                    boot=params["boot"],
                    journal=journal,
                    with_env=params["with_env"],
                    carry_ignored=list(params["carry_ignored"]),
                    egress=egress,
                    vnc=params["vnc"],
                ),
            )
            carried = created.carried or {"files": [], "bytes": 0, "secret": []}
            if params["with_env"] or params["carry_ignored"]:
                result["carried_ignored"] = {"files": carried["files"], "bytes": carried["bytes"]}
            result["carried_secret"] = carried["secret"]
            if created.image_transfer:
                result["image_transfer"] = created.image_transfer
            if created.pool:
                result["pool"] = created.pool  # docs/pool.md: claimed from the warm pool, or why not
            result["box"] = created.facts.to_dict()
            result["seed"] = created.seed.to_dict() if created.seed else None
            result["boot"] = created.boot
            result["access"] = created.access
            warnings.extend(created.seed.warnings if created.seed else [])
            warnings.extend((created.access or {}).get("warnings", []))
            warnings.extend(provider.take_warnings())
    else:
        if state in ("present", "started") and existing.labels.get("seed") == "true" and existing.state == "running":
            # Its create was interrupted (on another controller, or before the journal existed).
            if _seed.read_seed_record(provider, existing.name) is None:
                raise _rollback.half_made_error(existing.name)
        wanted = {"present": existing.state, "started": "running", "stopped": "stopped", "paused": "paused"}[state]
        if existing.state != wanted:
            result["changed"] = True
            if check_mode:
                result["box"] = {**before, "state": wanted}
            else:
                target = {"running": "started", "stopped": "stopped", "paused": "paused"}[wanted]
                result["box"] = _box.set_state(provider, existing, target, boot=params["boot"]).to_dict()
    result["diff"] = {"before": before, "after": result["box"]}
    return result, warnings


def _forget_missing_box(name: str, workspace: str, check_mode: bool, branch: str | None = None) -> dict[str, Any]:
    """Delete the branch (default agentbox/<name>) and the box's worktree registrations in the workspace's
    repositories for a box that no longer exists; what was (or, in check mode, would be) removed, and
    where it looked (`searched`)."""
    branch = branch or _naming.box_branch(name)
    removed_worktrees: list[str] = []
    deleted_branches: list[str] = []
    for repo in _git.find_repos(workspace):
        path = _seed.worktree_path(name, repo.sub)
        registered = any(entry.get("worktree") == path for entry in _rollback.registrations(repo.common_dir))
        if registered and (check_mode or _git.remove_worktree_registration(repo.common_dir, path)):
            removed_worktrees.append(path)
        # Never the branch the host has checked out: deleting it would leave the host's HEAD dangling.
        if repo.head_branch != branch and _git.branch_exists(repo.root, branch):
            if check_mode or _rollback.remove_branch(repo.root, branch):
                deleted_branches.append(f"{repo.root}:{branch}")
    return {"worktrees_removed": removed_worktrees, "branches_deleted": deleted_branches, "box_removed": False,
            "searched": workspace, "branch": branch}
