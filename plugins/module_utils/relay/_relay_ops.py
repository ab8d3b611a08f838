# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the relay does on the host for a box: push, fetch, pull, checkpoint, open, gh pr.

Blocking code, run by the server in a worker thread. Every git command goes through the one
host git entry point (`_git.git`: the repository owner's identity, never root on a user's
repository, hardened against repository-planted configuration); every argv is a list, never a
shell line. Which box asks is decided by the server (the socket the request came on); this file
only ever acts on that box's own repository and branch.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..box import _box
from ..core._provider import BoxFacts, Provider, ProviderError
from ..git import _git, _gitlayer
from ..providers._registry import get_provider
from ._relay_policy import DEFAULT_CI_PATHS, ci_files, policy_path
from ._relay_policy import load as load_policy
from ._relay_protocol import Request, approval_reason

if TYPE_CHECKING:  # imported when a push needs it
    from ..git._ship import BundleSource

GH_TIMEOUT = 120
BOX_BUNDLE = "agentbox-relay-fetch.bundle"
SEED_RECORD_TTL = 60.0  # as the server's box facts: written once at seeding, for that box id
_seed_records: dict[str, tuple[float, dict[str, Any]]] = {}


@dataclasses.dataclass
class Outcome:
    """The host operation's answer: its exit status and what it printed, plus data for the client."""

    rc: int
    stdout: str = ""
    stderr: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Work that must wait until the box has its answer (a Daytona checkpoint stops the box), run by
    # the server right after sending it, and audited on its own line.
    after: Callable[[], Outcome] | None = None

    def summary(self) -> dict[str, Any]:
        """What the audit log keeps: the status and the output's tail."""
        tail = (self.stderr or self.stdout).strip()[-500:]
        return {"rc": self.rc, "output": tail, **({"data": self.data} if self.data else {})}


class BoxGone(ProviderError):
    """The box a socket belonged to no longer exists (or its name now belongs to another box)."""


def provider_of(registration: dict[str, Any]) -> Provider:
    """The registered box's provider (no engine call yet)."""
    return get_provider(registration["provider"], **_provider_options(registration))


def box_of(registration: dict[str, Any]) -> tuple[Provider, BoxFacts]:
    """The provider and current facts of a registered box, checked against its id label."""
    provider = provider_of(registration)
    facts = provider.find(registration["name"])
    if facts is None or facts.id != registration["id"]:
        raise BoxGone(
            f"box {registration['name']!r} (id {registration['id']}) no longer exists on engine {registration['engine']}",
            box=registration["name"],
        )
    return provider, facts


def wake(provider: Provider, facts: BoxFacts) -> BoxFacts:
    """The box running again if it was paused or stopped (the collection's own start); its facts."""
    current = provider.find(facts.name)
    if current is None or current.id != facts.id:
        raise BoxGone(f"box {facts.name!r} (id {facts.id}) no longer exists", box=facts.name)
    if current.state in ("paused", "stopped"):
        return _box.set_state(provider, current, "started")
    return current


def _seed_record(provider: Provider, facts: BoxFacts) -> dict[str, Any] | None:
    """The box's seed record, read from the box once per SEED_RECORD_TTL per box id: one exec less
    per push. It is the box's to write either way: fetch_box_branch checks it on every use (only
    the box's own branch moves), so a stale copy can only refuse or fetch that box's own work.
    None when the box has none (not kept: asked again next time)."""
    from ..git._seed import read_seed_record

    now = time.monotonic()
    cached = _seed_records.get(facts.id)
    if cached is not None and now - cached[0] < SEED_RECORD_TTL:
        return cached[1]
    for box_id in [key for key, (when, _record) in _seed_records.items() if now - when >= SEED_RECORD_TTL]:
        _seed_records.pop(box_id, None)  # boxes gone or quiet: not kept for the relay's lifetime
    record = read_seed_record(provider, facts.name)
    if record is not None:
        _seed_records[facts.id] = (now, record)
    return record


def _provider_options(registration: dict[str, Any]) -> dict[str, Any]:
    # The engine as registered ('local' for this machine's), then the provider's reopen_options.
    return {"engine": registration.get("engine"), **registration.get("options", {})}


