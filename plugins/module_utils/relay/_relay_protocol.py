# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The relay's wire format and every check made on what a box asks, before anything runs.

Pure helpers (no engine, no host repository): a request is one JSON object on one line, at most
MAX_REQUEST_BYTES; each operation's arguments are checked against a fixed shape and normalised;
the policy says which requests wait for the user. The box is assumed hostile: anything not
understood is refused with a message, never guessed at.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import time
import unicodedata
from typing import Any

from ..core._naming import check_checkpoint_name_free, validate_checkpoint_name

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024
# How long a request may wait for the user; the box may ask for less, never more.
DEFAULT_APPROVAL_TIMEOUT = 600.0
MAX_APPROVAL_TIMEOUT = 3600.0
# Per box: a burst of RATE_BURST requests, then one every 60/RATE_PER_MINUTE seconds.
RATE_BURST = 20
RATE_PER_MINUTE = 60
REMOTE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_URL_LENGTH = 2048
MAX_TEXT_LENGTH = 16 * 1024  # a pull request's title or body
# A push's new commits, sent by the box over its socket as one git bundle: the host streams at most
# this many bytes to a temporary file (docs/relay.md, "Bundles over the socket").
MAX_BUNDLE_BYTES = 1024 * 1024 * 1024
# The bytes of a bundle must keep up BUNDLE_MIN_RATE on average once BUNDLE_GRACE seconds have passed since
# its header, all along (bundle_behind_at): a bundle that does arrives within BUNDLE_GRACE plus 1 s per MiB
# (1 GiB: 10 + 1024 s); one that falls behind is cut then. The box sends a file it has already made over a
# unix socket on this host, hundreds of MiB/s when idle: 1 MiB/s leaves a loaded host 100x slack. A deadline
# alone let a box declaring 1 GiB and sending a byte every 29 s hold its slot for 1084 s.
BUNDLE_GRACE = 10.0
BUNDLE_MIN_RATE = 1024 * 1024  # bytes per second
# Bundles received at once, all boxes together: each holds one of the relay's few worker threads
# (asyncio's default pool: cores + 4) and up to MAX_BUNDLE_BYTES of disk. One more is refused.
MAX_BUNDLE_RECEPTIONS = 2
# `agentbox-ctl cp`: the largest file one copy carries, either way, and the longest path it names.
MAX_COPY_BYTES = 256 * 1024 * 1024
MAX_PATH_LENGTH = 4096

OPERATIONS = ("git.push", "git.fetch", "git.pull", "checkpoint", "open", "gh.pr", "file.cp")
GH_PR_ACTIONS = ("create", "view", "list", "merge")


class RequestError(ValueError):
    """The request is refused before anything runs; the message says what to change."""


@dataclasses.dataclass
class Request:
    operation: str
    args: dict[str, Any]
    timeout: float = DEFAULT_APPROVAL_TIMEOUT
    # The box's client can send a push's commits as a bundle on the same connection when asked.
    bundles: bool = False

    def describe(self) -> str:
        """The arguments on one line, as relay_approvals.yml lists them."""
        parts = []
        for key in sorted(self.args):
            value = self.args[key]
            if value is None or value is False:
                continue
            parts.append(key if value is True else f"{key}={shown(value) if isinstance(value, str) else value}")
        return " ".join(parts) or "-"


