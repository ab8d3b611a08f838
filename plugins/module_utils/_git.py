# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host-side git: read a workspace without ever changing its working tree, index or stash list.

Every call runs with a private copy of the index (GIT_INDEX_FILE) where git would otherwise
refresh the real one (`stash create` and `status` both do), and with GIT_OPTIONAL_LOCKS=0.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from ._journal import pause_point
from ._naming import box_branch
from ._secret_files import HEAD_BYTES, named_like_secret

INDEX_COPY_PREFIX = "agentbox-index-"


class GitError(RuntimeError):
    pass


# Settings that win over anything the repository's own config says (command-line -c beats repo
# config, and children such as upload-pack inherit them): none of them is something a user needs
# for what the collection does on the host. Program-running settings a user may rightly hold in
# their global config (credential helpers, core.sshCommand for the relay's push) are handled per
# repository instead (_local_overrides): only a value the repository's own config sets is replaced.
HARDENED_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "core.editor=true",
    "sequence.editor=true",
    "diff.external=",
    "gc.auto=0",
    "maintenance.auto=false",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "protocol.ext.allow=never",
)
# Environment for every host git call: no pager, no editor, no prompt, and no optional locks
# (reads must not rewrite the index). GIT_CONFIG_NOSYSTEM is added except for the commands that
# may talk to a remote for the relay (push, fetch, pull, ls-remote): a system-wide credential
# helper is the administrator's, and those need it.
HARDENED_ENV = {
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": "true",
    "GIT_SEQUENCE_EDITOR": "true",
    "LC_ALL": "C",
}
NETWORK_COMMANDS = frozenset({"push", "fetch", "pull", "ls-remote"})
# Keys that make git run a program (or pick one), matched on git's canonical key names.
_PROGRAM_KEYS = re.compile(
    r"^(core\.(sshcommand|askpass|gitproxy|alternaterefscommand|worktree)|credential\.(.+\.)?helper"
    r"|diff\..+\.(command|textconv)|merge\..+\.driver|filter\..+\.(clean|smudge|process)"
    r"|gpg\.(.+\.)?program|remote\..+\.(uploadpack|receivepack|vcs)|pager\..+|interactive\.difffilter"
    r"|uploadpack\.packobjectshook|ssh\.variant)$",
    re.IGNORECASE,
)
_NEUTRAL = {"core.sshcommand": "ssh", "core.worktree": ".."}
_override_cache: dict[str, list[str]] = {}


def _local_overrides(repo: str, env: dict[str, str], identity: tuple[int, int, str] | None) -> list[str]:
    """`-c` settings that undo every program-running key the repository's own config (local or
    worktree scope, includes followed) sets: back to the user's global or system value when there
    is one, else neutral (empty: no filter, no helper, no driver). Reading config runs nothing."""
    cached = _override_cache.get(repo)
    if cached is not None:
        return cached
    probe = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", repo, "config", "--show-scope", "-z", "--list", "--includes"],
        env={key: value for key, value in env.items() if key != "GIT_CONFIG_NOSYSTEM"},
        capture_output=True,
        check=False,
        user=identity[0] if identity else None,
        group=identity[1] if identity else None,
    )
    fields = probe.stdout.decode("utf-8", "surrogateescape").split("\0")
    planted: list[str] = []
    trusted: dict[str, list[str]] = {}
    for scope, entry in zip(fields[0::2], fields[1::2], strict=False):
        key, _sep, value = entry.partition("\n")
        if not _PROGRAM_KEYS.match(key):
            continue
        if scope in ("local", "worktree"):
            if key not in planted:
                planted.append(key)
        elif scope in ("global", "system"):
            trusted.setdefault(key, []).append(value)
    overrides: list[str] = []
    for key in planted:
        if key.lower() == "core.worktree":
            continue  # a submodule's own: where its working tree is, not a program
        # An empty value resets a list (credential helpers) and turns a filter or driver off.
        overrides += ["-c", f"{key}={_NEUTRAL.get(key.lower(), '')}"]
        overrides += [part for value in trusted.get(key, []) for part in ("-c", f"{key}={value}")]
        if key.lower().startswith("filter.") and not trusted.get(key):
            # A required filter that does not run is an error: say it is not required.
            overrides += ["-c", f"{key.rpartition('.')[0]}.required=false"]
    _override_cache[repo] = overrides
    return overrides