def _text(result: subprocess.CompletedProcess) -> tuple[str, str]:
    return result.stdout.decode("utf-8", "replace"), result.stderr.decode("utf-8", "replace")


def _own_branch(facts: BoxFacts) -> str:
    if not facts.branch:
        raise ProviderError("this box has no git workspace (it was seeded as a plain copy): nothing to push or fetch",
                            box=facts.name)
    return facts.branch


def missing_remote(repo: str, remote: str) -> str | None:
    """Why `remote` cannot be pushed to or fetched from in the host repository `repo` (None: it is there)."""
    remotes = _git.git_out(repo, "remote").split()
    if remote in remotes:
        return None
    return f"the host repository {repo} has no remote {remote!r} (its remotes: {', '.join(remotes) or 'none'})"


def _check_remote(repo: str, remote: str) -> Outcome | None:
    missing = missing_remote(repo, remote)
    return None if missing is None else Outcome(2, stderr=missing)


@dataclasses.dataclass
class StagedPush:
    """A push's first half, done before the policy decides (the server asks the user in between): the box's
    commits brought into the host repository, the commit the push will send, and the CI configuration files
    its new commits add or change. The second half pushes exactly `tip`, whatever the box does meanwhile."""

    tip: str  # "" for a delete
    notes: str = ""
    ci: list[str] = dataclasses.field(default_factory=list)
    wakes_box = False  # its second half needs nothing more of the box

    def approval(self, request: Request, own_branch: str) -> str | None:
        """Why the user must approve it (None: the box may push alone)."""
        return approval_reason(request, own_branch, self.ci)

    def run(self, provider: Provider, facts: BoxFacts, request: Request, bundles: BundleSource | None,
            approved: bool) -> Outcome:
        """The second half: exactly `tip`, whatever the box did meanwhile."""
        return carry_out(provider, facts, request, bundles, self)


def stage_push(provider: Provider, facts: BoxFacts, request: Request, bundles: BundleSource | None = None,
               ci_patterns: tuple[str, ...] = DEFAULT_CI_PATHS) -> StagedPush | Outcome:
    """The first half of a push (see StagedPush); an Outcome when the push cannot go on.
    `bundles`: the box's client sends its new commits on its own connection (local boxes' socket)."""
    branch = _own_branch(facts)
    args = request.args
    repo = facts.workspace
    refused = _check_remote(repo, args["remote"])
    if refused:
        return refused
    if args["delete"]:
        return StagedPush(tip="")
    notes = ""
    if not provider.shares_host_filesystem or _gitlayer.has_layers(facts):
        # The box's commits live in its own clone, or its own git layer: bring them into the host repository first.
        # Only the box's own branch moves there; nothing reaches the remote before the policy said yes.
        from ..git._ship import fetch_box_branch

        fetched = fetch_box_branch(provider, facts, force=bool(args["force"]), record=_seed_record(provider, facts),
                                   bundles=bundles)
        new = sum(item["new_commits"] for item in fetched["repos"])
        notes = f"fetched {new} new commit(s) of {branch} from the box into {repo}\n"
    found = _git.git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}^{{commit}}", check=False)
    tip = found.stdout.decode().strip()
    if found.returncode != 0 or not tip:
        return Outcome(1, stderr=f"{notes}the host repository {repo} has no branch {branch} to push\n")
    return StagedPush(tip=tip, notes=notes, ci=ci_changes(repo, tip, args["remote"], ci_patterns))


def ci_changes(repo: str, tip: str, remote: str, patterns: tuple[str, ...]) -> list[str]:
    """The CI configuration files (`patterns`, _relay_policy) that the commits `tip` brings add or change: the
    paths its commits touch that neither `remote` (as the host last fetched or pushed it) nor the user's own
    branches have. Other boxes' agentbox/* branches, the pushing box's own included, are not the user's. A
    merge counts only for what differs from every parent (`-c`), so merging the user's main brings nothing."""
    if not patterns:
        return []
    listed = _git.git(repo, "log", "--format=", "--name-only", "-c", "--no-renames", "-z", tip, "--not",
                      f"--remotes={remote}", "--exclude=agentbox/*", "--branches")  # fmt: skip
    paths = {part.strip("\n") for part in listed.stdout.decode("utf-8", "surrogateescape").split("\0")}
    return ci_files((path for path in paths if path), patterns)


