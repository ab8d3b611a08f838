# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""boxd provider: boxes as boxd microVMs, driven by the official SDK (boxd==0.2.19, gRPC).

What production boxd does, and how this provider lives with it (the seed's notes, docs/providers/boxd.md):
  * machines are addressed by id; a name lookup fails. A box is found by its io.agentbox.box label through
    `machines.list`; the name -> id map is only a cache in front of the listing, so a fresh process
    re-derives it and a machine deleted behind our back is noticed on the next call;
  * a create is sent once. After a lost answer (connection reset, UNAVAILABLE, a timeout) the machine is
    looked up by its io.agentbox.id label and adopted; a name conflict with a machine that lacks our labels
    is an error that names it; nothing half-made stays when a create fails;
  * exec streams stdout and stderr apart (no size limit) with the exact exit code; a time bound runs the
    command under `timeout`, which reports 124. A suspended or hibernated machine wakes on exec; the only
    exec error retried is a conflict naming a stopped machine, which boxd raises before running anything
    (the machine is started, polled to running, and the command sent again). A stream lost after it began
    is never re-sent: the command may have run;
  * files travel as tar through exec's stdin and stdout (streamed, no gRPC message cap); an upload lands
    atomically (a temporary directory in the destination, then renames), a lost one leaves no debris;
  * pause is suspend (memory kept); a suspended machine comes back with `resume`, a hibernated one (boxd's
    auto-hibernate puts idle machines on disk) with `wake`; stop and start poll to the state;
  * the egress allow list: in the create's spec for a restore from a snapshot; boxd takes no spec next to an
    image, so a create from an image sets it as soon as the machine exists, before it has booted;
  * ports: the web port (80) and the box's other ports are exposed at create (`machines.ports.expose`, a
    public TCP forward: a DNS name and a public port; boxd allows 3 per machine). The web URL and each
    port's URL (preview_url, for agentbox_forward) are http://<dns>:<public port>/, read from the listing.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from ...core._naming import BOX_USER, SECRETS_DIR, label, strip_labels
from ...core._provider import (
    BOX_TEXT_LIMIT,
    BoxFacts,
    BoxNotFound,
    BoxSpec,
    CappedOutput,
    Command,
    EngineUnreachable,
    ExecResult,
    Provider,
    ProviderError,
    SshProxy,
    own_network,
)
from ...core._shell_line import command_line, gib
from ...egress._egress_policy import EgressPolicy
from .._snapshot_store import parse_snapshot_name
from ._boxd_api import (
    BoxdConflict,
    BoxdSettings,
    call,
    client_for,
    forget_client,
    is_already_exists,
    is_ambiguous,
    is_sdk_error,
    translate,
)
from ._boxd_state import (
    ASLEEP,
    GONE,
    HIBERNATED,
    box_state,
    conflict_names_stopped,
    egress_allow_for,
    is_ready,
    machine_name,
    needs_start,
)

