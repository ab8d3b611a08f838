# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The coding agents' states the relay last read, in one host file that the inventory reads whole.

    ~/.agentbox/relay/agents.json   (0600, written whole by the relay after each idle-policy pass)
    {"version": 1, "written": <epoch>, "interval": <the pass interval, s>,
     "boxes": {<box id>: {"name", "provider", "engine", "read": <epoch>, "agent": {name, session, state, since,
                                                                             quiet_seconds} | null}}}

The relay's pass reads every running box it serves (one exec each, the pass's own); the inventory then
needs no exec per box. An entry older than `max_age(interval)` is not returned: its state is unknown.
The box wrote what the relay read; the relay kept only checked values (_agent.sanitize_state), and the
readers check them again: here the file's size and shape (a hand-edited, truncated or oversized file gives
fewer entries, never an error), in the inventory each agent's values (_agent.checked).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..core._host_files import ensure_private_dir, write_atomic

VERSION = 1
MAX_BOXES = 4096  # bounded: one relay serves one user's boxes
MAX_BYTES = MAX_BOXES * 1024  # an entry is about 300 bytes; a file past this is not read
FILE_NAME = "agents.json"
AGENT_KEYS = ("name", "session", "state", "since", "quiet_seconds")


def record_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".agentbox", "relay", FILE_NAME)


def max_age(interval: float) -> float:
    """How long a read stays good: three passes, and never less than 90 s (a pass over many boxes takes time)."""
    return max(90.0, 3 * interval)


def write(entries: dict[str, dict[str, Any]], interval: float, now: float | None = None, path: str | None = None) -> None:
    """Replace the record with `entries` ({box id: {name, provider, engine, read, agent}})."""
    path = path or record_path()
    kept = dict(sorted(entries.items(), key=lambda item: -float(item[1].get("read") or 0))[:MAX_BOXES])
    data = {"version": VERSION, "written": time.time() if now is None else now, "interval": interval, "boxes": kept}
    ensure_private_dir(os.path.dirname(path))
    write_atomic(path, json.dumps(data, sort_keys=True) + "\n", mode=0o600)


def load(path: str | None = None) -> dict[str, Any]:
    """The whole record as written ({} when missing or unreadable): the relay merges its next pass into it."""
    try:
        with open(path or record_path(), "rb") as handle:
            text = handle.read(MAX_BYTES + 1)
        data = json.loads(text) if len(text) <= MAX_BYTES else None
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("boxes"), dict):
        return {}
    return data


def fresh(now: float | None = None, path: str | None = None) -> dict[str, dict[str, Any]]:
    """{box id: {name, provider, engine, read, agent}} for the reads younger than max_age; others are left out."""
    data = load(path)
    now = time.time() if now is None else now
    try:
        bound = max_age(float(data.get("interval") or 0))
    except (TypeError, ValueError):
        bound = max_age(0)
    found: dict[str, dict[str, Any]] = {}
    for box_id, entry in list(data.get("boxes", {}).items())[:MAX_BOXES]:
        if not isinstance(entry, dict) or not isinstance(entry.get("read"), (int, float)):
            continue
        if not 0 <= now - entry["read"] <= bound:
            continue
        agent = entry.get("agent")
        if agent is not None and not (isinstance(agent, dict) and isinstance(agent.get("state"), str)):
            continue
        found[str(box_id)] = {
            "name": entry.get("name"),
            "provider": entry.get("provider"),
            "engine": entry.get("engine"),
            "read": float(entry["read"]),
            "agent": {key: agent.get(key) for key in AGENT_KEYS} if agent else None,
        }
    return found
