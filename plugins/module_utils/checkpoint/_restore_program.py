# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The in-box half of a checkpoint restore, run in the box as `python3 -c <this file's source>`.

stdin is the JSON request built by _restore.restore_workspace, stdout's last line the JSON answer.
It runs as the repository's owner against the box's view of the host .git (its git layer), with the
box's own python3 and the standard library only: nothing here imports the collection. The host reads
this source with inspect.getsource, which works from Ansiballz's zip too (the loader's get_source).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

CARRY_REF = "refs/agentbox/carry-over"  # _ship.CARRY_REF: the host state a shipped box was seeded with
GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "rerere.enabled=false",
       "-c", "merge.conflictStyle=merge", "-c", "core.autocrlf=false"]


class Failure(Exception):
    pass


def git(cwd: str, *args: str, check: bool = True, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(GIT + list(args), cwd=cwd, input=data, capture_output=True, check=False)
    if check and done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()
        raise Failure(f"git {' '.join(args[:3])} failed in {cwd}: {detail}")
    return done


def text(cwd: str, *args: str) -> str:
    return git(cwd, *args).stdout.decode().strip()


def ancestor(cwd: str, older: str, newer: str) -> bool:
    return git(cwd, "merge-base", "--is-ancestor", older, newer, check=False).returncode == 0


def register(job: dict[str, Any], home: str, box: str) -> str:
    physical = os.path.realpath(job["old_path"])
    if not os.path.isdir(physical):
        raise Failure(f"the checkpoint image has no worktree at {job['old_path']}")
    holder = tempfile.mkdtemp(prefix=".restore-", dir=home)
    # Named after the new path: git names the admin directory .git/worktrees/<this name>.
    scratch = os.path.join(holder, os.path.basename(job["new_path"]))
    try:
        git("/", "--git-dir=" + job["common_dir"], "worktree", "add", "-q", "--no-checkout", "--lock",
            "--reason", "agentbox box " + box, scratch, job["branch"])
        try:
            with open(os.path.join(scratch, ".git")) as handle:
                gitfile = handle.read()
            admin = gitfile.split("gitdir:", 1)[1].strip()
            # The registration names the new box's path, so the host sees (and later removes) it by that path.
            with open(os.path.join(admin, "gitdir"), "w") as handle:
                handle.write(job["new_path"] + "/.git\n")
            target = os.path.join(physical, ".git")
            if os.path.isdir(target) and not os.path.islink(target):
                raise Failure(f"{target} holds a repository, not a worktree: cannot restore it")
            staged = target + ".agentbox-new"
            with open(staged, "w") as handle:
                handle.write(gitfile)
            os.replace(staged, target)
        except BaseException:
            git("/", "--git-dir=" + job["common_dir"], "worktree", "remove", "-f", "-f", scratch, check=False)
            raise
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    if not os.path.lexists(job["new_path"]):
        os.makedirs(os.path.dirname(job["new_path"]), exist_ok=True)
        os.symlink(physical, job["new_path"])
    elif os.path.realpath(job["new_path"]) != physical:
        raise Failure(f"{job['new_path']} exists in the checkpoint and is not its worktree")
    return physical


def unmerged(cwd: str) -> dict[str, set[int]]:
    stages = {}
    raw = git(cwd, "ls-files", "-u", "-z").stdout.split(b"\0")
    for entry in raw:
        if not entry:
            continue
        meta, path = entry.split(b"\t", 1)
        stages.setdefault(path.decode("utf-8", "surrogateescape"), set()).add(int(meta.split()[2]))
    return stages


def blob(cwd: str, spec: str) -> bytes | None:
    done = git(cwd, "cat-file", "blob", spec, check=False)
    return done.stdout if done.returncode == 0 else None


def write_file(full: str, data: bytes, executable: bool = False, link: bool = False) -> None:
    os.makedirs(os.path.dirname(full), exist_ok=True)
    if os.path.lexists(full) and (os.path.islink(full) or not os.path.isdir(full)):
        os.unlink(full)
    if link:
        os.symlink(data.decode("utf-8", "surrogateescape"), full)
        return
    with open(full, "wb") as handle:
        handle.write(data)
    os.chmod(full, 0o755 if executable else 0o644)


def current(full: str) -> bytes | None:
    if os.path.islink(full):
        return os.readlink(full).encode("utf-8", "surrogateescape")
    if os.path.isfile(full):
        with open(full, "rb") as handle:
            return handle.read()
    return None


def merge_file(cwd: str, ours: bytes, base: bytes, theirs: bytes, favor: str) -> tuple[bytes | None, bool]:
    """3-way merge of one file's contents; (result, conflicted) or (None, True) for binary ones."""
    holder = tempfile.mkdtemp(prefix=".agentbox-merge-")
    try:
        names = []
        for label, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            name = os.path.join(holder, label)
            with open(name, "wb") as handle:
                handle.write(data)
            names.append(name)
        done = git(cwd, "merge-file", "-p", "--" + favor, *names, check=False)
        if done.returncode < 0 or done.returncode > 127:
            return None, True
        conflicted = git(cwd, "merge-file", "-p", *names, check=False).returncode != 0
        return done.stdout, conflicted
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def resolve_for_box(cwd: str, box_stage: int, other_stage: int, kind: str, conflicts: list[dict[str, str]]) -> None:
    """Resolve every unmerged path so the box's side wins, keeping the other side's clean hunks."""
    for path, stages in sorted(unmerged(cwd).items()):
        full = os.path.join(cwd, path)
        if box_stage in stages and 1 in stages and other_stage in stages:
            ours = blob(cwd, f":{box_stage}:{path}")
            theirs = blob(cwd, f":{other_stage}:{path}")
            merged, _conflicted = merge_file(cwd, ours, blob(cwd, ":1:" + path), theirs, "ours")
            write_file(full, merged if merged is not None else ours, os.access(full, os.X_OK))
        elif box_stage in stages:
            data = blob(cwd, f":{box_stage}:{path}")
            write_file(full, data, os.access(full, os.X_OK) if os.path.exists(full) else False)
        elif os.path.lexists(full):
            os.unlink(full)
        conflicts.append({"path": path, "kind": kind, "kept": "box", "detail": "changed on both sides"})
        if os.path.lexists(full):
            git(cwd, "add", "--", path)
        else:
            git(cwd, "rm", "-q", "--cached", "--ignore-unmatch", "--", path)


def merge_host(job: dict[str, Any], cwd: str, home: str, conflicts: list[dict[str, str]]) -> str:
    commit, head = job["commit"], job["host_head"]
    if ancestor(cwd, head, commit):
        return "up-to-date"
    added = [p for p in git(cwd, "diff", "--name-only", "--no-renames", "-z", "--diff-filter=A", commit, head)
             .stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    holder = tempfile.mkdtemp(prefix=".restore-aside-", dir=home)
    aside = {}
    try:
        for number, path in enumerate(added):
            full = os.path.join(cwd, path)
            if os.path.lexists(full):
                shutil.move(full, os.path.join(holder, str(number)))
                aside[path] = os.path.join(holder, str(number))
        if ancestor(cwd, commit, head):
            git(cwd, "merge", "-q", "--ff-only", head)
            kind = "fast-forward"
        else:
            probe = git(cwd, "merge-tree", "--write-tree", "--name-only", "--no-messages", commit, head, check=False)
            expected = []
            if probe.returncode == 1:
                expected = [line for line in probe.stdout.decode().splitlines()[1:] if line]
            message = f"Merge the host's HEAD into {job['branch']} (box restored from checkpoint {job['checkpoint']})"
            done = git(cwd, "merge", "-q", "--no-edit", "-X", "ours", "-m", message, head, check=False)
            if done.returncode != 0:
                if not unmerged(cwd):
                    raise Failure("merging the host's HEAD failed: " + done.stderr.decode(errors="replace").strip())
                resolve_for_box(cwd, 2, 3, "merge", conflicts)
                git(cwd, "commit", "-q", "--no-edit")
            listed = {c["path"] for c in conflicts}
            for path in expected:
                if path not in listed:
                    conflicts.append({"path": path, "kind": "merge", "kept": "box",
                                      "detail": "changed on both sides; the box's hunks kept, the host's others merged"})
            kind = "merged"
        for path, held in aside.items():
            full = os.path.join(cwd, path)
            if os.path.lexists(full):
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)
                else:
                    os.unlink(full)
            shutil.move(held, full)
            conflicts.append({"path": path, "kind": "merge", "kept": "box",
                              "detail": "untracked or ignored in the box, committed on the host"})
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    return kind


def tree_entry(cwd: str, commit: str, path: str) -> tuple[str | None, bytes | None]:
    out = git(cwd, "ls-tree", "-z", commit, "--", path).stdout.split(b"\0")[0]
    if not out:
        return None, None
    mode = out.split(b" ", 1)[0].decode()
    return mode, blob(cwd, f"{commit}:{path}")


def changed_paths(cwd: str, older: str, newer: str) -> list[str]:
    raw = git(cwd, "diff", "--name-only", "--no-renames", "-z", older, newer).stdout.decode("utf-8", "surrogateescape")
    return [p for p in raw.split("\0") if p]


def overlay_host(job: dict[str, Any], cwd: str, conflicts: list[dict[str, str]]) -> None:
    """The host's uncommitted tracked changes, file by file; where the box changed a file too, it wins.

    A shipped box keeps the host state it was seeded with (job["seeded"]): a file the box still holds
    exactly as seeded is the host's old work, not the box's, so the host's version now replaces it
    (else an edit the host made since, or a revert, would lose to its own older version)."""
    head = job["host_head"]
    stash = job["host_stash"] or head
    seeded = job.get("seeded") or ""
    paths = changed_paths(cwd, head, stash) if job["host_stash"] else []
    seeded_paths = set(changed_paths(cwd, seeded + "^1", seeded)) if seeded else set()
    paths += sorted(seeded_paths.difference(paths))
    for path in paths:
        full = os.path.join(cwd, path)
        base_mode, base = tree_entry(cwd, head, path)
        other_mode, other = tree_entry(cwd, stash, path)
        if "160000" in (base_mode, other_mode):
            continue
        blocked = any(os.path.lexists(os.path.join(cwd, *path.split("/")[:i])) and
                      not os.path.isdir(os.path.join(cwd, *path.split("/")[:i]))
                      for i in range(1, path.count("/") + 1))
        mine = None if blocked else current(full)

        def keep(detail: str, path: str = path) -> None:
            conflicts.append({"path": path, "kind": "host-changes", "kept": "box", "detail": detail})
        if blocked:
            keep("a parent of this path is a file in the box")
        elif path in seeded_paths and mine == tree_entry(cwd, seeded, path)[1]:
            if other is None:
                if mine is not None:
                    os.unlink(full)
            elif mine != other or base_mode != other_mode:
                write_file(full, other, other_mode == "100755", other_mode == "120000")
        elif other is None:
            if mine is None:
                continue
            if mine == base:
                os.unlink(full)
            else:
                keep("deleted on the host, changed in the box")
        elif base is None:
            if mine is None:
                write_file(full, other, other_mode == "100755", other_mode == "120000")
            elif mine != other:
                keep("added on the host and, differently, in the box")
        elif mine is None:
            keep("changed on the host, deleted in the box")
        elif mine == base or mine == other:
            if mine != other or (base_mode != other_mode):
                write_file(full, other, other_mode == "100755", other_mode == "120000")
        elif "120000" in (base_mode, other_mode):
            keep("symbolic link changed on both sides")
        else:
            merged, conflicted = merge_file(cwd, mine, base, other, "ours")
            if merged is None:
                keep("binary file changed on both sides")
            else:
                write_file(full, merged, os.access(full, os.X_OK))
                if conflicted:
                    keep("changed on both sides; the box's hunks kept, the host's others applied")


def stage_host_index(job: dict[str, Any], cwd: str, conflicts: list[dict[str, str]]) -> None:
    """Stage again what the host had staged (the stash's second parent is its index), partial
    staging included, for each path the box kept nothing of its own and whose committed version in
    the box is the host's: there staging means what it meant on the host. Four git calls, however
    many paths."""
    index = job["host_stash"] + "^2"
    if git(cwd, "rev-parse", "-q", "--verify", index, check=False).returncode != 0:
        return
    # --raw -z: ":<old mode> <new mode> <old oid> <new oid> <status>" NUL <path> NUL, per staged path;
    # a path the host deleted from its index has mode 000000, which --index-info takes as removal.
    staged = git(cwd, "diff", "--raw", "-z", "--no-renames", "--no-abbrev", job["host_head"], index).stdout
    fields = staged.split(b"\0")
    moved = set(git(cwd, "diff", "--name-only", "-z", "--no-renames", job["host_head"], "HEAD").stdout.split(b"\0"))
    kept = {conflict["path"].encode("utf-8", "surrogateescape") for conflict in conflicts}
    entries = []
    for meta, path in zip(fields[0:-1:2], fields[1::2]):  # noqa: B905  (the box's python3 may predate 3.10)
        _old_mode, mode, _old_oid, oid, _status = meta.decode().lstrip(":").split(" ")
        if path not in kept and path not in moved and mode != "160000":
            entries.append(b"%s %s\t%s\0" % (mode.encode(), oid.encode(), path))
    if entries:
        git(cwd, "update-index", "-z", "--index-info", data=b"".join(entries))


def object_format(cwd: str) -> str:
    """The repository's hash ('sha1' unless extensions.objectFormat says otherwise), read by the box's git."""
    configured = git(cwd, "config", "--get", "extensions.objectFormat", check=False).stdout.decode().strip()
    return configured.lower() or "sha1"


def blob_ids(cwd: str, paths: list[str], hash_name: str) -> list[str]:
    """git's blob id of each path as it stands, raw bytes (as `hash-object --no-filters`), a symlink by its
    target text as git stores it. Not `hash-object --stdin-paths`: it follows links (a dangling one fails)
    and splits a name holding a newline. `hash_name`: the repository's object_format (each side asks its
    own git: the host through its hardened wrapper)."""
    ids = []
    for path in paths:
        full = os.path.join(cwd, path)
        digest = hashlib.new(hash_name)
        if os.path.islink(full):
            target = os.fsencode(os.readlink(full))
            digest.update(b"blob %d\0" % len(target) + target)
        else:
            digest.update(b"blob %d\0" % os.path.getsize(full))
            with open(full, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        ids.append(digest.hexdigest())
    return ids


def untracked_report(job: dict[str, Any], cwd: str) -> tuple[dict[str, str], list[str]]:
    existing, blocked = [], []
    for path in job["untracked"]:
        parts = path.split("/")
        if any(os.path.lexists(os.path.join(cwd, *parts[:i])) and not os.path.isdir(os.path.join(cwd, *parts[:i]))
               for i in range(1, len(parts))):
            blocked.append(path)
        elif os.path.lexists(os.path.join(cwd, path)):
            existing.append(path)
    hashes = {}
    if existing:
        hashes = dict(zip(existing, blob_ids(cwd, existing, object_format(cwd))))  # noqa: B905  (as above)
    return hashes, blocked


def adopt_clone(job: dict[str, Any]) -> str:
    """Remote engines: the repo is a clone in the box; fetch the shipped host state, switch branch."""
    cwd = os.path.realpath(job["path"])
    if not os.path.isdir(os.path.join(cwd, ".git")):
        raise Failure(f"the checkpoint has no git clone at {job['path']}")
    refspecs = ["+refs/heads/agentbox-restore/host-head:refs/agentbox/restore/host-head"]
    if job["with_stash"]:
        refspecs.append("+refs/agentbox/carry-over:refs/agentbox/restore/carry-over")
    # The host state the source box was seeded with (none when the host was clean then).
    seeded = git(cwd, "rev-parse", "-q", "--verify", CARRY_REF + "^{commit}", check=False)
    job["seeded"] = seeded.stdout.decode().strip() if seeded.returncode == 0 else ""
    git(cwd, "fetch", "-q", "--no-tags", "--update-shallow", job["source"], *refspecs)
    job["commit"] = text(cwd, "rev-parse", "HEAD")
    job["host_head"] = text(cwd, "rev-parse", "refs/agentbox/restore/host-head")
    job["host_stash"] = text(cwd, "rev-parse", "refs/agentbox/restore/carry-over") if job["with_stash"] else ""
    # A new branch at the checkpoint's commit; the working tree (warm state included) stays as it is.
    git(cwd, "checkout", "-q", "-B", job["branch"])
    return cwd


def forget_clone_refs(job: dict[str, Any], cwd: str) -> None:
    # This box was seeded with the host's state now: a checkpoint of it tells its own edits from that.
    if job["host_stash"]:
        git(cwd, "update-ref", CARRY_REF, job["host_stash"])
    else:
        git(cwd, "update-ref", "-d", CARRY_REF, check=False)
    for ref in ("refs/agentbox/restore/host-head", "refs/agentbox/restore/carry-over"):
        git(cwd, "update-ref", "-d", ref, check=False)
    shutil.rmtree(job["source"], ignore_errors=True)


def restore(job: dict[str, Any], home: str, box: str, checkpoint: str) -> dict[str, Any]:
    job["checkpoint"] = checkpoint
    clock = [time.monotonic()]
    seconds = {}

    def lap(name: str) -> None:
        now = time.monotonic()
        seconds[name] = round(now - clock[0], 3)
        clock[0] = now

    clone = job.get("mode") == "clone"
    if clone:
        home = tempfile.gettempdir()  # a shipped box has no worktrees home
    physical = adopt_clone(job) if clone else register(job, home, box)
    lap("register")
    cwd = physical
    conflicts = []
    if not clone:
        git(cwd, "update-ref", "refs/heads/" + job["branch"], job["commit"])
    git(cwd, "read-tree", job["commit"])
    # `stash create` exits 1 on a clean tree (git 2.39); its output is what matters.
    made = git(cwd, "stash", "create", "agentbox: the checkpoint's uncommitted changes", check=False)
    changes = made.stdout.decode().strip()
    if made.returncode != 0 and (changes or made.stderr.strip()):
        raise Failure(f"git stash create failed in {cwd}: {made.stderr.decode(errors='replace').strip()}")
    needs_merge = not ancestor(cwd, job["host_head"], job["commit"])
    lap("checkpoint_state")
    if changes and needs_merge:
        git(cwd, "reset", "-q", "--hard", job["commit"])
    merge = merge_host(job, cwd, home, conflicts)
    lap("merge")
    if changes and needs_merge:
        done = git(cwd, "stash", "apply", "-q", changes, check=False)
        if done.returncode != 0:
            if not unmerged(cwd):
                raise Failure("re-applying the checkpoint's own changes failed: " + done.stderr.decode(errors="replace"))
            resolve_for_box(cwd, 3, 2, "checkpoint-changes", conflicts)
        git(cwd, "reset", "-q")
    lap("checkpoint_changes")
    if job["host_stash"] or job.get("seeded"):
        overlay_host(job, cwd, conflicts)
    if job["host_stash"]:
        stage_host_index(job, cwd, conflicts)
    existing, blocked = untracked_report(job, cwd)
    if clone:
        forget_clone_refs(job, cwd)
    lap("host_changes")
    return {
        "sub": job["sub"],
        "physical": physical,
        "merge": merge,
        "merge_commit": text(cwd, "rev-parse", "HEAD") if merge == "merged" else "",
        "head": text(cwd, "rev-parse", "HEAD"),
        "conflicts": conflicts,
        "untracked_existing": existing,
        "untracked_blocked": blocked,
        "seconds": seconds,
    }


def main() -> None:
    request = json.load(sys.stdin)
    jobs = sorted(request["jobs"], key=lambda j: j["sub"])  # the root worktree first: nested ones live in it
    answers = []
    try:
        for job in jobs:
            answers.append(restore(job, request["worktrees_home"], request["box"], request["checkpoint"]))
    except Failure as exc:
        sys.stderr.write(str(exc) + "\n")
        raise SystemExit(1) from None
    sys.stdout.write(json.dumps({"worktrees": answers}) + "\n")


if __name__ == "__main__":
    main()