def push(provider: Provider, facts: BoxFacts, request: Request, bundles: BundleSource | None = None,
         staged: StagedPush | None = None) -> Outcome:
    """Push the box's own branch from the host repository, as itself or (approved) as another name: the
    commit `staged` names (staged here when not given)."""
    if staged is None:
        made = stage_push(provider, facts, request, bundles)
        if isinstance(made, Outcome):
            return made
        staged = made
    branch = _own_branch(facts)
    args = request.args
    target = args["as"] or branch
    if args["delete"]:
        refspec = f":refs/heads/{target}"
    else:
        refspec = f"{'+' if args['force'] else ''}{staged.tip}:refs/heads/{target}"
    result = _git.git(facts.workspace, "push", "--no-verify", args["remote"], refspec, check=False)
    stdout, stderr = _text(result)
    return Outcome(result.returncode, stdout=stdout, stderr=staged.notes + stderr,
                   data={"remote": args["remote"], "branch": branch, "target": target, "commit": staged.tip})


def fetch(provider: Provider, facts: BoxFacts, request: Request) -> Outcome:
    """Fetch the remote's branches into the host repository (which a local box shares)."""
    _own_branch(facts)
    repo = facts.workspace
    remote = request.args["remote"]
    refused = _check_remote(repo, remote)
    if refused:
        return refused
    # Only remote-tracking refs move; --no-write-fetch-head keeps the shared FETCH_HEAD untouched.
    result = _git.git(repo, "fetch", "--no-write-fetch-head", "--no-recurse-submodules", remote, check=False)
    stdout, stderr = _text(result)
    if result.returncode == 0 and not provider.shares_host_filesystem:
        stderr += _fetch_into_box(provider, facts, remote)
    elif result.returncode == 0 and _gitlayer.has_layers(facts):
        # The box sees the host's .git as it was when it started: ship what was fetched into its view.
        _gitlayer.refresh_view(provider, facts)
    return Outcome(result.returncode, stdout=stdout, stderr=stderr, data={"remote": remote})


def _fetch_into_box(provider: Provider, facts: BoxFacts, remote: str) -> str:
    """A shipped box (remote engine, Daytona) has its own clone: the host's refs/remotes/<remote>/*
    go into it as a bundle made against the commit the box started from (which it has)."""
    from ..core._tarstream import tar_of_files
    from ..git._seed import read_seed_record

    record = read_seed_record(provider, facts.name) or {}
    entry = next((item for item in record.get("worktrees", []) if item.get("sub") == ""), None)
    if entry is None:
        raise ProviderError("the box has no shipped repository to fetch into", box=facts.name, operation="fetch")
    repo, base = facts.workspace, entry["base"]
    listed = _git.git_out(repo, "for-each-ref", "--format=%(refname)", f"refs/remotes/{remote}/").split()
    wanted = [ref for ref in listed if not ref.endswith("/HEAD")
              and _git.git_out(repo, "rev-list", "--count", ref, f"^{base}") != "0"]
    if not wanted:
        return ""
    scratch = tempfile.mkdtemp(prefix="agentbox-relay-")
    try:
        bundle = os.path.join(scratch, "fetch.bundle")
        identity = _git.owner_identity(repo)
        if identity:  # host git runs as the repository's owner: let it write the bundle here
            os.chown(scratch, identity[0], identity[1])
        _git.git(repo, "bundle", "create", "-q", bundle, *wanted, f"^{base}")
        with open(bundle, "rb") as handle:
            data = handle.read()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    provider.put_archive(facts.name, "/tmp", tar_of_files({BOX_BUNDLE: (data, 0o644)}))
    try:
        fetched = provider.exec(
            facts.name,
            ["git", "-C", entry["path"], "fetch", "-q", "--no-tags", "--no-write-fetch-head", f"/tmp/{BOX_BUNDLE}",
             f"+refs/remotes/{remote}/*:refs/remotes/{remote}/*"],
        )
    finally:
        provider.exec(facts.name, ["rm", "-f", f"/tmp/{BOX_BUNDLE}"])
    fetched.check("fetching the host's refs into the box's clone", facts.name)
    return f"{len(wanted)} branch(es) of {remote} brought into the box's clone\n"


