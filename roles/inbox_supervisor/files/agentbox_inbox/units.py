# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The daemon's units: logs, processes, task and service state machines, readiness probes."""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from .common import log, utc_now
from .spec import Command, ReadyCheck, ServiceSpec, TaskSpec

if TYPE_CHECKING:
    from .supervisor import Supervisor


class UnitLog:
    """Append-only log of one unit, bounded: at max_bytes the file moves to <name>.log.1 (one kept)."""

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.followers: set = set()
        self._handle: Any = None
        self._size = 0

    def _open(self) -> None:
        if self._handle is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._handle = open(self.path, "ab")
            self._size = self._handle.tell()

    def write(self, data: bytes) -> None:
        try:
            self._open()
            if self._size > 0 and self._size + len(data) > self.max_bytes:
                self._handle.close()
                os.replace(self.path, self.path + ".1")
                self._handle = open(self.path, "ab")
                self._size = 0
            self._handle.write(data)
            self._handle.flush()
            self._size += len(data)
        except OSError as exc:  # a full disk must not take the supervisor down
            log(f"cannot write {self.path}: {exc}")
        for queue in list(self.followers):
            if queue.qsize() > 1000:  # a follower that stopped reading is dropped, never waited for
                self.followers.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(data)

    def event(self, message: str) -> None:
        self.write(f"[agentbox-ctl {utc_now()}] {message}\n".encode())

    def tail(self, lines: int) -> bytes:
        chunks = []
        for path in (self.path + ".1", self.path):
            try:
                with open(path, "rb") as handle:
                    chunks.append(handle.read())
            except FileNotFoundError:
                continue
        data = b"".join(chunks)
        if lines <= 0:
            return b""
        parts = data.split(b"\n")
        if parts and parts[-1] == b"":
            parts.pop()
        return b"\n".join(parts[-lines:]) + (b"\n" if parts else b"")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def signal_group(pid: int | None, sig: int) -> None:
    """Signal the process group the unit leads (each unit gets its own session)."""
    if not pid:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not start"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


def command_argv(command: Command) -> list[str]:
    if isinstance(command, list):
        return list(command)
    shell = shutil.which("bash") or "/bin/sh"
    return [shell, "-c", command]


class RequestError(Exception):
    pass


class UnitRuntime:
    kind = "unit"

    def __init__(self, sup: Supervisor, spec: Any) -> None:
        self.sup = sup
        self.spec = spec
        self.name = spec.name
        self.state = "pending"
        self.detail = ""
        self.since = utc_now()
        self.proc: asyncio.subprocess.Process | None = None
        self.exit_code: int | None = None
        self.runs = 0
        self.blocked: str | None = None
        self.runner: asyncio.Task | None = None
        self.stopping = False  # set by stop(): the exit that follows is requested, not a failure
        self.log = sup.unit_log(spec.name)

    def active(self) -> bool:
        return self.runner is not None and not self.runner.done()

    def set_state(self, state: str, detail: str = "") -> None:
        if state == self.state and detail == self.detail:
            return
        if state != self.state:
            self.since = utc_now()
            self.log.event(f"{self.kind} {self.name}: {state}" + (f" ({detail})" if detail else ""))
        self.state = state
        self.detail = detail
        self.sup.notify()

    async def spawn(self, command: Command, on_line: Any = None) -> tuple[asyncio.subprocess.Process, asyncio.Task]:
        spec = self.spec
        cwd = os.path.normpath(os.path.join(self.sup.workspace, spec.cwd or "."))
        if not os.path.isdir(cwd):
            raise OSError(f"cwd {cwd} does not exist")
        env = dict(os.environ)
        env.pop("AGENTBOX_CTL_SOCKET", None)
        env.update({"AGENTBOX_UNIT": spec.name, "AGENTBOX_WORKSPACE": self.sup.workspace})
        env.update(spec.env)
        argv = command_argv(command)
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        self.log.event(f"started pid {proc.pid}: {argv if isinstance(command, list) else command}")
        return proc, asyncio.ensure_future(self._pump(proc, on_line))

    async def _pump(self, proc: asyncio.subprocess.Process, on_line: Any) -> None:
        pending = b""
        assert proc.stdout is not None
        while True:
            chunk = await proc.stdout.read(65536)
            if not chunk:
                break
            self.log.write(chunk)
            if on_line is not None:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                pending = pending[-65536:]
                for raw in lines:
                    on_line(raw.decode("utf-8", "replace"))

    async def reap(self, proc: asyncio.subprocess.Process, pump: asyncio.Task) -> int:
        """Wait for the unit's main process, then clear what it left in its group."""
        code = await proc.wait()
        signal_group(proc.pid, signal.SIGKILL)  # leftovers would hold ports and the output pipe
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(pump), 1.0)
        pump.cancel()
        return code

    async def terminate(self, grace_s: float) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace_s)
        except TimeoutError:
            self.log.event(f"pid {proc.pid} ignored SIGTERM for {grace_s:.1f}s; sending SIGKILL")
            signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()

    def snapshot(self) -> dict[str, Any]:
        proc = self.proc
        return {
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "detail": self.detail,
            "since": self.since,
            "pid": proc.pid if proc is not None and proc.returncode is None else None,
            "exit_code": self.exit_code,
            "runs": self.runs,
            "needs": list(self.spec.needs),
            "blocked": self.blocked,
            "log": self.log.path,
        }


