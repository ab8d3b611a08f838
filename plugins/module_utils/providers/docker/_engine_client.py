# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Docker SDK client of an engine (local, or over SSH), one per engine per process, and the one
message for an engine that does not answer or answers with an error. The Docker provider (_docker.py)
uses it; the two kinds of engine differ only here.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ...core._provider import BoxNotFound, EngineUnreachable, ProviderError
from . import _box_engine

API_TIMEOUT = 120

# The docker SDK is imported on first use: the per-task calls (list, find, exec, archives), a box's
# create, removal and state changes, and checkpoints go through _engine_api on engines it reaches,
# and must not pay for it. Until sdk() rebinds it, the SDK's exception name below is a stand-in
# that nothing raises: no SDK exception can exist before the SDK is loaded, so an `except` clause
# naming it never catches anything.
class _DockerExceptionStandIn(Exception):
    """Caught before the SDK is loaded: nothing raises it."""


docker: Any = None
DockerException: Any = _DockerExceptionStandIn


def sdk() -> Any:
    global docker, DockerException
    if docker is None:
        try:
            import docker as package
            from docker import errors
        except ImportError as exc:
            raise ProviderError(f"the Python 'docker' package is required on the controller: {exc}") from exc
        DockerException = errors.DockerException
        docker = package
    return docker


# One client per engine per process: Ansible builds a new connection object for every task,
# and the inventory lists many engines; reconnecting each time is the slow part.
_CLIENTS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()
# Engine API versions seen answering; unlike clients, safe to inherit across a fork.
_API_VERSIONS: dict[str, str] = {}


def engine_unreachable(engine: str, exc: Exception, docker_host: str | None = None) -> EngineUnreachable:
    """The one message for an engine that does not answer: where it was looked for, and what to do."""
    if engine == "local" and docker_host and docker_host == _box_engine.box_engine_host():
        return EngineUnreachable(f"the box engine at {docker_host} does not answer ({exc}): {_box_engine.START_HINT}")
    where = (docker_host or _box_engine.user_engine_host()) if engine == "local" else engine
    return EngineUnreachable(
        f"the Docker engine at {where} does not answer ({exc}). Start it (scripts/ensure-docker.sh "
        "starts a local one) or point DOCKER_HOST at a running engine."
    )


def engine_error(
    status: int | None, text: str, name: str, operation: str, engine: str, missing: str | None = None
) -> ProviderError:
    """One ProviderError for an engine's error answer, whichever client got it. `missing` is the
    message for a 404 about something other than the container (a path in it)."""
    if "is paused" in text:
        return ProviderError(
            "the box is paused: resume it (playbooks/box_state.yml -e state=started) and try again",
            box=name,
            operation=operation,
        )
    if "is not running" in text:
        return ProviderError(
            "the box is stopped: start it (playbooks/box_state.yml -e state=started) and try again",
            box=name,
            operation=operation,
        )
    if status == 404 and "no such container" in text.lower():
        return BoxNotFound(f"no box called {name!r} on engine {engine}", box=name, operation=operation)
    if status == 404 and missing:
        return ProviderError(missing, box=name, operation=operation)
    return ProviderError(text, box=name, operation=operation)


def client_for(engine: str, ssh_options: dict[str, Any] | None = None, docker_host: str | None = None) -> Any:
    sdk()
    # Keyed by pid too: a forked Ansible worker must not share its parent's connection.
    key = f"{os.getpid()}:{engine}:{docker_host or ''}"
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is not None:
            return client
        try:
            if engine == "local":
                # A worker forked from a process that already reached this engine knows its API
                # version: skip the /version and /_ping round trips every new client would make.
                known = _API_VERSIONS.get(key.split(":", 1)[1])
                environment = {**os.environ, "DOCKER_HOST": docker_host} if docker_host else None
                client = docker.from_env(timeout=API_TIMEOUT, version=known or "auto", environment=environment)
                if not known:
                    client.api.ping()
                    _API_VERSIONS[key.split(":", 1)[1]] = client.api.api_version
            else:
                from ...ssh._ssh import docker_client_over_ssh

                client = docker_client_over_ssh(engine, timeout=API_TIMEOUT, **(ssh_options or {}))
                client.api.ping()
        except DockerException as exc:
            raise engine_unreachable(engine, exc, docker_host) from exc
        _CLIENTS[key] = client
        return client


def forget_client(engine: str, docker_host: str | None = None) -> None:
    with _CLIENTS_LOCK:
        client = _CLIENTS.pop(f"{os.getpid()}:{engine}:{docker_host or ''}", None)
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing a dead client must not mask the real error
            pass
