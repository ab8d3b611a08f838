"""Daytona's sandbox lookup cache, as `GET /sandbox/{idOrName}` meets it (v0.190).

`findOneByIdOrName` looks the sandbox up by id, then by name, each query cached for
SANDBOX_LOOKUP_CACHE_TTL_MS (10 s) in TypeORM's query cache, a miss included. An update of a sandbox
(state, desired state, labels, the rename of a delete) removes the keys of its id and of its old and
new names; an insert removes none (only the organisation-id keys). So a name looked up just before a
sandbox of that name is made reads "not found" until that sandbox's first update, and a sandbox's own
activity (not an update of the entity) is served as it was when cached.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .errors import ApiError

if TYPE_CHECKING:
    from .core import Emulator


class LookupCache:
    def __init__(self) -> None:
        # (kind, key) -> (cached at, sandbox id or None for a miss, the sandbox's version, its DTO then)
        self._entries: dict[tuple[str, str], tuple[float, str | None, int, dict[str, Any] | None]] = {}

    def clear(self) -> None:
        self._entries.clear()

    def get(self, emu: Emulator, id_or_name: str) -> dict[str, Any]:
        """The sandbox's DTO as the cached queries give it; 404 when neither finds one. Call under emu.lock."""
        ttl = emu.config.lookup_cache_seconds
        now = time.monotonic()
        for kind in ("id", "name"):
            entry = self._entries.get((kind, id_or_name)) if ttl > 0 else None
            if entry is None or not self._valid(emu, entry, id_or_name, now, ttl):
                entry = self._query(emu, kind, id_or_name, now)
                if ttl > 0:
                    self._entries[(kind, id_or_name)] = entry
            if entry[1] is not None:
                return dict(entry[3] or {})
        raise ApiError(404, f"Sandbox with ID or name {id_or_name} not found")

    @staticmethod
    def _query(emu: Emulator, kind: str, key: str, now: float) -> tuple[float, str | None, int, dict | None]:
        if kind == "id":
            record = emu.sandboxes.get(key)
        else:
            record = next((sb for sb in emu.sandboxes.values() if sb.name == key), None)
        if record is None:
            return (now, None, 0, None)
        return (now, record.id, record.version, emu.sandbox_dto(record))

    @staticmethod
    def _valid(emu: Emulator, entry: tuple, key: str, now: float, ttl: float) -> bool:
        cached_at, sandbox_id, version, _dto = entry
        if now - cached_at > ttl:
            return False
        if sandbox_id is not None:
            record = emu.sandboxes.get(sandbox_id)
            return record is not None and record.version == version  # an update removed the key
        # A miss is removed only by an update of a sandbox that is, or was, called so (never by its insert).
        return not any(
            key in (sb.id, sb.name, sb.previous_name) and sb.updated_mono > cached_at for sb in emu.sandboxes.values()
        )
