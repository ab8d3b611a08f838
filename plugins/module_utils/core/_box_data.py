# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks on what a box wrote, made on the host before the host uses it.

The agent in a box is assumed hostile and root there: the seed record, the commits and branch
names its git reports, and the in-box restore's answer are all the box's to forge. Whatever of
them reaches a host git command line, a host ref or a host path is checked here first: object
ids are 40 or 64 hex digits, branch names pass git's own rules, lists and texts are bounded, and
JSON has the expected shape. A value that fails is refused with a message (never guessed at, never
trimmed into something else).
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from ..relay._relay_protocol import RequestError, check_branch_name
from ._errors import ProviderError

# Where the workspace is inside every box.
WORKSPACE = "/workspace"
OBJECT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
MAX_JSON_BYTES = 4 << 20
MAX_WORKTREES = 256  # nested repositories of one workspace
MAX_ITEMS = 100_000  # paths, conflicts
MAX_TEXT = 8192
SEED_MODES = ("worktree", "copy", "shipped", "checkpoint")


class BoxDataError(ProviderError):
    """What the box wrote is not what the host expects: the host does not use it."""


def refuse(what: str, problem: str, box: str) -> BoxDataError:
    return BoxDataError(f"{what} written by the box {problem}; the host does not use it (the box may have been "
                        "tampered with: destroy it, or restore it from a checkpoint)", box=box)


def object_id(value: Any, what: str, box: str) -> str:
    """A full git object id (SHA-1 or SHA-256), never a revision expression or an option."""
    if not isinstance(value, str) or not OBJECT_ID.fullmatch(value):
        raise refuse(what, f"is not a git object id ({_shown(value)})", box)
    return value


def branch_name(value: Any, what: str, box: str) -> str:
    """A branch name by git's rules (git check-ref-format), never a full ref, a refspec or an option."""
    if not isinstance(value, str):
        raise refuse(what, f"is not a branch name ({_shown(value)})", box)
    try:
        return check_branch_name(value)
    except RequestError as exc:
        raise refuse(what, f"is not a branch name ({exc})", box) from exc