def pull(provider: Provider, facts: BoxFacts, request: Request) -> Outcome:
    """Fetch on the host; the box merges `<remote>/<branch>` itself (no credentials needed there)."""
    fetched = fetch(provider, facts, request)
    if fetched.rc != 0:
        return fetched
    remote = request.args["remote"]
    branch = request.args["branch"] or facts.labels.get("base_branch") or "main"
    tracking = f"refs/remotes/{remote}/{branch}"
    probe = _git.git(facts.workspace, "rev-parse", "--verify", "-q", f"{tracking}^{{commit}}", check=False)
    if probe.returncode != 0:
        return Outcome(1, stdout=fetched.stdout, stderr=fetched.stderr + f"{remote} has no branch {branch!r} to merge\n")
    fetched.data = {"merge": f"{remote}/{branch}", "commit": probe.stdout.decode().strip()}
    return fetched


def checkpoint(provider: Provider, facts: BoxFacts, request: Request) -> Outcome:
    """Capture the box as playbooks/checkpoint.yml would (same planning, same capture), as a checkpoint the box
    took itself: within its quota (box_checkpoints, box_checkpoint_bytes in the policy file), and removed with
    the box unless the user keeps it."""
    from ..checkpoint import _checkpoint

    plan = _checkpoint.plan_capture(provider, facts, request.args["name"], made_by="box")  # every check, first
    refused = _over_quota(provider, facts, taken=False)
    if refused:
        return Outcome(1, stderr=refused)
    if provider.snapshot_stops_box:
        # The snapshot stops the box, which would end the command waiting for this answer: answer first.
        text = (f"checkpoint {plan.name} (snapshot) is being taken: this box stops for it and starts again (its "
                "processes restart); on the host, agentbox_checkpoint_info lists it once saved and the relay's "
                "audit log has the result\n")
        return Outcome(0, stdout=text, data={"checkpoint": plan.name, "deferred": True},
                       after=lambda: _capture_after_answer(provider, plan))
    made = _checkpoint.capture(provider, plan)
    return _captured(provider, facts, made)


def _over_quota(provider: Provider, facts: BoxFacts, taken: bool) -> str | None:
    """Why the box may not take one more checkpoint of its own (`taken`: may not keep the one it just took,
    which its own already count), or None."""
    from ..checkpoint import _checkpoint

    policy = load_policy()
    own = _checkpoint.box_checkpoints(provider, facts)
    count, size = len(own), sum(found.size for found in own)
    how = ("remove one on the host (agentbox_checkpoint name=NAME state=absent), or keep it as yours "
           f"(agentbox_checkpoint name=NAME keep=true), which takes it out of the box's count; "
           f"the box's own now: {', '.join(found.name for found in own) or 'none'}")
    if not taken and count >= policy["box_checkpoints"]:
        return (f"this box has {count} checkpoint(s) of its own, the most it may keep (box_checkpoints "
                f"{policy['box_checkpoints']} in {policy_path()}): {how}\n")
    if size > policy["box_checkpoint_bytes"] or (not taken and size >= policy["box_checkpoint_bytes"]):
        return (f"this box's own checkpoints take {size} bytes, over the {policy['box_checkpoint_bytes']} it may "
                f"keep (box_checkpoint_bytes in {policy_path()}): {how}\n")
    return None


def _captured(provider: Provider, facts: BoxFacts, made: dict[str, Any]) -> Outcome:
    """The answer to a box's checkpoint once captured; over the box's bytes quota it is removed again."""
    from ..checkpoint import _checkpoint

    refused = _over_quota(provider, facts, taken=True)
    if refused:
        found = _checkpoint.find_checkpoint(provider, facts.project, made["name"])
        if found is not None:
            _checkpoint.remove(provider, found)
        return Outcome(1, stderr=f"checkpoint {made['name']} was taken, and removed again: {refused}")
    warnings = "".join(f"warning: {text}\n" for text in made.get("warnings", []))
    text = (f"checkpoint {made['name']} ({made['type']}) saved as {made['image']}; it goes when this box is "
            "destroyed unless the user keeps it\n")
    return Outcome(0, stdout=text, stderr=warnings, data={"checkpoint": made["name"], "image": made["image"]})


