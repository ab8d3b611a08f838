# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The relay applies the idle policy (_idle) by itself, every `interval` seconds (30 by default).

Settings come from the host file ~/.agentbox/idle/policy.json, read again before every pass (so an
edit applies without a restart); every key is optional:

    {"enabled": true, "interval": 30, "max_running": 5, "idle_minutes": 5, "stop_after_hours": 12,
     "include_agentless": false, "scope": "project", "stalled_minutes": 10}

`"enabled": false` (or `"interval": 0`) is the off switch. The environment variable
AGENTBOX_IDLE_INTERVAL, when set in the relay's environment, overrides the interval (0: off).
One pass covers the boxes registered with this relay (the boxes this user made), on every engine
it serves a box on; other boxes on a shared engine are never counted or touched. max_running counts each
project's boxes apart (scope "project", the default): one relay serves every project of the user.

Each pass reads every running box's agent (one exec per box, which the policy needs anyway) and keeps what it
read in ~/.agentbox/relay/agents.json (_agent_record), so the inventory shows agent states without an exec
per box. While the policy is off nothing is read: the record ages out and the states show as unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from ..agent import _agent_record
from ..idle import _idle
from . import _relay_ops
from ._relay_policy import read_settings

LOG = logging.getLogger("agentbox-relay")
DEFAULT_INTERVAL = 30.0
OFF_RETRY = 30.0  # while switched off, how often the file is read again


def policy_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".agentbox", "idle", "policy.json")


def load_policy(path: str | None = None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """{enabled, interval, settings}: the file's values over the defaults; a broken file is reported, not fatal."""
    environ = dict(os.environ if environ is None else environ)
    raw, problem = read_settings(path or policy_path())
    interval = raw.get("interval", DEFAULT_INTERVAL)
    if environ.get("AGENTBOX_IDLE_INTERVAL"):
        interval = environ["AGENTBOX_IDLE_INTERVAL"]
    try:
        interval = float(interval)
    except (TypeError, ValueError):
        problem, interval = f"interval {interval!r} is not a number of seconds", DEFAULT_INTERVAL
    try:
        settings = _idle.validate({key: raw.get(key) for key in _idle.DEFAULTS})
    except ValueError as exc:
        problem, settings = str(exc), None
    enabled = bool(raw.get("enabled", True)) and interval > 0 and settings is not None
    return {"enabled": enabled, "interval": interval if interval > 0 else OFF_RETRY, "settings": settings,
            "problem": problem}  # fmt: skip


def engines_of(registrations: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One registration per provider and engine: the relay's way to reach each engine."""
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    for registration in registrations.values():
        chosen.setdefault((str(registration.get("provider")), str(registration.get("engine"))), registration)
    return [chosen[key] for key in sorted(chosen)]


def one_pass(
    registrations: dict[str, dict[str, Any]], settings: dict[str, Any], busy: set[str] | None = None,
    interval: float = DEFAULT_INTERVAL,
) -> list[dict[str, Any]]:
    """The policy on every engine the relay serves; what was done, logged. An engine that fails is logged, skipped.
    `busy`: ids of boxes with a request in flight, kept running whatever their agent says. The agents read are
    written to the record (_agent_record); a failed engine's earlier reads stay there until they age out."""
    results = []
    read: dict[str, dict[str, Any]] = {}
    for registration in engines_of(registrations):
        provider = None
        try:
            provider = _relay_ops.provider_of(registration)
            served = {box_id for box_id, other in registrations.items()
                      if (other.get("provider"), other.get("engine")) == (registration.get("provider"), registration.get("engine"))}  # fmt: skip
            result = _idle.run_pass(provider, settings, box_ids=served, busy_ids=busy)
        except Exception as exc:  # noqa: BLE001 - one engine down must not stop the policy on the others
            LOG.warning(
                "idle policy on %s %s failed: %s", registration.get("provider"), registration.get("engine"), exc
            )
            continue
        finally:
            with contextlib.suppress(Exception):
                if provider is not None:
                    provider.close()
        for entry in result["boxes"]:
            if entry["action"] != "keep":
                LOG.info("idle policy: %s %s (%s)", entry["action"], entry["name"], entry["reason"])
        for seen in result["agents"]:
            read[seen["id"]] = {"name": seen["name"], "provider": registration.get("provider"),
                                "engine": registration.get("engine"), "read": result["now"], "agent": seen["agent"]}  # fmt: skip
        results.append(result)
    try:
        # Earlier reads of boxes still registered stay (an engine that failed this time); the rest are replaced.
        earlier = _agent_record.load().get("boxes", {})
        kept = {box_id: entry for box_id, entry in earlier.items() if box_id in registrations and box_id not in read}
        _agent_record.write({**kept, **read}, interval)
    except OSError as exc:
        LOG.warning("cannot write the agents' states to %s: %s", _agent_record.record_path(), exc)
    return results


async def run_forever(relay: Any) -> None:
    """Every interval until the relay stops: read the policy file, and apply it when enabled."""
    reported = None
    while not relay.stopping.is_set():
        policy = load_policy()
        if policy["problem"] and policy["problem"] != reported:
            LOG.warning(
                "idle policy file %s: %s (defaults apply where it is unusable)", policy_path(), policy["problem"]
            )
        reported = policy["problem"]
        if policy["enabled"] and relay.registrations:
            try:
                await asyncio.to_thread(one_pass, dict(relay.registrations), policy["settings"], relay.busy(),
                                        policy["interval"])
            except Exception:  # retried at the next interval
                LOG.exception("idle policy pass failed")
        await refill_pools()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(relay.stopping.wait(), policy["interval"])


async def refill_pools() -> None:
    """The warm pools (box/_pool) brought to their size, off the event loop: never on a user's create path."""
    from ..box import _pool

    if not _pool.configured():
        return
    try:
        for report in await asyncio.to_thread(_pool.refill_all):
            for made in report.get("made", []):
                LOG.info("pool: made %s", made)
            for removed in report.get("removed", []):
                LOG.info("pool: removed %s (%s)", removed.get("container") or removed.get("volume"), removed["why"])
            for problem in report.get("problems", []):
                LOG.warning("pool on %s %s: %s", report["provider"], report["engine"], problem)
    except Exception:  # retried at the next interval
        LOG.exception("pool refill failed")
