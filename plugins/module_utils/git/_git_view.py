# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A box's view of a host .git: the lower layer of its git overlay (_gitlayer), made on the host.

The view is a snapshot of the host's .git taken at create, not the live directory:
- **ownership**: its directories belong to the box user's host uid (under the box engine's
  user-namespace remap, the host's own uids are nobody in the box), so git in the box can add
  objects and refs anywhere, whoever the host user is and whatever the host writes later;
- **stability**: the host committing, fetching, repacking or gc-ing never changes a layer under a
  mounted overlay (which overlayfs leaves undefined: stale entries showed as `-?????????`); the
  host's new objects and refs reach a running box through `_gitlayer.refresh_view` instead;
- **scrubbed**: its config holds only what git in the box needs (no remote URLs, credentials,
  helpers, includes, hooks path); its refs are the box's own branch and the branch the host had
  checked out; the host's hooks, reflogs, index and other worktrees are not in it.

Files are hard links to the host's (objects and packs are never rewritten in place, and the
overlay copies a file up before any write reaches it), so a view costs one directory entry per
file; a file others cannot read, or a view on another filesystem, gets a copy instead. Object-level
sharing remains: a box can read every object of the host repository (`git cat-file
--batch-all-objects`), including commits of other boxes already fetched into it, though no ref
names them in its view.

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat

# What the box's git needs of the host's config: the repository's format and how it reads files.
CONFIG_KEPT = {
    "core": {"repositoryformatversion", "filemode", "bare", "symlinks", "ignorecase", "precomposeunicode",
             "logallrefupdates", "autocrlf", "eol", "safecrlf", "checkstat", "trustctime", "quotepath",
             "bigfilethreshold", "compression", "loosecompression"},
    "extensions": None,  # every key: the repository cannot be read without them
    "index": {"version"},
}
# Top-level entries of a .git copied whole (their files linked); the rest is written here or left out.
COPIED = ("objects", "lfs", "shallow", "info")
# Small files the box's git writes in place (info/exclude, info/sparse-checkout): copies owned by the
# box, as a link keeps the host's owner, which root in the box cannot write through.
WRITABLE = ("info",)
NESTED = "modules"  # submodules' git directories: views of their own
_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*$')
_ENTRY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*?))?\s*$")


def views_dir() -> str:
    """Where the views of the host's .git directories (the git layers' lower directories) are kept."""
    from ..core._host_files import agentbox_dir

    return os.path.join(agentbox_dir(), "gitviews")


def view_path(box: str, box_id: str, index: int) -> str:
    return os.path.join(views_dir(), f"{box}-{box_id}-git{index}")


def checked_out_branch(view: str) -> str:
    """The branch the host had checked out when the view was made ('' for a detached HEAD): the box's
    base branch. Read on the host from the view, which the box cannot change (its lower layer)."""
    head = _read(os.path.join(view, "HEAD")).strip()
    return head.removeprefix("ref: refs/heads/") if head.startswith("ref: refs/heads/") else ""


def build(git_dir: str, view: str, owner: tuple[int, int], branch: str) -> None:
    """Make `view` (must not exist) from the host .git at `git_dir`; directories and written files
    owned by `owner` (the box user's host uid and gid); `branch` is the box's own branch."""
    os.mkdir(view, 0o755)
    try:
        _build(git_dir, view, owner, branch)
    except BaseException:
        shutil.rmtree(view, ignore_errors=True)
        raise