START_TIMEOUT = 300.0
STOP_TIMEOUT = 120.0
ADOPT_WAIT_SECONDS = 15.0
POLL_SECONDS = 0.25
STDIN_CHUNK = 1 << 20
KILL_GRACE_SECONDS = 5
WEB_PORT = 80
MAX_EXPOSED_PORTS = 3  # boxd's limit of public forwards per machine
UPLOAD_PREFIX = ".agentbox-upload"
# put_archive's script ($1: the destination directory, $2: the temporary directory's name in it). A
# directory that exists on both sides is kept (given the archive's owner and mode) and merged into;
# anything else is renamed over its old self, which rename(2) does atomically, a new subtree in one move.
# The trap removes the temporary directory however tar ends.
ATOMIC_UNTAR = r"""set -e
d=$1; t=$1/$2
mkdir -p "$d"
mkdir -m 0700 "$t"
trap 'rm -rf "$t"' EXIT
trap 'exit 1' HUP INT TERM
tar -x -p -f - -C "$t"
merge() {
  for src in "$t$1"/* "$t$1"/.[!.]* "$t$1"/..?*; do
    [ -e "$src" ] || [ -L "$src" ] || continue
    rel=$1/${src##*/}; dst=$d$rel
    if [ -d "$src" ] && [ ! -L "$src" ] && [ -d "$dst" ]; then
      [ -L "$dst" ] || { chown --reference="$src" "$dst"; chmod --reference="$src" "$dst"; }
      merge "$rel"
    else
      if [ -d "$src" ] && [ ! -L "$src" ] && { [ -e "$dst" ] || [ -L "$dst" ]; }; then rm -f "$dst"; fi
      mv -f -T "$src" "$dst"
    fi
  done
}
merge ""
"""
# After a lost upload ($1: directory, $2-$3: the temporary name, split): kill what still runs under that name,
# then remove the temporary directory.
ABANDON_UPLOAD = r"""n="$2-$3"
for p in /proc/[0-9]*; do
  case "$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)" in *"$n"*) kill -KILL "${p#/proc/}" 2>/dev/null || true;; esac
done
rm -rf -- "$1/$n"
"""


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ProviderError(f"{name}={value!r} is not a whole number") from exc


def _chunks(source: bytes | IO[bytes] | Iterable[bytes]) -> Iterator[bytes]:
    if isinstance(source, (bytes, bytearray)):
        for offset in range(0, len(source), STDIN_CHUNK):
            yield bytes(source[offset:offset + STDIN_CHUNK])
        return
    read = getattr(source, "read", None)
    if read is not None:
        while True:
            data = read(STDIN_CHUNK)
            if not data:
                return
            yield data
        return
    for data in source:  # type: ignore[union-attr]
        if data:
            yield data


