# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A create's claim of a pooled box (docs/pool.md, "The claim"): which requests a pooled box can serve, the
claim itself (the provider's pool store does the engine side), and the one line the create reports: `claimed
<pooled box>`, or why it made a box instead. Everything after the claim (seed, carry-over, boot, access) is
the create's own code, unchanged: a claimed box differs from a made one only in how it came to run.
"""

from __future__ import annotations

import shlex
from typing import Any

from ..core import _journal
from ..core._provider import BoxFacts, BoxSpec, Provider, ProviderError
from . import _pool

# Where both kinds of box say who they are (a claimed box's container environment still names its pooled box).
IDENTITY_FILE = "/etc/agentbox/box.env"


def unservable(spec: BoxSpec, restore: Any, boot: bool) -> str:
    """Why a pooled box cannot be this box ('' when it can): what the request fixes at `docker create`."""
    extra = sorted(set(spec.ports) - {_pool.WEB_PORT})
    for why, holds in (
        ("a checkpoint restore starts from the checkpoint's image, not the pool's", restore is not None),
        ("env is set at docker create", bool(spec.env)),
        (f"ports {', '.join(map(str, extra))} are published at docker create (a pooled box publishes "
         f"{_pool.WEB_PORT} only)", bool(extra)),
        ("memory, cpus and pids_limit are set at docker create", bool(spec.resources)),
        ("an egress policy puts the box on its own network at docker create", spec.egress),
        ("secrets are written as the box is made", bool(spec.secrets)),
        ("boot=false asks for a box not booted, and a pooled box is", not boot),
    ):
        if holds:
            return why
    return ""


def create(provider: Provider, spec: BoxSpec, journal: _journal.Journal, fingerprint: str, restore: Any = None,
           boot: bool = True, path: str | None = None) -> tuple[BoxFacts, str]:  # fmt: skip
    """The box `spec` describes: a pooled box claimed when one can serve it, else provider.create. (its facts,
    the pool's line for the create's output: '' when no pool is set for this engine)."""
    facts, line = claim(provider, spec, journal, fingerprint, restore, boot, path)
    return (facts if facts is not None else provider.create(spec)), line


def claim(provider: Provider, spec: BoxSpec, journal: _journal.Journal, fingerprint: str, restore: Any = None,
          boot: bool = True, path: str | None = None) -> tuple[BoxFacts | None, str]:  # fmt: skip
    """(the claimed box's facts, 'claimed <pooled box>') or (None, why not). Never a half box: a claim that
    fails leaves nothing (the pool store's undo), and the caller makes the box as usual."""
    store_of = getattr(provider, "pool_store", None)
    here = {k: v for k, v in _pool.configured(path).items()
            if v.get("provider") == provider.name and v.get("engine") == provider.engine}
    if store_of is None or not here:
        return None, ""  # no pool on this engine: nothing to say
    key = _pool.pool_key(provider.name, provider.engine, fingerprint, None)
    why = unservable(spec, restore, boot)
    if not why and key not in here:
        why = f"no pool is set for image {spec.image} as it is now (playbooks/pool.yml sets one)"
    store = store_of()
    why = why or store.cannot_claim(spec)
    if why:
        return None, f"made, not claimed: {why}"
    try:
        for item in store.pooled(key, _pool.owner(path)):
            if item["state"] != "paused":
                continue
            journal.write(pool_claim=item["container"])  # a claim killed from here on is undone by the refill
            facts = store.claim(item, spec)
            if facts is not None:
                return facts, f"claimed {item['container']}"
    except ProviderError as exc:
        return None, "made, not claimed: " + " ".join(str(exc).split())[:300]
    return None, f"made, not claimed: no pooled box ready in pool {key[:8]} (the host daemon refills it)"


def identity_command(provider: Provider, spec: BoxSpec) -> str | None:
    """A root shell line that writes IDENTITY_FILE: who the box is, for both kinds of box alike; None on a
    provider without a warm pool (no box there is ever a claimed one, and its exec may not run as root)."""
    if getattr(provider, "pool_store", None) is None:
        return None
    env = {k: v for k, v in spec.box_env().items() if k.startswith("AGENTBOX")}
    lines = "".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items())
    return (f"mkdir -p {IDENTITY_FILE.rsplit('/', 1)[0]} && printf '%s' {shlex.quote(lines)} > {IDENTITY_FILE}")