def _build(git_dir: str, view: str, owner: tuple[int, int], branch: str) -> None:
    os.chown(view, *owner)
    for name in COPIED:
        source = os.path.join(git_dir, name)
        if os.path.isdir(source) and not os.path.islink(source):
            _mirror(source, os.path.join(view, name), owner, copy=name in WRITABLE)
        elif os.path.isfile(source) and not os.path.islink(source):
            _copy(source, os.path.join(view, name), owner)
    head = _read(os.path.join(git_dir, "HEAD")) or "ref: refs/heads/main\n"
    _write(os.path.join(view, "HEAD"), head, owner)
    _write(os.path.join(view, "config"), scrubbed_config(_read(os.path.join(git_dir, "config"))), owner)
    for sub in ("refs", "refs/heads", "refs/tags", "refs/remotes"):
        _mkdir(os.path.join(view, sub), 0o755, owner)
    wanted = [f"refs/heads/{branch}"] if branch else []
    if head.startswith("ref: "):
        wanted.append(head[5:].strip())
    for ref in dict.fromkeys(wanted):
        oid = resolve(git_dir, ref)
        if oid:  # a loose ref, as the host's own git writes a new branch
            target = os.path.join(view, ref)
            _mkdir_parents(target, view, owner)
            _write(target, oid + "\n", owner)
    modules = os.path.join(git_dir, NESTED)
    if os.path.isdir(modules) and not os.path.islink(modules):
        _mkdir(os.path.join(view, NESTED), 0o755, owner)
        for root, dirs, _files in os.walk(modules):
            for name in list(dirs):
                nested = os.path.join(root, name)
                if os.path.islink(nested):
                    dirs.remove(name)
                elif os.path.isfile(os.path.join(nested, "HEAD")) and os.path.isdir(os.path.join(nested, "objects")):
                    dirs.remove(name)  # a submodule's git directory: a view of its own
                    target = os.path.join(view, os.path.relpath(nested, git_dir))
                    _mkdir_parents(target, view, owner)
                    os.mkdir(target, 0o755)
                    _build(nested, target, owner, branch)


def resolve(git_dir: str, ref: str) -> str:
    """The object id a ref of the host .git names ('' when it has none): its loose file, else packed-refs."""
    if ".." in ref.split("/") or not ref.startswith("refs/"):
        return ""
    loose = _read(os.path.join(git_dir, ref)).strip()
    if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", loose):
        return loose
    for line in _read(os.path.join(git_dir, "packed-refs")).splitlines():
        oid, _space, name = line.partition(" ")
        if name == ref and re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", oid):
            return oid
    return ""


def scrubbed_config(text: str) -> str:
    """The host config with only the keys of CONFIG_KEPT (no remotes, credentials, includes, hooks)."""
    kept: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        header = _SECTION.match(line)
        if header:
            # A subsection ([remote "origin"], [credential "..."]) is never kept.
            section = "" if header.group(2) is not None else header.group(1).lower()
            continue
        entry = _ENTRY.match(line)
        if not entry or section not in CONFIG_KEPT:
            continue
        allowed = CONFIG_KEPT[section]
        value = re.split(r"\s[#;]", entry.group(2) or "true")[0].strip()
        # Plain words only: a value that needs quoting or escapes is nothing git in the box needs.
        if (allowed is None or entry.group(1).lower() in allowed) and re.fullmatch(r"[A-Za-z0-9_.+/-]*", value):
            kept.setdefault(section, []).append(f"\t{entry.group(1)} = {value}\n")
    kept.setdefault("core", [])
    if not any(line.strip().lower().startswith("bare") for line in kept["core"]):
        kept["core"].append("\tbare = false\n")
    return "".join(f"[{name}]\n" + "".join(lines) for name, lines in kept.items())


def _mirror(source: str, target: str, owner: tuple[int, int], copy: bool = False) -> None:
    """Directories made (owned by `owner`), files linked (copied where linking cannot serve, or `copy`)."""
    for root, dirs, files in os.walk(source):
        relative = os.path.relpath(root, source)
        made = target if relative == "." else os.path.join(target, relative)
        _mkdir(made, stat.S_IMODE(os.lstat(root).st_mode) | 0o700, owner)
        dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(root, name))]
        for name in files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and copy:
                _copy(path, os.path.join(made, name), owner)
            elif stat.S_ISREG(info.st_mode):
                _link_or_copy(path, os.path.join(made, name), info, owner)


def _link_or_copy(source: str, target: str, info: os.stat_result, owner: tuple[int, int]) -> None:
    if info.st_mode & stat.S_IROTH:
        try:
            os.link(source, target, follow_symlinks=False)
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
    _copy(source, target, owner)


def _copy(source: str, target: str, owner: tuple[int, int]) -> None:
    shutil.copyfile(source, target, follow_symlinks=False)
    os.chmod(target, 0o644)
    os.chown(target, *owner)


def _mkdir(path: str, mode: int, owner: tuple[int, int]) -> None:
    os.makedirs(path, exist_ok=True)
    os.chmod(path, mode)
    os.chown(path, *owner)


def _mkdir_parents(path: str, top: str, owner: tuple[int, int]) -> None:
    parent = os.path.dirname(path)
    if parent != top and not os.path.isdir(parent):
        _mkdir_parents(parent, top, owner)
        _mkdir(parent, 0o755, owner)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(1 << 20)
    except OSError:
        return ""


def _write(path: str, text: str, owner: tuple[int, int]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chown(path, *owner)
