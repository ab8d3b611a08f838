# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daytona sandboxes as boxes, for the daytona provider: facts, create, start, stop, pause, resume and
destroy, each driven to its state by reading it again (never by re-sending a lifecycle call blindly).

  * lifecycle calls (start, stop, archive, delete) never re-POST blindly: after a failure the state
    is read again and the call is only made again when the sandbox is still where it was;
  * a create is never re-sent after an ambiguous failure (dropped answer, 5xx, timeout): the sandbox
    is looked up by name and adopted when it carries this box's id.

Pause is stop then archive (archive only from stopped); resume is start, and runs the in-box start
sequence again (a stopped sandbox lost its processes).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from ...core._boot import boot_box
from ...core._naming import BOX_USER, SECRETS_DIR, label, strip_labels
from ...core._provider import BoxFacts, BoxNotFound, BoxSpec, ProviderError, own_network
from ...core._shell_line import gib
from ...egress._egress_policy import EgressPolicy
from .._snapshot_store import parse_snapshot_name
from ._daytona_api import (
    API_TIMEOUT,
    DEFAULT_API_URL,
    DEFAULT_RETRIES,
    HAS_DAYTONA,
    POLL_SECONDS,
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    DaytonaCallError,
    DaytonaConflictError,
    Image,
    ListSandboxesQuery,
    Resources,
    SandboxListSortDirection,
    SandboxListSortField,
    backoff_delay,
    is_api_error,
    is_retryable,
    is_transport_error,
    status_of,
)
from ._daytona_exec import DEFAULT_EXEC_SLICE
from ._daytona_idle import DEFAULT_IDLE_MINUTES, IDLE_LABEL
from ._daytona_options import (
    daytona_egress_network,
    env_minutes,
    is_ephemeral,
    refuse_if_ephemeral,
    refuse_other_region,
)
from ._daytona_snapshots import DaytonaSnapshots
from ._daytona_state import (
    FAILED_STATES,
    TRANSITIONAL,
    box_state_of,
    changing,
    desired_name,
    keeps_memory,
    live_sandboxes,
    network_settings,
    settled,
    state_name,
)

WEB_PORT = 80
CREATE_TIMEOUT = 600.0
START_TIMEOUT = 300.0
STOP_TIMEOUT = 120.0
PREVIEW_TTL_SECONDS = 3600
ADOPT_WAIT_SECONDS = 15.0


def local_image_info(image: str) -> dict[str, Any] | None:
    """The local engine's inspect of `image`; None when it has no such image or there is no engine to ask."""
    from ..docker._engine_api import EngineAPIError, EngineUnanswered, local_engine

    try:
        engine = local_engine(timeout=10)
        return engine.inspect_image(image) if engine is not None else None
    except (EngineAPIError, EngineUnanswered, OSError):
        return None


def pinned_image(
    image: str, inspect: Callable[[str], dict[str, Any] | None] = local_image_info
) -> tuple[Any, str | None]:
    """What to build a sandbox from so that Daytona's build cache, keyed by the Dockerfile's text, follows the
    image's content, and a warning when it cannot: `repo@sha256:<digest>` when the local engine knows the
    registry digest of that tag; else, when it knows the image, `FROM image` plus a label naming the image id
    (a new id, a new Dockerfile); else the reference as given, with a warning (a tag that moves later may then
    be served from an older build)."""
    if "@sha256:" in image:
        return image, None
    info = inspect(image)
    if not info:
        return image, (
            f"image {image!r} is not on this machine's Docker engine, so it goes to Daytona by its tag, unpinned: "
            "Daytona builds a tag once and reuses that build, so a later push under the same tag is not picked up. "
            "Give the image by digest (repo@sha256:...), a new tag per build, or pull it here first"
        )
    repository = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    for digest in info.get("RepoDigests") or []:
        if digest.split("@", 1)[0] == repository:
            return digest, None
    return Image.base(image).dockerfile_commands([f"LABEL io.agentbox.image-id={info['Id']}"]), None


