# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The trust boundary between a box and the host's .git (local engine).

A box never gets the host's .git itself, not even read-only: root in the box (vscode has
passwordless sudo, and boxes carry CAP_SYS_ADMIN for Docker-in-box) can `mount -o remount,rw`
any bind mount and write through it. Instead each host .git reaches the box as an overlay that
the engine mounts: the host's .git is the lower layer, which overlayfs never writes; every write
the box makes (objects, refs, its worktree's admin directory, but also a planted hook or config)
lands in an upper layer held in a Docker volume of that box. Remounting or unmounting it in the
box reaches nothing of the host: the lower directory is not in the box's mount namespace.

The host takes the box's work only through git's own transport: the box's branch is bundled in
the box and fetched on the host (`_ship.fetch_box_branch`), where index-pack re-hashes every
object, and only `refs/heads/agentbox/<box>` moves. That happens at stop, destroy, checkpoint
and on `agentbox_worktree state=fetched`.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from ._box_data import head_line
from ._provider import BoxFacts, Provider, ProviderError

BOX_UID = 1000


def layer_paths(common_dirs: list[str]) -> list[str]:
    """The .git directories that need a layer: one inside another (a submodule's
    .git/modules/<name>) is already covered by the outer one's."""
    unique = sorted({os.path.realpath(path) for path in common_dirs})
    return [path for path in unique if not any(path.startswith(outer + "/") for outer in unique if outer != path)]


# Run as root in the box, on the overlay (the box's own view), before git uses it. Arguments:
# the layer paths. The box user must be able to reach and write the .git whoever owns it on
# the host: its parents in the box (made by the engine, or the image's /root) get o+x, and its
# directories and small files become vscode's (the copy-up lands in the box's upper layer;
# objects, packs, LFS content and index files keep their owner: git never rewrites them in
# place). A submodule's core.worktree names a host path that the box does not have.
PREPARE_SCRIPT = r"""
for g in "$@"; do
  d=$(dirname "$g")
  while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done
  find "$g" \( -path '*/objects/??' -o -path '*/objects/pack' -o -path '*/lfs' \) -prune ! -user 1000 \
    -exec chown 1000:1000 {} + -o ! -name index ! -user 1000 -exec chown -h 1000:1000 {} +
  for c in "$g"/modules/*/config "$g"/modules/*/*/config "$g"/modules/*/*/*/config; do
    [ -f "$c" ] && git config --file "$c" --unset core.worktree 2>/dev/null
  done
done
true
"""


def prepare_command(paths: list[str]) -> str:
    """PREPARE_SCRIPT as one shell command line, for folding into another in-box script."""
    return "set -- " + " ".join(shlex.quote(path) for path in paths) + "\n" + PREPARE_SCRIPT


def has_layers(facts: BoxFacts) -> bool:
    """True for a box whose .git is an overlay (made since the layers exist): its commits reach
    the host only by import. Older boxes had the .git bind-mounted, so theirs are already there."""
    return facts.labels.get("git_layers") == "1"


def import_work(provider: Provider, facts: BoxFacts) -> dict[str, Any]:
    """Bring the box's branch into the host repositories (the box's own branch only, moved to
    wherever the box has it: the box may amend and rebase its branch). Needs a running box;
    nothing to do for a box without layers or without a seed record."""
    if not has_layers(facts) or facts.state != "running":
        return {"repos": [], "changed": False}
    from . import _seed, _ship

    if _seed.read_seed_record(provider, facts.name) is None:
        return {"repos": [], "changed": False}
    return _ship.fetch_box_branch(provider, facts, facts.workspace, force=True)


def send_objects(provider: Provider, box: str, host_root: str, git_dir: str, tips: list[str], base: str) -> None:
    """Write the objects `tips` reach past `base` (made on the host after the box's view of `git_dir`
    was taken: a stash captured later) into the box's own layer of that .git."""
    wanted = "".join(f"{tip}\n" for tip in tips) + (f"^{base}\n" if base else "")
    from . import _git

    pack = _git.git(host_root, "pack-objects", "--stdout", "--revs", "-q", input_bytes=wanted.encode()).stdout
    provider.exec(box, ["git", f"--git-dir={git_dir}", "index-pack", "--stdin"], stdin=pack).check(
        "writing the host's new objects into the box", box)


def box_heads(provider: Provider, facts: BoxFacts, records: list[dict[str, str]]) -> list[dict[str, str]]:
    """[{sub, git_dir, path, branch, commit}] of the box's worktrees, every commit brought into
    the host first (a checkpoint names them). A box that is not running cannot have moved since
    it was stopped, which imported its branch: the host's branch is its state."""
    from . import _git, _ship

    host_roots = {record["sub"]: os.path.join(facts.workspace, record["sub"]) for record in records}
    heads = []
    if facts.state != "running":
        for record in records:
            tip = _git.git(host_roots[record["sub"]], "rev-parse", "--verify", "-q", f"refs/heads/{facts.branch}")
            heads.append({**_head_keys(record), "branch": facts.branch, "commit": tip.stdout.decode().strip()})
        return heads
    import_work(provider, facts)
    script = 'for p in "$@"; do git -C "$p" rev-parse --verify -q "HEAD^{commit}" || echo -; ' \
        'git -C "$p" symbolic-ref -q --short HEAD || echo -; done'
    run = provider.exec(facts.name, ["sh", "-c", script, "heads", *[record["path"] for record in records]],
                        limit=(len(records) + 1) * 64 * 1024, what="heads of its worktrees")
    lines = run.text.split("\n")
    for position, record in enumerate(records):
        commit, branch = ([*lines[2 * position:2 * position + 2], "-", "-"])[:2]
        if commit == "-":
            raise ProviderError(f"the box's worktree {record['path']} has no commit checked out", box=facts.name)
        commit, branch = head_line(commit, branch, f"the box's worktree {record['path']}", facts.name)
        root = host_roots[record["sub"]]
        if _git.git(root, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
            # Checked out off the box's branch: bring that commit too, against the box's base.
            _ship.fetch_bundle(provider, facts.name, root, record["path"], "HEAD", _base_of(provider, facts, record["sub"]))
        heads.append({**_head_keys(record), "branch": branch, "commit": commit})
    return heads


def _head_keys(record: dict[str, str]) -> dict[str, str]:
    return {"sub": record.get("sub", ""), "git_dir": record["git_dir"], "path": record["path"]}


def _base_of(provider: Provider, facts: BoxFacts, sub: str) -> str:
    from . import _seed

    record = _seed.read_seed_record(provider, facts.name) or {}
    for entry in record.get("worktrees", []):
        if entry.get("sub") == sub:
            return str(entry.get("base", ""))
    raise ProviderError(f"the box's seed record names no base commit for {sub or 'the workspace'}", box=facts.name)


def refresh_view(provider: Provider, facts: BoxFacts) -> int:
    """Bring the host's base branch and the box's own (local and remote-tracking) into the box's view of the .git.

    The lower layer is the host's .git, but overlayfs keeps what it has looked up: an objects/XX
    directory or pack the box looked for and missed stays missing there after the host makes it
    (a restart shows it), while a directory it already knew shows the new names. So the box's
    view of new host objects is partial, and a box-side `git fetch` of them would trust it (its
    connectivity check finds the commit and tree, never reads a blob, and skips the pack). Every
    object the host's refs reach past the box's base is therefore written into the box's own
    upper layer: a thin pack made on the host is streamed into `git index-pack --fix-thin` in the
    box (the base's objects, there at start, complete it), then one `git update-ref --stdin` sets
    the refs (the box's own agentbox/ branches are left alone). The number of refs set."""
    import shutil
    import tempfile

    from . import _git

    base = facts.labels.get("base_commit", "")
    if not has_layers(facts) or facts.state != "running" or not base:
        return 0
    from . import _git_view

    # Only the box's base branch and its own, as they are on the host and its remotes: never other
    # boxes' branches or the host's other branches and tags.
    base_branch = _git_view.checked_out_branch(_git_view.view_path(facts.name, facts.id, 0))
    names = {name for name in (base_branch, facts.branch) if name}
    listed = _git.git_out(facts.workspace, "for-each-ref", "--format=%(objectname) %(refname) %(symref)",
                          "refs/heads/", "refs/remotes/")
    # A symbolic ref (refs/remotes/origin/HEAD) follows its target, which is set itself.
    refs = {fields[1]: fields[0] for fields in (line.split() for line in listed.splitlines())
            if len(fields) == 2 and _names_one_of(fields[1], names)}
    if not refs:
        return 0
    scratch = tempfile.mkdtemp(prefix="agentbox-view-")
    try:
        identity = _git.owner_identity(facts.workspace)
        if identity:
            os.chown(scratch, identity[0], identity[1])
        bundle = os.path.join(scratch, "view.bundle")
        wanted = "".join(f"{ref}\n" for ref in refs) + f"^{base}\n"  # on stdin: any number of refs
        made = _git.git(facts.workspace, "bundle", "create", "-q", bundle, "--stdin", input_bytes=wanted.encode(),
                        check=False)
        if made.returncode == 0 and os.path.exists(bundle):  # else every ref is at or behind the base
            with open(bundle, "rb") as stream:
                while stream.readline() not in (b"\n", b""):  # the bundle's header; the pack follows
                    pass
                provider.exec(facts.name, ["git", "-C", "/workspace", "index-pack", "--fix-thin", "--stdin"],
                              stdin=stream).check("writing the host's new objects into the box", facts.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    updates = "".join(f"update {ref} {oid}\n" for ref, oid in refs.items())
    provider.exec(facts.name, ["git", "-C", "/workspace", "update-ref", "-m", "agentbox: the host's refs",
                               "--stdin"], stdin=updates.encode()).check("setting the host's refs in the box", facts.name)
    return len(refs)


def _names_one_of(ref: str, branches: set[str]) -> bool:
    """refs/heads/<b> (not the box's own: the box moves that) or refs/remotes/<remote>/<b>, for a b of `branches`."""
    if ref.startswith("refs/heads/"):
        return ref.removeprefix("refs/heads/") in branches and not ref.startswith("refs/heads/agentbox/")
    remote_branch = ref.removeprefix("refs/remotes/").partition("/")[2]
    return ref.startswith("refs/remotes/") and remote_branch in branches


def branch_reserved_for(workspace: str, facts: BoxFacts) -> bool:
    """Whether the repository at `workspace` is where this box's branch was reserved (the branch's
    reflog names the box's id): how destroy knows a moved workspace, the box's worktree being
    registered in its git layer rather than in the host repository."""
    from . import _git

    if not (facts.branch and facts.id and has_layers(facts)):
        return False
    log = _git.git(workspace, "reflog", "show", "--format=%gs", f"refs/heads/{facts.branch}", "--", check=False)
    return log.returncode == 0 and f" id {facts.id}" in log.stdout.decode("utf-8", "replace")