def _capture_after_answer(provider: Provider, plan: Any) -> Outcome:
    """A Daytona checkpoint, once the box's client has read its answer (it removes the answer file;
    one in-box wait of at most 10 s), so the stop does not cut the command short."""
    from ..checkpoint import _checkpoint
    from ._relay_poll import QUEUE_DIR

    box = plan.facts.name
    try:
        provider.exec(box, ["sh", "-c", 'i=0; while [ "$i" -lt 50 ] && ls "$1"/*.out >/dev/null 2>&1; '
                                        'do sleep 0.2; i=$((i + 1)); done; true', "wait", QUEUE_DIR])
        made = _checkpoint.capture(provider, plan)
        return _captured(provider, plan.facts, made)
    except (ProviderError, _git.GitError, ValueError) as exc:
        return Outcome(1, stderr=f"{exc}\n")


def open_url(provider: Provider, facts: BoxFacts, request: Request) -> Outcome:
    """Show the URL on the host; open it in the host's browser when the relay runs on a desktop."""
    url = request.args["url"]
    desktop = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    opener = shutil.which("xdg-open") or shutil.which("open")
    if desktop and opener:
        subprocess.Popen([opener, url], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        return Outcome(0, stdout=f"opened on the host: {url}\n", data={"opened": True})
    return Outcome(0, stdout=f"the host has no desktop to open it on; the URL is in the relay's log: {url}\n",
                   data={"opened": False})


def gh_pr(provider: Provider, facts: BoxFacts, request: Request) -> Outcome:
    """gh pr create|view|list|merge in the host repository, always about the box's own branch."""
    branch = _own_branch(facts)
    gh = shutil.which("gh")
    if gh is None:
        return Outcome(1, stderr="gh is not installed on the host: install GitHub's gh CLI there and sign in (gh auth login)")
    args = request.args
    action = args["action"]
    argv = [gh, "pr", action]
    if action == "create":
        argv += ["--head", branch, "--title", args["title"] or branch, "--body", args["body"] or ""]
        argv += ["--base", args["base"]] if args["base"] else []
        argv += ["--draft"] if args["draft"] else []
    elif action == "view":
        argv += [str(args["number"]) if args["number"] else branch]
    elif action == "list":
        argv += ["--head", branch]
    else:
        argv += [str(args["number"])]
    identity = _git.owner_identity(facts.workspace)
    env = {**os.environ, "GH_PROMPT_DISABLED": "1", "GIT_TERMINAL_PROMPT": "0"}
    if identity:
        env["HOME"] = identity[2]
    try:
        result = subprocess.run(
            argv, cwd=facts.workspace, env=env, capture_output=True, check=False, timeout=GH_TIMEOUT,
            user=identity[0] if identity else None, group=identity[1] if identity else None,
        )
    except subprocess.TimeoutExpired:
        return Outcome(1, stderr=f"gh pr {action} did not finish within {GH_TIMEOUT} s")
    stdout, stderr = _text(result)
    return Outcome(result.returncode, stdout=stdout, stderr=stderr)


HANDLERS = {
    "git.push": push,
    "git.fetch": fetch,
    "git.pull": pull,
    "checkpoint": checkpoint,
    "open": open_url,
    "gh.pr": gh_pr,
}


def carry_out(provider: Provider, facts: BoxFacts, request: Request, bundles: BundleSource | None = None,
              staged: StagedPush | None = None) -> Outcome:
    """Run one checked request for the box; provider and git failures become an Outcome. `bundles`:
    the box's connection can carry a push's bundle (None: the host fetches it with an exec); `staged`:
    a push's first half, done already (stage_push)."""
    try:
        if request.operation == "git.push":
            return push(provider, facts, request, bundles, staged)
        return HANDLERS[request.operation](provider, facts, request)
    except (ProviderError, _git.GitError, ValueError) as exc:
        return Outcome(1, stderr=f"{exc}\n")


def stage(provider: Provider, facts: BoxFacts, request: Request, bundles: BundleSource | None,
          ci_patterns: tuple[str, ...]) -> StagedPush | Outcome:
    """stage_push with failures as an Outcome, as carry_out gives them."""
    try:
        return stage_push(provider, facts, request, bundles, ci_patterns)
    except (ProviderError, _git.GitError, ValueError) as exc:
        return Outcome(1, stderr=f"{exc}\n")
