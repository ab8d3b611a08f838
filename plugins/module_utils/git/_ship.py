# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Seeding a box whose engine cannot see the host's files (remote Docker, Daytona): ship the repo.

Written against the Provider interface only (exec, put_archive, get_archive), so every provider
that does not share the host filesystem uses it.

Per repo (the workspace's own, then each first-level nested one):
  host: `git init` a staging repo and fetch into it, over file:// from the host repo, the HEAD
        commit as agentbox/<box> and the carry-over stash commit as refs/agentbox/carry-over,
        both with --depth (default 200 commits, 100 when that packs over 20 MiB; 0 = full
        history). The host repo is only read: no ref, index or working tree of it changes.
  box:  the staging .git is streamed as a tar into /workspace[/<sub>]/.git, then
        `git checkout -f -B agentbox/<box> <HEAD>`, `git stash apply --index` of the carried
        commit (plain apply when the index part does not apply), and the untracked files as a
        tar stream. Tracked and untracked files end up byte-identical to the host's.

Bringing work back (fetch_box_branch): the box's branch tip is fetched into the host repo as
agentbox/<box>. New commits travel as a git bundle made in the box against the base commit the
box started from (which the host has), so a shallow box history still resolves on the host.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from ..core._box_data import object_id, own_branch
from ..core._naming import BOX_USER
from ..core._provider import BoxFacts, OutputTooLarge, Provider, ProviderError, too_large
from ..core._tarstream import tar_of_paths, tar_of_tree
from ..relay._relay_protocol import MAX_BUNDLE_BYTES
from . import _git, _seed

WORKSPACE = _seed.WORKSPACE
CARRY_REF = "refs/agentbox/carry-over"
DEFAULT_DEPTH = 200
ADAPTIVE_DEPTH = 100
ADAPTIVE_LIMIT_BYTES = 20 * 1024 * 1024
DEPTH_ENV = "AGENTBOX_SHIP_DEPTH"
BUNDLE_PATH = "/tmp/agentbox-fetch.bundle"
# Tar headers read before a copied-out file's own bytes (a pax header, a long name: a few blocks).
TAR_HEADER_LIMIT = 64 * 1024
# What a box that sends its own bundle is asked: (path, ref, base, have, destination) -> (the tip it
# names, whether it wrote a bundle to destination), or raises. The relay's socket channel is one.
BundleSource = Callable[[str, str, str, str, str], tuple[str, bool]]

_CHECKOUT_SCRIPT = r"""
set -eu
dir=$1 branch=$2 head=$3 carry=$4 origin=$5
cd "$dir"
git checkout -q -f -B "$branch" "$head"
if [ -n "$carry" ]; then
  if ! git stash apply -q --index "$carry" 2>/dev/null; then
    # The staged part does not apply on its own: carry the changes unstaged rather than lose them.
    git reset -q --hard HEAD
    git stash apply -q "$carry"
    echo "staged state could not be restored; changes carried as unstaged" >&2
  fi
fi
if [ -n "$origin" ]; then
  git remote add origin "$origin" 2>/dev/null || git remote set-url origin "$origin"
fi
"""


@dataclasses.dataclass
class StagedRepo:
    """A repo's shallow copy on the controller, ready to stream into a box."""

    sub: str
    path: str  # staging directory; its .git is what gets shipped
    head: str
    depth: int  # 0 = full history
    shallow: bool
    pack_bytes: int


def ship_depth(depth: int | None = None) -> tuple[int, bool]:
    """(depth, adaptive): an explicit depth is kept as given; the default may shrink."""
    if depth is not None:
        return _checked_depth(depth), False
    raw = os.environ.get(DEPTH_ENV)
    if raw:
        try:
            return _checked_depth(int(raw)), False
        except ValueError as exc:
            raise ProviderError(f"{DEPTH_ENV}={raw!r} is not a number of commits (0 = full history)") from exc
    return DEFAULT_DEPTH, True


def _checked_depth(depth: int) -> int:
    if depth < 0:
        raise ProviderError(f"history depth {depth} is negative: give a number of commits, or 0 for full history")
    return depth


def stage_repo(repo: _git.Repo, branch: str, stash: str | None, depth: int, workdir: str) -> StagedRepo:
    """Fetch HEAD (as `branch`) and the stash commit from the host repo into a new staging repo."""
    path = os.path.join(workdir, repo.sub or "_root")
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    # Stage as the host repo's owner: git refuses to serve a repository owned by someone else to
    # root's upload-pack, whatever safe.directory says on the command line.
    identity = _git.owner_identity(repo.root)
    if identity:
        for owned in (workdir, path):
            os.chown(owned, identity[0], identity[1])
    _git.git(path, "init", "-q", "--template=")
    refspecs = [f"{repo.head}:refs/heads/{branch}"]
    if stash:
        refspecs.append(f"{stash}:{CARRY_REF}")
    depth_args = [f"--depth={depth}"] if depth > 0 else []
    # The stash commit is reachable from no ref of the host: let upload-pack serve it by id.
    _git.git(
        path,
        "-c",
        "uploadpack.allowAnySHA1InWant=true",
        "fetch",
        "-q",
        "--no-tags",
        "--no-write-fetch-head",
        *depth_args,
        "file://" + repo.common_dir,
        *refspecs,
    )
    _git.git(path, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
    return StagedRepo(
        sub=repo.sub,
        path=path,
        head=repo.head,
        depth=depth,
        shallow=os.path.exists(os.path.join(path, ".git", "shallow")),
        pack_bytes=_tree_bytes(os.path.join(path, ".git")),
    )


def _tree_bytes(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def box_path(sub: str) -> str:
    return f"{WORKSPACE}/{sub}" if sub else WORKSPACE


def _origin_url(repo: _git.Repo) -> str:
    result = _git.git(repo.root, "config", "--get", "remote.origin.url", check=False)
    return result.stdout.decode("utf-8", "replace").strip() if result.returncode == 0 else ""


def seed_shipped(
    provider: Provider,
    box: str,
    repos: list[_git.Repo],
    branch: str,
    carry: dict[str, _git.CarryOver],
    depth: int | None = None,
) -> _seed.SeedResult:
    """Ship each repo into the box at /workspace[/<sub>] on `branch`, with its carry-over."""
    wanted_depth, adaptive = ship_depth(depth)
    result = _seed.SeedResult(mode="shipped", branch=branch, base_commit=repos[0].head)
    workdir = tempfile.mkdtemp(prefix="agentbox-ship-")
    try:
        for repo in repos:
            state = carry[repo.sub]
            staged = stage_repo(repo, branch, state.stash, wanted_depth, workdir)
            if adaptive and staged.shallow and staged.pack_bytes > ADAPTIVE_LIMIT_BYTES:
                staged = stage_repo(repo, branch, state.stash, ADAPTIVE_DEPTH, workdir)
                result.warnings.append(
                    f"{repo.root}: {wanted_depth} commits of history pack over {ADAPTIVE_LIMIT_BYTES >> 20} MiB; "
                    f"shipped the last {ADAPTIVE_DEPTH} (set {DEPTH_ENV} to choose, 0 for all)"
                )
            _ship_one(provider, box, repo, staged, branch, state, result)
            shutil.rmtree(staged.path, ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _seed.finish(provider, box, None, result)
    return result


def _ship_one(
    provider: Provider,
    box: str,
    repo: _git.Repo,
    staged: StagedRepo,
    branch: str,
    state: _git.CarryOver,
    result: _seed.SeedResult,
) -> None:
    target = box_path(repo.sub)
    provider.exec(box, ["mkdir", "-p", target], user=BOX_USER).check(f"making {target}", box)
    upload(provider, box, target, tar_of_tree(staged.path), f"the repository {repo.root} ({_mb(staged.pack_bytes)})")
    run = provider.exec(
        box,
        ["bash", "-c", _CHECKOUT_SCRIPT, "ship", target, branch, staged.head, CARRY_REF if state.stash else "",
         _origin_url(repo)],
        user=BOX_USER,
    )  # fmt: skip
    run.check(f"checking out {branch} in {target}", box)
    if run.stderr.strip():
        result.warnings.append(f"{repo.root}: {run.stderr.decode('utf-8', 'replace').strip()}")
    if state.untracked:
        upload(provider, box, target, tar_of_paths(repo.root, state.untracked), f"untracked files of {repo.root}")
    result.modified += state.modified
    result.deleted += state.deleted
    result.renamed += state.renamed
    result.untracked += len(state.untracked)
    result.worktrees.append(
        {
            "sub": repo.sub,
            "path": target,
            "host_root": repo.root,
            "branch": branch,
            "base": staged.head,
            "depth": staged.depth,
            "shallow": staged.shallow,
            "pack_bytes": staged.pack_bytes,
        }
    )


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def upload(provider: Provider, box: str, target: str, stream: Iterable[bytes], what: str) -> None:
    """put_archive with a failure that names what was sent and says when the engine's disk is full."""
    try:
        provider.put_archive(box, target, stream)
    except ProviderError as exc:
        text = str(exc)
        hint = ""
        if "no space" in text.lower():
            hint = (
                f" The engine {provider.engine} is out of disk space: free some there (docker system prune, "
                "or remove old boxes and checkpoints) and try again."
            )
        raise ProviderError(f"uploading {what} to {target} failed: {text}.{hint}", box=box) from exc


# --------------------------------------------------------------------------------------------
# Bringing the box's branch back


class _IterReader:
    """A read()-able file over an iterator of chunks (for tarfile's stream mode). `budget`: how many
    bytes it hands out at most; past it, over() is raised (the chunks are the box's to make any size)."""

    def __init__(self, chunks: Iterable[bytes], budget: int | None = None,
                 over: Callable[[], Exception] | None = None) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""
        self.budget = budget
        self.consumed = 0
        self._over = over

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            try:
                self._buffer += next(self._chunks)
            except StopIteration:
                break
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        self.consumed += len(data)
        if self.budget is not None and self.consumed > self.budget:
            raise self._over() if self._over else ProviderError(f"more than {self.budget} bytes came: refused")
        return data


def _box_git(provider: Provider, box: str, path: str, *args: str) -> Any:
    return provider.exec(box, ["git", "-C", path, *args], user=BOX_USER)


def _host_has_commit(root: str, commit: str) -> bool:
    return _git.git(root, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0


def _copy_out(provider: Provider, box: str, path: str, destination: str, limit: int = MAX_BUNDLE_BYTES) -> None:
    """The file at `path` in the box streamed into `destination`, at most `limit` bytes of it: a bundle
    the box made, never held in memory. Only the archive's first member is read; before its bytes, at
    most TAR_HEADER_LIMIT of headers (a box that makes its own tar can claim a header of any size)."""
    what = f"bundle {path}"
    reader = _IterReader(provider.get_archive(box, path), TAR_HEADER_LIMIT, lambda: too_large(box, what, limit))
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        member = tar.next()
        if member is None or not member.isfile():
            raise ProviderError(f"{path} in the box is not a file (a box replaced it?): nothing fetched", box=box,
                                operation="fetch")
        if member.size > limit:
            raise too_large(box, what, limit)
        reader.budget = reader.consumed + member.size + TAR_HEADER_LIMIT
        source = tar.extractfile(member)
        if source is None:
            raise ProviderError(f"{path} came out of the box empty", box=box)
        with open(destination, "wb") as handle:
            shutil.copyfileobj(source, handle, 1 << 20)


def fetch_box_branch(
    provider: Provider,
    facts: BoxFacts,
    workspace: str | None = None,
    *,
    force: bool = False,
    record: dict[str, Any] | None = None,
    bundles: BundleSource | None = None,
) -> dict[str, Any]:
    """Fetch the box's branch into each host repo as the same branch (agentbox/<box>).

    Fast-forward only unless force; a branch checked out on the host is never moved. `record`:
    the box's seed record when the caller has it already (read from the box otherwise).
    `bundles`: the box sends its new commits itself (the relay's socket) instead of an exec.
    Returns {'repos': [{'sub', 'host_root', 'branch', 'commit', 'previous', 'new_commits', 'changed'}]}.
    """
    box = facts.name
    record = record if record is not None else _seed.read_seed_record(provider, box)
    # A local box whose .git is an overlay (_gitlayer) keeps its commits in the box too.
    if not record or record.get("mode") not in ("shipped", "worktree", "checkpoint"):
        raise ProviderError(
            "this box was not seeded by shipping the repository (its commits are already in the host repo, or "
            "it has no git workspace): nothing to fetch",
            box=box,
            operation="fetch",
        )
    host_root = _git.find_repos(workspace or facts.workspace)
    by_sub = {repo.sub: repo for repo in host_root}
    results = []
    for entry in record.get("worktrees", []):
        repo = by_sub.get(entry["sub"])
        if repo is None:
            raise ProviderError(
                f"the host has no repository at {os.path.join(workspace or facts.workspace, entry['sub'])} to fetch "
                f"{entry['branch']} into: pass the workspace the box was created from",
                box=box,
                operation="fetch",
            )
        own_branch(entry, facts.branch, box)  # the record is the box's to forge: only its own branch moves
        results.append(_fetch_one(provider, box, repo, entry, force, bundles))
    return {"repos": results, "changed": any(item["changed"] for item in results)}


def _fetch_one(
    provider: Provider, box: str, repo: _git.Repo, entry: dict[str, Any], force: bool, bundles: BundleSource | None
) -> dict[str, Any]:
    branch, path, base = entry["branch"], entry["path"], entry["base"]
    ref = f"refs/heads/{branch}"
    previous = _git.git(repo.root, "rev-parse", "--verify", "-q", ref, check=False).stdout.decode().strip()
    if bundles is not None:
        tip = _bring_tip_sent(bundles, box, repo.root, path, ref, base, previous)
    else:
        tip = _bring_tip(provider, box, repo.root, path, ref, base, previous)
    if previous == tip:
        return _report(repo, entry, tip, previous, 0, changed=False)
    current = _git.git(repo.root, "symbolic-ref", "-q", "HEAD", check=False).stdout.decode().strip()
    if current == ref:
        raise ProviderError(
            f"{branch} is checked out in {repo.root}: moving it would leave that working tree out of step; check out "
            "another branch there and fetch again",
            box=box,
            operation="fetch",
        )
    # One walk answers both questions: is the host's branch an ancestor of the tip (nothing of it
    # only on the host), and how many commits are new.
    counted = _git.git(repo.root, "rev-list", "--left-right", "--count", f"{previous or base}...{tip}", check=False)
    only_host, new_commits = (
        ([int(part) for part in counted.stdout.split()] + [0, 0])[:2] if counted.returncode == 0 else (-1, 0)
    )
    if previous and not force and only_host != 0:
        raise ProviderError(
            f"{branch} in {repo.root} has commits the box's branch does not ({previous[:12]} is not an ancestor of "
            f"{tip[:12]}): merge them into the box first, or fetch with force to overwrite",
            box=box,
            operation="fetch",
        )
    _git.git(
        repo.root, "update-ref", "-m", f"agentbox: fetched from box {box}", ref, tip, *([previous] if previous else [])
    )
    return _report(repo, entry, tip, previous, new_commits, changed=True)


# In the box, as its user, in one exec: the branch's tip (first line), then what came of the
# commits the host lacks (second line): "none", "file" (a bundle at BUNDLE_PATH, copied out
# streaming) or "inline" (a small bundle, following on stdout: no copy-out, no clean-up exec).
# The bundle leaves out what the host has: the base the box started from and the host's copy of
# the branch when the box has that commit, so a push after others carries only its own new
# commits. Arguments: path ref base have bundle-path inline-limit.
_TIP_AND_BUNDLE = r"""
cd "$1" || exit 3
tip=$(git rev-parse --verify -q "$2^{commit}") || exit 3
echo "$tip"
[ "$tip" = "$4" ] && { echo none; exit 0; }
have=$4 out=$5 limit=$6
set -- "$2" "^$3"
if [ -n "$have" ] && git cat-file -e "$have^{commit}" 2>/dev/null; then set -- "$@" "^$have"; fi
[ -z "$(git rev-list -1 "$@")" ] && { echo none; exit 0; }
git bundle create -q "$out" "$@" || exit 4
if [ "$(wc -c < "$out")" -le "$limit" ]; then echo inline; cat "$out"; rm -f "$out"; else echo file; fi
"""
INLINE_BUNDLE_LIMIT = 4 * 1024 * 1024
# The tip and the "inline" line before the bundle, and git's stderr: what the host reads past the limit.
INLINE_OVERHEAD = 64 * 1024


def _bring_tip(provider: Provider, box: str, repo_root: str, path: str, ref: str, base: str, have: str) -> str:
    """The tip of the box's `ref`, its new commits fetched into the host repo (no host ref moves)."""
    # Inline only where exec's output is the engine's own byte stream (the local engine); remote
    # channels keep the streamed copy-out.
    limit = INLINE_BUNDLE_LIMIT if provider.shares_host_filesystem else 0
    # The script keeps to the limit, but the box can replace what it runs (root is one sudo away):
    # the host reads no more than the limit itself.
    try:
        run = provider.exec(
            box,
            ["sh", "-c", _TIP_AND_BUNDLE, "tip", path, ref, base, have, BUNDLE_PATH, str(limit)],
            user=BOX_USER,
            limit=limit + INLINE_OVERHEAD,
            what=f"answer to the fetch of {ref.removeprefix('refs/heads/')}",
        )
    except OutputTooLarge as exc:
        raise ProviderError(
            f"the box answered the fetch of {ref.removeprefix('refs/heads/')} with more than {limit + INLINE_OVERHEAD} "
            f"bytes (an inline bundle is at most {limit}): refused, nothing fetched ({exc})",
            box=box,
            operation="fetch",
        ) from exc
    if run.rc == 3:
        raise ProviderError(
            f"the box's repo at {path} has no branch {ref.removeprefix('refs/heads/')} any more",
            box=box,
            operation="fetch",
        )
    run.check(f"git bundle of {ref} in {path}", box)
    first, _sep, rest = run.stdout.partition(b"\n")
    how, _sep, inline = rest.partition(b"\n")
    tip = object_id(
        first.decode("utf-8", "replace").strip(), f"the tip of {ref.removeprefix('refs/heads/')} in the box", box
    )
    if how == b"inline" and len(inline) > limit:
        raise ProviderError(
            f"the box sent an inline bundle of {len(inline)} bytes (at most {limit} here): refused, nothing fetched",
            box=box,
            operation="fetch",
        )
    if how == b"file":
        _fetch_box_bundle(provider, box, repo_root, ref, base)
    elif how == b"inline":
        _fetch_box_bundle(provider, box, repo_root, ref, base, inline)
    elif not _host_has_commit(repo_root, tip):
        raise ProviderError(
            f"the box's tip {tip[:12]} is in neither the base nor {ref} on the host, and the box made no bundle of it",
            box=box,
            operation="fetch",
        )
    return tip


def _bring_tip_sent(bundles: BundleSource, box: str, repo_root: str, path: str, ref: str, base: str, have: str) -> str:
    """As _bring_tip, the bundle sent by the box: the same checks on what arrives (tip form, fetched
    by host git, hardened; no host ref moves here). The temporary file is removed whatever happens."""
    scratch = tempfile.mkdtemp(prefix="agentbox-fetch-")
    bundle = os.path.join(scratch, "box.bundle")
    try:
        told, sent = bundles(path, ref, base, have, bundle)
        tip = object_id(told, f"the tip of {ref.removeprefix('refs/heads/')} in the box", box)
        if sent:
            _fetch_bundle_file(repo_root, scratch, bundle, ref, base, box)
        elif tip != have and not _host_has_commit(repo_root, tip):
            raise ProviderError(
                f"the box's tip {tip[:12]} is in neither the base nor {ref} on the host, and the box sent no bundle of it",
                box=box,
                operation="fetch",
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return tip


def _report(repo: _git.Repo, entry: dict[str, Any], tip: str, previous: str, new: int, changed: bool) -> dict[str, Any]:
    return {
        "sub": repo.sub,
        "host_root": repo.root,
        "branch": entry["branch"],
        "commit": tip,
        "previous": previous or None,
        "new_commits": new,
        "changed": changed,
    }


def fetch_bundle(provider: Provider, box: str, repo_root: str, path: str, ref: str, base: str) -> None:
    """New commits: a bundle made in the box against the base the host has, fetched on the host
    (where index-pack re-hashes every object and git's object checks run; no host ref moves here)."""
    made = _box_git(provider, box, path, "bundle", "create", "-q", BUNDLE_PATH, ref, f"^{base}")
    made.check(f"git bundle of {ref} in {path}", box)
    _fetch_box_bundle(provider, box, repo_root, ref, base)


def _fetch_box_bundle(
    provider: Provider, box: str, repo_root: str, ref: str, base: str, inline: bytes | None = None
) -> None:
    """Fetch `ref` into the host repo from the bundle: `inline` (already read from the box), else
    BUNDLE_PATH copied out of the box, whose copy is then removed."""
    scratch = tempfile.mkdtemp(prefix="agentbox-fetch-")
    bundle = os.path.join(scratch, "box.bundle")
    try:
        if inline is None:
            _copy_out(provider, box, BUNDLE_PATH, bundle)
        else:
            with open(bundle, "wb") as handle:
                handle.write(inline)
        _fetch_bundle_file(repo_root, scratch, bundle, ref, base, box)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if inline is None:
            provider.exec(box, ["rm", "-f", BUNDLE_PATH], user=BOX_USER)


def _fetch_bundle_file(repo_root: str, scratch: str, bundle: str, ref: str, base: str, box: str) -> None:
    """Fetch `ref`'s objects from a bundle file the box made (no host ref moves; the caller checks
    and moves it)."""
    # git may run as the repo's owner (see _git): let it read the bundle.
    os.chmod(scratch, 0o755)
    os.chmod(bundle, 0o644)
    # fetch checks the bundle's prerequisites itself; verify runs only to say why it failed. And every
    # object the box made passes git's object checks first (a refusal raises, naming them).
    try:
        fetched = _git.fetch_box_bundle(repo_root, bundle, ref)
    except _git.RefusedObjects as exc:
        raise ProviderError(str(exc), box=box, operation="fetch") from exc
    if fetched.returncode != 0:
        verify = _git.git(repo_root, "bundle", "verify", "-q", bundle, check=False)
        if verify.returncode != 0:
            raise ProviderError(
                f"the box's commits do not apply to {repo_root}: "
                f"{verify.stderr.decode('utf-8', 'replace').strip()[-500:]} (the base commit {base[:12]} the box "
                "started from is missing there)",
                box=box,
                operation="fetch",
            )
        detail = fetched.stderr.decode("utf-8", "replace").strip()
        raise _git.GitError(f"git fetch -q --no-tags in {repo_root} failed: {detail}")