class BoxdProvider(Provider):
    """Boxes as boxd machines. `engine` is the API base URL."""

    name = "boxd"
    shares_host_filesystem = False
    relay_channel = "poll"
    port_urls = "exposed"

    def __init__(
        self,
        api_key: str | None = None,
        token: str | None = None,
        base_url: str | None = None,
        org: str | None = None,
        *,
        auto_suspend: int | None = None,
        disk: int | None = None,
        egress_allow: list[str] | None = None,
        **_ignored: Any,
    ) -> None:
        super().__init__()
        self.settings = BoxdSettings(api_key=api_key, token=token, base_url=base_url, org=org)
        self.settings.check()
        # Seconds idle before boxd suspends the machine (None: boxd's default; 0: never).
        self._auto_suspend = auto_suspend if auto_suspend is not None else _env_int("AGENTBOX_BOXD_AUTO_SUSPEND")
        self._disk = disk if disk is not None else _env_int("AGENTBOX_BOXD_DISK")  # GiB
        self._network_option = egress_allow is not None  # the create option `network`, not the environment's
        raw_egress = os.environ.get("AGENTBOX_BOXD_EGRESS_ALLOW", "")
        self._egress = egress_allow if egress_allow is not None else [e for e in raw_egress.split(",") if e.strip()]
        self._ids: dict[str, str] = {}  # box name -> machine id: a cache, never the truth
        self._lock = threading.Lock()

    def egress_network(self, policy: EgressPolicy) -> bool:
        self._egress = own_network("boxd", self._network_option, lambda: egress_allow_for(policy),  # the env's list
                                   "egress: allowlist is the default list plus egress_allow")
        return True

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        return self.settings.base_url

    @property
    def sdk(self) -> Any:
        return client_for(self.settings)

    def _call(self, fn: Any, box: str | None, operation: str, read: bool = False) -> Any:
        return call(fn, self.settings.base_url, box=box, operation=operation, read=read)

    def _missing(self, name: str, operation: str) -> BoxNotFound:
        return BoxNotFound(f"no box called {name!r} on boxd ({self.engine})", box=name, operation=operation)

    def _get(self, machine_id: str, name: str, operation: str) -> Any | None:
        try:
            return self._call(lambda: self.sdk.machines.get(machine_id), name, operation, read=True)
        except BoxNotFound:
            return None

    def _listed(self, wanted: dict[str, str], operation: str, box: str | None = None) -> list[Any]:
        found = self._call(lambda: self.sdk.machines.list(org=self.settings.org, labels=wanted), box, operation,
                           read=True)
        return [m for m in found if (m.status or "").lower() not in GONE]

    def _machine(self, name: str, operation: str) -> Any | None:
        """The machine of box `name` (fresh), or None: the cached id first, then the label listing."""
        cached = self._ids.get(name)
        if cached:
            machine = self._get(cached, name, operation)
            if machine is not None and machine.labels.get(label("box")) == name:
                return machine
            self._ids.pop(name, None)  # deleted or replaced behind our back: ask the listing
        found = self._listed({label("box"): name}, operation, name)
        if not found:
            return None
        if len(found) > 1:
            preferred = [m for m in found if m.name == machine_name(name)]
            if len(preferred) != 1:
                ids = ", ".join(sorted(m.id for m in found))
                raise ProviderError(f"{len(found)} boxd machines carry the label of box {name!r} ({ids}): delete "
                                    "the ones that are not this box", box=name, operation=operation)
            found = preferred
        self._ids[name] = found[0].id
        return found[0]

    def _require(self, name: str, operation: str) -> Any:
        machine = self._machine(name, operation)
        if machine is None:
            raise self._missing(name, operation)
        return machine

    def _forwards(self, machine_id: str | None, name: str | None, operation: str) -> list[Any]:
        """The public forwards of one machine (None: every machine the caller owns)."""
        return self._call(lambda: self.sdk.machines.ports.list(machine_id), name, operation, read=True)

    def _facts(self, machine: Any, forwards: list[Any] | None = None) -> BoxFacts:
        """The box's facts; its exposed ports are read unless given (a failed read never hides the box)."""
        if forwards is None:
            try:
                forwards = self._forwards(machine.id, machine.name, "exposed ports")
            except ProviderError:
                forwards = []
        ports = {str(f.machine_port): int(f.public_port) for f in forwards if f.machine_id == machine.id}
        web = next((f for f in forwards if f.machine_id == machine.id and f.machine_port == WEB_PORT), None)
        web_url = _forward_url(web) if web is not None else getattr(machine.access, "url", None) or None
        labels = strip_labels(dict(machine.labels or {}))
        return BoxFacts(
            name=labels.get("box", machine.name), id=labels.get("id", ""), provider=self.name, engine=self.engine,
            state=box_state(machine.status), container=machine.id, image=labels.get("image") or machine.image_ref,
            project=labels.get("project", ""), workspace=labels.get("workspace", ""),
            branch=labels.get("branch", ""), created=labels.get("created", ""), ports=ports, labels=labels,
            checkpoint=labels.get("checkpoint") or None, web_url=web_url,
        )

    def preview_url(self, name: str, port: int, expires_in: int = 0) -> str:
        """The public URL of a port the box exposed at create (boxd's forwards do not expire)."""
        machine = self._require(name, "preview URL")
        forwards = [f for f in self._forwards(machine.id, name, "preview URL") if f.machine_id == machine.id]
        found = next((f for f in forwards if f.machine_port == port), None)
        if found is None:
            exposed = ", ".join(str(f.machine_port) for f in sorted(forwards, key=lambda f: f.machine_port))
            raise ProviderError(
                f"box {name!r} does not expose port {port} on boxd (it exposes {exposed or 'none'}): ports are "
                f"exposed when the box is created (agentbox_box ports: [...]; boxd allows {MAX_EXPOSED_PORTS} per "
                f"machine, the web port {WEB_PORT} among them)", box=name, operation="preview URL")
        return _forward_url(found)

    # -- discovery ------------------------------------------------------------------------------
    def find(self, name: str) -> BoxFacts | None:
        machine = self._machine(name, "find")
        return None if machine is None else self._facts(machine)

    def list_boxes(self, project: str | None = None) -> list[BoxFacts]:
        wanted = {label("kind"): "box"}
        if project:
            wanted[label("project")] = project
        machines = self._listed(wanted, "list boxes")
        try:
            forwards = self._forwards(None, None, "exposed ports") if machines else []
        except ProviderError:
            forwards = []  # a failed read never hides the boxes
        return sorted((self._facts(m, forwards) for m in machines), key=lambda f: f.name)

    # -- lifecycle ------------------------------------------------------------------------------
    def create(self, spec: BoxSpec) -> BoxFacts:
        exposed = sorted({WEB_PORT, *spec.ports})
        if len(exposed) > MAX_EXPOSED_PORTS or not all(0 < p < 65536 for p in exposed):
            raise ProviderError(f"boxd exposes at most {MAX_EXPOSED_PORTS} ports (1-65535) per machine, the web port "
                                f"{WEB_PORT} among them; asked for {', '.join(map(str, exposed))}: nothing was created",
                                box=spec.name, operation="create")
        machine = self._create_once(spec)
        try:
            if self._egress and (parse_snapshot_name(spec.image) is None
                                 or list(getattr(machine, "egress_allow", None) or []) != list(self._egress)):
                # The machine is only scheduled yet: the list is in force before its image's start runs. A
                # restore's spec list was combined with its snapshot's (never open): narrowed to this one.
                self._call(lambda: self.sdk.machines.set_egress_allow(machine.id, self._egress), spec.name,
                           "egress allow list")
            machine = self._until_ready(spec.name, machine.id, "create")
            # Re-exposing a port keeps its public port: safe on a machine adopted after a lost answer.
            forwards = [self._call(lambda p=port: self.sdk.machines.ports.expose(machine.id, p), spec.name,
                                   f"exposing port {port}") for port in exposed]
            if parse_snapshot_name(spec.image) is not None:
                # Docker in the box renames /var/lib/docker/runtimes at start, which a directory from the
                # snapshot's lower layer refuses (EXDEV); it is rebuilt at start, so it goes.
                self.exec(spec.name, ["rm", "-rf", "/var/lib/docker/runtimes"], user="root").check(
                    "preparing in-box Docker", spec.name)
            if spec.secrets:
                self.write_secrets(spec.name, spec.secrets)
            return self._facts(machine, forwards)
        except BaseException:
            self._delete_quietly(machine.id)
            raise

    def _create_once(self, spec: BoxSpec) -> Any:
        """Send the create once; after a lost answer adopt the machine carrying this box's id, never re-send."""
        if self._machine(spec.name, "create") is not None:
            raise ProviderError(f"a box called {spec.name!r} already exists on boxd ({self.engine})", box=spec.name,
                                operation="create")
        resources = spec.resources or {}
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "labels": dict(spec.labels),
            "env": dict(spec.env) or None,
            "org": self.settings.org,
            "vcpu": max(1, math.ceil(float(resources["cpus"]))) if resources.get("cpus") else None,
            "memory": gib(resources["memory"]) << 30 if resources.get("memory") else None,
            "disk": (self._disk << 30) if self._disk else None,
            "auto_suspend_timeout": self._auto_suspend,
        }
        if parse_snapshot_name(spec.image) is not None:
            # A checkpoint: the machine is made from its snapshot, which carries the image and its env.
            for key in ("image", "env"):
                kwargs.pop(key)
            kwargs["from_snapshot"] = spec.image
            if self._egress:
                # In the create, so the network is never open. A spec carries the labels too (boxd takes
                # neither labels nor a size next to one); the machine keeps its snapshot's size.
                kwargs["spec"] = {"labels": kwargs.pop("labels"), "egress": list(self._egress)}
                kwargs.pop("vcpu")
                kwargs.pop("memory")
        name = machine_name(spec.name)
        try:
            machine = self.sdk.machines.create(name, **kwargs)
        except Exception as exc:
            if not is_sdk_error(exc):
                raise
            failure = translate(exc, self.engine, spec.name, "create")
            # Only ALREADY_EXISTS means the name is in use; FAILED_PRECONDITION/ABORTED say why boxd refused.
            if is_already_exists(exc):
                adopted = self._adopt(spec, wait=0)
                if adopted is not None:
                    return adopted
                raise ProviderError(
                    f"the boxd machine name {name!r} is taken by a machine that is not this box (no matching "
                    f"{label('id')} label): pick another box name, or delete that machine", box=spec.name,
                    operation="create") from exc
            if is_ambiguous(exc):
                adopted = self._adopt(spec, wait=ADOPT_WAIT_SECONDS)
                if adopted is not None:
                    return adopted
            raise failure from exc
        self._ids[spec.name] = machine.id
        return machine

    def _adopt(self, spec: BoxSpec, wait: float) -> Any | None:
        deadline = time.monotonic() + wait
        while True:
            try:
                found = self._listed({label("id"): spec.box_id}, "create", spec.name)
            except EngineUnreachable:
                found = []
            if found:
                self._ids[spec.name] = found[0].id
                return found[0]
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_SECONDS * 4)

    def _until_ready(self, name: str, machine_id: str, operation: str, timeout: float = START_TIMEOUT) -> Any:
        """Poll until the machine can run commands (running, or asleep: it wakes on exec); a stopped
        machine is started once."""
        deadline = time.monotonic() + timeout
        started = False
        while True:
            machine = self._get(machine_id, name, operation)
            if machine is None:
                self._ids.pop(name, None)
                raise BoxNotFound(f"the boxd machine {machine_id} of box {name!r} was deleted while it came up",
                                  box=name, operation=operation)
            if is_ready(machine.status):
                return machine
            if (machine.status or "").lower() == "failed" and started:
                raise ProviderError(f"the boxd machine {machine_id} failed to start: destroy the box and create "
                                    "it again", box=name, operation=operation)
            if needs_start(machine.status) and (machine.status or "").lower() != "stopping" and not started:
                try:
                    self._call(lambda: self.sdk.machines.start(machine_id), name, operation)
                except BoxdConflict:
                    pass  # it is changing state: read it again
                started = True
            if time.monotonic() > deadline:
                raise ProviderError(f"the boxd machine is still {machine.status} after {timeout:.0f} s; check it "
                                    "with the boxd CLI and try again", box=name, operation=operation)
            time.sleep(POLL_SECONDS)

    def _until_status(self, name: str, machine_id: str, wanted: set[str], operation: str) -> Any:
        deadline = time.monotonic() + STOP_TIMEOUT
        while True:
            machine = self._get(machine_id, name, operation)
            if machine is None:
                raise self._missing(name, operation)
            if (machine.status or "").lower() in wanted:
                return machine
            if time.monotonic() > deadline:
                raise ProviderError(f"the boxd machine is still {machine.status} after {STOP_TIMEOUT:.0f} s",
                                    box=name, operation=operation)
            time.sleep(POLL_SECONDS)

    def write_secrets(self, name: str, values: dict[str, str]) -> None:
        """Each secret a file on a tmpfs, its value through exec's stdin: never in env, labels or snapshots."""
        script = (
            'd=$1; mkdir -p "$d"; mountpoint -q "$d" || mount -t tmpfs -o mode=0700,size=1m agentbox-secrets "$d" '
            '|| { echo "cannot mount a tmpfs at $d" >&2; exit 1; }; chown "$2:" "$d"; chmod 0700 "$d"'
        )
        self.exec(name, ["sh", "-c", script, "secrets", SECRETS_DIR, BOX_USER], user="root").check(
            "making the secrets tmpfs", name)
        for key, value in values.items():
            if "/" in key or key in ("", ".", ".."):
                raise ProviderError(f"secret name {key!r} is not a file name", box=name, operation="secrets")
            self.exec(name, ["sh", "-c", 'umask 077; cat > "$1"', "secret", f"{SECRETS_DIR}/{key}"],
                      stdin=value.encode("utf-8")).check(f"writing secret {key}", name)

    def _wake(self, name: str, machine: Any, operation: str) -> None:
        """Bring an asleep machine back: `wake` from hibernation (on disk), `resume` from suspension."""
        if (machine.status or "").lower() in HIBERNATED:
            self._call(lambda: self.sdk.machines.wake(machine.id), name, operation)
        else:
            self._call(lambda: self.sdk.machines.resume(machine.id), name, operation)

    def start(self, name: str) -> BoxFacts:
        machine = self._require(name, "start")
        if (machine.status or "").lower() in ASLEEP:
            self._wake(name, machine, "start")
        return self._facts(self._until_ready(name, machine.id, "start"))

    def stop(self, name: str) -> BoxFacts:
        machine = self._require(name, "stop")
        if not needs_start(machine.status):
            try:
                self._call(lambda: self.sdk.machines.stop(machine.id), name, "stop")
            except BoxdConflict:
                pass  # stopping already, or changing: the poll below says where it lands
        return self._facts(self._until_status(name, machine.id, {"stopped", "failed"}, "stop"))

    def pause(self, name: str) -> BoxFacts:
        """Suspend: memory kept, nothing runs; the next exec (or resume) wakes it."""
        machine = self._require(name, "pause")
        if (machine.status or "").lower() not in ASLEEP:
            machine = self._until_ready(name, machine.id, "pause")
            if (machine.status or "").lower() not in ASLEEP:
                self._call(lambda: self.sdk.machines.pause(machine.id), name, "pause")
        return self._facts(self._until_status(name, machine.id, set(ASLEEP), "pause"))

    def resume(self, name: str) -> BoxFacts:
        machine = self._require(name, "resume")
        status = (machine.status or "").lower()
        if status in ASLEEP:
            self._wake(name, machine, "resume")
            return self._facts(self._until_status(name, machine.id, {"running"}, "resume"))
        facts = self._facts(self._until_ready(name, machine.id, "resume"))
        if needs_start(status):
            from ...core._boot import boot_box  # lazy: only a stopped machine needs it

            boot_box(self, name)  # a stopped machine lost its processes
        return facts

    def destroy(self, name: str) -> None:
        machine = self._machine(name, "destroy")
        if machine is None:
            return
        try:
            self._call(lambda: self.sdk.machines.delete(machine.id), name, "destroy")
        except BoxNotFound:
            pass
        self._ids.pop(name, None)
        deadline = time.monotonic() + STOP_TIMEOUT
        while self._get(machine.id, name, "destroy") is not None:
            if time.monotonic() > deadline:
                raise ProviderError(f"the boxd machine {machine.id} was still there {STOP_TIMEOUT:.0f} s after its "
                                    "delete", box=name, operation="destroy")
            time.sleep(POLL_SECONDS)

    def _delete_quietly(self, machine_id: str) -> None:
        """The clean-up of a failed create: a delete is idempotent, so a lost connection is asked again
        (call's read retries); the create's own error is the one reported."""
        try:
            self._call(lambda: self.sdk.machines.delete(machine_id), None, "clean-up delete", read=True)
        except ProviderError:
            pass

    # -- inside the box -------------------------------------------------------------------------
    def run_command(self, name: str, command: Command) -> ExecResult:
        line = command_line(command.argv, user=command.user, workdir=command.workdir, env=command.env)
        timeout, stdin = command.timeout, command.stdin
        if timeout:
            # TERM first so `timeout` itself reports 124, KILL after a grace for a command that ignores it.
            line = f"timeout -k {KILL_GRACE_SECONDS} {max(1, math.ceil(timeout))} {line}"
        output = CappedOutput(command.limit)
        code = self._stream(name, line, stdin, output.add)
        if output.over:
            raise output.refused(command.argv, name)
        return output.result(code)

    def _stream(self, name: str, line: str, stdin: bytes | IO[bytes] | Iterable[bytes] | None, sink: Any) -> int:
        """Run one command line, passing output to sink(data, is_stderr); its exit code. A sink that
        answers False wants no more: the call is cancelled (the server ends the command) and -1 returned."""
        machine = self._require(name, "exec")
        retried = False
        while True:
            received = 0
            try:
                stream = self.sdk.machines.stream_exec(machine.id, command=line, close_stdin=stdin is None)
                if stdin is not None:
                    threading.Thread(target=_feed, args=(stream, stdin), daemon=True).start()
                for chunk in stream.iter_chunks():
                    received += len(chunk.data)
                    if sink(chunk.data, chunk.is_stderr) is False:
                        stream.close()
                        return -1
                code = stream.exit_code
            except Exception as exc:
                if not is_sdk_error(exc):
                    raise
                failure = translate(exc, self.engine, name, "exec")
                refused_before = received == 0 and not retried and (stdin is None or isinstance(stdin, bytes))
                stopped = isinstance(failure, BoxdConflict) and conflict_names_stopped(str(exc))
                if refused_before and (stopped or isinstance(failure, BoxNotFound)):
                    # Refused before the command ran: a stopped machine (start it) or a stale id (look again).
                    retried = True
                    self._ids.pop(name, None)
                    machine = self._require(name, "exec")
                    self._until_ready(name, machine.id, "exec")
                    continue
                if received:
                    raise ProviderError(f"the exec stream broke after {received} bytes ({failure}); the command "
                                        "may have run: check the box before running it again", box=name,
                                        operation="exec") from exc
                raise failure from exc
            if code is None:
                raise ProviderError("the exec stream ended without an exit code; the command may have run",
                                    box=name, operation="exec")
            return int(code)

    def put_archive(self, name: str, path: str, tar_stream: Iterable[bytes] | IO[bytes]) -> None:
        """Unpack a tar into directory `path` (made with its parents) so that no reader ever sees a partial
        file: into a temporary directory inside `path` (the same filesystem), then each entry renamed
        into place. A failed or cut-off upload leaves the old files as they were and no temporary one."""
        temporary = f"{UPLOAD_PREFIX}-{secrets.token_hex(6)}"
        err = bytearray()
        try:
            code = self._stream(name, command_line(["sh", "-c", ATOMIC_UNTAR, "put", path, temporary], user="root"),
                                tar_stream, lambda data, is_err: _keep_tail(err, data) if is_err else None)
        except ProviderError:
            self._abandon_upload(name, path, temporary)
            raise
        if code != 0:
            raise ProviderError(f"extracting into {path} exited {code}: {err.decode('utf-8', 'replace')[-2000:]}",
                                box=name, operation="upload")

    def _abandon_upload(self, name: str, path: str, temporary: str) -> None:
        """After a lost upload stream: end the upload's processes if they still run, remove its directory.
        The name is passed in two parts so this command's own line never matches the one it looks for."""
        prefix, _dash, nonce = temporary.rpartition("-")
        try:
            self.exec(name, ["sh", "-c", ABANDON_UPLOAD, "abandon", path, prefix, nonce], user="root")
        except ProviderError:
            pass  # the upload's own error is the one to report

    def get_archive(self, name: str, path: str) -> Iterator[bytes]:
        """A tar stream of `path`, read from exec's stdout as it comes (a thread feeds a small queue)."""
        import queue  # lazy: only downloads need it

        parent, _slash, base = path.rstrip("/").rpartition("/")
        line = command_line(["tar", "-c", "-f", "-", "-C", parent or "/", "--", base or "."], user="root")
        pipe: queue.Queue = queue.Queue(maxsize=16)
        err = bytearray()
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["code"] = self._stream(name, line, None,
                                              lambda data, is_err: _keep_tail(err, data) if is_err else pipe.put(data))
            except BaseException as exc:  # noqa: BLE001 - handed to the reading side
                result["error"] = exc
            finally:
                pipe.put(None)

        threading.Thread(target=run, daemon=True).start()
        while True:
            data = pipe.get()
            if data is None:
                break
            yield data
        if "error" in result:
            raise result["error"]
        if result.get("code") != 0:
            raise ProviderError(f"reading {path} exited {result.get('code')}: "
                                f"{err.decode('utf-8', 'replace')[-2000:]}", box=name, operation="download")

    # -- images and checkpoints -----------------------------------------------------------------
    def checkpoint_store(self) -> Any:
        """The engine side of checkpoints for _checkpoint: boxd snapshots (_boxd_store)."""
        from ._boxd_store import BoxdCheckpoints  # lazy: only checkpoints need it

        return BoxdCheckpoints(self)

    def image_exists(self, image: str) -> bool:
        """boxd pulls an image when it makes a machine (a missing one fails that create); a checkpoint's
        snapshot is looked up."""
        if parse_snapshot_name(image) is None:
            return True
        store = self.checkpoint_store()
        return store.usable(store.snapshot(image))

    def commit(self, name: str, image: str, labels: dict[str, str], env: list[str] | None = None) -> dict[str, Any]:
        """A live snapshot of the box's machine called `image` (labels live in the host manifest), waited for
        until the version this capture made is ready (statuses: pending, ready, failed)."""
        machine = self._require(name, "checkpoint")
        store = self.checkpoint_store()
        if store.snapshot(image) is not None:
            # boxd would save a new version of it, over whatever it holds, not make a new snapshot.
            raise ProviderError(f"a boxd snapshot called {image} exists already; nothing was captured: take the "
                                "checkpoint again (it draws a new name)", box=name, operation="checkpoint")
        created = self._call(lambda: self.sdk.snapshots.create(machine.id, image), name, "checkpoint")
        wanted = int(getattr(created, "version", 0) or 1)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            snapshot = store.snapshot(image)
            status = (getattr(snapshot, "status", "") or "").lower()
            if status == "failed":
                try:
                    store.delete_snapshot(image)  # nothing refers to it: no manifest was written
                except ProviderError:
                    pass  # prune_checkpoints.yml removes it later; the failure is what to report
                raise ProviderError(f"snapshot {image} failed on boxd, and nothing was recorded: take the "
                                    "checkpoint again", box=name, operation="checkpoint")
            if snapshot is not None and status != "pending" and (snapshot.version or 0) >= wanted:
                break
            if time.monotonic() > deadline:
                raise ProviderError(f"snapshot {image} was not ready after {START_TIMEOUT:.0f} s (still "
                                    f"{status or 'not listed'})", box=name, operation="checkpoint")
            time.sleep(POLL_SECONDS)
        return {"id": getattr(created, "id", "") or snapshot.id, "size": store.size_bytes(snapshot)}

    def reopen_options(self) -> dict[str, Any]:
        return {"base_url": self.engine}  # the key comes from BOXD_API_KEY in the other process

    def ssh_proxy(self, name: str) -> SshProxy:
        from . import _boxd_pipe

        return SshProxy(_boxd_pipe.proxy_argv(self.engine, name))  # sshd -i through boxd's streaming exec

    def close(self) -> None:
        forget_client(self.settings)


def _keep_tail(kept: bytearray, data: bytes) -> None:
    """A streamed command's stderr as a message quotes it: its last BOX_TEXT_LIMIT bytes, no more kept."""
    kept.extend(data[-BOX_TEXT_LIMIT:])
    del kept[:-BOX_TEXT_LIMIT]


def _forward_url(forward: Any) -> str:
    return f"http://{forward.dns}:{forward.public_port}/"


def _feed(stream: Any, source: bytes | IO[bytes] | Iterable[bytes]) -> None:
    """stdin for a running exec; a stream that ended early (the command exited) stops the feed."""
    try:
        for data in _chunks(source):
            stream.write(data)
    except RuntimeError:
        return
    finally:
        stream.write_eof()
