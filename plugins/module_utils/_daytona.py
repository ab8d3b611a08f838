# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daytona provider: boxes as Daytona sandboxes, driven by the official SDK (daytona==0.226.1).

Boxes are found by name with `get` (lists are eventually consistent) and recognised by their
io.agentbox.* labels (the SDK adds its own `code-toolbox-language` label; it is ignored).

Resilience: the SDK calls go through `_daytona_api` (bounded retries of idempotent calls, every
failure a ProviderError naming the box and the operation); on top of that
  * lifecycle calls (start, stop, archive, delete) never re-POST blindly: after a failure the state
    is read again and the call is only made again when the sandbox is still where it was;
  * a create is never re-sent after an ambiguous failure (dropped answer, 5xx, timeout): the sandbox
    is looked up by name and adopted when it carries this box's id.

Commands (`exec`) run as session commands so the ~5 minute proxy cut does not kill them: a
launcher, started in a per-box session, runs the command in the background with stdout, stderr and
the exit status written to files under /dev/shm/agentbox-exec/<nonce>; a waiter (a short, read-only
`process.exec`) returns them base64-framed once they exist, or says "still running" after a slice
of seconds shorter than the proxy cut. A re-sent launcher finds the nonce directory already made
and starts nothing, so the command runs once even when the SDK re-sends the request. stdin is
uploaded as a file first (never put in the command text, which the daemon keeps in the session
history).

Pause is stop then archive (archive only from stopped); resume is start, and runs the in-box start
sequence again (a stopped sandbox lost its processes). Checkpoints are sandbox snapshots: stop,
capture, start, boot; the snapshot name carries a nonce because Daytona never lets a name be used
twice, and the host manifest maps the checkpoint name to it (`DaytonaCheckpoints`).
"""

from __future__ import annotations

import base64
import math
import os
import secrets
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ._daytona_api import (
    API_TIMEOUT,
    DEFAULT_API_URL,
    DEFAULT_RETRIES,
    HAS_DAYTONA,
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    DaytonaAPI,
    DaytonaCallError,
    DaytonaConflictError,
    DaytonaSessionEndedError,
    FileUpload,
    Image,
    ListSandboxesQuery,
    Resources,
    SessionExecuteRequest,
    backoff_delay,
    bounded,
    is_api_error,
    is_refusal_worth_retrying,
    is_retryable,
    is_transport_error,
    make_client,
    status_of,
)

# `name as name`: re-exported, the tests read these names here.
from ._daytona_api import MAX_RETRY_AFTER as MAX_RETRY_AFTER  # pylint: disable=useless-import-alias,unused-import
from ._daytona_api import RETRY_DEADLINE_SECONDS as RETRY_DEADLINE_SECONDS  # pylint: disable=useless-import-alias,unused-import
from ._daytona_api import retry_after as retry_after  # pylint: disable=useless-import-alias,unused-import
from ._daytona_idle import DEFAULT_IDLE_MINUTES, IDLE_LABEL
from ._daytona_idle import IDLE_PROBE_SCRIPT as IDLE_PROBE_SCRIPT  # pylint: disable=useless-import-alias,unused-import
from ._daytona_idle import idle_decision as idle_decision  # pylint: disable=useless-import-alias,unused-import
from ._daytona_options import refuse_if_ephemeral, refuse_other_region
from ._daytona_state import (
    FAILED_STATES,
    SNAPSHOT_FAILED,
    TRANSITIONAL,
    box_state,
    box_state_of,
    changing,
    desired_name,
    keeps_memory,
    live_sandboxes,
    network_settings,
    settled,
    snapshot_usable,
    state_name,
)
from ._naming import CHECKPOINT_IMAGE_PREFIX, label, strip_labels
from ._provider import (
    BoxFacts,
    BoxNotFound,
    BoxSpec,
    EngineUnreachable,
    ExecResult,
    Provider,
    ProviderError,
)
from ._shell_line import command_line, gib  # shared with the boxd provider (moved, same behaviour)
from ._snapshot_store import SnapshotCheckpoints, parse_snapshot_name

BOX_USER = "vscode"
WEB_PORT = 80
SDK_LABEL = "code-toolbox-language"
SECRETS_DIR = "/run/agentbox/secrets"
# Control files of running commands: a tmpfs that the checkpoint cleanup (which empties /tmp) and a
# snapshot never see.
EXEC_DIR = "/dev/shm/agentbox-exec"
# Their output, on disk under the daemon user's home: Daytona's /dev/shm is 64 MiB, and the checkpoint cleanup
# empties /tmp and /var/tmp (a command's own output would vanish under it). Captures remove the old ones.
EXEC_OUTPUT_DIR = "~/.cache/agentbox-exec"
# Archives in transit live on disk: they can be large.
TRANSFER_DIR = "/var/tmp"
EXEC_SESSION = "agentbox-exec"

CREATE_TIMEOUT = 600.0
START_TIMEOUT = 300.0
STOP_TIMEOUT = 120.0
SNAPSHOT_TIMEOUT = 600.0
# How long a finished capture's snapshot may take to be found before the capture counts as failed.
SNAPSHOT_APPEAR_SECONDS = 60.0
TRANSFER_TIMEOUT = 1800
# A waiter returns after this many seconds even when the command still runs (below the proxy cut).
DEFAULT_EXEC_SLICE = 50
# Cuts in a row tolerated once the slice is down to 1 s, before the exec fails.
MIN_SLICE_CUTS = 8
# Empty answers to the exec waiter in a row that count as lost replies before the exec fails.
EMPTY_WAITER_ANSWERS = 3
PREVIEW_TTL_SECONDS = 3600
ADOPT_WAIT_SECONDS = 15.0
POLL_SECONDS = 1.0
# How long an accepted launch may take to show up in the box before the command counts as never started.
LAUNCH_GRACE_SECONDS = 30.0


# sh -c LAUNCH agentbox-exec DIR CMDLINE STDIN_PATH
# Runs in the box's session shell; returns at once. A second delivery finds DIR and starts nothing.
LAUNCH_SCRIPT = r"""
d=$1 cmd=$2 in=$3 obase=$4
base=${d%/*}
mkdir -p "$base" 2>/dev/null
find "$base" -mindepth 1 -maxdepth 1 -name '*.done' -mmin +10 2>/dev/null | while read -r old; do
  o=$(cat "$old/outdir" 2>/dev/null); [ -n "$o" ] && rm -rf "$o"; rm -rf "$old"
done
mkdir -m 0700 "$d" 2>/dev/null || exit 0
# The output goes to disk (the tmpfs is 64 MiB on Daytona); only the control files stay on it.
o=$d
if [ -n "$obase" ]; then
  case $obase in "~"/*) obase=$HOME/${obase#"~/"} ;; esac
  mkdir -p "$obase" 2>/dev/null && mkdir -m 0700 "$obase/${d##*/}" 2>/dev/null && o=$obase/${d##*/}
