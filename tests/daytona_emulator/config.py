"""Settings of one emulator instance (CLI flags, the fixture's keyword arguments, POST /_emulator/config)."""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_IMAGE = "agentbox/box:latest"
EMULATOR_LABEL = "io.agentbox.emulator"
SANDBOX_LABEL = "io.agentbox.emulator.sandbox"
SNAPSHOT_LABEL = "io.agentbox.emulator.snapshot"

# On by default, as Daytona always behaves so (the real lags vary; these keep the suite quick): a lifecycle call
# first sets the desired state and the state follows, and list() catches up after a create or delete.
DESIRED_STATE_SECONDS = 0.5
LIST_LAG_SECONDS = 0.5

# Settings a running emulator accepts through POST /_emulator/config.
RUNTIME_SETTINGS = (
    "transition_seconds",
    "list_lag_seconds",
    "proxy_timeout_seconds",
    "proxy_cut_mode",
    "minute_seconds",
    "desired_state_seconds",
    "snapshot_activation_seconds",
    "throttle_limits",
    "rename_deleted",
    "build_cache",
    "throttle_window_seconds",
    "toolbox_as_image_user",
    "lookup_cache_seconds",
    "list_page_size",
    "ended_session_answer",
)


@dataclass
class EmulatorConfig:
    host: str = "127.0.0.1"
    port: int = 0
    api_key: str = ""
    image: str = DEFAULT_IMAGE
    # Name of the always-present general snapshot backed by `image`; empty means the image name itself.
    default_snapshot: str = ""
    # The sandbox's reported `user` when a create does not name one; empty means the image's USER, else root.
    default_user: str = ""
    # As on Daytona: the toolbox daemon (so every exec, session and upload) runs as the image's USER, root when
    # the image has none, whatever `user` (os_user) the create named. False: run toolbox calls as `user`.
    toolbox_as_image_user: bool = True
    instance_id: str = field(default_factory=lambda: secrets.token_hex(6))
    organization_id: str = "00000000-0000-4000-8000-00000000e0e0"
    target: str = "us"
    # The regions a create may name as its `target` (others: 404 Region not found). A snapshot taken of a
    # sandbox lives in that sandbox's region only, as on Daytona; other snapshots in every region.
    regions: tuple[str, ...] = ("us", "eu")
    # >0: lifecycle calls answer at once with the transitional state, which lasts at least this long
    # (the SDK then polls every second). 0: the call does the work and answers with the final state.
    transition_seconds: float = 0.0
    # As on Daytona: a deleted sandbox is renamed DESTROYED_<name>_<ms> at once (its name is free again) and
    # lingers, desired state `destroyed`, until it is gone. False: it keeps its name until then.
    rename_deleted: bool = True
    # As on Daytona: a sandbox made from an image (a Dockerfile) reuses the first build of the same Dockerfile
    # text, so `FROM repo:tag` is resolved once and never refreshed. False: resolved again at every create.
    build_cache: bool = True
    # >0: create, start, stop and archive (auto-stop too) first only set the desired state, and the state
    # moves this long later, as on Daytona (the runner acts on the desired state); a create sits in `unknown`.
    desired_state_seconds: float = DESIRED_STATE_SECONDS
    # An activated snapshot is `pending` this long before it is `active` again (the runners pull it back).
    snapshot_activation_seconds: float = 1.0
    # Daytona's named rate limits, e.g. {"sandbox-lifecycle": 2}: calls per window, counted across the routes
    # each covers (authenticated: every API call; sandbox-create; sandbox-lifecycle). Empty: no limits.
    throttle_limits: dict[str, int] = field(default_factory=dict)
    throttle_window_seconds: float = 60.0
    # As Daytona: GET /sandbox/{idOrName} answers from a lookup cache kept this long (10 s), cleared by an update
    # of the sandbox but not by its insert (lookup_cache.py). 0: every get reads the current sandbox.
    lookup_cache_seconds: float = 10.0
    # Sandboxes a list page holds when the client names no limit (Daytona: 100). A small page makes a few
    # sandboxes span pages, as an account with more than a page of them does.
    list_page_size: int = 100
    # A sandbox shows up in list() this long after create, and lingers there this long after delete.
    list_lag_seconds: float = LIST_LAG_SECONDS
    # Toolbox calls running longer than this are cut by the "proxy", like Daytona's ~5 minute cut.
    proxy_timeout_seconds: float = 300.0
    # "504": answer 504 from the proxy; "drop": close the connection.
    proxy_cut_mode: str = "504"
    # What a command sent to a session whose shell has ended gets: "410" (SESSION_ENDED), or "400" ("failed to
    # write command: ... broken pipe", from a daemon that writes the command into the dead shell's stdin).
    ended_session_answer: str = "410"
    # Real seconds in one emulated minute, for the auto-stop/auto-archive/auto-delete timers.
    minute_seconds: float = 60.0
    # Apply cpu/memory to the container (off by default: CI hosts are small).
    enforce_resources: bool = False
    # Box capabilities from the project rules (SYS_ADMIN, NET_ADMIN, /dev/fuse, unconfined profiles).
    box_capabilities: bool = True
    # Push sandbox state changes over Socket.IO (the SDK's waits then end at once instead of polling).
    events: bool = True
    # Leave containers and snapshot images in place when the emulator stops.
    keep_on_exit: bool = False
    request_log_size: int = 2000
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def snapshot_name(self) -> str:
        return self.default_snapshot or self.image

    def public(self) -> dict[str, Any]:
        """The settings without the API key."""
        data = asdict(self)
        data.pop("api_key")
        return data


def validate_runtime_setting(name: str, value: Any) -> Any:
    if name not in RUNTIME_SETTINGS:
        raise ValueError(f"unknown setting {name!r}; settable at run time: {', '.join(RUNTIME_SETTINGS)}")
    if name == "throttle_limits":
        known = {"authenticated", "sandbox-create", "sandbox-lifecycle"}
        if not isinstance(value, dict) or not all(
            key in known and isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0
            for key, limit in value.items()
        ):
            raise ValueError(f"throttle_limits maps throttler names ({', '.join(sorted(known))}) to whole numbers")
        return dict(value)
    if name in ("toolbox_as_image_user", "rename_deleted", "build_cache"):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false")
        return value
    if name == "list_page_size":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 200:
            raise ValueError("list_page_size must be a whole number from 1 to 200")
        return value
    if name == "ended_session_answer":
        if value not in ("410", "400"):
            raise ValueError("ended_session_answer must be '410' or '400'")
        return value
    if name == "proxy_cut_mode":
        if value not in ("504", "drop"):
            raise ValueError("proxy_cut_mode must be '504' or 'drop'")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    if name in ("proxy_timeout_seconds", "minute_seconds", "throttle_window_seconds") and value == 0:
        raise ValueError(f"{name} must be greater than 0")
    return float(value)
