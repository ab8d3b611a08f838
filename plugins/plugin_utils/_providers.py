# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the `boxes` inventory plugin and the `box` connection plugin share.

Note that this plugin util is PRIVATE to the collection: it can change at any time.

- One Provider per (provider, engine, settings) per process. Ansible builds a new connection
  object for every task; building the provider (and its engine client) again each time is the
  slow part, so the connection asks here.
- Ansible forks a worker per task from a controller that may already hold engine clients (the
  inventory plugin listed the boxes through them). A client's pooled socket must never be used
  by two processes at once, so a forked child forgets every inherited client and opens its own.
- The host variables that carry a box's address from the inventory to the connection.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

from ansible_collections.agentbox.box.plugins.module_utils._provider import Provider, get_provider

# Host variables the inventory sets and the connection plugin reads (its `vars:` entries).
VAR_BOX = "agentbox_box"
VAR_PROVIDER = "agentbox_provider"
VAR_ENGINE = "agentbox_engine"
VAR_DAYTONA_API_URL = "agentbox_daytona_api_url"
VAR_DAYTONA_TARGET = "agentbox_daytona_target"
CONNECTION_PLUGIN = "agentbox.box.box"
LOCAL_ENGINE = "local"

_PROVIDERS: dict[tuple[Any, ...], Provider] = {}
_LOCK = threading.Lock()
_OWNER_PID = os.getpid()
# In a forked child: the parent's providers and clients, kept referenced so they are never
# garbage-collected here. Collecting them would run their finalizers (urllib3 closes its pooled
# connections, paramiko's Channel.__del__ closes the channel), and closing an SSH channel from a
# child waits forever on a transport whose reader thread stayed in the parent.
_INHERITED: list[Any] = []


def _forget_inherited_clients() -> None:
    """Runs in a freshly forked child: set aside (never close, never reuse) the parent's clients."""
    global _OWNER_PID
    _OWNER_PID = os.getpid()
    _INHERITED.extend(_PROVIDERS.values())
    _PROVIDERS.clear()
    # Only if the parent loaded it: importing it here would cost every forked worker the import.
    docker_provider = sys.modules.get("ansible_collections.agentbox.box.plugins.module_utils._docker")
    if docker_provider is not None:
        _INHERITED.extend(docker_provider._CLIENTS.values())
        docker_provider._CLIENTS.clear()


os.register_at_fork(after_in_child=_forget_inherited_clients)


def provider_key(provider: str, engine: str | None, options: dict[str, Any] | None = None) -> tuple[Any, ...]:
    settings = tuple(sorted((k, repr(v)) for k, v in (options or {}).items() if v is not None))
    return (provider, engine or LOCAL_ENGINE, settings)


def provider_for(provider: str, engine: str | None = None, options: dict[str, Any] | None = None) -> Provider:
    """The process-wide Provider for this provider, engine and settings (made on first use)."""
    key = provider_key(provider, engine, options)
    with _LOCK:
        if os.getpid() != _OWNER_PID:  # a fork without the at-fork hook (should not happen)
            _forget_inherited_clients()
        found = _PROVIDERS.get(key)
        if found is not None:
            return found
    kwargs: dict[str, Any] = dict(options or {})
    if provider in ("docker", "docker_ssh"):
        kwargs["engine"] = None if (engine or LOCAL_ENGINE) == LOCAL_ENGINE else engine
    made = get_provider(provider, **kwargs)
    with _LOCK:
        return _PROVIDERS.setdefault(key, made)


def forget_provider(provider: str, engine: str | None = None, options: dict[str, Any] | None = None) -> None:
    """Drop a cached provider (after its engine failed) so the next use reconnects."""
    with _LOCK:
        found = _PROVIDERS.pop(provider_key(provider, engine, options), None)
    if found is not None:
        # A broken provider must not hide the error that got us here.
        with contextlib.suppress(Exception):
            found.close()
        if provider in ("docker", "docker_ssh"):
            try:
                from ansible_collections.agentbox.box.plugins.module_utils._docker import forget_client

                forget_client(found.engine)
            except ImportError:
                pass


def make_unsafe(value: Any) -> Any:
    """Mark engine data as not to be templated (labels and names are agent-controlled)."""
    from ansible.utils.unsafe_proxy import wrap_var

    return wrap_var(value)