class DaytonaSandboxes(DaytonaSnapshots):
    """The box lifecycle on Daytona, with the provider's settings for the sandboxes it makes."""

    def __init__(
        self,
        api_url: str | None = None,
        target: str | None = None,
        *,
        retries: int | None = None,
        exec_slice: int | None = None,
        idle_timeout: int | None = None,
        auto_stop: int | None = None,
        auto_archive: int | None = None,
        disk: int | None = None,
        network: str | None = None,
        auto_delete: int | None = None,
        retry_deadline: float | None = None,
        **_ignored: Any,
    ):
        slice_env = env_minutes("AGENTBOX_DAYTONA_EXEC_SLICE", None, "seconds")
        super().__init__(
            (api_url or os.environ.get("DAYTONA_API_URL") or DEFAULT_API_URL).rstrip("/"),
            DEFAULT_RETRIES if retries is None else max(0, int(retries)),
            int(exec_slice or slice_env or DEFAULT_EXEC_SLICE),
        )
        self.target = target or os.environ.get("DAYTONA_TARGET") or None
        self._idle_timeout = (
            idle_timeout if idle_timeout is not None else env_minutes("AGENTBOX_IDLE_TIMEOUT", DEFAULT_IDLE_MINUTES)
        )
        # Daytona's own auto-stop: the backstop when no reaper runs (any API traffic resets it).
        default_stop = max(15, 2 * (self._idle_timeout or DEFAULT_IDLE_MINUTES))
        self._auto_stop = (
            auto_stop if auto_stop is not None else env_minutes("AGENTBOX_DAYTONA_AUTO_STOP", default_stop)
        )
        self._auto_archive = (
            auto_archive if auto_archive is not None else env_minutes("AGENTBOX_DAYTONA_AUTO_ARCHIVE", None)
        )
        # Disk in GiB for a box made from an image (Daytona's default is 3; Docker in the box wants more).
        self._disk = disk if disk is not None else env_minutes("AGENTBOX_DAYTONA_DISK", None, "GiB")
        self._network_option = network is not None  # the create option, not the environment's default
        raw_network = network if network is not None else os.environ.get("AGENTBOX_DAYTONA_NETWORK")
        try:
            self._network = network_settings(raw_network)
        except ValueError as exc:
            source = "network" if network is not None else "AGENTBOX_DAYTONA_NETWORK"
            raise ProviderError(f"{source}={raw_network!r}: {exc}") from exc
        self._auto_delete = auto_delete  # minutes stopped before Daytona deletes the box; 0: ephemeral
        if retry_deadline is not None:  # the tests' shorter deadline; the collection keeps the default
            self.retry_deadline = float(retry_deadline)

    def egress_network(self, policy: EgressPolicy) -> bool:
        self._network = own_network("Daytona", self._network_option, lambda: daytona_egress_network(policy),
                                    "egress: none is network: block_all")  # in place of AGENTBOX_DAYTONA_NETWORK's
        return True

    def _facts(self, sandbox: Any, web_url: str | None = None) -> BoxFacts:
        labels = strip_labels(dict(sandbox.labels or {}))
        return BoxFacts(
            name=labels.get("box", sandbox.name),
            id=labels.get("id", ""),
            provider=self.name,
            engine=self.api_url,
            state=box_state_of(sandbox),
            container=sandbox.id,
            image=labels.get("image") or getattr(sandbox, "snapshot", None) or "",
            project=labels.get("project", ""),
            workspace=labels.get("workspace", ""),
            branch=labels.get("branch", ""),
            created=labels.get("created", ""),
            ports={},
            labels=labels,
            checkpoint=labels.get("checkpoint") or None,
            web_url=web_url,
            ephemeral=is_ephemeral(sandbox),
        )

    def _owned(self, sandbox: Any, name: str) -> Any:
        if label("box") not in (sandbox.labels or {}):
            raise ProviderError(
                f"a Daytona sandbox called {name!r} exists but was not made by agentbox (no io.agentbox.box label); "
                "pick another box name or delete that sandbox",
                box=name,
            )
        return sandbox

    def web_url(self, name: str, expires_in: int = PREVIEW_TTL_SECONDS, port: int = WEB_PORT) -> str | None:
        """A signed preview URL of a port of the box (its web port by default; works without
        headers, until it expires)."""
        sandbox = self.cached_sandbox(name, "preview URL")
        preview = self.api_call(
            lambda: sandbox.create_signed_preview_url(port, expires_in_seconds=expires_in, request_timeout=API_TIMEOUT),
            box=name,
            operation="preview URL",
        )
        return getattr(preview, "url", None)

    def preview_url(self, name: str, port: int, expires_in: int = PREVIEW_TTL_SECONDS) -> str:
        """A signed preview URL of any port of the box, valid `expires_in` seconds (no header needed: treat it
        as a credential)."""
        sandbox = self.cached_sandbox(name, "preview URL")
        preview = self.api_call(
            lambda: sandbox.create_signed_preview_url(port, expires_in_seconds=expires_in, request_timeout=API_TIMEOUT),
            box=name,
            operation=f"preview URL of port {port}",
        )
        return str(preview.url)

    def ssh_access(self, name: str, minutes: int = 60) -> dict[str, str]:
        """A Daytona SSH access token for the box: {command, token, expires_at}. The token is a credential."""
        sandbox = self.cached_sandbox(name, "SSH access")
        access = self.api_call(
            lambda: sandbox.create_ssh_access(expires_in_minutes=minutes, request_timeout=API_TIMEOUT),
            box=name,
            operation="SSH access",
            idempotent=False,
        )
        return {"command": access.ssh_command, "token": access.token, "expires_at": str(access.expires_at)}

    def _facts_with_url(self, sandbox: Any, name: str) -> BoxFacts:
        url = None
        if state_name(sandbox.state) == "started" and settled("started", desired_name(sandbox)):
            try:
                url = self.web_url(name)
            except ProviderError:
                url = None  # a missing preview link never hides the box itself
        return self._facts(sandbox, url)

    # -- discovery ------------------------------------------------------------------------------
    def find(self, name: str) -> BoxFacts | None:
        sandbox = self.get_sandbox(name, "find")
        if sandbox is None:
            return None
        return self._facts_with_url(self._owned(sandbox, name), name)

    def list_boxes(self, project: str | None = None) -> list[BoxFacts]:
        wanted = {label("kind"): "box"}
        if project:
            wanted[label("project")] = project
        # Oldest first by creation: the service's default order (last activity, newest first) moves a box used
        # while the pages are fetched ahead of the keyset cursor, and the listing would miss it. A creation
        # time never changes; a box made meanwhile comes on the last page.
        query = ListSandboxesQuery(labels=wanted, sort=SandboxListSortField.CREATEDAT,
                                   order=SandboxListSortDirection.ASC)  # fmt: skip
        found = self.api_call(
            lambda: list(self.sdk.list(query, request_timeout=API_TIMEOUT)),
            box=None,
            operation="list boxes",
        )
        boxes = [self._facts(s) for s in live_sandboxes(found)]
        return sorted(boxes, key=lambda facts: facts.name)

    # -- lifecycle ------------------------------------------------------------------------------
    def _create_params(self, spec: BoxSpec) -> Any:
        labels = {**spec.labels, label("image"): spec.image}
        if self._idle_timeout:
            labels[label(IDLE_LABEL)] = str(self._idle_timeout)
        common: dict[str, Any] = {
            "name": spec.name,
            "os_user": BOX_USER,
            "env_vars": spec.box_env(),
            "labels": labels,
            "public": False,
            "auto_stop_interval": self._auto_stop,
        }
        if self._auto_archive is not None:
            common["auto_archive_interval"] = self._auto_archive
        if self._auto_delete is not None:
            common["auto_delete_interval"] = self._auto_delete
        common.update(self._network)
        resources = dict(spec.resources or {})
        unsupported = sorted(set(resources) - {"memory", "cpus"})
        if unsupported:
            raise ProviderError(
                f"resources {', '.join(unsupported)} cannot be set on Daytona (memory and cpus can, for a box made "
                "from an image)",
                box=spec.name,
                operation="create",
            )
        snapshot = self.ready_snapshot(spec.image, spec.name)
        if snapshot is not None:
            refuse_other_region(snapshot, spec.image, self.target, spec.name)
            if self._disk:
                raise ProviderError(
                    f"disk (AGENTBOX_DAYTONA_DISK) cannot apply to a box started from the Daytona snapshot {spec.image!r} "
                    "(its disk comes from the snapshot): make the snapshot with the disk you want, or use a "
                    "registry image",
                    box=spec.name,
                    operation="create",
                )
            if resources:
                raise ProviderError(
                    f"resources cannot be set for a box started from the Daytona snapshot {spec.image!r} (its size "
                    "comes from the snapshot): drop 'resources', or use a registry image",
                    box=spec.name,
                    operation="create",
                )
            return CreateSandboxFromSnapshotParams(snapshot=spec.image, **common)
        sizes = None
        if resources or self._disk:
            sizes = Resources(
                cpu=max(1, math.ceil(float(resources["cpus"]))) if resources.get("cpus") else None,
                memory=gib(resources["memory"]) if resources.get("memory") else None,
                disk=self._disk or None,
            )
        image, warning = pinned_image(spec.image)
        if warning:
            self.warn(warning)
        return CreateSandboxFromImageParams(image=image, resources=sizes, **common)

    def create(self, spec: BoxSpec) -> BoxFacts:
        params = self._create_params(spec)
        try:
            sandbox = self._create_once(spec, params)
        except BaseException as exc:
            # A create that failed leaves nothing: e.g. the SDK's wait saw build_failed (an error without a
            # status), after which the sandbox is adopted, found failed, and must not stay behind. The error
            # says what became of it (never "destroy it": it is gone, or its delete failed and says so).
            outcome = self._discard_own(spec)
            if outcome and isinstance(exc, ProviderError):
                exc.args = (f"{exc}; {outcome}",)  # in place: its type, box, operation and status stay
            raise
        try:
            if parse_snapshot_name(spec.image) is not None:
                self._after_restore(spec.name)
            if spec.secrets:
                self.write_secrets(spec.name, spec.secrets)
            return self._facts_with_url(sandbox, spec.name)
        except BaseException:
            self._destroy_quietly(spec.name)
            raise

    def _create_once(self, spec: BoxSpec, params: Any) -> Any:
        """POST the create once; after an ambiguous failure adopt the sandbox by name, never re-POST."""
        attempt = 0
        while True:
            try:
                sandbox = self.sdk.create(params, timeout=CREATE_TIMEOUT)
                self.sandboxes[spec.name] = sandbox
                return sandbox
            except Exception as exc:
                if not is_api_error(exc):
                    raise
                status = status_of(exc)
                if (HAS_DAYTONA and isinstance(exc, DaytonaConflictError)) or status == 409:
                    adopted = self._adopt(spec, wait=0)
                    if adopted is not None:
                        return adopted
                    raise ProviderError(
                        f"a Daytona sandbox called {spec.name!r} already exists and is not this box: pick another "
                        "name, or destroy that box first",
                        box=spec.name,
                        operation="create",
                    ) from exc
                if status == 429 and attempt < self.retries:
                    # Refused before any work: nothing was created, so asking again is safe.
                    if self._adopt(spec, wait=0) is None:
                        time.sleep(backoff_delay(attempt, exc))
                        attempt += 1
                        continue
                ambiguous = is_retryable(exc) or status is None or status >= 500
                if ambiguous:
                    adopted = self._adopt(spec, wait=ADOPT_WAIT_SECONDS)
                    if adopted is not None:
                        return adopted
                    raise self.api_error(exc, spec.name, "create") from exc
                # A definite refusal (4xx) or a sandbox that reached an error state: nothing usable stays
                # (create() deletes what carries this box's id).
                raise self.api_error(exc, spec.name, "create") from exc

    def _discard_own(self, spec: BoxSpec) -> str | None:
        """Delete the sandbox called spec.name when it is this box's (its io.agentbox.id), never another's.
        What became of it, for the create's error: None when there was none of ours."""
        try:
            sandbox = self.get_sandbox(spec.name, "create")
            if sandbox is None or (sandbox.labels or {}).get(label("id")) != spec.box_id:
                return None
            self.destroy(spec.name)
        except ProviderError as exc:
            return (f"deleting the sandbox it made failed too ({exc}): delete the box (state: absent) before "
                    "creating it again")  # fmt: skip
        return "the sandbox it made was deleted, nothing is left"

    def _adopt(self, spec: BoxSpec, wait: float) -> Any | None:
        """The sandbox a lost create answer made, when it is this box's (same io.agentbox.id)."""
        deadline = time.monotonic() + wait
        while True:
            sandbox = self.get_sandbox(spec.name, "create")
            if sandbox is not None:
                if (sandbox.labels or {}).get(label("id")) != spec.box_id:
                    return None
                # No "destroy it" advice on failure: create() deletes the sandbox and says so.
                return self.converge(spec.name, "create", {"started"}, {}, START_TIMEOUT, advice="")
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_SECONDS)

    def _after_restore(self, name: str) -> None:
        """A box from a checkpoint snapshot: its root is layered over the snapshot, where a directory that
        came with a lower layer cannot be renamed (EXDEV). dockerd renames /var/lib/docker/runtimes at every
        start and refuses to start when it cannot; the directory is rebuilt at start, so it goes."""
        self.exec(name, ["rm", "-rf", "/var/lib/docker/runtimes"], user="root").check("preparing in-box Docker", name)

    def write_secrets(self, name: str, values: dict[str, str]) -> None:
        """Each secret a file on a tmpfs: never in env, labels, session history or snapshots."""
        script = (
            f'd={SECRETS_DIR}; mkdir -p "$d"; '
            'if ! mountpoint -q "$d" 2>/dev/null && ! mount -t tmpfs -o mode=0700,uid=$1,gid=$1,size=1m '
            'agentbox-secrets "$d" 2>/dev/null; then '
            # No tmpfs mount allowed: keep the files on /dev/shm (a tmpfs too) behind a link.
            'rmdir "$d" 2>/dev/null; mkdir -p -m 0700 /dev/shm/agentbox-secrets; '
            'chown "$1:$1" /dev/shm/agentbox-secrets; ln -sfn /dev/shm/agentbox-secrets "$d"; fi; '
            'chown "$1:$1" "$d"; chmod 0700 "$d"'
        )
        self.exec(name, ["sh", "-c", script, "secrets", "1000"], user="root").check("making the secrets tmpfs", name)
        sandbox = self.cached_sandbox(name, "secrets")
        for key, value in values.items():
            if "/" in key or key in ("", ".", ".."):
                raise ProviderError(f"secret name {key!r} is not a file name", box=name, operation="secrets")
            path = f"{SECRETS_DIR}/{key}"
            data = value.encode("utf-8")
            try:
                self.api_call(
                    lambda path=path, data=data: sandbox.fs.upload_file_stream(data, path, timeout=API_TIMEOUT),
                    box=name,
                    operation="writing secrets",
                )
                check = self.exec(name, ["sh", "-c", 'test "$(wc -c < "$1")" -eq "$2"', "check", path, str(len(data))])
                if check.rc == 0:
                    continue
            except ProviderError:
                pass
            # The upload could not reach the tmpfs (the local emulator writes through the Docker archive API,
            # which does not see tmpfs mounts): the value passes as stdin, through a file deleted at once.
            self.exec(name, ["sh", "-c", 'umask 077; cat > "$1"', "secret", path], stdin=data).check(
                f"writing secret {key}", name
            )
        # Uploaded files belong to the daemon's user (root on Daytona): hand them to the box user.
        self.exec(
            name,
            ["sh", "-c", f'chown "$1:" {SECRETS_DIR}/*; chmod 0600 {SECRETS_DIR}/*', "secrets", BOX_USER],
            user="root",
        ).check("handing the secrets to the box user", name)

    def converge(
        self,
        name: str,
        operation: str,
        wanted: set[str],
        actions: dict[str, Callable[[Any], Any]],
        timeout: float,
        advice: str = ": destroy it and create it again",
    ) -> Any:
        """Drive the sandbox to one of `wanted` states: read, act once, read again (never blind re-POSTs).
        `advice` ends the message when the sandbox failed for good."""
        deadline = time.monotonic() + timeout
        failures = 0
        recoveries = 0
        retry_until: float | None = None  # the overall retry deadline, as api_call's, from the first retry
        while True:
            sandbox = self.get_sandbox(name, operation)
            if sandbox is None:
                raise BoxNotFound(f"no box called {name!r} on Daytona ({self.api_url})", box=name, operation=operation)
            state = state_name(sandbox.state)
            desired = desired_name(sandbox)
            # Reached only when the sandbox is also heading there: `started` with desired `stopped` (a stop or
            # an auto-stop under way) is about to stop, not started.
            if state in wanted and settled(state, desired):
                return sandbox
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"the sandbox is still {state} after {timeout:.0f} s (wanted {' or '.join(sorted(wanted))}); "
                    "check it in the Daytona dashboard and try again",
                    box=name,
                    operation=operation,
                )
            if state in FAILED_STATES:
                reason = getattr(sandbox, "error_reason", None) or "no reason given"
                if state != "error" or not getattr(sandbox, "recoverable", False) or recoveries:
                    raise ProviderError(
                        f"the sandbox is in state {state} ({reason}) and Daytona cannot recover it{advice}",
                        box=name,
                        operation=operation,
                    )
                # Daytona says it can repair this one (a full disk, a lost runner): recover() starts it again.
                recoveries += 1
                action: Callable[[Any], Any] | None = _recover_action
            elif changing(state, desired):
                time.sleep(POLL_SECONDS)  # the service is moving it (desired state set): acting now would 409
                continue
            else:
                action = actions.get(state)
            if action is None:
                if state in TRANSITIONAL:
                    time.sleep(POLL_SECONDS)
                    continue
                raise ProviderError(f"cannot {operation} a sandbox in state {state}", box=name, operation=operation)
            try:
                action(sandbox)
            except Exception as exc:
                if not is_api_error(exc):
                    raise
                if (HAS_DAYTONA and isinstance(exc, DaytonaConflictError)) or status_of(exc) == 409:
                    time.sleep(POLL_SECONDS)  # a transition is in progress: wait for it
                    continue
                if is_retryable(exc) and failures < self.retries:
                    delay = backoff_delay(failures, exc)
                    retry_until = retry_until or time.monotonic() + self.retry_deadline
                    if time.monotonic() + delay > retry_until:
                        raise self.api_error(exc, name, operation, failures + 1, self.retry_deadline) from exc
                    time.sleep(delay)
                    failures += 1
                    continue
                if status_of(exc) is None and not is_transport_error(exc) and failures < self.retries:
                    # The SDK's own wait ran out or saw a transient state: read the state again.
                    failures += 1
                    continue
                raise self.api_error(exc, name, operation, failures + 1) from exc

    def start(self, name: str) -> BoxFacts:
        sandbox = self.converge(
            name,
            "start",
            {"started"},
            {s: _start_action for s in ("stopped", "archived", "archiving", "paused")},
            START_TIMEOUT,
        )
        self.sessions.discard(sandbox.id)
        return self._facts_with_url(sandbox, name)

    def stop(self, name: str) -> BoxFacts:
        current = self.get_sandbox(name, "stop")
        if current is not None:
            refuse_if_ephemeral(current, name, "stop")
        sandbox = self.converge(
            name, "stop", {"stopped", "archived", "archiving"}, {"started": stop_action}, STOP_TIMEOUT
        )
        self.sessions.discard(sandbox.id)
        return self._facts(sandbox)

    def pause(self, name: str) -> BoxFacts:
        """Stop, then archive (Daytona archives only a stopped sandbox); a linux-vm sandbox is paused instead,
        keeping its memory, so the agent in it is not killed."""
        current = self.get_sandbox(name, "pause")
        if current is not None:
            refuse_if_ephemeral(current, name, "pause")
        if current is not None and keeps_memory(current):
            sandbox = self.converge(name, "pause", {"paused"}, {"started": _pause_action}, STOP_TIMEOUT)
            self.sessions.discard(sandbox.id)
            return self._facts(sandbox)
        sandbox = self.converge(
            name,
            "pause",
            {"archived", "archiving"},
            {"started": stop_action, "stopped": lambda sb: sb.archive(request_timeout=API_TIMEOUT)},
            STOP_TIMEOUT + START_TIMEOUT,
        )
        self.sessions.discard(sandbox.id)
        return self._facts(sandbox)

    def resume(self, name: str) -> BoxFacts:
        """Start again and re-run the in-box start sequence (the stop ended every process)."""
        before = self.get_sandbox(name, "resume")
        was_running = before is not None and (
            (state_name(before.state) == "started" and settled("started", desired_name(before)))
            or (state_name(before.state) == "paused" and keeps_memory(before))  # its processes were kept
        )
        facts = self.start(name)
        if not was_running:
            boot_box(self, name)
            facts = self.find(name) or facts
        return facts

    def destroy(self, name: str) -> None:
        """Delete the sandbox and wait until it is gone. A missing box is not an error.

        A deleted sandbox lingers on Daytona renamed DESTROYED_<name>_<ms> (still in its old state, desired
        state `destroyed`) until the runner removes it, so the wait follows its id, not its name.
        """
        deadline = time.monotonic() + STOP_TIMEOUT
        sandbox = self.get_sandbox(name, "destroy")
        if sandbox is None:
            return
        while True:
            self.sessions.discard(sandbox.id)
            try:
                self.api_call(lambda sb=sandbox: sb.delete(timeout=API_TIMEOUT), box=name, operation="destroy")
                break
            except BoxNotFound:
                return
            except DaytonaCallError as exc:
                # 409: a transition is in progress; delete once it settles.
                if exc.status != 409 or time.monotonic() > deadline:
                    raise
            time.sleep(POLL_SECONDS / 2)
            current = self.get_sandbox(name, "destroy")
            if current is None:
                break  # deleted meanwhile (by a timer or another client): wait for it below
            sandbox = current
        self.sandboxes.pop(name, None)
        sandbox_id = sandbox.id
        while time.monotonic() < deadline:
            try:
                current = self.api_call(
                    lambda: self.sdk.get(sandbox_id, request_timeout=API_TIMEOUT), box=name, operation="destroy"
                )
            except BoxNotFound:
                return
            if state_name(current.state) == "destroyed":
                return
            time.sleep(POLL_SECONDS / 2)
        raise ProviderError(
            f"the sandbox was still there {STOP_TIMEOUT:.0f} s after its delete", box=name, operation="destroy"
        )

    def _destroy_quietly(self, name: str) -> None:
        try:
            self.destroy(name)
        except ProviderError:
            pass


def _start_action(sandbox: Any) -> None:
    sandbox.start(timeout=START_TIMEOUT)


def stop_action(sandbox: Any) -> None:
    sandbox.stop(timeout=STOP_TIMEOUT)


def _pause_action(sandbox: Any) -> None:
    sandbox.pause(timeout=STOP_TIMEOUT)


def _recover_action(sandbox: Any) -> None:
    sandbox.recover(timeout=START_TIMEOUT)