def git(
    repo: str,
    *args: str,
    env: dict[str, str] | None = None,
    check: bool = True,
    input_bytes: bytes | None = None,
    stdin: IO[bytes] | None = None,
) -> subprocess.CompletedProcess:
    """Run host git in `repo`: the one place every host git call of the collection goes through.

    It runs as the repository's owner (never root on someone else's repository) with settings
    no repository config can override (HARDENED_CONFIG, HARDENED_ENV, _local_overrides).
    """
    full_env = {**os.environ, **HARDENED_ENV, **(env or {})}
    command = next((arg for arg in args if not arg.startswith("-")), "")
    if command not in NETWORK_COMMANDS:
        full_env["GIT_CONFIG_NOSYSTEM"] = "1"
    identity = owner_identity(repo)
    if identity:
        full_env["HOME"] = identity[2]
    hardened = [part for setting in HARDENED_CONFIG for part in ("-c", setting)]
    try:
        overrides = _local_overrides(repo, full_env, identity)
        # safe.directory: root acting as the owner may still meet a root-owned .git inside a
        # user's tree; git is already the owner, and the settings above cover what it guards.
        argv = ["git", "-c", "safe.directory=*", *hardened, *overrides, "-C", repo, *args]
        result = subprocess.run(
            argv,
            env=full_env,
            input=input_bytes,
            stdin=stdin,
            capture_output=True,
            check=False,
            user=identity[0] if identity else None,
            group=identity[1] if identity else None,
        )
    except FileNotFoundError as exc:
        raise GitError("git is not installed on the controller: install it (apt-get install git)") from exc
    if check and result.returncode != 0:
        detail = result.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git {' '.join(args[:3])} in {repo} failed: {detail}")
    return result


# git's object checks (fsck's rules: a tree entry named .git in any case, `..` or `/` in a name, a
# malformed commit or tree...) on what a fetch brings in. What a box made is fetched only with them.
FSCK_FETCH = ("-c", "transfer.fsckObjects=true", "-c", "fetch.fsckObjects=true")
MAX_BUNDLE_HEADER = 1 << 20


class RefusedObjects(GitError):
    """A bundle holds objects git's checks refuse: nothing of it entered the repository."""


def fetch_box_bundle(repo_root: str, bundle: str, ref: str) -> subprocess.CompletedProcess:
    """`git fetch` of `ref` from a bundle a box made, with git's object checks on: no ref moves, and
    nothing enters the object store unless every object passes. A fetch from a bundle skips
    fetch.fsckObjects in git before 2.46 (its unbundle runs index-pack without --strict), so the
    bundle's pack is first indexed with --strict into a quarantine (the repository's objects as an
    alternate); then the fetch, with the checks asked for too. Raises RefusedObjects naming git's
    complaint; returns the fetch's result otherwise (the caller reads its exit code)."""
    scratch = tempfile.mkdtemp(prefix="agentbox-quarantine-")
    try:
        quarantine = os.path.join(scratch, "objects")
        os.makedirs(os.path.join(quarantine, "pack"))
        identity = owner_identity(repo_root)
        if identity:  # git runs as the repository's owner: it writes the quarantine
            for path in (scratch, quarantine, os.path.join(quarantine, "pack")):
                os.chown(path, identity[0], identity[1])
        objects = git_out(repo_root, "rev-parse", "--git-path", "objects")
        objects = objects if os.path.isabs(objects) else os.path.join(repo_root, objects)
        # Unbuffered: the descriptor's offset is where the header ends, for the child that reads the pack.
        with open(bundle, "rb", buffering=0) as handle:
            if not _skip_bundle_header(handle):
                raise RefusedObjects(
                    f"refused the box's commits: what it sent is not a git bundle with a header of at most "
                    f"{MAX_BUNDLE_HEADER >> 20} MiB; nothing was fetched"
                )
            checked = git(repo_root, "index-pack", "--stdin", "--fix-thin", "--strict", stdin=handle, check=False,
                          env={"GIT_OBJECT_DIRECTORY": quarantine, "GIT_ALTERNATE_OBJECT_DIRECTORIES": objects})
        if checked.returncode != 0:
            detail = checked.stderr.decode("utf-8", "replace").strip()
            verify = git(repo_root, "bundle", "verify", "-q", bundle, check=False)
            if verify.returncode == 0:  # the bundle applies: its objects are what git refused
                raise RefusedObjects(
                    f"refused the box's commits: git's object checks failed on them ({detail[-500:]}); a tree with an "
                    "entry named .git (in any case) could plant hooks or config in a checkout. Nothing was fetched "
                    f"and no branch moved; the commits stay in the box (rewrite them there without such paths)"
                )
        return git(repo_root, *FSCK_FETCH, "fetch", "-q", "--no-tags", "--no-write-fetch-head", bundle, ref,
                   check=False)  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _skip_bundle_header(handle: IO[bytes]) -> bool:
    """Move `handle` past a bundle's header (a signature line, prerequisite, ref and capability lines,
    an empty line: as git reads it) to its pack; False when it is not one."""
    if handle.readline(64) not in (b"# v2 git bundle\n", b"# v3 git bundle\n"):
        return False
    while handle.tell() < MAX_BUNDLE_HEADER:
        line = handle.readline(MAX_BUNDLE_HEADER)
        if line == b"\n":
            return True
        if not line.endswith(b"\n"):
            return False
    return False