class TaskRuntime(UnitRuntime):
    kind = "task"

    def start(self, force: bool = False) -> None:
        self.runner = asyncio.ensure_future(self._run(force))

    def ok(self) -> bool:
        return self.state in ("done", "skipped")

    async def _execute(self, command: Command) -> tuple[int | None, str]:
        timeout = self.spec.timeout_ms / 1000 if self.spec.timeout_ms else None
        try:
            self.proc, pump = await self.spawn(command)
        except OSError as exc:
            self.log.event(f"cannot start: {exc}")
            return None, f"cannot start: {exc}"
        self.runs += 1
        self.sup.notify()
        try:
            code = await asyncio.wait_for(asyncio.shield(self.reap(self.proc, pump)), timeout)
            return code, describe_exit(code)
        except TimeoutError:
            await self.terminate(5.0)
            return self.proc.returncode, f"timed out after {timeout:g}s (timeout_ms) and was killed"
        finally:
            if self.proc.returncode is None:
                signal_group(self.proc.pid, signal.SIGKILL)

    async def _run(self, force: bool) -> None:
        spec: TaskSpec = self.spec
        self.exit_code = None
        try:
            if spec.run_once and not force:
                if spec.run_once_check:
                    self.set_state("running", "run_once check")
                    code, _output = await self._execute(spec.run_once_check)
                    if code == 0:
                        self.set_state("skipped", "run_once check passed")
                        return
                else:
                    marker = self.sup.read_marker(spec)
                    if marker:
                        self.set_state("skipped", f"ran on {marker.get('finished_at', '?')}; "
                                                  f"`agentbox-ctl run-task {spec.name} --force` runs it again")
                        return
            self.set_state("running", "")
            code, detail = await self._execute(spec.command)
            self.exit_code = code
            if self.stopping:
                return  # stop() sets the final state
            if code == 0:
                if spec.run_once:
                    self.sup.write_marker(spec)
                self.set_state("done", "")
            else:
                self.set_state("failed", detail)
        except asyncio.CancelledError:
            if not self.stopping:
                self.set_state("failed", "stopped by request")
            raise

    async def stop(self, reason: str) -> None:
        if self.active():
            self.stopping = True
            try:
                await self.terminate(5.0)
                assert self.runner is not None
                self.runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.runner
            finally:
                self.stopping = False
            self.set_state("failed", reason)


