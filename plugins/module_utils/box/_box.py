# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The life of a box, written once for every provider: create (with seeding and the in-box
start sequence), change state, destroy. Modules call these; providers do the engine work.

create: workspace → names, project, repos → branch reserved → carry-over captured →
provider.create → seed → boot. Anything that fails after the first side effect undoes every
side effect made so far (container, volume, worktree registrations, the reserved branch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from ..access import _forwards, _screen
from ..agent import _agent
from ..core import _journal, _naming, _preflight
from ..core._boot import BOOT_COMMAND, boot_box, boot_box_then  # below the providers, which run it after a restart
from ..core._provider import (
    BoxFacts,
    BoxSpec,
    ExecTimedOut,
    OutputTooLarge,
    Provider,
    ProviderError,
    exec_deadline,
    worktree_records,
)
from ..egress import _egress_forwarder
from ..egress._egress_policy import EgressPolicy
from ..git import _carry_env, _git, _gitlayer, _seed
from ..relay import _relay_state
from . import _pool_claim, _rollback

if TYPE_CHECKING:
    from ..access._access import Identities

DEFAULT_IMAGE = "agentbox/box:latest"
WEB_PORT = 80
# Seconds a box gets to hand its last commits over at destroy and stop (every exec of the fetch-back
# together): root in a box can replace its git with one that never answers.
FETCH_TIMEOUT = 120.0
# Seconds the in-box shutdown of a stop may take; after it the engine's stop ends the box anyway.
SHUTDOWN_TIMEOUT = 60.0
SHUTDOWN_OUTPUT_LIMIT = 64 * 1024  # what of agentbox-ctl shutdown's output the host reads (it uses none)


@dataclasses.dataclass
class CreateRequest:
    name: str | None
    workspace: str
    image: str = DEFAULT_IMAGE
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    ports: list[int] = dataclasses.field(default_factory=list)
    resources: dict[str, Any] = dataclasses.field(default_factory=dict)
    secrets: dict[str, str] = dataclasses.field(default_factory=dict)
    checkpoint: str | None = None
    seed: bool = True
    boot: bool = True
    ship_depth: int | None = None  # history shipped to remote boxes (None: adaptive default, 0: all)
    journal: _journal.Journal | None = None  # the caller's claimed journal (else create claims one)
    with_env: bool = False  # the ignored .env* files too, onto the box's tmpfs (_carry_env)
    carry_ignored: list[str] = dataclasses.field(default_factory=list)  # more ignored files, by glob
    egress: EgressPolicy | None = None  # the host's gateway or the provider's allow list (docs/egress.md); None: open
    vnc: bool = False  # the box's screen: the screen image, its noVNC port published, a VNC password (_screen)


@dataclasses.dataclass
class Created:
    facts: BoxFacts
    seed: _seed.SeedResult | None
    boot: dict[str, Any] | None
    image_transfer: dict[str, Any] | None = None
    access: dict[str, Any] | None = None
    carried: dict[str, Any] | None = None  # what went onto the box's tmpfs (_carry_env.carry's answer)
    pool: str = ""  # the warm pool's line: 'claimed <pooled box>' or why not ('' with no pool on the engine)


class BoxError(ProviderError):
    pass


def resolve_name(name: str | None, workspace: str) -> tuple[str, str]:
    """(box name, box id): a given name is validated; none gives <workspace>-<id>."""
    box_id = _naming.new_box_id()
    if name:
        return _naming.validate_box_name(name), box_id
    return _naming.default_box_name(workspace, box_id), box_id


def check_name_fits(provider: Provider, name: str) -> None:
    """Refuse, before any side effect, a valid name the provider cannot give a box (see Provider.max_box_name)."""
    if len(name) > provider.max_box_name:
        raise BoxError(
            f"box name {name!r} is {len(name)} characters: a box on a Docker engine is a container whose hostname, "
            f"{_naming.container_name(name)}, Linux caps at {_naming.HOSTNAME_MAX} characters, so its name has at most "
            f"{provider.max_box_name}; pick a shorter one",
            box=name,
            operation="create",
        )


def check_owner(facts: BoxFacts, project: str) -> None:
    if facts.project and facts.project != project:
        raise BoxError(
            f"box name {facts.name!r} is already used by another project (workspace {facts.workspace}); "
            "pick another name",
            box=facts.name,
        )


def create_box(provider: Provider, request: CreateRequest) -> Created:
    workspace = _naming.workspace_path(request.workspace)
    _preflight.check_workspace_path(workspace)
    name, box_id = resolve_name(request.name, workspace)
    check_name_fits(provider, name)
    # The policy is held by the host's gateway (the local box engine) or by the provider's own network setting
    # (Daytona, boxd): `gateway` is the policy when the gateway holds it.
    gateway = request.egress if request.egress is not None and provider.holds_egress else None
    if request.egress is not None and gateway is None and not provider.egress_network(request.egress):
        raise BoxError(f"egress: a policy holds boxes on this machine's box engine (its gateway), Daytona and boxd "
                       f"(their own allow lists) only, not {provider.name} on {provider.engine} (a remote engine or "
                       "isolation none): create the box without egress and egress_allow", box=name,
                       operation="create")
    request = dataclasses.replace(request, egress=gateway)  # past here: the gateway's policy (None: no gateway part)
    no_screen = _screen.supported(provider) if request.vnc else ""
    if no_screen:
        raise BoxError(f"vnc: {no_screen}: create the box without vnc", box=name, operation="create")
    provider.check_can_create(name, egress=gateway is not None)  # before an image is sent or anything made
    project = _naming.project_id(workspace)
    _preflight.check_not_bare(workspace)
    repos = _git.find_repos(workspace)
    _preflight.check_no_operation_in_progress([repo.root for repo in repos])
    if request.seed:
        _preflight.check_project_file(workspace)
    image = _screen.image_for(request.image) if request.vnc else request.image
    restore = None
    checkpoint = request.checkpoint
    if checkpoint:
        # Checkpoint restore: the box starts from the checkpoint's image (see _checkpoint).
        # 'default' is the project's default checkpoint when one is set; 'none' is none.
        from ..checkpoint import _checkpoint, _restore

        if checkpoint == "default":
            checkpoint = _checkpoint.project_default(provider, project)
        elif checkpoint == "none":
            checkpoint = None
    if checkpoint:
        restore = _restore.plan_restore(provider, project, checkpoint)
        image = restore.image
    image_transfer = None
    if restore is None and provider.transfers_images:
        # A remote engine gets the image from the local one (or a registry) when it lacks it.
        image_transfer = provider.bring_image(image)
    image_labels = provider.image_labels(image)  # one lookup: labels, and presence when it has any
    if request.vnc:
        try:
            _screen.check_image(image, image_labels, provider.engine)
        except ProviderError as exc:
            raise BoxError(f"vnc: {exc}", box=name, operation="create") from None
    if not image_labels and not provider.image_exists(image):
        raise BoxError(
            f"image {image!r} is not on engine {provider.engine}: build it with the box_image role "
            "(ansible-playbook playbooks/create_box.yml does that) or pass an existing 'image'",
            box=name,
            operation="create",
        )
    fingerprint = image_labels.get(_naming.label("image_fingerprint"), "")
    # Local engine: the box works on the host's own .git, on a branch reserved here.
    # Elsewhere the repository is shipped (_ship) and the branch lives in the box's clone.
    shares_git = bool(repos) and provider.shares_host_filesystem
    journal = request.journal
    if journal is None:
        journal = _journal.Journal(provider.name, provider.engine, name)
        stale = journal.claim()
        try:
            if stale:
                _rollback.roll_back(provider, stale)
                journal.forget()
            return _create_claimed(provider, request, journal, name, box_id, workspace, project, repos,
                                   image, fingerprint, checkpoint, restore, shares_git, image_transfer)
        finally:
            journal.release()
    return _create_claimed(provider, request, journal, name, box_id, workspace, project, repos,
                           image, fingerprint, checkpoint, restore, shares_git, image_transfer)


def _create_claimed(
    provider: Provider,
    request: CreateRequest,
    journal: _journal.Journal,
    name: str,
    box_id: str,
    workspace: str,
    project: str,
    repos: list[_git.Repo],
    image: str,
    fingerprint: str,
    checkpoint: str | None,
    restore: Any,
    shares_git: bool,
    image_transfer: dict[str, Any] | None,
) -> Created:
    """The side effects of a create, each recorded in the journal first, all undone on failure."""
    journal.write(
        box=name,
        box_id=box_id,
        provider=provider.name,
        engine=provider.engine,
        workspace=workspace,
        stage="reserving",
        repos=[
            {"root": r.root, "common_dir": r.common_dir, "sub": r.sub, "head": r.head,
             "path": _seed.worktree_path(name, r.sub)}
            for r in repos
        ] if shares_git else [],
    )
    try:
        if shares_git:
            branch = _git.reserve_branch(repos, name, reason=f"agentbox: reserved for box {name} id {box_id}")
        else:
            branch = _naming.box_branch(name) if repos else ""
        journal.write(stage="reserved", branch=branch if shares_git else "")
        _journal.pause_point("reserved")
        plans = [_seed.WorktreePlan.for_repo(repo, name, branch) for repo in repos] if shares_git else []
        for plan in plans:
            # The box's view of each .git is an overlay that the box user owns (_gitlayer), whoever owns the host's.
            plan.owner_uid = _seed.BOX_UID
        carry = _seed.capture_all(repos) if repos and (request.seed or restore) else {}
        labels = _naming.box_labels(
            box=name,
            box_id=box_id,
            project=project,
            workspace=workspace,
            branch=branch,
            image_fingerprint=fingerprint,
            provider=provider.name,
            engine=provider.engine,
            checkpoint=checkpoint,
        )
        if shares_git:
            labels[_naming.label("worktrees")] = json.dumps(
                [{"git_dir": p.common_dir, "path": p.path, "sub": p.sub} for p in plans], separators=(",", ":")
            )
            labels[_naming.label("git_layers")] = "1"
        labels[_naming.label("image")] = image  # the name it was made from (a listing shows only the id)
        # Whether a seed record must exist once the create finished (labels cannot change later).
        labels[_naming.label("seed")] = "true" if (request.seed or restore is not None) else "false"
        if request.egress is not None:
            labels[_naming.label("egress")] = request.egress.mode  # set_state starts its forwarder again
        if request.vnc:
            labels[_naming.label(_screen.SCREEN_LABEL)] = "true"  # a start gives the box its VNC password again
        if repos:
            labels[_naming.label("base_commit")] = repos[0].head
            labels[_naming.label("base_branch")] = repos[0].head_branch or ""
        spec = BoxSpec(
            name=name,
            box_id=box_id,
            project=project,
            workspace=workspace,
            image=image,
            labels=labels,
            env=dict(request.env),
            ports=sorted({WEB_PORT, *request.ports, *([_screen.NOVNC_PORT] if request.vnc else [])}),
            resources=dict(request.resources),
            bind_paths=_gitlayer.layer_paths([plan.common_dir for plan in plans]),
            secrets={**request.secrets, **({_screen.SECRET: _screen.password(box_id)} if request.vnc else {})},
            egress=request.egress is not None,
        )
        if request.egress is not None:
            spec.env.update(_egress_forwarder.box_environment())  # no secret in them: the container's own
        journal.write(stage="creating")
        # The host relay serves the box (docs/relay.md): a socket directory to bind, or none; it starts if need be.
        egress = request.egress.record() if request.egress is not None else None
        spec.mounts.update(_relay_state.attach_box(provider, name, box_id, egress))
        # A pooled box when one can be this box (docs/pool.md), else a new one: the rest is the same for both.
        facts, pool_line = _pool_claim.create(provider, spec, journal, fingerprint, restore, request.boot)
        journal.write(stage="seeding")
        _journal.pause_point("created")
        # Before git uses the .git: the git layer's preparation. And dockerd takes about as long to
        # come up as seeding takes: start it now, in the background. Both are root shell commands,
        # run in the worktree seed's own exec when there is one (one exec less each), else alone.
        before = [_gitlayer.prepare_command(spec.bind_paths)] if spec.bind_paths else []
        identity = _pool_claim.identity_command(provider, spec)
        if identity:
            before.append(identity)
        if request.egress is not None:
            before.append(_egress_forwarder.setup_command())  # before anything in the box reaches out
        elif restore is not None:
            before.append(_egress_forwarder.clear_command())
        if request.boot:
            before.append(early_boot_command())
        # The SSH access's box side rides in an exec the create makes anyway: the boot's, else a
        # worktree seed's (refresh_access reads how it went, and makes its own exec when neither ran it).
        from ..access import _access

        keys = _access.box_identities()  # the boxes' own key is made here when the user has none
        access_lines = _access.folded_setup(keys.public_lines())
        seed_result, folded_output, carried = None, "", None
        # Files named like secrets are never seeded into a layer: they go to the box's tmpfs below.
        secret = _carry_env.secret_paths(carry) if repos else []
        if not repos and request.seed and restore is None:  # a plain copy: no .gitignore, same rule
            secret = _seed.secret_files_in_tree(workspace)
        if restore is None and request.seed:
            seed_result, folded_output = _seed_workspace(
                provider, name, workspace, repos, plans, branch, carry, request.ship_depth, box_id,
                before="\n".join(before), report="" if request.boot else access_lines, secret=secret,
            )  # fmt: skip
        else:
            _seed.run_before(provider, name, "\n".join(before))
            if restore is not None:
                seed_result = restore.restore_workspace(provider, name, repos, plans, carry)
        if seed_result is not None and (secret or request.with_env or request.carry_ignored):
            # Before the boot: the project's services may read them as they start.
            carried = _carry_env.carry(provider, name, workspace, request.with_env, request.carry_ignored,
                                       _seed.WORKSPACE, secret)  # fmt: skip
        journal.write(stage="booting")
        _journal.pause_point("seeded")
        boot = None
        if request.boot:
            boot, folded_output = boot_box_then(provider, name, access_lines)
        if restore is not None and request.boot:
            _agent.resume(provider, facts)  # a checkpoint remembers which agents ran, never their credentials
        _relay_state.notify(box_id)  # the box runs now: a relay channel waiting for it opens at once
    except BaseException:
        try:
            _rollback.roll_back(provider, journal.record)
            journal.forget()
        except Exception:  # noqa: BLE001 - the journal stays: the next create or destroy finishes the undo
            pass
        raise
    journal.forget()
    access = refresh_access(provider, facts, folded_output, keys)
    return Created(facts=facts, seed=seed_result, boot=boot, image_transfer=image_transfer, access=access,
                   carried=carried, pool=pool_line)


def refresh_access(
    provider: Provider,
    facts: BoxFacts,
    folded_output: str = "",
    keys: Identities | None = None,
) -> dict[str, Any]:
    """`ssh agentbox-<box>` for a running box (see _access). A failure here is a warning: the box
    itself is fine, and attach.yml writes the entry again. `folded_output`: the stdout of an exec with
    the access's box side folded in (the boot's or the seed's), "" when none ran it; `keys`: the
    box_identities() it was given (so the host's key files are read once)."""
    from ..access import _access

    try:
        return _access.box_ready(provider, facts, folded_output, keys).to_dict()
    except (OSError, ProviderError) as exc:
        return {"alias": _access.alias(facts.name), "warnings": [f"ssh agentbox-{facts.name} is not set up: {exc}"]}


def _seed_workspace(
    provider: Provider,
    name: str,
    workspace: str,
    repos: list[_git.Repo],
    plans: list[_seed.WorktreePlan],
    branch: str,
    carry: dict[str, _git.CarryOver],
    ship_depth: int | None = None,
    box_id: str = "",
    before: str = "",
    report: str = "",
    secret: list[str] | None = None,
) -> tuple[_seed.SeedResult, str]:
    """The one dispatch between the three ways of seeding /workspace; the result, and the stdout of
    the exec that ran `report` ("" when none did). `before`: root shell commands run first: in the
    worktree seed's own exec, else in one of their own. `report`: see _seed.seed_worktrees (only
    that seed carries it). `secret`: a plain copy's files named like secrets, left out of it (a repository's
    are in its carry-over's `secret`, never in `untracked`)."""
    if plans:
        return _seed.seed_worktrees(provider, name, plans, carry, box_id, before, report)
    _seed.run_before(provider, name, before)
    if repos:
        from ..git import _ship

        return _ship.seed_shipped(provider, name, repos, branch, carry, depth=ship_depth), ""
    return _seed.seed_copy(provider, name, workspace, secret), ""


def seed_existing(provider: Provider, facts: BoxFacts) -> tuple[bool, dict[str, Any]]:
    """Seed a box made with seed=false; (changed, seed record). A seeded box is left alone."""
    record = _seed.read_seed_record(provider, facts.name)
    if record is not None:
        return False, record
    repos = _git.find_repos(facts.workspace)
    plans: list[_seed.WorktreePlan] = []
    if repos and provider.shares_host_filesystem:
        by_sub = {record["sub"]: record for record in worktree_records(facts)}
        missing = [repo.root for repo in repos if repo.sub not in by_sub]
        if missing:
            raise BoxError(
                f"{', '.join(missing)} appeared after the box was made, so its .git is not mounted in the box; "
                "destroy and re-create the box",
                box=facts.name,
                operation="seed",
            )
        for repo in repos:
            plan = _seed.WorktreePlan.for_repo(repo, facts.name, facts.branch)
            plan.path = by_sub[repo.sub]["path"]
            if _gitlayer.has_layers(facts):
                plan.owner_uid = _seed.BOX_UID
            plans.append(plan)
    carry = _seed.capture_all(repos) if repos else {}
    if _gitlayer.has_layers(facts):
        # The box's view of each .git was taken at create: this stash is newer.
        for plan in plans:
            stash = carry[plan.sub].stash
            if stash:
                _gitlayer.send_objects(provider, facts.name, plan.host_root, plan.common_dir, [stash], plan.base)
    secret = _carry_env.secret_paths(carry) if repos else _seed.secret_files_in_tree(facts.workspace)
    try:
        result, _output = _seed_workspace(provider, facts.name, facts.workspace, repos, plans, facts.branch, carry,
                                          secret=secret)  # fmt: skip
        if secret:
            _carry_env.carry(provider, facts.name, facts.workspace, False, [], _seed.WORKSPACE, secret)
    except BaseException:
        for plan in plans:
            _git.remove_worktree_registration(plan.common_dir, plan.path)
        raise
    return True, result.to_dict()


def start_egress(provider: Provider, facts: BoxFacts) -> None:
    """A box with an egress policy lost its forwarder with its processes: start it again (docs/egress.md)."""
    if facts.labels.get("egress"):
        provider.exec(facts.name, ["sh", "-c", _egress_forwarder.setup_command()], user="root").check(
            "starting the egress forwarder", facts.name)


def early_boot_command() -> str:
    """The in-box start sequence without the supervisor, detached (a root shell command); boot_box completes it."""
    return f"command -v {BOOT_COMMAND} >/dev/null 2>&1 && ({BOOT_COMMAND} --no-supervisor >/dev/null 2>&1 &); true"


def destroy_box(
    provider: Provider,
    facts: BoxFacts,
    delete_branch: bool = False,
    moved_to: str | None = None,
    fetch: bool = True,
    fetch_timeout: float = FETCH_TIMEOUT,
    keep_checkpoints: bool = False,
) -> dict[str, Any]:
    """Remove the box, its volumes and its worktree registrations; the branch stays unless asked.

    `moved_to`: where the workspace is now, when it moved after the box was made; its registrations
    are found there by the box's id. What could not be found is reported, never claimed removed.
    The box's last commits are brought into its branch first (they live in the box's git layer), within
    `fetch_timeout` seconds; `fetch` False skips that. What was not fetched is reported (`not_fetched`).
    The checkpoints the box took itself (through the relay) go too, unless kept (`keep_checkpoints`, or the
    user kept one: _checkpoint.remove_box_checkpoints).
    """
    warnings: list[str] = []
    report: dict[str, Any] = {}
    if provider.shares_host_filesystem and _gitlayer.has_layers(facts) and not delete_branch:
        where = dataclasses.replace(facts, workspace=moved_to) if moved_to else facts
        why = "fetch=false"
        if fetch:
            try:
                if facts.state != "running":
                    facts = provider.start(facts.name)  # the container only: git is all that runs
                with exec_deadline(fetch_timeout):
                    _gitlayer.import_work(provider, dataclasses.replace(facts, workspace=where.workspace))
                why = ""
            except ExecTimedOut:
                why = f"the box did not answer within {fetch_timeout:g} s (fetch_timeout)"
            except (ProviderError, _git.GitError) as exc:
                why = str(exc)
        if why:
            report["not_fetched"] = _host_tips(where)
            kept = ", ".join(f"{item['repo']} at {item['commit'][:12] or 'nothing'}" for item in report["not_fetched"])
            warnings.append(f"the box's last commits were not brought into {facts.branch} on the host ({why}): what "
                            f"it committed since its branch was last fetched went with the box; the host's "
                            f"{facts.branch} stays as it was ({kept})")
    provider.destroy(facts.name)
    # The relay's files of the box go whatever the box put in them; what cannot go is reported.
    problem = _relay_state.forget_box(facts.id) if facts.id else None
    if problem:
        warnings.append(problem)
    from ..access import _access

    _access.box_removed(facts.name, facts.engine)
    _forwards.remove(provider.name, provider.engine, facts.name)  # their processes end with the box
    if not keep_checkpoints and facts.project:
        from ..checkpoint import _checkpoint

        try:
            taken = _checkpoint.remove_box_checkpoints(provider, facts)
        except ProviderError as exc:
            warnings.append(f"the checkpoints the box took could not be looked up to be removed: {exc}")
        else:
            report.update(checkpoints_removed=taken["removed"], checkpoints_kept=taken["kept"])
            warnings.extend(taken["warnings"])
    removed_worktrees: list[str] = []
    not_found: list[str] = []
    deleted_branches: list[str] = []
    if provider.shares_host_filesystem:
        for record in worktree_records(facts):
            repo_root = facts.workspace if not record["sub"] else f"{facts.workspace}/{record['sub']}"
            if _gitlayer.has_layers(facts):
                pass  # registered in the box's git layer, which went with the box: nothing on the host
            elif _git.remove_worktree_registration(record["git_dir"], record["path"]):
                removed_worktrees.append(record["path"])
            else:
                found = _rollback.find_registration_by_id(moved_to, record, facts.id) if moved_to else None
                if found and _git.remove_worktree_registration(found["common_dir"], record["path"]):
                    removed_worktrees.append(record["path"])
                    repo_root = found["root"]
                else:
                    not_found.append(
                        f"{record['path']} in {record['git_dir']} (gone: if the workspace moved, remove it with "
                        f"git -C <new path> worktree remove -f -f {record['path']})"
                    )
            if delete_branch and facts.branch and _rollback.remove_branch(repo_root, facts.branch):
                deleted_branches.append(f"{repo_root}:{facts.branch}")
    if provider.shares_host_filesystem and facts.branch:
        # The labels go with the container: where its branch stays is kept for a later delete_branch.
        if delete_branch:
            _rollback.forget_kept_branch(provider.name, provider.engine, facts.name)
        else:
            _rollback.remember_kept_branch(provider.name, provider.engine, facts.name, moved_to or facts.workspace,
                                           facts.branch)  # fmt: skip
    report.update(worktrees_removed=removed_worktrees, branches_deleted=deleted_branches)
    if not_found:
        report["worktrees_not_found"] = not_found
    if warnings:
        report["warnings"] = warnings
    return report


def _host_tips(facts: BoxFacts) -> list[dict[str, str]]:
    """[{repo, branch, commit}]: where the box's branch is in each host repository (commit '' when absent)."""
    tips = []
    for record in worktree_records(facts) or [{"sub": ""}]:
        root = facts.workspace if not record.get("sub") else f"{facts.workspace}/{record['sub']}"
        try:
            found = _git.git(root, "rev-parse", "--verify", "-q", f"refs/heads/{facts.branch}", check=False)
            commit = found.stdout.decode().strip()
        except (_git.GitError, OSError):  # the workspace is gone: nothing there to say
            commit = ""
        tips.append({"repo": root, "branch": facts.branch, "commit": commit})
    return tips


def set_state(provider: Provider, facts: BoxFacts, state: str, boot: bool = True) -> BoxFacts:
    """Move an existing box to started, stopped or paused; a start re-runs the boot sequence."""
    if state == "started":
        if facts.state == "paused":
            resumed = provider.resume(facts.name)
            if provider.resume_restarts_processes:
                # A Daytona pause is a stop: the keys' tmpfs is gone, and the alias gets a fresh token; the
                # agents it ended run again, as after a stop (a session still running is left alone).
                refresh_access(provider, resumed)
                if boot:
                    _agent.resume(provider, resumed)
            return resumed
        if facts.state == "stopped":
            provider.start(facts.name)
            start_egress(provider, facts)
            _screen.give_password(provider, facts)
            if boot:
                boot_box(provider, facts.name)
            started = provider.find(facts.name) or facts
            refresh_access(provider, started)  # the keys lived on the box's tmpfs
            if boot:
                _agent.resume(provider, started)  # the agents a stop ended, with the host's credentials
            return started
        return facts
    if state == "stopped":
        _forwards.remove(provider.name, provider.engine, facts.name)  # a forward to a stopped box serves nothing
        if facts.state == "stopped":
            return facts
        if facts.state == "paused":
            # A paused box runs nothing, not even a shutdown: resume it so its services stop cleanly too.
            facts = provider.resume(facts.name)
        if facts.state == "running":
            if provider.shares_host_filesystem:
                # A stopped box's commits are on the host. A box that broke its own git (or whose git
                # never answers) keeps them in its layer: destroy tries again (and says so), the stop goes ahead.
                with contextlib.suppress(ProviderError, _git.GitError), exec_deadline(FETCH_TIMEOUT):
                    _gitlayer.import_work(provider, facts)
            # Let the supervisor stop services cleanly: `docker stop` alone SIGKILLs them (and does, past the bound).
            # Its output is not used: a box that prints more than the host reads is stopped all the same.
            with contextlib.suppress(ExecTimedOut, OutputTooLarge), exec_deadline(SHUTDOWN_TIMEOUT):
                provider.exec(facts.name, ["sh", "-c", "command -v agentbox-ctl >/dev/null && agentbox-ctl shutdown || true"],
                              limit=SHUTDOWN_OUTPUT_LIMIT, what="output of agentbox-ctl shutdown")
        return provider.stop(facts.name)
    if state == "paused":
        if facts.state == "stopped":
            provider.start(facts.name)
            start_egress(provider, facts)
            _screen.give_password(provider, facts)
            if boot:
                boot_box(provider, facts.name)
            refresh_access(provider, facts)
        return provider.pause(facts.name) if facts.state != "paused" else facts
    raise BoxError(f"unknown state {state!r}", box=facts.name)