def shown(text: str) -> str:
    """`text` as an approval line shows it: printable ASCII as it is; anything else escaped (`\\u0430`) and the
    whole flagged with the characters' names, so a look-alike (`mаin` with a Cyrillic а) never reads as the
    ASCII name the user would approve without a second look. git's ref rules allow such names."""
    odd = [char for char in dict.fromkeys(text) if not (char.isascii() and char.isprintable())]
    if not odd:
        return text
    escaped = "".join(char if char not in odd else
                      (f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}") for char in text)
    names = ", ".join(f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed character')}" for char in odd[:8])
    return f"{escaped} [not plain ASCII: {names}{', ...' if len(odd) > 8 else ''}]"


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")


def _json_object(raw: bytes, what: str, form: str) -> dict[str, Any]:
    """`raw` decoded as a JSON object, or RequestError saying that `what` is not `form`."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(f"{what} is not {form}: {exc}") from exc
    if not isinstance(value, dict):
        raise RequestError(f"{what} must be a JSON object")
    return value


def parse_request(line: bytes) -> Request:
    """A Request from one line, or RequestError. Never raises anything else."""
    if len(line) > MAX_REQUEST_BYTES:
        raise RequestError(f"request is {len(line)} bytes; the limit is {MAX_REQUEST_BYTES}")
    raw = _json_object(line, "request", "one JSON object on one line")
    unknown = set(raw) - {"v", "op", "args", "timeout", "bundles"}
    if unknown:
        raise RequestError(f"unknown request fields: {', '.join(sorted(unknown))}")
    if raw.get("v") != PROTOCOL_VERSION:
        raise RequestError(f"protocol version {raw.get('v')!r} is not spoken here (this relay speaks {PROTOCOL_VERSION})")
    operation = raw.get("op")
    if operation not in OPERATIONS:
        raise RequestError(f"unknown operation {operation!r}: use one of {', '.join(OPERATIONS)}")
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise RequestError("'args' must be a JSON object")
    timeout = raw.get("timeout", DEFAULT_APPROVAL_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_APPROVAL_TIMEOUT:
        raise RequestError(f"'timeout' must be a number of seconds in (0, {MAX_APPROVAL_TIMEOUT:g}]")
    bundles = raw.get("bundles", False)
    if not isinstance(bundles, bool):
        raise RequestError("'bundles' must be true or false")
    return Request(operation=operation, args=_CHECKERS[operation](args), timeout=float(timeout), bundles=bundles)


def bundle_header(raw: bytes) -> dict[str, Any]:
    """The box's answer to a "bundle" message, checked: {"tip": str, "size": int} (size 0: no bundle
    follows) or {"missing": true} (the box has no such branch). RequestError otherwise."""
    header = _json_object(raw, "the box's bundle header", "one JSON object")
    if header.get("missing") is True and set(header) == {"missing"}:
        return header
    tip, size = header.get("tip"), header.get("size")
    if set(header) != {"tip", "size"} or not isinstance(tip, str) or len(tip) > 64:
        raise RequestError("the box's bundle header must be {\"tip\": <commit id>, \"size\": <bytes>}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise RequestError("the bundle's size must be a whole number of bytes")
    if size > MAX_BUNDLE_BYTES:
        raise RequestError(f"the box's bundle is {size} bytes, over the {MAX_BUNDLE_BYTES} the host takes: refused")
    return header


def bundle_behind_at(received: int, grace: float = BUNDLE_GRACE, rate: float = BUNDLE_MIN_RATE) -> float:
    """Seconds after its header when a box that has sent `received` bytes of its bundle falls below the
    minimum rate: `grace`, plus the time those bytes buy at `rate`. Cut then, unless more came."""
    return grace + received / rate


def _fields(args: dict[str, Any], allowed: dict[str, type]) -> dict[str, Any]:
    unknown = set(args) - set(allowed)
    if unknown:
        raise RequestError(f"unknown arguments: {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(allowed))})")
    checked: dict[str, Any] = {}
    for key, kind in allowed.items():
        value = args.get(key)
        if value is None:
            checked[key] = False if kind is bool else None
            continue
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise RequestError(f"argument {key!r} must be a {kind.__name__}")
        checked[key] = value
    return checked


def check_remote(name: str | None) -> str:
    remote = name or "origin"
    if not REMOTE_NAME.match(remote):
        raise RequestError(f"remote {remote!r} is not a remote name: use a configured remote such as 'origin' (never a URL)")
    return remote


def check_branch_name(name: str) -> str:
    """A branch name git itself accepts (git check-ref-format), never an option or a full ref."""
    if not name or len(name) > 255 or name.startswith("-") or name.startswith("refs/") or name == "HEAD":
        raise RequestError(f"{name!r} is not a branch name: give a plain branch name such as 'main' or 'fix/login'")
    if any(ord(char) < 0x20 or char == "\x7f" for char in name):
        raise RequestError(f"{name!r} is not a branch name: it holds control characters")
    result = subprocess.run(
        ["git", "check-ref-format", f"refs/heads/{name}"], capture_output=True, check=False, timeout=10
    )
    if result.returncode != 0:
        raise RequestError(f"{name!r} is not a valid branch name by git's rules (git check-ref-format)")
    return name


def _check_push(args: dict[str, Any]) -> dict[str, Any]:
    checked = _fields(args, {"as": str, "remote": str, "force": bool, "delete": bool})
    checked["remote"] = check_remote(checked["remote"])
    if checked["as"] is not None:
        checked["as"] = check_branch_name(checked["as"])
    if checked["delete"] and checked["force"]:
        raise RequestError("--delete and --force do not go together")
    return checked


def _check_fetch(args: dict[str, Any]) -> dict[str, Any]:
    checked = _fields(args, {"remote": str})
    checked["remote"] = check_remote(checked["remote"])
    return checked


def _check_pull(args: dict[str, Any]) -> dict[str, Any]:
    checked = _fields(args, {"remote": str, "branch": str})
    checked["remote"] = check_remote(checked["remote"])
    if checked["branch"] is not None:
        checked["branch"] = check_branch_name(checked["branch"])
    return checked


def _check_checkpoint(args: dict[str, Any]) -> dict[str, Any]:
    checked = _fields(args, {"name": str})
    if checked["name"] is None:
        raise RequestError("checkpoint needs --name NAME")
    try:
        check_checkpoint_name_free(validate_checkpoint_name(checked["name"]))
    except ValueError as exc:
        raise RequestError(str(exc)) from exc
    return checked


def _check_open(args: dict[str, Any]) -> dict[str, Any]:
    checked = _fields(args, {"url": str})
    url = checked["url"] or ""
    if not re.match(r"^https?://[^\s/]", url) or len(url) > MAX_URL_LENGTH:
        raise RequestError(f"only http:// and https:// URLs of at most {MAX_URL_LENGTH} characters can be opened")
    if any(ord(char) < 0x21 or char == "\x7f" for char in url):
        raise RequestError("the URL holds spaces or control characters: percent-encode them")
    return checked


def _check_gh_pr(args: dict[str, Any]) -> dict[str, Any]:
    checked = _fields(
        args, {"action": str, "title": str, "body": str, "base": str, "draft": bool, "number": int}
    )
    if checked["action"] not in GH_PR_ACTIONS:
        raise RequestError(f"gh pr supports {', '.join(GH_PR_ACTIONS)}")
    for key in ("title", "body"):
        if checked[key] is not None and len(checked[key]) > MAX_TEXT_LENGTH:
            raise RequestError(f"--{key} is longer than {MAX_TEXT_LENGTH} characters")
    if checked["base"] is not None:
        checked["base"] = check_branch_name(checked["base"])
    if checked["number"] is not None and not 0 < checked["number"] < 10**9:
        raise RequestError("a pull request number is a positive integer")
    if checked["action"] == "merge" and checked["number"] is None:
        raise RequestError("gh pr merge needs the pull request's number")
    return checked


def check_copy_path(path: str | None, side: str) -> str:
    """A path of a copy as the box gave it: text of at most MAX_PATH_LENGTH, no control characters, no `..`
    (a host path that leaves where it seems to is refused, not resolved); the box's own path absolute."""
    if not path:
        raise RequestError(f"cp needs the {side} path")
    if len(path) > MAX_PATH_LENGTH or any(ord(char) < 0x20 or char == "\x7f" for char in path):
        raise RequestError(f"the {side} path is longer than {MAX_PATH_LENGTH} characters or holds control characters")
    if ".." in path.split("/"):
        raise RequestError(f"the {side} path {shown(path)} holds '..': give it without")
    if side == "box" and not path.startswith("/"):
        raise RequestError("the box path must be absolute (agentbox-ctl makes a relative one absolute)")
    if path.endswith("/") or path.rstrip("/").rsplit("/", 1)[-1] in ("", "."):
        raise RequestError(f"the {side} path {shown(path)} names a directory: name the file")
    return path


def _check_copy(args: dict[str, Any]) -> dict[str, Any]:
    checked = _fields(args, {"direction": str, "host": str, "box": str})
    if checked["direction"] not in ("in", "out"):
        raise RequestError("a copy's direction is 'in' (host to box) or 'out' (box to host)")
    checked["host"] = check_copy_path(checked["host"], "host")
    checked["box"] = check_copy_path(checked["box"], "box")
    return checked


_CHECKERS = {
    "git.push": _check_push,
    "git.fetch": _check_fetch,
    "git.pull": _check_pull,
    "checkpoint": _check_checkpoint,
    "open": _check_open,
    "gh.pr": _check_gh_pr,
    "file.cp": _check_copy,
}


def approval_reason(request: Request, own_branch: str, ci: list[str] | tuple[str, ...] = ()) -> str | None:
    """Why the request must wait for the user, or None when the box may do it alone.

    Allowed alone: push of the box's own branch to its own name, fetch, pull, checkpoint, open,
    and pull requests from the box's branch. Anything that writes elsewhere waits, and so does a push
    whose commits add or change CI configuration (`ci`: those files; CI runs what a pushed branch says,
    with the repository's secrets).
    """
    if request.operation == "git.push":
        target = shown(request.args["as"] or own_branch)
        reasons = []
        if request.args["delete"]:
            reasons.append(f"deletes the remote branch {target}")
        elif request.args["force"]:
            reasons.append(f"force-pushes {target}")
        elif (request.args["as"] or own_branch) != own_branch:
            reasons.append(f"pushes to {target}, which is not the box's own branch {own_branch}")
        if ci and not request.args["delete"]:
            listed = ", ".join(shown(path) for path in ci[:5]) + (f" and {len(ci) - 5} more" if len(ci) > 5 else "")
            reasons.append(f"adds or changes CI configuration ({listed})")
        return "; ".join(reasons) or None
    if request.operation == "gh.pr" and request.args["action"] == "merge":
        return f"merges pull request #{request.args['number']}"
    return None


class RateLimiter:
    """A token bucket per key: `burst` at once, refilled at `per_minute`."""

    def __init__(self, burst: int = RATE_BURST, per_minute: int = RATE_PER_MINUTE):
        self.burst = burst
        self.rate = per_minute / 60.0
        self._buckets: dict[str, tuple[float, float]] = {}

    def allow(self, key: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True