fi
[ "$o" = "$d" ] || printf '%s\n' "$o" > "$d/outdir"  # none: beside the control files (they move)
[ -n "$in" ] || in=/dev/null
(
  exec < "$in"
  [ "$in" = /dev/null ] || rm -f "$in"
  sh -c "$cmd" > "$o/out" 2> "$o/err"
  echo $? > "$d/rc.tmp"
  mv "$d/rc.tmp" "$d/rc"
) < /dev/null > /dev/null 2>&1 &
echo $! > "$d/pid"
"""

# sh -c FORGET agentbox-forget EXEC_DIR: remove every finished command's control files and output.
FORGET_OUTPUTS_SCRIPT = r"""
for d in "$1"/*.done; do
  [ -d "$d" ] || continue
  o=$(cat "$d/outdir" 2>/dev/null); [ -n "$o" ] && rm -rf "$o"; rm -rf "$d"
done
exit 0
"""

# sh -c WAIT agentbox-wait DIR SLICE: read-only until the result is printed, so it may be re-sent.
WAIT_SCRIPT = r"""
d=$1 slice=$2
[ -d "$d" ] || { [ -d "$d.done" ] && d=$d.done; }
end=$(( $(date +%s) + slice ))
i=0
# The clock is read every ~second (every 4th turn for a short slice: a cut edge leaves no room to spare).
n=20; [ "$slice" -le 2 ] && n=4
while [ ! -e "$d/rc" ]; do
  i=$((i + 1))
  # Forks are slow on a loaded box: the slice is measured on the clock, not in turns.
  if [ $((i % n)) -eq 0 ]; then
    if [ ! -d "$d" ]; then
      [ -d "$d.done" ] && { d=$d.done; continue; }
      [ "$(date +%s)" -ge "$end" ] && { echo "AGENTBOX-EXEC NOTSTARTED"; exit 0; }
    elif [ -e "$d/pid" ] && ! kill -0 "$(cat "$d/pid")" 2>/dev/null && [ ! -e "$d/rc" ]; then
      echo "AGENTBOX-EXEC LOST"; exit 0
    fi
    [ "$(date +%s)" -ge "$end" ] && { echo "AGENTBOX-EXEC PENDING"; exit 0; }
  fi
  sleep 0.05
done
printf 'AGENTBOX-EXEC DONE %s\n' "$(cat "$d/rc")"
o=$(cat "$d/outdir" 2>/dev/null); [ -n "$o" ] || o=$d
base64 < "$o/out"
echo --
base64 < "$o/err"
case $d in *.done) ;; *) mv "$d" "$d.done" 2>/dev/null ;; esac
"""


def parse_wait_output(text: str) -> tuple[str, int | None, bytes, bytes]:
    """(status, rc, stdout, stderr) from the waiter's output; status DONE, PENDING, LOST or NOTSTARTED."""
    head, _sep, rest = text.partition("\n")
    fields = head.strip().split()
    if len(fields) < 2 or fields[0] != "AGENTBOX-EXEC":
        raise ValueError(f"unexpected waiter output: {text[:200]!r}")
    status = fields[1]
    if status != "DONE":
        return status, None, b"", b""
    rc = int(fields[2])
    out_text, sep, err_text = rest.partition("\n--\n")
    if not sep:
        # An empty stdout gives "--" on the first line.
        if rest.startswith("--\n") or rest == "--":
            out_text, err_text = "", rest[3:]
        else:
            raise ValueError("waiter output has no stderr section")
    return status, rc, base64.b64decode(out_text), base64.b64decode(err_text)


def pinned_image(image: str) -> Any:
    """What to build a sandbox from so that Daytona's build cache, keyed by the Dockerfile's text, follows the
    image's content: `repo@sha256:<digest>` when the local engine knows the registry digest of that tag; else,
    when it knows the image, `FROM image` plus a label naming the image id (a new id, a new Dockerfile); else
    the reference as given (a tag that moves later may then be served from an older build)."""
    if "@sha256:" in image:
        return image
    from ._engine_api import EngineAPIError, EngineUnanswered, local_engine

    try:
        engine = local_engine(timeout=10)
        info = engine.inspect_image(image) if engine is not None else None
    except (EngineAPIError, EngineUnanswered, OSError):
        info = None
    if not info:
        return image
    repository = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    for digest in info.get("RepoDigests") or []:
        if digest.split("@", 1)[0] == repository:
            return digest
    return Image.base(image).dockerfile_commands([f"LABEL io.agentbox.image-id={info['Id']}"])


def is_registry_reference(image: str) -> bool:
    """True for an image a registry can serve by name (its first part names a host: ghcr.io/x, host:5000/x)."""
    first, sep, _rest = image.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def _env_minutes(name: str, default: int | None, unit: str = "minutes") -> int | None:
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


class DaytonaProvider(DaytonaAPI, Provider):
    """Boxes as Daytona sandboxes. `engine` is the API URL."""

    name = "daytona"
    shares_host_filesystem = False
    relay_channel = "poll"

    def __init__(
        self,
        api_key: str | None = None,
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
        **_ignored: Any,
    ):
        super().__init__(
            (api_url or os.environ.get("DAYTONA_API_URL") or DEFAULT_API_URL).rstrip("/"),
            DEFAULT_RETRIES if retries is None else max(0, int(retries)),
        )
        self._api_key = api_key or os.environ.get("DAYTONA_API_KEY") or None
        self._target = target or os.environ.get("DAYTONA_TARGET") or None
        slice_env = _env_minutes("AGENTBOX_DAYTONA_EXEC_SLICE", None, "seconds")
        self._exec_slice = int(exec_slice or slice_env or DEFAULT_EXEC_SLICE)
        self._idle_timeout = (
            idle_timeout if idle_timeout is not None else _env_minutes("AGENTBOX_IDLE_TIMEOUT", DEFAULT_IDLE_MINUTES)
        )
        # Daytona's own auto-stop: the backstop when no reaper runs (any API traffic resets it).
        default_stop = max(15, 2 * (self._idle_timeout or DEFAULT_IDLE_MINUTES))
        self._auto_stop = (
            auto_stop if auto_stop is not None else _env_minutes("AGENTBOX_DAYTONA_AUTO_STOP", default_stop)
        )
        self._auto_archive = (
            auto_archive if auto_archive is not None else _env_minutes("AGENTBOX_DAYTONA_AUTO_ARCHIVE", None)
        )
        # Disk in GiB for a box made from an image (Daytona's default is 3; Docker in the box wants more).
        self._disk = disk if disk is not None else _env_minutes("AGENTBOX_DAYTONA_DISK", None, "GiB")
        raw_network = network if network is not None else os.environ.get("AGENTBOX_DAYTONA_NETWORK")
        try:
            self._network = network_settings(raw_network)
        except ValueError as exc:
            source = "network" if network is not None else "AGENTBOX_DAYTONA_NETWORK"
            raise ProviderError(f"{source}={raw_network!r}: {exc}") from exc
        self._auto_delete = auto_delete  # minutes stopped before Daytona deletes the box; 0: ephemeral
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        return self.api_url

    @property
    def sdk(self) -> Any:
        return _client_for(self.api_url, self._api_key, self._target)

    def checkpoint_store(self) -> DaytonaCheckpoints:
        """The engine side of checkpoints for _checkpoint: sandbox snapshots, not Docker images."""
        return DaytonaCheckpoints(self)

    # The tests call these under their old names.
    _fail = DaytonaAPI.api_error
    _call = DaytonaAPI.api_call

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
        found = self.api_call(
            lambda: list(self.sdk.list(ListSandboxesQuery(labels=wanted), request_timeout=API_TIMEOUT)),
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
        env = {
            "AGENTBOX": "1",
            "AGENTBOX_BOX_NAME": spec.name,
            "AGENTBOX_BOX_ID": spec.box_id,
            "AGENTBOX_PROJECT": spec.project,
            "AGENTBOX_HOST_WORKSPACE": spec.workspace,
            **spec.env,
        }
        common: dict[str, Any] = {
            "name": spec.name,
            "os_user": BOX_USER,
            "env_vars": env,
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
        snapshot = self._ready_snapshot(spec.image, spec.name)
        if snapshot is not None:
            refuse_other_region(snapshot, spec.image, self._target, spec.name)
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
        return CreateSandboxFromImageParams(image=pinned_image(spec.image), resources=sizes, **common)

    def create(self, spec: BoxSpec) -> BoxFacts:
        params = self._create_params(spec)
        try:
            sandbox = self._create_once(spec, params)
        except BaseException:
            # A create that failed leaves nothing: e.g. the SDK's wait saw build_failed (an error without a
            # status), after which the sandbox is adopted, found failed, and must not stay behind.
            self._discard_own(spec)
            raise
        try:
            if parse_snapshot_name(spec.image) is not None:
                self._after_restore(spec.name)
            if spec.secrets:
                self._write_secrets(spec.name, spec.secrets)
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

    def _discard_own(self, spec: BoxSpec) -> None:
        """Delete the sandbox called spec.name when it is this box's (its io.agentbox.id), never another's."""
        try:
            sandbox = self.get_sandbox(spec.name, "create")
            if sandbox is not None and (sandbox.labels or {}).get(label("id")) == spec.box_id:
                self.destroy(spec.name)
        except ProviderError:
            pass

    def _adopt(self, spec: BoxSpec, wait: float) -> Any | None:
        """The sandbox a lost create answer made, when it is this box's (same io.agentbox.id)."""
        deadline = time.monotonic() + wait
        while True:
            sandbox = self.get_sandbox(spec.name, "create")
            if sandbox is not None:
                if (sandbox.labels or {}).get(label("id")) != spec.box_id:
                    return None
                return self._converge(spec.name, "create", {"started"}, {}, START_TIMEOUT)
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_SECONDS)

    def _after_restore(self, name: str) -> None:
        """A box from a checkpoint snapshot: its root is layered over the snapshot, where a directory that
        came with a lower layer cannot be renamed (EXDEV). dockerd renames /var/lib/docker/runtimes at every
        start and refuses to start when it cannot; the directory is rebuilt at start, so it goes."""
        self.exec(name, ["rm", "-rf", "/var/lib/docker/runtimes"], user="root").check("preparing in-box Docker", name)

    def _write_secrets(self, name: str, values: dict[str, str]) -> None:
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

    def _converge(
        self,
        name: str,
        operation: str,
        wanted: set[str],
        actions: dict[str, Callable[[Any], Any]],
        timeout: float,
    ) -> Any:
        """Drive the sandbox to one of `wanted` states: read, act once, read again (never blind re-POSTs)."""
        deadline = time.monotonic() + timeout
        failures = 0
        recoveries = 0
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
                        f"the sandbox is in state {state} ({reason}) and Daytona cannot recover it: destroy it "
                        "and create it again",
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
                    time.sleep(backoff_delay(failures, exc))
                    failures += 1
                    continue
                if status_of(exc) is None and not is_transport_error(exc) and failures < self.retries:
                    # The SDK's own wait ran out or saw a transient state: read the state again.
                    failures += 1
                    continue
                raise self.api_error(exc, name, operation, failures + 1) from exc

    def start(self, name: str) -> BoxFacts:
        sandbox = self._converge(
            name,
            "start",
            {"started"},
            {s: _start_action for s in ("stopped", "archived", "archiving", "paused")},
            START_TIMEOUT,
        )
        self._sessions.discard(sandbox.id)
        return self._facts_with_url(sandbox, name)

    def stop(self, name: str) -> BoxFacts:
        current = self.get_sandbox(name, "stop")
        if current is not None:
            refuse_if_ephemeral(current, name, "stop")
        sandbox = self._converge(
            name, "stop", {"stopped", "archived", "archiving"}, {"started": _stop_action}, STOP_TIMEOUT
        )
        self._sessions.discard(sandbox.id)
        return self._facts(sandbox)

    def pause(self, name: str) -> BoxFacts:
        """Stop, then archive (Daytona archives only a stopped sandbox); a linux-vm sandbox is paused instead,
        keeping its memory, so the agent in it is not killed."""
        current = self.get_sandbox(name, "pause")
        if current is not None:
            refuse_if_ephemeral(current, name, "pause")
        if current is not None and keeps_memory(current):
            sandbox = self._converge(name, "pause", {"paused"}, {"started": _pause_action}, STOP_TIMEOUT)
            self._sessions.discard(sandbox.id)
            return self._facts(sandbox)
        sandbox = self._converge(
            name,
            "pause",
            {"archived", "archiving"},
            {"started": _stop_action, "stopped": lambda sb: sb.archive(request_timeout=API_TIMEOUT)},
            STOP_TIMEOUT + START_TIMEOUT,
        )
        self._sessions.discard(sandbox.id)
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
            from ._box import boot_box

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
            self._sessions.discard(sandbox.id)
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

    # -- inside the box -------------------------------------------------------------------------
    def exec(
        self,
        name: str,
        argv: list[str],
        *,
        user: str = BOX_USER,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | IO[bytes] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        sandbox = self.cached_sandbox(name, "exec")
        # sandbox.user is only what the create asked for (os_user): the daemon runs as the image's USER.
        line = command_line(argv, user=user, workdir=workdir, env=env, timeout=timeout)
        try:
            return self._exec(name, sandbox, line, stdin, timeout)
        except ProviderError as exc:
            raise self._why_not_running(name, exc) from exc

    def _why_not_running(self, name: str, failure: ProviderError) -> ProviderError:
        """A failed toolbox call: say so when the box is not running (an archived sandbox answers a
        misleading 404), and forget the cached sandbox (it may have been re-created under the name)."""
        self.sandboxes.pop(name, None)
        try:
            sandbox = self.get_sandbox(name, "exec")
        except ProviderError:
            return failure
        if sandbox is None:
            return BoxNotFound(f"no box called {name!r} on Daytona ({self.api_url})", box=name, operation="exec")
        state = state_name(sandbox.state)
        if state != "started":
            what = "paused (archived)" if box_state(state) == "paused" else state
            return ProviderError(
                f"the box is {what}: start it (playbooks/box_state.yml -e state=started) and try again",
                box=name,
                operation="exec",
            )
        return failure

    def _exec(
        self, name: str, sandbox: Any, line: str, stdin: bytes | IO[bytes] | None, timeout: float | None
    ) -> ExecResult:
        nonce = secrets.token_hex(8)
        directory = f"{EXEC_DIR}/{nonce}"
        in_path = ""
        if stdin is not None:
            # On disk, not on the /dev/shm tmpfs: the emulator's uploads cannot reach a tmpfs mount. The
            # launcher deletes it as soon as the command has it open.
            in_path = f"{TRANSFER_DIR}/agentbox-in-{nonce}"
            self._upload(name, sandbox, stdin, in_path, "exec stdin")
        started = time.monotonic()
        launch = f"sh -c {shlex.quote(LAUNCH_SCRIPT)} agentbox-exec {shlex.quote(directory)} {shlex.quote(line)}"
        launch += f" {shlex.quote(in_path)}" if in_path else " ''"
        launch += f" {shlex.quote(EXEC_OUTPUT_DIR)}"
        self._launch(name, sandbox, launch)
        return self._wait(name, sandbox, directory, started, timeout)

    def _launch(self, name: str, sandbox: Any, launch: str) -> None:
        request = SessionExecuteRequest(command=launch, run_async=True)

        def send() -> Any:
            return sandbox.process.execute_session_command(EXEC_SESSION, request, timeout=int(API_TIMEOUT))

        for round_ in range(2):
            try:
                self.api_call(send, box=name, operation="exec")
            except ProviderError as exc:
                cause = exc.__cause__
                session_missing = cause is not None and (
                    status_of(cause) in (404, 410) or (HAS_DAYTONA and isinstance(cause, DaytonaSessionEndedError))
                )
                # The first launch of this process in this sandbox may fail for want of the session, whatever
                # the daemon answers then: make sure it exists and launch again (the launcher is idempotent).
                if round_ or not (session_missing or sandbox.id not in self._sessions):
                    raise self._toolbox_hint(exc, name) from exc
                self._ensure_session(name, sandbox)
                continue
            self._sessions.add(sandbox.id)
            return

    def _ensure_session(self, name: str, sandbox: Any) -> None:
        def make() -> None:
            try:
                sandbox.process.create_session(EXEC_SESSION, request_timeout=API_TIMEOUT)
            except Exception as exc:
                if (HAS_DAYTONA and isinstance(exc, DaytonaConflictError)) or status_of(exc) == 409:
                    return  # made by another process, or by a re-sent request
                if status_of(exc) == 410 or (HAS_DAYTONA and isinstance(exc, DaytonaSessionEndedError)):
                    # A session that ended (an `exit` in it) keeps its name: free the name and make it again.
                    sandbox.process.delete_session(EXEC_SESSION, request_timeout=API_TIMEOUT)
                    sandbox.process.create_session(EXEC_SESSION, request_timeout=API_TIMEOUT)
                    return
                raise

        try:
            self.api_call(make, box=name, operation="exec (session)")
        except BoxNotFound:
            # The cached sandbox may be gone (re-created under the same name): look it up again.
            fresh = self.cached_sandbox(name, "exec", fresh=True)
            if fresh.id == sandbox.id:
                raise
            self.api_call(
                lambda: fresh.process.create_session(EXEC_SESSION, request_timeout=API_TIMEOUT),
                box=name,
                operation="exec (session)",
            )
        self._sessions.add(sandbox.id)

    def _toolbox_hint(self, exc: ProviderError, name: str) -> ProviderError:
        text = str(exc)
        if "not started" in text.lower() or "is the sandbox started" in text.lower():
            return ProviderError(
                "the box is not running: start it (playbooks/box_state.yml -e state=started) and try again",
                box=name,
                operation="exec",
            )
        return exc

    def _wait(self, name: str, sandbox: Any, directory: str, started: float, timeout: float | None) -> ExecResult:
        cut_in_a_row = 0
        empty_in_a_row = 0
        while True:
            waiter = f"sh -c {shlex.quote(WAIT_SCRIPT)} agentbox-wait {shlex.quote(directory)} {self._exec_slice}"
            asked = time.monotonic()
            try:
                answer = self.api_call(
                    lambda waiter=waiter: sandbox.process.exec(waiter, timeout=self._exec_slice + 30),
                    box=name,
                    operation="exec",
                    retry_on=is_refusal_worth_retrying,  # a cut is handled here, where the slice adapts
                )
                cut_in_a_row = 0
            except ProviderError as exc:
                # The edge cut the waiter (a 502/504, or the connection dropped): the command still runs. Ask
                # again with a slice well inside the cut (remembered for the box's later commands); give up only
                # when even a 1 s slice keeps being cut.
                cut = getattr(exc, "status", None) in (502, 504) or isinstance(exc, EngineUnreachable)
                if cut:
                    waited = time.monotonic() - asked
                    shorter = max(1, min(self._exec_slice // 2, int(waited / 2)))
                    if shorter < self._exec_slice:
                        self._exec_slice = shorter
                        continue
                    # At the shortest slice, a loaded box can still overrun a cut now and then.
                    if cut_in_a_row < max(self.retries, MIN_SLICE_CUTS):
                        cut_in_a_row += 1
                        continue
                raise self._toolbox_hint(exc, name) from exc
            if not (answer.result or "").strip() and empty_in_a_row < EMPTY_WAITER_ANSWERS:
                # An empty answer is a lost reply (the toolbox's exec can drop a short command's output), not the
                # waiter's: it writes a status line whenever it runs. Asking again is safe, the waiter only reads.
                empty_in_a_row += 1
                continue
            empty_in_a_row = 0
            try:
                status, rc, out, err = parse_wait_output(answer.result or "")
            except ValueError as exc:
                raise ProviderError(
                    f"the box answered the exec waiter with exit {answer.exit_code}: {(answer.result or '')[-500:]}. "
                    "The box needs sh, base64 and sleep",
                    box=name,
                    operation="exec",
                ) from exc
            if status == "DONE":
                if timeout and rc in (124, 137) and time.monotonic() - started >= timeout:
                    raise ProviderError(
                        f"the command did not finish within {timeout:g} s and was killed", box=name, operation="exec"
                    )
                return ExecResult(rc=rc if rc is not None else -1, stdout=out, stderr=err)
            if status == "LOST":
                raise ProviderError(
                    "the command was killed before it finished (the box was stopped, or its session deleted)",
                    box=name,
                    operation="exec",
                )
            if status == "NOTSTARTED" and time.monotonic() - started > LAUNCH_GRACE_SECONDS:
                raise ProviderError(
                    "the command never started in the box (its session did not run the launcher); try again",
                    box=name,
                    operation="exec",
                )
            if timeout and time.monotonic() - started > timeout + 30:
                raise ProviderError(f"the command did not finish within {timeout:g} s", box=name, operation="exec")

    def _upload(self, name: str, sandbox: Any, source: bytes | IO[bytes] | str, path: str, what: str) -> None:
        """Upload bytes, an open file or a local path to `path` in the box, retried when it can start over."""
        position = None
        if not isinstance(source, (bytes, bytearray, str)):
            try:
                position = source.tell()
            except (AttributeError, OSError):
                position = None

        def send() -> None:
            if isinstance(source, (bytes, bytearray, str)):
                # The pooled client (a local path is streamed from disk in 64 KiB pieces).
                sandbox.fs.upload_files([FileUpload(source=source, destination=path)], timeout=TRANSFER_TIMEOUT)
                return
            if position is not None:
                source.seek(position)
            sandbox.fs.upload_file_stream(source, path, timeout=TRANSFER_TIMEOUT)

        restartable = isinstance(source, (bytes, bytearray, str)) or position is not None
        try:
            self.api_call(send, box=name, operation=what, idempotent=restartable)
        except ProviderError as exc:
            raise self._toolbox_hint(exc, name) from exc

    def put_archive(self, name: str, path: str, tar_stream: Iterable[bytes] | IO[bytes]) -> None:
        """Spooled to a host temp file (flat memory, and an upload that can be retried), then untarred as root."""
        sandbox = self.cached_sandbox(name, f"copy into {path}")
        remote = f"{TRANSFER_DIR}/agentbox-put-{secrets.token_hex(8)}.tar"
        with tempfile.NamedTemporaryFile(prefix="agentbox-put-", suffix=".tar") as spool:
            if hasattr(tar_stream, "read"):
                shutil.copyfileobj(tar_stream, spool, 1 << 20)  # type: ignore[arg-type]
            else:
                for chunk in tar_stream:  # type: ignore[union-attr]
                    spool.write(chunk)
            spool.flush()
            self._upload(name, sandbox, spool.name, remote, f"copy into {path}")
        script = (
            '[ -d "$1" ] || { echo "$1 is not a directory in the box" >&2; rm -f "$2"; exit 2; }; '
            'tar -C "$1" -xpf "$2"; rc=$?; rm -f "$2"; exit $rc'
        )
        run = self.exec(name, ["sh", "-c", script, "put", path, remote], user="root")
        if run.rc != 0:
            detail = (run.stderr or run.stdout).decode("utf-8", "replace").strip()[-1000:]
            raise ProviderError(detail or f"tar exited {run.rc}", box=name, operation=f"copy into {path}")

    def get_archive(self, name: str, path: str) -> Iterator[bytes]:
        """A tar of `path` made in the box, streamed down chunk by chunk (never held whole)."""
        sandbox = self.cached_sandbox(name, "copy out")
        remote = f"{TRANSFER_DIR}/agentbox-get-{secrets.token_hex(8)}.tar"
        script = (
            'p=${1%/}; [ -n "$p" ] || p=/; [ -e "$p" ] || [ -L "$p" ] || '
            '{ echo "$1 does not exist in the box" >&2; exit 2; }; '
            'parent=$(dirname "$p"); base=$(basename "$p"); '
            'tar -C "$parent" -cf "$2" "$base" && chmod 0644 "$2"'
        )
        run = self.exec(name, ["sh", "-c", script, "get", path, remote], user="root")
        if run.rc != 0:
            self.exec(name, ["rm", "-f", remote], user="root")
            detail = (run.stderr or run.stdout).decode("utf-8", "replace").strip()[-1000:]
            raise ProviderError(detail or f"tar exited {run.rc}", box=name, operation="copy out")
        return self._stream_down(name, sandbox, remote)

    def _stream_down(self, name: str, sandbox: Any, remote: str) -> Iterator[bytes]:
        attempt = 0
        try:
            while True:
                received = False
                try:
                    for chunk in sandbox.fs.download_file_stream(remote, timeout=TRANSFER_TIMEOUT):
                        received = True
                        yield chunk
                    return
                except Exception as exc:
                    if not is_api_error(exc):
                        raise
                    # Only a download that has not yielded anything can start over.
                    if not received and is_retryable(exc) and attempt < self.retries:
                        time.sleep(backoff_delay(attempt, exc))
                        attempt += 1
                        continue
                    raise self.api_error(exc, name, "copy out", attempt + 1) from exc
        finally:
            try:
                self.exec(name, ["rm", "-f", remote], user="root")
            except ProviderError:
                pass

    # -- images, snapshots and checkpoints ------------------------------------------------------
    def _snapshot(self, image: str) -> Any | None:
        try:
            return self.api_call(
                lambda: bounded(lambda: self.sdk.snapshot.get(image), API_TIMEOUT, "snapshot lookup"),
                box=None,
                operation=f"snapshot lookup of {image!r}",
            )
        except BoxNotFound:
            return None

    def _snapshot_exists(self, image: str) -> bool:
        return snapshot_usable(self._snapshot(image))

    def image_exists(self, image: str) -> bool:
        """A Daytona snapshot of that name (an inactive one too: it is activated on use), or a registry image
        Daytona can build from (host/path:tag)."""
        return self._snapshot_exists(image) or is_registry_reference(image)

    def _ready_snapshot(self, image: str, box: str) -> Any | None:
        """The snapshot `image` ready to start from, or None when there is no such snapshot. Daytona
        deactivates snapshots unused for 14 days (a create from one is refused): activate it and wait."""
        snapshot = self._snapshot(image)
        if snapshot is None:
            return None
        state = state_name(snapshot.state)
        if state == "inactive":
            try:
                self.api_call(
                    lambda: bounded(lambda: self.sdk.snapshot.activate(snapshot), API_TIMEOUT, "snapshot activate"),
                    box=box,
                    operation=f"activating snapshot {image!r}",
                )
            except DaytonaCallError as exc:
                # Another client activated it meanwhile ("already active"); anything else says why not.
                if exc.status != 400 or "already active" not in str(exc):
                    raise
        elif state in SNAPSHOT_FAILED:
            raise ProviderError(
                f"snapshot {image!r} is {state} ({getattr(snapshot, 'error_reason', None) or 'no reason given'}): "
                "it cannot be started from",
                box=box,
                operation="create",
            )
        return self._wait_snapshot_active(box, image, operation="create")

    def image_labels(self, image: str) -> dict[str, str]:
        """Snapshots carry no labels: a checkpoint snapshot's name tells its project and checkpoint."""
        parsed = parse_snapshot_name(image)
        if parsed is None:
            return {}
        return {label("kind"): "checkpoint", label("project"): parsed[0], label("checkpoint"): parsed[1]}

    def delete_snapshot(self, image: str) -> bool:
        snapshot = self._snapshot(image)
        if snapshot is None:
            return False
        self.api_call(
            lambda: bounded(lambda: self.sdk.snapshot.delete(snapshot), API_TIMEOUT, "snapshot delete"),
            box=None,
            operation=f"delete of snapshot {image!r}",
        )
        return True

    def list_snapshots(self, prefix: str = CHECKPOINT_IMAGE_PREFIX) -> list[Any]:
        found: list[Any] = []
        page = 1
        while True:
            result = self.api_call(
                lambda page=page: bounded(lambda: self.sdk.snapshot.list(page=page, limit=100), API_TIMEOUT, "list"),
                box=None,
                operation="list snapshots",
            )
            found += [item for item in result.items if (item.name or "").startswith(prefix)]
            if page >= (result.total_pages or 1):
                return found
            page += 1

    def commit(self, name: str, image: str, labels: dict[str, str], env: list[str] | None = None) -> dict[str, Any]:
        """Capture the box as snapshot `image`: stop, snapshot, then start and boot again if it ran.

        Snapshots carry no labels (the manifest keeps them). `image` must be a new name: Daytona
        never accepts a name twice.
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
            stopped = self._converge(name, "checkpoint", {"stopped"}, {"started": _stop_action}, STOP_TIMEOUT)
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
            self._converge(name, "checkpoint", {"stopped"}, {}, SNAPSHOT_TIMEOUT)
            snapshot = self._wait_snapshot_active(name, image, lost=lost)
        finally:
            if was_running:
                self.start(name)
                from ._box import boot_box

                boot_box(self, name)
        size = getattr(snapshot, "size", None) or 0
        return {"id": snapshot.id, "size": int(float(size) * (1 << 30)) if size else 0}

    def _wait_snapshot_active(
        self, name: str, image: str, *, lost: ProviderError | None = None, operation: str = "checkpoint"
    ) -> Any:
        """The snapshot once `active`. A capture's snapshot appears only when the capture has ended, and may
        take a moment more to be listed, so a missing one is waited for (SNAPSHOT_APPEAR_SECONDS) before the
        capture counts as failed (a failed capture on Daytona leaves no snapshot and no error state)."""
        now = time.monotonic()
        deadline, appear_by = now + SNAPSHOT_TIMEOUT, now + SNAPSHOT_APPEAR_SECONDS
        while True:
            snapshot = self._snapshot(image)
            state = state_name(snapshot.state) if snapshot is not None else "missing"
            if state == "active":
                return snapshot
            if state in SNAPSHOT_FAILED:
                reason = getattr(snapshot, "error_reason", None) or "no reason given"
                raise ProviderError(f"snapshot {image!r} is {state} ({reason})", box=name, operation=operation)
            if state == "missing" and time.monotonic() > appear_by:
                why = f" (the capture request failed: {lost})" if lost is not None else ""
                raise ProviderError(
                    f"Daytona made no snapshot {image!r}: the capture failed on its side{why}; try again",
                    box=name,
                    operation=operation,
                )
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"snapshot {image!r} is still {state} after {SNAPSHOT_TIMEOUT:.0f} s", box=name, operation=operation
                )
            time.sleep(POLL_SECONDS)

    def close(self) -> None:
        self.sandboxes.clear()
        self._sessions.clear()


def _start_action(sandbox: Any) -> None:
    sandbox.start(timeout=START_TIMEOUT)


def _stop_action(sandbox: Any) -> None:
    sandbox.stop(timeout=STOP_TIMEOUT)


def _pause_action(sandbox: Any) -> None:
    sandbox.pause(timeout=STOP_TIMEOUT)


def _recover_action(sandbox: Any) -> None:
    sandbox.recover(timeout=START_TIMEOUT)


# -- checkpoints as snapshots -----------------------------------------------------------------------
class DaytonaCheckpoints(SnapshotCheckpoints):
    """The engine side of checkpoints on Daytona, called by _checkpoint through `checkpoint_store`."""

    kind = "daytona"
    cloud = "Daytona"
    provider: DaytonaProvider

    def snapshot(self, image: str) -> Any | None:
        return self.provider._snapshot(image)

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
