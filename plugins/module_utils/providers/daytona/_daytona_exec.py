# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Commands and files in a Daytona box, for the daytona provider.

Commands (`exec`) run as session commands so the ~5 minute proxy cut does not kill them: a
launcher, started in a per-box session, runs the command in the background with stdout, stderr and
the exit status written to files under /dev/shm/agentbox-exec/<nonce>; a waiter (a short, read-only
`process.exec`) returns them base64-framed once they exist, or says "still running" after a slice
of seconds shorter than the proxy cut. A re-sent launcher finds the nonce directory already made
and starts nothing, so the command runs once even when the SDK re-sends the request. stdin is
uploaded as a file first (never put in the command text, which the daemon keeps in the session
history). Archives go up and down through files in the box, spooled on the host.
"""

from __future__ import annotations

import base64
import secrets
import shlex
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from ...core._provider import BoxNotFound, CappedOutput, Command, EngineUnreachable, ExecResult, ProviderError
from ...core._shell_line import command_line
from ._daytona_api import (
    API_TIMEOUT,
    HAS_DAYTONA,
    DaytonaAPI,
    DaytonaConflictError,
    DaytonaSessionEndedError,
    FileUpload,
    SessionExecuteRequest,
    backoff_delay,
    is_api_error,
    is_refusal_worth_retrying,
    is_retryable,
    status_of,
)
from ._daytona_state import box_state, state_name

# Control files of running commands: a tmpfs that the checkpoint cleanup (which empties /tmp) and a
# snapshot never see.
EXEC_DIR = "/dev/shm/agentbox-exec"
# Their output, on disk under the daemon user's home: Daytona's /dev/shm is 64 MiB, and the checkpoint cleanup
# empties /tmp and /var/tmp (a command's own output would vanish under it). Captures remove the old ones.
EXEC_OUTPUT_DIR = "~/.cache/agentbox-exec"
# Archives in transit live on disk: they can be large.
TRANSFER_DIR = "/var/tmp"
EXEC_SESSION = "agentbox-exec"
TRANSFER_TIMEOUT = 1800
# A waiter returns after this many seconds even when the command still runs (below the proxy cut).
DEFAULT_EXEC_SLICE = 50
# Cuts in a row tolerated once the slice is down to 1 s, before the exec fails.
MIN_SLICE_CUTS = 8
# Empty answers to the exec waiter in a row that count as lost replies before the exec fails.
EMPTY_WAITER_ANSWERS = 3
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

# sh -c WAIT agentbox-wait DIR SLICE LIMIT: read-only until the result is printed, so it may be re-sent.
# LIMIT (none: empty) caps what it prints of each stream at one byte past the host's cap, and the control
# files it prints are read with a cap too: all of them are in the box, the box's to make any size.
WAIT_SCRIPT = r"""
d=$1 slice=$2 limit=$3
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
printf 'AGENTBOX-EXEC DONE %s\n' "$(head -c 16 "$d/rc")"
o=$(head -c 4096 "$d/outdir" 2>/dev/null); [ -n "$o" ] || o=$d
if [ -n "$limit" ]; then head -c "$((limit + 1))" "$o/out" | base64; else base64 < "$o/out"; fi
echo --
if [ -n "$limit" ]; then head -c "$((limit + 1))" "$o/err" | base64; else base64 < "$o/err"; fi
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


def _session_ended(exc: BaseException) -> bool:
    """The daemon's answer for a session whose shell is gone (the name stays taken until deleted): 410
    SESSION_ENDED, or, from a daemon that writes the command into the dead shell's stdin (apps/daemon
    session/execute.go), 400 "failed to write command: ... broken pipe"."""
    if HAS_DAYTONA and isinstance(exc, DaytonaSessionEndedError):
        return True
    status = status_of(exc)
    return status == 410 or (status == 400 and "failed to write command" in str(exc))


