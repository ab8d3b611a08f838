# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the `boxes` inventory plugin and the `box` connection plugin share.

Note that this plugin util is PRIVATE to the collection: it can change at any time.

- One Provider per (provider, engine, settings) per process. Ansible builds a new connection
  object for every task; building the provider (and its engine client) again each time is the
  slow part, so the connection asks here.
- Ansible forks a worker per task from a controller that may already hold engine clients (the
  inventory plugin listed the boxes through them). A client's pooled socket must never be used
  by two processes at once, so a forked child opens its own (and leaves the inherited ones be).
- The host variables that carry a box's address from the inventory to the connection.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import Provider
from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import ENGINE_PROVIDERS, get_provider

# Host variables the inventory sets and the connection plugin reads (its `vars:` entries).
VAR_BOX = "agentbox_box"
VAR_PROVIDER = "agentbox_provider"
VAR_ENGINE = "agentbox_engine"
CONNECTION_PLUGIN = "agentbox.box.box"
BOX_PYTHON = "/usr/bin/python3"  # the box image's (Debian's) interpreter
LOCAL_ENGINE = "local"

# Keyed by process id, like the Docker clients in _docker: Ansible forks a worker per task, and a
# child must neither reuse its parent's providers (their pooled sockets) nor drop them. Dropping
# would run their finalizers, and closing an inherited SSH channel waits forever on a transport
# whose reader thread stayed in the parent. The parent's entries just stay in the dict, unused.
_PROVIDERS: dict[tuple[Any, ...], Provider] = {}
_LOCK = threading.Lock()


def provider_key(provider: str, engine: str | None, options: dict[str, Any] | None = None) -> tuple[Any, ...]:
    settings = tuple(sorted((k, repr(v)) for k, v in (options or {}).items() if v is not None))
    return (os.getpid(), provider, engine or LOCAL_ENGINE, settings)


def provider_for(provider: str, engine: str | None = None, options: dict[str, Any] | None = None) -> Provider:
    """The process-wide Provider for this provider, engine and settings (made on first use)."""
    key = provider_key(provider, engine, options)
    with _LOCK:
        found = _PROVIDERS.get(key)
        if found is not None:
            return found
    kwargs: dict[str, Any] = dict(options or {})
    if provider in ENGINE_PROVIDERS:
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
            found.discard()


def make_unsafe(value: Any) -> Any:
    """Mark engine data as not to be templated (labels and names are agent-controlled)."""
    from ansible.utils.unsafe_proxy import wrap_var

    return wrap_var(value)
