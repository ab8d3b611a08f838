# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daytona provider: boxes as Daytona sandboxes, driven by the official SDK (daytona==0.226.1).

Boxes are found by name with `get` (lists are eventually consistent) and recognised by their
io.agentbox.* labels (the SDK adds its own `code-toolbox-language` label; it is ignored).

The provider is assembled from one file per concern, each class built on the one before:
  _daytona_api.py        the SDK client, calls with bounded retries, errors as ProviderError (DaytonaAPI)
  _daytona_exec.py       commands and files in the box (DaytonaExec)
  _daytona_snapshots.py  snapshots: lookup, activation, waits, list, delete (DaytonaSnapshots)
  _daytona_sandboxes.py  facts and the lifecycle: create, start, stop, pause, resume, destroy (DaytonaSandboxes)
  _daytona.py            DaytonaProvider: the per-process client, checkpoints (commit, DaytonaCheckpoints)
with _daytona_state.py (states), _daytona_options.py (options), _daytona_idle.py (the idle probe)
and _daytona_ssh.py (SSH access) beside them.

Checkpoints are sandbox snapshots: stop, capture, start, boot; the snapshot name carries a nonce (a
checkpoint taken again is captured next to the snapshot it replaces, and names are unique among the
snapshots that exist), and the host manifest maps the checkpoint name to it (`DaytonaCheckpoints`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ...core._boot import boot_box
from ...core._provider import BoxFacts, BoxNotFound, Provider, ProviderError, SshProxy
from ...core._provider import EngineUnreachable as EngineUnreachable  # pylint: disable=useless-import-alias,unused-import
from ...core._shell_line import command_line as command_line  # pylint: disable=useless-import-alias,unused-import
from ...core._shell_line import gib as gib  # pylint: disable=useless-import-alias,unused-import
from .._snapshot_store import SnapshotCheckpoints

# `name as name`: re-exported, the tests (and callers from before the split) read these names here.
from ._daytona_api import MAX_RETRY_AFTER as MAX_RETRY_AFTER  # pylint: disable=useless-import-alias,unused-import
from ._daytona_api import RETRY_DEADLINE_SECONDS as RETRY_DEADLINE_SECONDS  # pylint: disable=useless-import-alias,unused-import
from ._daytona_api import DaytonaAPI, make_client
from ._daytona_api import backoff_delay as backoff_delay  # pylint: disable=useless-import-alias,unused-import
from ._daytona_api import is_retryable as is_retryable  # pylint: disable=useless-import-alias,unused-import
from ._daytona_api import retry_after as retry_after  # pylint: disable=useless-import-alias,unused-import
from ._daytona_exec import EXEC_DIR, FORGET_OUTPUTS_SCRIPT
from ._daytona_exec import LAUNCH_SCRIPT as LAUNCH_SCRIPT  # pylint: disable=useless-import-alias,unused-import
from ._daytona_exec import WAIT_SCRIPT as WAIT_SCRIPT  # pylint: disable=useless-import-alias,unused-import
from ._daytona_exec import parse_wait_output as parse_wait_output  # pylint: disable=useless-import-alias,unused-import
from ._daytona_idle import IDLE_PROBE_SCRIPT as IDLE_PROBE_SCRIPT  # pylint: disable=useless-import-alias,unused-import
from ._daytona_idle import idle_decision as idle_decision  # pylint: disable=useless-import-alias,unused-import
from ._daytona_options import refuse_if_ephemeral
from ._daytona_sandboxes import STOP_TIMEOUT, DaytonaSandboxes, stop_action
from ._daytona_snapshots import SNAPSHOT_TIMEOUT, DaytonaSnapshots
from ._daytona_snapshots import is_registry_reference as is_registry_reference  # pylint: disable=useless-import-alias,unused-import
from ._daytona_state import box_state as box_state  # pylint: disable=useless-import-alias,unused-import
from ._daytona_state import snapshot_usable, state_name

# -- clients ----------------------------------------------------------------------------------------
# One SDK client per (url, key, target) per process: each starts an event thread.
_CLIENTS: dict[tuple[str, str, str], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _forget_inherited_clients() -> None:
    """In a forked child (Ansible forks a worker per task): never reuse the parent's pooled sockets,
    and its event thread did not come along; the child makes its own client on first use."""
    global _CLIENTS_LOCK
    _CLIENTS_LOCK = threading.Lock()
    _CLIENTS.clear()


os.register_at_fork(after_in_child=_forget_inherited_clients)


def _client_for(api_url: str, api_key: str | None, target: str | None) -> Any:
    key = (api_url, api_key or "", target or "")
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = make_client(api_url, api_key, target)
            _CLIENTS[key] = client
        return client


class DaytonaProvider(DaytonaSandboxes, Provider):
    """Boxes as Daytona sandboxes. `engine` is the API URL."""

    name = "daytona"
    shares_host_filesystem = False
    relay_channel = "poll"
    port_urls = "signed"
    ssh_access_expires = True
    resume_restarts_processes = True  # a pause is a stop
    snapshot_stops_box = True

    def __init__(
        self,
        api_key: str | None = None,
        api_url: str | None = None,
        target: str | None = None,
        **options: Any,
    ):
        """`options`: the sandbox settings DaytonaSandboxes takes (retries, exec_slice, idle_timeout,
        auto_stop, auto_archive, disk, network, auto_delete, retry_deadline), passed on as given: one list, there."""
        self._api_key = api_key or os.environ.get("DAYTONA_API_KEY") or None
        super().__init__(api_url, target, **options)  # the DaytonaSandboxes chain, then Provider's

    @property
    def engine(self) -> str:
        return self.api_url

    @property
    def sdk(self) -> Any:
        return _client_for(self.api_url, self._api_key, self.target)

    def reopen_options(self) -> dict[str, Any]:
        return {"api_url": self.api_url}  # the key comes from DAYTONA_API_KEY in the other process

    def ssh_proxy(self, name: str) -> SshProxy:
        from . import _daytona_ssh

        # Through Daytona's SSH gateway with a fresh token; the alias's wake renews one that ran out.
        argv, expires_at = _daytona_ssh.proxy_argv(self, name)
        return SshProxy(argv, expires_at=expires_at)

    def checkpoint_store(self) -> DaytonaCheckpoints:
        """The engine side of checkpoints for _checkpoint: sandbox snapshots, not Docker images."""
        return DaytonaCheckpoints(self)

    # The tests call these under their names from before the split.
    _fail = DaytonaAPI.api_error
    _call = DaytonaAPI.api_call

    def commit(self, name: str, image: str, labels: dict[str, str], env: list[str] | None = None) -> dict[str, Any]:
        """Capture the box as snapshot `image`: stop, snapshot, then start and boot again if it ran.

        Snapshots carry no labels (the manifest keeps them). `image` must be a name no snapshot has
        (Daytona answers 409 for a name in use).
        """
        sandbox = self.get_sandbox(name, "checkpoint")
        if sandbox is None:
            raise BoxNotFound(f"no box called {name!r} on Daytona ({self.api_url})", box=name, operation="checkpoint")
        state = state_name(sandbox.state)
        if state not in ("started", "stopped"):
            raise ProviderError(
                f"the sandbox is {state}: a snapshot is taken of a running or stopped box; start it first",
                box=name,
                operation="checkpoint",
            )
        was_running = state == "started"
        lost: ProviderError | None = None
        if was_running:
            # Finished commands' outputs (kept a while for re-sent waiters) stay out of the snapshot.
            self.exec(name, ["sh", "-c", FORGET_OUTPUTS_SCRIPT, "agentbox-forget", EXEC_DIR], user=None)
        try:
            stopped = self.converge(name, "checkpoint", {"stopped"}, {"started": stop_action}, STOP_TIMEOUT)
            try:
                self.api_call(
                    lambda: stopped.create_snapshot(image, timeout=SNAPSHOT_TIMEOUT),
                    box=name,
                    operation="checkpoint",
                    idempotent=False,
                )
            except ProviderError as exc:
                status = getattr(exc, "status", None)
                if status is not None and 400 <= status < 500 and status not in (408, 429):
                    raise  # refused: no capture started
                # The answer may be lost after the capture started. The snapshot exists only once the capture
                # has ended (Daytona persists it then), so its absence now says nothing: wait for the end.
                lost = exc
            self.converge(name, "checkpoint", {"stopped"}, {}, SNAPSHOT_TIMEOUT)
            snapshot = self.wait_snapshot_active(name, image, lost=lost)
        finally:
            if was_running:
                self.start(name)
                boot_box(self, name)
        size = getattr(snapshot, "size", None) or 0
        return {"id": snapshot.id, "size": int(float(size) * (1 << 30)) if size else 0}

    def close(self) -> None:
        self.sandboxes.clear()
        self.sessions.clear()


# -- checkpoints as snapshots -----------------------------------------------------------------------
class DaytonaCheckpoints(SnapshotCheckpoints):
    """The engine side of checkpoints on Daytona, called by _checkpoint through `checkpoint_store`."""

    kind = "daytona"
    cloud = "Daytona"
    provider: DaytonaSnapshots

    def snapshot(self, image: str) -> Any | None:
        return self.provider.find_snapshot(image)

    def snapshots(self, prefix: str) -> list[Any]:
        return self.provider.list_snapshots(prefix)

    def delete_snapshot(self, image: str) -> bool:
        return self.provider.delete_snapshot(image)

    def usable(self, snapshot: Any | None) -> bool:
        return snapshot_usable(snapshot)  # an inactive snapshot is activated when restored from

    def size_bytes(self, snapshot: Any | None) -> int:
        size = getattr(snapshot, "size", None)
        return int(float(size) * (1 << 30)) if size else 0

    def prepare_capture(self, facts: BoxFacts) -> tuple[list[str], list[str], dict[str, Any]]:
        sandbox = self.provider.cached_sandbox(facts.name, "checkpoint", fresh=True)
        refuse_if_ephemeral(sandbox, facts.name, "checkpoint")
        warnings = ["Daytona checkpoints stop the box while the snapshot is taken: its processes were restarted "
                    "(agentbox-boot ran again)"]
        env = [f"{k}={v}" for k, v in (sandbox.env or {}).items()]
        return warnings, env, {"region": getattr(sandbox, "target", None)}
