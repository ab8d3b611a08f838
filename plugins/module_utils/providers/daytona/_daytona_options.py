# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""agentbox_box's cloud create options: disk, network, ephemeral, auto_delete for Daytona (the region is
daytona_target), disk and network (its egress allow list) for boxd, what Daytona's rules on them mean
for a box, and an egress policy (docs/egress.md) as each provider's own network setting.

All of it is checked before anything is made: a bad value, or an option given to a provider that cannot
honour it, fails naming the option and what to do.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any

from ...core._errors import ProviderError
from ...egress._egress_policy import EgressPolicy, check_open_network
from ._daytona_state import network_settings

# Merged into agentbox_box's argument spec (documented in the module).
BOX_OPTIONS: dict[str, dict[str, Any]] = {
    "disk": {"type": "int"},
    "network": {"type": "raw"},
    "ephemeral": {"type": "bool"},
    "auto_delete": {"type": "int"},
}


def network_text(value: Any) -> str | None:
    """`network` as Daytona's one string: 'block_all', '' (open), or CIDRs joined by commas."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if not all(isinstance(item, str) for item in value):
            raise ValueError("network: a list of IPv4 CIDRs (strings such as 10.0.0.0/8), or block_all")
        return ",".join(item.strip() for item in value)
    if not isinstance(value, str):
        raise ValueError("network: block_all, or an IPv4 CIDR or a list of them (10.0.0.0/8)")
    return value


# The options boxd honours too: its disk, and its egress allow list as `network`.
BOXD_OPTIONS = ("disk", "network")


def daytona_options(params: dict[str, Any]) -> dict[str, Any]:
    """DaytonaProvider's keyword arguments for agentbox_box's cloud options; ValueError when one is bad."""
    options: dict[str, Any] = {}
    if params.get("network") is not None:
        text = network_text(params["network"])
        try:
            network_settings(text)
        except ValueError as exc:
            raise ValueError(f"network {text!r}: {exc}") from exc
        options["network"] = text
    disk = params.get("disk")
    if disk is not None:
        if disk < 1:
            raise ValueError(f"disk must be a whole number of GiB, at least 1 (got {disk})")
        options["disk"] = disk
    auto_delete = params.get("auto_delete")
    if auto_delete is not None and auto_delete < -1:
        raise ValueError(
            f"auto_delete must be -1 (never), 0 (as soon as the box stops) or minutes stopped (got {auto_delete})"
        )
    if params.get("ephemeral"):
        if auto_delete not in (None, 0):
            raise ValueError(
                "an ephemeral box is deleted as soon as it stops (auto_delete 0): drop auto_delete, or ephemeral"
            )
        auto_delete = 0
    if auto_delete is not None:
        options["auto_delete"] = auto_delete
    return options


_HOST_NAME = re.compile(r"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def egress_entry_ok(item: str) -> bool:
    """A host name (github.com) or an IP network (10.1.0.0/16, 2001:db8::/32)."""
    try:
        ipaddress.ip_network(item, strict=False)
        return True
    except ValueError:
        return bool(_HOST_NAME.fullmatch(item)) and len(item) <= 253


def boxd_options(params: dict[str, Any]) -> dict[str, Any]:
    """BoxdProvider's keyword arguments for `disk` (GiB) and `network` (boxd's egress allow list: host names
    and CIDRs; boxd offers no block_all, so an empty list leaves the machine open as boxd's default does)."""
    options: dict[str, Any] = {}
    disk = params.get("disk")
    if disk is not None:
        if disk < 1:
            raise ValueError(f"disk must be a whole number of GiB, at least 1 (got {disk})")
        options["disk"] = disk
    text = network_text(params.get("network"))
    if text is not None:
        allowed = [item.strip() for item in text.split(",") if item.strip()]
        if "block_all" in allowed:
            raise ValueError("network: boxd has no block_all; give the hosts and CIDRs the box may reach "
                             "(an allow list such as [github.com, pypi.org])")  # fmt: skip
        bad = [item for item in allowed if not egress_entry_ok(item)]
        if bad:
            raise ValueError(f"network: {', '.join(bad)} is neither a host name nor a CIDR")
        options["egress_allow"] = allowed
    return options


def daytona_egress_network(policy: EgressPolicy) -> dict[str, Any]:
    """Daytona's create parameters for an egress policy: none is network_block_all, open the open network;
    an allowlist names hosts, which Daytona's allow list (IPv4 CIDRs only) cannot hold: ValueError says what
    to write instead."""
    if policy.mode == "none":
        return {"network_block_all": True}
    if policy.mode == "open":
        check_open_network(policy, "Daytona")
        return {}
    raise ValueError("egress: allowlist lets a box reach host names (the default list and egress_allow), and "
                     "Daytona's network allow list takes IPv4 CIDRs only: create the box with network: "
                     "[10.0.0.0/8, ...] or network: block_all instead of egress, or with egress: none or open")


def is_ephemeral(sandbox: Any) -> bool:
    """Daytona deletes the sandbox the moment it stops (auto-delete interval 0)."""
    return getattr(sandbox, "auto_delete_interval", None) == 0


def refuse_if_ephemeral(sandbox: Any, box: str, operation: str) -> None:
    """Daytona deletes an ephemeral sandbox (auto-delete 0) the moment it stops: a pause, a stop or a
    checkpoint (which stops the box) would destroy the agent's work, so they are refused."""
    if is_ephemeral(sandbox):
        raise ProviderError(
            "the box is ephemeral: Daytona deletes it as soon as it stops, so it cannot be paused, stopped or "
            "checkpointed. Destroy it (state: absent) when done, or create boxes without ephemeral to keep them",
            box=box,
            operation=operation,
        )


def refuse_other_region(snapshot: Any, image: str, target: str | None, box: str) -> None:
    """Daytona snapshots live in regions: a create from one in another region is refused (400); say so first."""
    regions = [str(region) for region in (getattr(snapshot, "region_ids", None) or [])]
    if target and regions and target not in regions:
        raise ProviderError(
            f"snapshot {image!r} is only in region {', '.join(regions)} and this box would be made in {target} "
            "(Daytona snapshots are region-scoped): create the box with daytona_target "
            f"{regions[0]} (DAYTONA_TARGET={regions[0]}), or make the snapshot or checkpoint in {target}",
            box=box,
            operation="create",
        )


def env_minutes(name: str, default: int | None, unit: str = "minutes") -> int | None:
    """A whole, non-negative number from the environment variable `name` (`default` when unset)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ProviderError(f"{name}={raw!r} is not a whole number of {unit}") from exc
    if value < 0:
        raise ProviderError(f"{name}={raw!r} is negative: give {unit}, 0 to turn it off")
    return value