class ServiceRuntime(UnitRuntime):
    kind = "service"
    STABLE_AFTER_S = 10.0  # a run this long resets the backoff

    def __init__(self, sup: Supervisor, spec: ServiceSpec) -> None:
        super().__init__(sup, spec)
        self.launch_requested = spec.autostart
        self.stopped_by_user = False
        self.wanted = spec.autostart
        self.attempts = 0
        self.restarts = 0
        self.kill_reason: str | None = None
        self.log_matched = False
        self.probe_info = ""

    def is_up(self) -> bool:
        return self.state == "ready" or (self.state == "running" and self.spec.ready_when is None)

    def launch(self) -> None:
        self.launch_requested = False
        self.wanted = True  # stays wanted (and counted by wait-ready) until a user stops it
        self.runner = asyncio.ensure_future(self._run())

    def _on_line(self, line: str) -> None:
        check = self.spec.ready_when
        matching = check is not None and check.kind == "log_match" and not self.log_matched
        if matching and re.search(check.pattern, line):
            self.log_matched = True
            self.probe_info = f"log matched: {line.strip()[:200]}"

    async def _run(self) -> None:
        spec: ServiceSpec = self.spec
        probe: asyncio.Task | None = None
        pump: asyncio.Task | None = None
        try:
            while True:
                started = time.monotonic()
                self.kill_reason = None
                self.log_matched = False
                self.exit_code = None
                self.set_state("starting" if spec.ready_when else "running", "")
                try:
                    self.proc, pump = await self.spawn(spec.command, self._on_line)
                except OSError as exc:
                    code: int | None = None
                    detail = f"cannot start: {exc}"
                    self.log.event(detail)
                else:
                    self.runs += 1
                    if spec.ready_when:
                        probe = asyncio.ensure_future(self._probe(self.proc))
                        self.set_state("starting", f"pid {self.proc.pid}, waiting for {spec.ready_when.describe()}")
                    else:
                        self.set_state("running", f"pid {self.proc.pid}")
                    code = await self.reap(self.proc, pump)
                    if probe is not None:
                        probe.cancel()
                    detail = describe_exit(code)
                    if self.kill_reason:
                        detail = f"{self.kill_reason}; {detail}"
                    self.log.event(detail)
                self.exit_code = code
                if self.stopping:
                    return  # stop() sets the final state
                if time.monotonic() - started >= self.STABLE_AFTER_S:
                    self.attempts = 0
                failed = code != 0
                if spec.restart == "never" or (spec.restart == "on-failure" and not failed):
                    policy = f"restart: {spec.restart}"
                    self.set_state("crashed" if failed else "stopped", f"{detail} ({policy})")
                    return
                self.attempts += 1
                delay_ms = spec.backoff.delay_ms(self.attempts)
                self.set_state("backoff", f"{detail}; restart #{self.attempts} in {delay_ms / 1000:g}s")
                await asyncio.sleep(delay_ms / 1000)
                self.restarts += 1
        finally:
            for helper in (probe, pump):
                if helper is not None:
                    helper.cancel()
            if self.proc is not None and self.proc.returncode is None:
                signal_group(self.proc.pid, signal.SIGKILL)

    async def _probe(self, proc: asyncio.subprocess.Process) -> None:
        check: ReadyCheck = self.spec.ready_when
        await asyncio.sleep(check.initial_delay_ms / 1000)
        deadline = time.monotonic() + check.timeout_ms / 1000
        timed_out = False
        while proc.returncode is None:
            ok, info = await self._check(check)
            self.probe_info = info
            if ok:
                self.set_state("ready", info)
                return
            if not timed_out and time.monotonic() >= deadline:
                timed_out = True
                waited = f"not ready after {check.timeout_ms / 1000:g}s ({info})"
                if check.on_timeout == "kill":
                    self.kill_reason = f"{waited}, killed (on_timeout: kill)"
                    self.log.event(self.kill_reason)
                    await self.terminate(self.spec.stop_timeout_ms / 1000)
                    return
                self.set_state("unhealthy", f"{waited}; still checking")
            await asyncio.sleep(check.interval_ms / 1000)

    async def _check(self, check: ReadyCheck) -> tuple[bool, str]:
        if check.kind == "log_match":
            return (True, self.probe_info) if self.log_matched else (False, f"no output line matches /{check.pattern}/ yet")
        if check.kind == "port":
            try:
                _reader, writer = await asyncio.wait_for(asyncio.open_connection(check.host, check.port), 2.0)
            except (TimeoutError, OSError) as exc:
                return False, f"port {check.host}:{check.port}: {exc.__class__.__name__}"
            writer.close()
            return True, f"port {check.host}:{check.port} accepts connections"
        loop = asyncio.get_running_loop()
        status, error = await loop.run_in_executor(None, http_status, check.url, 2.0)
        if status is None:
            return False, f"GET {check.url}: {error}"
        wanted = check.expect_status
        ok = status in wanted if wanted else 200 <= status < 400
        return ok, f"GET {check.url} answered {status}"

    async def stop(self, reason: str) -> None:
        if self.active():
            self.stopping = True
            try:
                await self.terminate(self.spec.stop_timeout_ms / 1000)
                assert self.runner is not None
                self.runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.runner
            finally:
                self.stopping = False
        self.set_state("stopped", reason)

    def snapshot(self) -> dict[str, Any]:
        data = super().snapshot()
        data.update({
            "restarts": self.restarts,
            "restart": self.spec.restart,
            "ready_when": self.spec.ready_when.describe() if self.spec.ready_when else None,
            "expose": self.spec.expose_port,
            "wanted": self.wanted,
        })
        return data


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:  # the probe judges the first answer
        return None


_HTTP_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def http_status(url: str, timeout: float) -> tuple[int | None, str]:
    try:
        with _HTTP_OPENER.open(url, timeout=timeout) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason)