def text(value: Any, what: str, box: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit or "\0" in value:
        raise refuse(what, f"is not a text of at most {limit} characters", box)
    return value


def relative_path(value: Any, what: str, box: str) -> str:
    """A path inside a repository: relative, normalised, no '..', no NUL or line break."""
    path = text(value, what, box, 4096)
    if path.startswith("/") or "\n" in path or posixpath.normpath(path or ".") != (path or ".") \
            or path == ".." or path.startswith("../"):
        raise refuse(what, f"is not a path inside the repository ({_shown(path)})", box)
    return path


def json_object(data: bytes, what: str, box: str) -> dict[str, Any]:
    """One JSON object, of bounded size."""
    if len(data) > MAX_JSON_BYTES:
        raise refuse(what, f"is {len(data)} bytes, past the {MAX_JSON_BYTES} the host reads", box)
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise refuse(what, f"is not JSON ({exc})", box) from exc
    if not isinstance(value, dict):
        raise refuse(what, "is not a JSON object", box)
    return value


def bounded_list(value: Any, what: str, box: str, limit: int = MAX_ITEMS) -> list[Any]:
    if not isinstance(value, list) or len(value) > limit:
        raise refuse(what, f"is not a list of at most {limit} items", box)
    return value


def seed_record(data: bytes, box: str) -> dict[str, Any]:
    """The box's seed record (/etc/agentbox/seed.json), checked: every field the host acts on."""
    what = "the seed record"
    record = json_object(data, what, box)
    if record.get("mode") not in SEED_MODES:
        raise refuse(what, f"names no known seed mode ({_shown(record.get('mode'))})", box)
    if record.get("branch") is not None:
        branch_name(record["branch"], f"{what}'s branch", box)
    if record.get("base_commit") is not None:
        object_id(record["base_commit"], f"{what}'s base commit", box)
    for position, entry in enumerate(bounded_list(record.get("worktrees", []), f"{what}'s worktrees", box,
                                                  MAX_WORKTREES)):
        where = f"{what}'s worktree {position}"
        if not isinstance(entry, dict):
            raise refuse(where, "is not a JSON object", box)
        relative_path(entry.get("sub", ""), f"{where} sub", box)
        path = text(entry.get("path"), f"{where} path", box, 4096)
        if not path.startswith("/") or "\n" in path:
            raise refuse(f"{where} path", "is not an absolute path", box)
        branch_name(entry.get("branch"), f"{where} branch", box)
        if entry.get("base") != "":  # a repository without a commit yet has no base
            object_id(entry.get("base"), f"{where} base", box)
    for warning in bounded_list(record.get("warnings", []), f"{what}'s warnings", box, 1000):
        text(warning, f"{what}'s warning", box)
    return record


def own_branch(entry: dict[str, Any], branch: str, box: str) -> str:
    """The branch a seed record's worktree names, which must be the box's own (the host's label)."""
    if not branch or entry.get("branch") != branch:
        raise refuse("the seed record", f"names branch {_shown(entry.get('branch'))}, not the box's own "
                     f"({branch or 'none'})", box)
    return branch


def head_line(commit: str, branch: str, what: str, box: str) -> tuple[str, str]:
    """(commit, branch) the box's git printed for a worktree; branch '' when detached ('-')."""
    return object_id(commit, f"{what}'s commit", box), "" if branch in ("-", "") else branch_name(
        branch, f"{what}'s branch", box)


def restore_answer(stdout: bytes, asked: dict[str, list[str]], box: str) -> list[dict[str, Any]]:
    """The in-box restore's answer (its last line of output), one outcome per repository the host
    asked about (`asked`: sub -> the host's untracked paths), checked and rebuilt field by field."""
    what = "the restore's answer"
    lines = stdout.strip().splitlines()
    answer = json_object(lines[-1] if lines else b"", what, box)
    outcomes, seen = [], set()
    for raw in bounded_list(answer.get("worktrees"), f"{what}'s worktrees", box, MAX_WORKTREES):
        if not isinstance(raw, dict) or raw.get("sub") not in asked or raw["sub"] in seen:
            raise refuse(what, f"names a repository the host did not ask about ({_shown(raw)})", box)
        sub = raw["sub"]
        seen.add(sub)
        where, untracked = f"{what} for {sub or '.'}", set(asked[sub])
        existing = raw.get("untracked_existing")
        if not isinstance(existing, dict) or len(existing) > MAX_ITEMS:
            raise refuse(f"{where} untracked_existing", "is not a JSON object of paths", box)
        blocked = bounded_list(raw.get("untracked_blocked"), f"{where} untracked_blocked", box)
        strays = [path for path in [*existing, *blocked] if path not in untracked]
        if strays:
            raise refuse(where, f"names untracked files the host does not have ({_shown(strays[:3])})", box)
        physical = text(raw.get("physical"), f"{where} path", box, 4096)
        if not physical.startswith("/"):
            raise refuse(f"{where} path", "is not an absolute path", box)
        seconds = raw.get("seconds") if isinstance(raw.get("seconds"), dict) else {}
        outcomes.append({
            "sub": sub,
            "physical": physical,
            "merge": text(raw.get("merge"), f"{where} merge", box, 64),
            "merge_commit": object_id(raw["merge_commit"], f"{where} merge commit", box) if raw.get("merge_commit")
            else "",
            "head": object_id(raw.get("head"), f"{where} head", box),
            "conflicts": [_conflict(item, where, box) for item in bounded_list(raw.get("conflicts"), where, box)],
            "untracked_existing": {path: object_id(oid, f"{where} hash of {path}", box) for path, oid in existing.items()},
            "untracked_blocked": list(blocked),
            "seconds": {str(key)[:64]: value for key, value in list(seconds.items())[:64]
                        if isinstance(value, (int, float)) and not isinstance(value, bool)},
        })
    if seen != set(asked):
        raise refuse(what, f"leaves out {', '.join(sorted(set(asked) - seen)) or '.'}", box)
    return outcomes


def _conflict(raw: Any, where: str, box: str) -> dict[str, str]:
    """One conflict the restore reports: its four texts and nothing else (the host adds the repo)."""
    if not isinstance(raw, dict):
        raise refuse(f"{where} conflict", "is not a JSON object", box)
    return {key: text(raw.get(key, ""), f"{where} conflict {key}", box) for key in ("path", "kind", "kept", "detail")}


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."