def _delete_session(sandbox: Any) -> None:
    """Free the exec session's name; one already deleted (by another process) is fine."""
    try:
        sandbox.process.delete_session(EXEC_SESSION, request_timeout=API_TIMEOUT)
    except Exception as exc:
        if status_of(exc) != 404:
            raise


class DaytonaExec(DaytonaAPI):
    """exec, put_archive and get_archive on Daytona sandboxes."""

    def __init__(self, api_url: str, retries: int, exec_slice: int):
        super().__init__(api_url, retries)
        self._exec_slice = exec_slice
        self.sessions: set[str] = set()  # sandbox ids whose exec session this process has made

    def run_command(self, name: str, command: Command) -> ExecResult:
        sandbox = self.cached_sandbox(name, "exec")
        # sandbox.user is only what the create asked for (os_user): the daemon runs as the image's USER.
        line = command_line(
            command.argv, user=command.user, workdir=command.workdir, env=command.env, timeout=command.timeout
        )
        try:
            return self._exec(name, sandbox, line, command)
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

    def _exec(self, name: str, sandbox: Any, line: str, command: Command) -> ExecResult:
        stdin = command.stdin
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
        return self._wait(name, sandbox, directory, started, command)

    def _launch(self, name: str, sandbox: Any, launch: str) -> None:
        request = SessionExecuteRequest(command=launch, run_async=True)

        def send() -> Any:
            return sandbox.process.execute_session_command(EXEC_SESSION, request, timeout=int(API_TIMEOUT))

        for round_ in range(2):
            try:
                self.api_call(send, box=name, operation="exec")
            except ProviderError as exc:
                cause = exc.__cause__
                ended = cause is not None and _session_ended(cause)
                session_missing = ended or (cause is not None and status_of(cause) == 404)
                # The first launch of this process in this sandbox may fail for want of the session, whatever
                # the daemon answers then: make sure it exists and launch again (the launcher is idempotent).
                if round_ or not (session_missing or sandbox.id not in self.sessions):
                    raise self._toolbox_hint(exc, name) from exc
                self._ensure_session(name, sandbox, ended)
                continue
            self.sessions.add(sandbox.id)
            return

    def _ensure_session(self, name: str, sandbox: Any, ended: bool = False) -> None:
        """Make the box's exec session unless it exists. `ended`: the daemon said it has ended (its
        shell exited or died): an ended session keeps its name, so a create would answer 409 and
        every launch 410 for good; it is deleted first."""

        def make() -> None:
            if ended:
                _delete_session(sandbox)
            try:
                sandbox.process.create_session(EXEC_SESSION, request_timeout=API_TIMEOUT)
            except Exception as exc:
                if (HAS_DAYTONA and isinstance(exc, DaytonaConflictError)) or status_of(exc) == 409:
                    return  # made by another process, or by a re-sent request
                if ended or not _session_ended(exc):
                    raise
                # The create itself says the name is held by an ended session: free it, make it again.
                _delete_session(sandbox)
                sandbox.process.create_session(EXEC_SESSION, request_timeout=API_TIMEOUT)

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
        self.sessions.add(sandbox.id)

    def _toolbox_hint(self, exc: ProviderError, name: str) -> ProviderError:
        text = str(exc)
        if "not started" in text.lower() or "is the sandbox started" in text.lower():
            return ProviderError(
                "the box is not running: start it (playbooks/box_state.yml -e state=started) and try again",
                box=name,
                operation="exec",
            )
        return exc

    def _wait(self, name: str, sandbox: Any, directory: str, started: float, command: Command) -> ExecResult:
        timeout, limit = command.timeout, "" if command.limit is None else str(command.limit)
        cut_in_a_row = 0
        empty_in_a_row = 0
        while True:
            waiter = (f"sh -c {shlex.quote(WAIT_SCRIPT)} agentbox-wait {shlex.quote(directory)} {self._exec_slice} "
                      f"{shlex.quote(limit)}")
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
                output = CappedOutput(command.limit)
                if not (output.add(out) and output.add(err, stderr=True)):
                    raise output.refused(command.argv, name)
                return output.result(rc if rc is not None else -1)
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
