# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""boxd machine states and names, as data (no SDK, no I/O): what each status means for a box.

| boxd status | box state | exec | to start it |
|---|---|---|---|
| pending, starting, creating, booting, running | running | yes | - |
| migrating (moving to another worker: its processes keep running) | running | waited for, then yes | - |
| suspending, suspended | paused | yes: the machine wakes on exec | resume |
| hibernating, hibernated | paused | yes: the machine wakes on exec | wake |
| stopping, stopped, failed | stopped | refused (a conflict naming the stopped machine) | start, poll to running |
| destroyed, or not listed | missing | - | - |

The SDK's statuses (boxd==0.2.19, `boxd.models.MachineStatus`): pending, starting, running, suspended,
hibernated, stopped, failed, destroyed, migrating; the others are transitions a server may report.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re

from ...egress._egress_policy import EgressPolicy, check_open_network

RUNNING = frozenset({"running"})
COMING_UP = frozenset({"starting", "creating", "booting", "pending", "scheduled", "migrating"})
SUSPENDED = frozenset({"suspending", "suspended"})  # in memory: `resume` brings it back
HIBERNATED = frozenset({"hibernating", "hibernated"})  # on disk: `wake` brings it back, not `resume`
ASLEEP = SUSPENDED | HIBERNATED
DOWN = frozenset({"stopping", "stopped", "failed"})
GONE = frozenset({"destroyed", "destroying", "deleted"})
# A machine in one of these settled states needs no wait: asleep ones wake on the next exec.
READY = RUNNING | frozenset({"suspended", "hibernated"})
MACHINE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
NAME_PREFIX = "agentbox-"


def box_state(status: str) -> str:
    """The collection's state (running, paused, stopped, missing) of a boxd status."""
    status = (status or "").lower()
    if status in RUNNING or status in COMING_UP:
        return "running"
    if status in ASLEEP:
        return "paused"
    if status in GONE:
        return "missing"
    return "stopped"  # stopped, failed and anything unknown: a start is what brings it back


def needs_start(status: str) -> bool:
    return (status or "").lower() in DOWN


def is_ready(status: str) -> bool:
    return (status or "").lower() in READY


def conflict_names_stopped(message: str) -> bool:
    """The one exec error that is safe to retry: boxd refused before running anything because the
    machine is stopped (the seed's production notes); anything else may have run the command."""
    return bool(re.search(r"\b(stopped|not running)\b", message or "", re.I))


def machine_name(box: str, prefix: str = NAME_PREFIX) -> str:
    """The boxd machine name of a box: DNS-like (lowercase, digits, '-'); a box name that needs changing
    gets a short hash of itself so two boxes never map to one machine."""
    base = re.sub(r"[^a-z0-9-]", "-", f"{prefix}{box}".lower()).strip("-")
    if base == f"{prefix}{box}" and MACHINE_NAME.fullmatch(base):
        return base
    digest = hashlib.sha1(box.encode()).hexdigest()[:6]
    return f"{base[:55].rstrip('-')}-{digest}"


# boxd has no block_all and an empty list leaves a machine open: `egress: none` is an allow list naming only a
# host that never resolves (RFC 6761 reserves .invalid), so nothing is let out.
NOTHING_HOST = "nothing.invalid"


def egress_allow_for(policy: EgressPolicy) -> list[str]:
    """boxd's egress allow list for an egress policy (docs/egress.md; boxd takes host names, `*.` wildcards and
    public IPv4 addresses): none lets nothing out (NOTHING_HOST), open is boxd's open network ([]), an
    allowlist its hosts. ValueError says what to write instead of an entry boxd cannot take."""
    if policy.mode == "none":
        return [NOTHING_HOST]
    if policy.mode == "open":
        check_open_network(policy, "boxd")
        return []
    hosts = list(policy.allowed_hosts())
    bad = []
    for host in hosts:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            continue
        if address.version != 4 or not address.is_global:
            bad.append(host)
    if bad:
        raise ValueError(f"egress_allow {', '.join(bad)}: boxd's allow list takes host names and public IPv4 "
                         "addresses only: name the host instead, or leave the entry out")
    return hosts