def owner_identity(path: str) -> tuple[int, int, str] | None:
    """(uid, gid, home) of the repo's owner when we are root and they are not, else None.

    Root writing refs or objects into a user's repository would leave root-owned files there
    that the user (and the box user, sharing the .git) can no longer write; so act as the owner.
    """
    if os.geteuid() != 0:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    if info.st_uid == 0:
        return None
    try:
        import pwd

        home = pwd.getpwuid(info.st_uid).pw_dir
    except KeyError:
        home = "/nonexistent"
    return info.st_uid, info.st_gid, home


def git_out(repo: str, *args: str, env: dict[str, str] | None = None) -> str:
    return git(repo, *args, env=env).stdout.decode("utf-8", "replace").strip()


@dataclasses.dataclass
class Repo:
    """A git repository found in a workspace."""

    root: str  # its working tree on the host
    common_dir: str  # the .git directory that holds objects and refs (shared by all worktrees)
    head: str  # commit sha
    head_branch: str | None  # None when detached
    sub: str  # '' for the workspace itself, else the first-level directory name
    owner_uid: int


@contextmanager
def private_index(repo: Repo) -> Iterator[dict[str, str]]:
    """Env that points git at a throwaway copy of the index, so reads never rewrite the real one."""
    index = git_out(repo.root, "rev-parse", "--git-path", "index")
    index = index if os.path.isabs(index) else os.path.join(repo.root, index)
    # The pid in the name lets a later run remove the copy of a run that was killed holding it.
    sweep_dead_index_copies()
    scratch = tempfile.mkdtemp(prefix=f"{INDEX_COPY_PREFIX}{os.getpid()}-")
    try:
        copy = os.path.join(scratch, "index")
        if os.path.exists(index):
            # With its mtime: git's racy-clean check compares entries to the index file's mtime, and a
            # copy stamped "now" makes a same-size edit from the last index write's tick look clean.
            shutil.copy2(index, copy)
        identity = owner_identity(repo.root)
        if identity:
            for path in (scratch, copy):
                if os.path.exists(path):
                    os.chown(path, identity[0], identity[1])
        pause_point("index-copied")
        yield {"GIT_INDEX_FILE": copy}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def sweep_dead_index_copies() -> None:
    """Remove index copies left in the temp directory by runs that were killed (SIGKILL, os._exit)."""
    base = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(INDEX_COPY_PREFIX)]
    except OSError:
        return
    for entry in names:
        pid = entry[len(INDEX_COPY_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed worker stays a zombie until its new parent reaps it: that is dead too.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[:1] != ["Z"]
    except OSError:
        return True


def _repo_at(path: str, sub: str) -> Repo | None:
    if not os.path.exists(os.path.join(path, ".git")):
        return None
    probe = git(path, "rev-parse", "--show-toplevel", "--git-common-dir", check=False)
    if probe.returncode != 0:
        # A .git that git cannot read is an error, not a reason to fall back to a plain copy.
        detail = probe.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"{path} has a .git but git cannot read it ({detail}); fix its permissions or pass another workspace")
    toplevel, common = probe.stdout.decode().strip().splitlines()[:2]
    if os.path.realpath(toplevel) != os.path.realpath(path):
        return None
    common = os.path.realpath(common if os.path.isabs(common) else os.path.join(path, common))
    head = git(path, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False)
    if head.returncode != 0:
        raise GitError(
            f"the git repository at {path} has no commits yet: make a first commit "
            "(git commit --allow-empty -m init) and try again"
        )
    branch = git(path, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.decode().strip() or None
    return Repo(
        root=os.path.realpath(path),
        common_dir=common,
        head=head.stdout.decode().strip(),
        head_branch=branch,
        sub=sub,
        owner_uid=os.stat(common).st_uid,
    )


def find_repos(workspace: str) -> list[Repo]:
    """The workspace's own repo (first), then each first-level nested repo and each checked-out
    submodule of the workspace's repo (at any depth), by path; [] when not a repo."""
    root = _repo_at(workspace, "")
    if root is None:
        return []
    subs = set(_submodule_paths(root.root))
    for entry in os.listdir(workspace):
        path = os.path.join(workspace, entry)
        if not entry.startswith(".") and os.path.isdir(path) and not os.path.islink(path):
            subs.add(entry)
    repos = [root]
    for sub in sorted(subs):
        nested = _repo_at(os.path.join(workspace, sub), sub)
        if nested is not None:
            repos.append(nested)
    return repos


def _submodule_paths(root: str) -> list[str]:
    """Paths of the repo's submodules that are checked out (an uninitialised one has no .git)."""
    if not os.path.isfile(os.path.join(root, ".gitmodules")):
        return []
    listed = git(root, "config", "--file", ".gitmodules", "-z", "--get-regexp", r"^submodule\..*\.path$", check=False)
    paths = []
    for entry in listed.stdout.decode("utf-8", "surrogateescape").split("\0"):
        _key, _sep, path = entry.partition("\n")
        path = os.path.normpath(path.strip("/")) if path else ""
        inside = os.path.realpath(os.path.join(root, path)).startswith(root.rstrip("/") + "/")
        if path and not path.startswith("..") and inside and os.path.exists(os.path.join(root, path, ".git")):
            paths.append(path)
    return paths


@dataclasses.dataclass
class CarryOver:
    """The uncommitted state of one repo, captured without touching it."""

    stash: str | None  # a stash commit (staged + unstaged tracked changes), or None when clean
    untracked: list[str]  # untracked, not ignored paths relative to the repo root
    modified: int = 0
    deleted: int = 0
    renamed: int = 0
    # Untracked, not ignored regular files named like secrets (_secret_files), left out of `untracked`:
    # they go to the box's tmpfs only (_carry_env), never a layer or a checkpoint.
    secret: list[str] = dataclasses.field(default_factory=list)


def capture_carry_over(repo: Repo, skip_dirs: list[str] | None = None) -> CarryOver:
    skipped = tuple(d.rstrip("/") + "/" for d in (skip_dirs or []))
    with private_index(repo) as env:
        # The stash commit is an internal carrier: give it an identity so a user without one still works.
        identity = {
            "GIT_AUTHOR_NAME": "agentbox",
            "GIT_AUTHOR_EMAIL": "agentbox@localhost",
            "GIT_COMMITTER_NAME": "agentbox",
            "GIT_COMMITTER_EMAIL": "agentbox@localhost",
        }
        created = git(repo.root, "stash", "create", "agentbox carry-over", env={**env, **identity}, check=False)
        # A tree whose index stat data is stale (as in a fresh copy) but has nothing to save
        # makes `stash create` exit 1 silently: that is "no stash", not a failure.
        if created.returncode not in (0, 1) or (created.returncode == 1 and created.stderr.strip()):
            detail = created.stderr.decode("utf-8", "replace").strip()
            raise GitError(f"git stash create in {repo.root} failed: {detail}")
        stash = created.stdout.decode().strip() or None
        status = git(repo.root, "status", "--porcelain=v1", "-z", "--untracked-files=no", env=env).stdout
        untracked_raw = git(repo.root, "ls-files", "--others", "--exclude-standard", "-z", env=env).stdout
    carry = CarryOver(stash=stash, untracked=[])
    entries = status.split(b"\0")
    position = 0
    while position < len(entries):
        entry = entries[position]
        position += 1
        if len(entry) < 4:
            continue
        code = entry[:2].decode()
        if "R" in code:
            carry.renamed += 1
            position += 1  # the rename's source path follows
        elif "D" in code:
            carry.deleted += 1
        else:
            carry.modified += 1
    for raw in untracked_raw.split(b"\0"):
        if not raw:
            continue
        path = os.fsdecode(raw)
        if path.endswith("/") or path.startswith(skipped):
            continue  # nested repositories are seeded on their own
        (carry.secret if secret_file(repo.root, path) else carry.untracked).append(path)
    return carry


def secret_file(root: str, path: str) -> bool:
    """Whether root/path is a regular file named like a secret (_secret_files): a link carries no content,
    it travels as it is."""
    full = os.path.join(root, path)

    def regular() -> bool:
        try:
            return stat.S_ISREG(os.lstat(full).st_mode)
        except OSError:
            return False

    def head() -> bytes:
        if not regular():  # never open a fifo or follow a link for its content
            return b""
        try:
            with open(full, "rb") as handle:
                return handle.read(HEAD_BYTES)
        except OSError:
            return b""

    return named_like_secret(path, head) and regular()


def reserve_branch(repos: list[Repo], box: str, limit: int = 100, reason: str = "") -> str:
    """Create agentbox/<box> (or -2, -3...) at each repo's HEAD, free in every repo.

    `update-ref` with an empty old value creates the ref only if absent, so two boxes racing
    for one name cannot both get it. `reason` goes to the branch's reflog (which create made it).
    """
    message = ["-m", reason] if reason else []
    for suffix in range(1, limit + 1):
        name = box_branch(box, suffix)
        made: list[Repo] = []
        for repo in repos:
            result = git(repo.root, "update-ref", *message, f"refs/heads/{name}", repo.head, "", check=False)
            if result.returncode != 0:
                break
            made.append(repo)
        else:
            return name
        for repo in made:
            git(repo.root, "update-ref", "-d", f"refs/heads/{name}", repo.head, check=False)
    raise GitError(f"no free branch name for box {box!r} after {limit} tries: delete old agentbox/{box}* branches")


def delete_branch(repo_root: str, name: str) -> None:
    git(repo_root, "update-ref", "-d", f"refs/heads/{name}", check=False)


def branch_exists(repo_root: str, name: str) -> bool:
    return git(repo_root, "show-ref", "--verify", "-q", f"refs/heads/{name}", check=False).returncode == 0


def remove_worktree_registration(common_dir: str, worktree_path: str) -> bool:
    """Forget a box's worktree in the host repo (the path exists only in the box)."""
    result = git(common_dir, f"--git-dir={common_dir}", "worktree", "remove", "-f", "-f", worktree_path, check=False)
    if result.returncode == 0:
        return True
    # Fall back to the admin directory itself when git refuses (e.g. a half-written entry).
    admin_root = os.path.join(common_dir, "worktrees")
    for entry in os.listdir(admin_root) if os.path.isdir(admin_root) else []:
        gitdir_file = os.path.join(admin_root, entry, "gitdir")
        try:
            with open(gitdir_file, encoding="utf-8") as handle:
                registered = handle.read().strip()
        except OSError:
            continue
        if os.path.dirname(registered) == worktree_path.rstrip("/"):
            shutil.rmtree(os.path.join(admin_root, entry), ignore_errors=True)
            return True
    return False
