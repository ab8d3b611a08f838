# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The daemon: runs the tasks and services of agentbox.yaml and answers on its unix socket."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from .common import (
    DEFAULT_CONFIG,
    DEFAULT_LOG_DIR,
    DEFAULT_LOG_MAX_BYTES,
    DEFAULT_SOCKET,
    DEFAULT_STATE_DIR,
    EXIT_FAILED,
    EXIT_OK,
    PROTOCOL_VERSION,
    log,
    utc_now,
)
from .config import load_config_file, topological_order
from .spec import Config, ConfigIssue, TaskSpec
from .units import RequestError, ServiceRuntime, TaskRuntime, UnitLog, UnitRuntime
from .wire import http_error, peer_refusal, pipe, send


@dataclass
class DaemonOptions:
    config: str = DEFAULT_CONFIG
    socket: str = DEFAULT_SOCKET
    log_dir: str = DEFAULT_LOG_DIR
    state_dir: str = DEFAULT_STATE_DIR
    markers_dir: str | None = None
    web_port: int | None = 80
    web_fd: int | None = None
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES


class _Attach(Exception):
    """Carries structured data along a RequestError (its __cause__)."""

    def __init__(self, payload: Any) -> None:
        super().__init__("attached")
        self.payload = payload


class Supervisor:
    def __init__(self, opts: DaemonOptions) -> None:
        self.opts = opts
        self.config_path = os.path.abspath(opts.config)
        self.workspace = os.path.dirname(self.config_path)
        self.markers_dir = opts.markers_dir or os.path.join(opts.state_dir, "markers")
        self.config: Config | None = None
        self.issues: list[ConfigIssue] = []
        self.config_note = ""
        self.units: dict[str, UnitRuntime] = {}
        self.order: list[str] = []
        self.logs: dict[str, UnitLog] = {}
        self.started_at = utc_now()
        self.web: dict[str, Any] = {"listen": None, "error": None}
        self._tick = asyncio.Event()
        self._shutdown = asyncio.Event()
        self._lock = asyncio.Lock()  # one reload/start/stop at a time

    # -- plumbing --------------------------------------------------------------------------

    def notify(self) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def wait_change(self, timeout: float) -> None:
        tick = self._tick
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(tick.wait(), timeout)

    def unit_log(self, name: str) -> UnitLog:
        if name not in self.logs:
            self.logs[name] = UnitLog(os.path.join(self.opts.log_dir, f"{name}.log"), self.opts.log_max_bytes)
        return self.logs[name]

    def read_marker(self, spec: TaskSpec) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.markers_dir, f"{spec.name}.json"), encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("sha256") == spec.marker_key() else None

    def write_marker(self, spec: TaskSpec) -> None:
        os.makedirs(self.markers_dir, exist_ok=True)
        path = os.path.join(self.markers_dir, f"{spec.name}.json")
        data = {"task": spec.name, "sha256": spec.marker_key(), "finished_at": utc_now()}
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)

    # -- configuration ---------------------------------------------------------------------

    def read_config(self) -> tuple[Config | None, list[ConfigIssue], str]:
        if not os.path.exists(self.config_path):
            note = f"no {self.config_path}: nothing to run"
            return Config(source=self.config_path, workspace=self.workspace), [], note
        config, issues = load_config_file(self.config_path)
        return config, issues, ""

    def _runtime(self, spec: Any) -> UnitRuntime:
        return TaskRuntime(self, spec) if spec.kind == "task" else ServiceRuntime(self, spec)

    def apply_initial(self) -> None:
        config, issues, note = self.read_config()
        self.issues, self.config_note = issues, note
        for issue in issues:
            log(issue.render(self.config_path))
        if config is None:
            log("agentbox.yaml is invalid: nothing starts until it is fixed and `agentbox-ctl reload` runs")
            return
        self.config = config
        self.order = topological_order(config)
        self.units = {name: self._runtime(spec) for name, spec in config.all_units().items()}
        self.notify()

    async def reload(self) -> dict[str, Any]:
        async with self._lock:
            config, issues, note = self.read_config()
            if config is None:
                errors = [i.as_dict() for i in issues]
                raise RequestError("agentbox.yaml is invalid; nothing was changed:\n" +
                                   "\n".join(i.render(self.config_path) for i in issues if i.severity == "error"),
                                   ) from _Attach(errors)
            new_specs = config.all_units()
            summary: dict[str, list[str]] = {"added": [], "removed": [], "changed": [], "unchanged": []}
            old_units = self.units
            for name, runtime in old_units.items():
                spec = new_specs.get(name)
                if spec is not None and spec.kind == runtime.kind and spec == runtime.spec:
                    runtime.spec = spec  # same definition; take the new line numbers
                    summary["unchanged"].append(name)
                    continue
                await runtime.stop("removed by reload" if spec is None else "changed by reload")
                summary["removed" if spec is None else "changed"].append(name)
            units: dict[str, UnitRuntime] = {}
            for name, spec in new_specs.items():
                if name in summary["unchanged"]:
                    units[name] = old_units[name]
                    continue
                runtime = self._runtime(spec)
                previous = old_units.get(name)
                if isinstance(runtime, ServiceRuntime) and isinstance(previous, ServiceRuntime):
                    runtime.launch_requested = runtime.wanted = spec.autostart or previous.wanted
                if name not in old_units:
                    summary["added"].append(name)
                units[name] = runtime
            self.config, self.issues, self.config_note = config, issues, note
            self.units = units
            self.order = topological_order(config)
            self.notify()
            summary["warnings"] = [i.render(self.config_path) for i in issues]  # type: ignore[assignment]
            log(f"reloaded: {json.dumps(summary)}")
            return summary

    # -- scheduling ------------------------------------------------------------------------

    def _needs_verdict(self, runtime: UnitRuntime) -> tuple[str, str]:
        waiting = []
        for need in runtime.spec.needs:
            dep = self.units[need]
            if dep.blocked:
                return "blocked", f"needs {need}, which is blocked ({dep.blocked})"
            if isinstance(dep, TaskRuntime):
                if dep.ok():
                    continue
                if dep.state == "failed":
                    return "blocked", f"needs task {need}, which failed"
                waiting.append(f"{need} ({dep.state})")
            else:
                assert isinstance(dep, ServiceRuntime)
                if dep.is_up():
                    continue
                if dep.state == "crashed":
                    return "blocked", f"needs service {need}, which crashed"
                if dep.state == "stopped" and not dep.active() and not dep.launch_requested:
                    return "blocked", f"needs service {need}, which is stopped"
                waiting.append(f"{need} ({dep.state})")
        if waiting:
            return "wait", "waiting for " + ", ".join(waiting)
        return "ok", ""

    def _pull_in_needs(self) -> None:
        """A service with autostart: false still starts when a unit that is going to run needs it."""
        going: list[str] = [n for n, u in self.units.items() if isinstance(u, TaskRuntime) and not u.ok()]
        going += [n for n, u in self.units.items()
                  if isinstance(u, ServiceRuntime) and (u.launch_requested or u.active())]
        seen = set()
        while going:
            name = going.pop()
            if name in seen:
                continue
            seen.add(name)
            for need in self.units[name].spec.needs:
                dep = self.units[need]
                if (isinstance(dep, ServiceRuntime) and not dep.active() and not dep.launch_requested
                        and not dep.stopped_by_user and dep.runs == 0 and dep.state in ("pending", "stopped")):
                    dep.launch_requested = dep.wanted = True
                    dep.log.event(f"service {need}: starting because {name} needs it")
                going.append(need)

    def schedule(self) -> None:
        if self._shutdown.is_set():
            return
        self._pull_in_needs()
        for name in self.order:
            runtime = self.units[name]
            if isinstance(runtime, TaskRuntime):
                if runtime.state != "pending" or runtime.active():
                    runtime.blocked = None
                    continue
                verdict, detail = self._needs_verdict(runtime)
                runtime.blocked = detail if verdict == "blocked" else None
                if verdict == "ok":
                    runtime.start()
                else:
                    runtime.set_state("pending", detail)
                continue
            assert isinstance(runtime, ServiceRuntime)
            if not runtime.launch_requested:
                runtime.blocked = None
                if runtime.state == "pending":
                    runtime.set_state("stopped", f"autostart: false; `agentbox-ctl start {name}` starts it")
                continue
            verdict, detail = self._needs_verdict(runtime)
            runtime.blocked = detail if verdict == "blocked" else None
            if verdict == "ok":
                runtime.launch()
            else:
                runtime.set_state("waiting", detail)

    async def scheduler(self) -> None:
        while not self._shutdown.is_set():
            tick = self._tick
            try:
                self.schedule()
            except Exception as exc:  # noqa: BLE001 - one bad evaluation must not stop the supervisor
                log(f"scheduler error: {exc!r}")
            await tick.wait()

    # -- readiness -------------------------------------------------------------------------

    def readiness(self, names: list[str] | None) -> tuple[str, list[str], list[str]]:
        """('ready'|'failed'|'waiting', problems, still-waiting)."""
        if self.config is None:
            errors = [i.render(self.config_path) for i in self.issues if i.severity == "error"]
            return "failed", ["agentbox.yaml is invalid, nothing was started:", *errors], []
        targets = names if names else [n for n in self.order
                                       if isinstance(self.units[n], TaskRuntime) or self.units[n].wanted]
        problems: list[str] = []
        waiting: list[str] = []
        for name in targets:
            unit = self.units[name]
            line = f"{name}: {unit.state}" + (f" ({unit.detail})" if unit.detail else "")
            if unit.blocked:
                problems.append(f"{name}: {unit.blocked}")
            elif isinstance(unit, TaskRuntime):
                if unit.state == "failed":
                    problems.append(line)
                elif not unit.ok():
                    waiting.append(line)
            else:
                assert isinstance(unit, ServiceRuntime)
                if unit.is_up():
                    continue
                if unit.state in ("crashed", "unhealthy") or (unit.state == "stopped" and not unit.active() and not unit.launch_requested):
                    problems.append(line)
                else:
                    waiting.append(line)
        if problems:
            return "failed", problems, waiting
        return ("waiting" if waiting else "ready"), problems, waiting

    def status(self) -> dict[str, Any]:
        exposed = self.config.exposed_service() if self.config else None
        return {
            "schema": 1,
            "daemon": {"pid": os.getpid(), "started_at": self.started_at, "socket": self.opts.socket,
                       "log_dir": self.opts.log_dir, "markers_dir": self.markers_dir},
            "config": {"path": self.config_path, "valid": self.config is not None, "note": self.config_note,
                       "issues": [i.as_dict() for i in self.issues]},
            "web": dict(self.web, service=exposed.name if exposed else None,
                        target_port=exposed.expose_port if exposed else None),
            "tasks": [self.units[n].snapshot() for n in self.order if isinstance(self.units[n], TaskRuntime)],
            "services": [self.units[n].snapshot() for n in self.order if isinstance(self.units[n], ServiceRuntime)],
        }

    # -- requests --------------------------------------------------------------------------

    def _unit(self, name: Any, kind: str | None = None) -> UnitRuntime:
        if not isinstance(name, str) or name not in self.units:
            known = ", ".join(self.order) or "none"
            raise RequestError(f"no unit named {name!r} (units: {known})")
        unit = self.units[name]
        if kind and unit.kind != kind:
            hint = "use run-task" if unit.kind == "task" else "use start/stop/restart"
            raise RequestError(f"{name} is a {unit.kind}, not a {kind}; {hint}")
        return unit

    async def op_wait_ready(self, req: dict[str, Any]) -> dict[str, Any]:
        timeout = float(req.get("timeout", 120))
        names = req.get("units") or None
        if names:
            for name in names:
                self._unit(name)
        deadline = time.monotonic() + timeout
        while True:
            verdict, problems, waiting = self.readiness(names)
            remaining = deadline - time.monotonic()
            if verdict != "waiting" or remaining <= 0:
                result = verdict if verdict != "waiting" else "timeout"
                return {"result": result, "problems": problems, "waiting": waiting, "status": self.status()}
            await self.wait_change(min(remaining, 1.0))

    async def _launched(self, unit: ServiceRuntime, timeout: float = 10.0) -> dict[str, Any]:
        """The unit's snapshot once the scheduler has acted on a start: the state reached, not the
        'stopped' it had when the request came in (starting, running, ready, waiting for its needs...)."""
        deadline = time.monotonic() + timeout
        while unit.state in ("stopped", "pending") and not unit.active():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self.wait_change(min(remaining, 0.5))
        return unit.snapshot()

    async def op_start(self, req: dict[str, Any]) -> dict[str, Any]:
        unit = self._unit(req.get("unit"), "service")
        assert isinstance(unit, ServiceRuntime)
        async with self._lock:
            unit.stopped_by_user = False
            if not unit.active():
                unit.launch_requested = unit.wanted = True
                unit.attempts = 0
                self.notify()
        return await self._launched(unit)

    async def op_stop(self, req: dict[str, Any]) -> dict[str, Any]:
        unit = self._unit(req.get("unit"))
        async with self._lock:
            if isinstance(unit, ServiceRuntime):
                unit.stopped_by_user = True
                unit.launch_requested = False
                unit.wanted = False
                await unit.stop("stopped by request")
            else:
                await unit.stop("stopped by request")
            self.notify()
        return unit.snapshot()

    async def op_restart(self, req: dict[str, Any]) -> dict[str, Any]:
        unit = self._unit(req.get("unit"), "service")
        assert isinstance(unit, ServiceRuntime)
        async with self._lock:
            await unit.stop("restarting")
            unit.stopped_by_user = False
            unit.attempts = 0
            unit.launch_requested = unit.wanted = True
            self.notify()
        return await self._launched(unit)

    async def op_run_task(self, req: dict[str, Any]) -> dict[str, Any]:
        unit = self._unit(req.get("name"), "task")
        assert isinstance(unit, TaskRuntime)
        if unit.active():
            raise RequestError(f"task {unit.name} is already running")
        verdict, detail = self._needs_verdict(unit)
        if verdict != "ok":
            raise RequestError(f"task {unit.name} cannot run yet: {detail}")
        unit.start(force=bool(req.get("force")))
        assert unit.runner is not None
        await asyncio.shield(unit.runner)
        return unit.snapshot()

    async def op_logs(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        name = req.get("unit")
        if not isinstance(name, str) or (name not in self.units and name not in self.logs):
            raise RequestError(f"no unit named {name!r} (units: {', '.join(self.order) or 'none'})")
        unit_log = self.unit_log(name)
        tail = int(req.get("tail", 100))
        text = unit_log.tail(tail).decode("utf-8", "replace")
        await send(writer, {"ok": True, "data": {"text": text}})
        if not req.get("follow"):
            return
        queue: asyncio.Queue = asyncio.Queue()
        unit_log.followers.add(queue)
        try:
            while not self._shutdown.is_set():
                chunk = await queue.get()
                if chunk is None:
                    await send(writer, {"ok": False, "error": "follow stopped: the reader fell too far behind"})
                    return
                await send(writer, {"ok": True, "data": {"text": chunk.decode("utf-8", "replace")}})
        finally:
            unit_log.followers.discard(queue)

    async def handle_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            refusal = peer_refusal(writer)
            if refusal:
                await send(writer, {"ok": False, "error": refusal})
                return
            while True:
                line = await reader.readline()
                if not line:
                    return
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError("not an object")
                except ValueError as exc:
                    await send(writer, {"ok": False, "error": f"bad request (one JSON object per line): {exc}"})
                    continue
                op = req.get("op")
                try:
                    if op == "logs":
                        await self.op_logs(req, writer)
                        if req.get("follow"):
                            return
                        continue
                    data = await self.dispatch(op, req)
                    await send(writer, {"ok": True, "data": data})
                except RequestError as exc:
                    reply: dict[str, Any] = {"ok": False, "error": str(exc)}
                    if isinstance(exc.__cause__, _Attach):
                        reply["issues"] = exc.__cause__.payload
                    await send(writer, reply)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def dispatch(self, op: Any, req: dict[str, Any]) -> Any:
        if op == "ping":
            return {"pid": os.getpid(), "protocol": PROTOCOL_VERSION, "started_at": self.started_at}
        if op == "status":
            return self.status()
        if op == "wait-ready":
            return await self.op_wait_ready(req)
        if op == "start":
            return await self.op_start(req)
        if op == "stop":
            return await self.op_stop(req)
        if op == "restart":
            return await self.op_restart(req)
        if op == "run-task":
            return await self.op_run_task(req)
        if op == "reload":
            return await self.reload()
        if op == "shutdown":
            # after this reply is written: stop every unit (SIGTERM to each process group), then exit
            asyncio.get_running_loop().call_later(0.05, self._shutdown.set)
            return {"pid": os.getpid()}
        raise RequestError(f"unknown op {op!r}")

    # -- web port --------------------------------------------------------------------------

    async def start_web(self) -> asyncio.AbstractServer | None:
        try:
            if self.opts.web_fd is not None:
                sock = socket.socket(fileno=self.opts.web_fd)
                sock.setblocking(False)
                server = await asyncio.start_server(self.web_client, sock=sock)
            elif self.opts.web_port is not None:
                server = await asyncio.start_server(self.web_client, host="0.0.0.0", port=self.opts.web_port,
                                                    reuse_address=True)
            else:
                return None
        except OSError as exc:
            hint = " (ports below 1024 need root: start the daemon through agentbox-boot)" if (
                self.opts.web_port or 0) < 1024 else ""
            self.web["error"] = f"cannot listen on the web port: {exc}{hint}"
            log(self.web["error"])
            return None
        self.web["listen"] = server.sockets[0].getsockname()[1]
        log(f"web port forwarder listening on :{self.web['listen']}")
        return server

    async def web_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        service = self.config.exposed_service() if self.config else None
        try:
            if service is None:
                await http_error(writer, 503, "No service in /workspace/agentbox.yaml sets expose: {port: N}.")
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", service.expose_port), 5.0)
            except (TimeoutError, OSError):
                state = self.units[service.name].state if service.name in self.units else "unknown"
                await http_error(writer, 502, f"Service {service.name} ({state}) does not accept connections on "
                                              f"port {service.expose_port} yet. Try `agentbox-ctl status`.")
                return
            upstream = asyncio.ensure_future(pipe(reader, up_writer))
            try:
                await pipe(up_reader, writer)  # the answer is complete when the service closes its side
            finally:
                upstream.cancel()
                up_writer.close()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    # -- life cycle ------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._shutdown.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self._reload_on_hup()))
        server = await self.open_socket()
        if server is None:
            return EXIT_FAILED
        web_server = await self.start_web()
        self.apply_initial()
        scheduler = asyncio.ensure_future(self.scheduler())
        log(f"listening on {self.opts.socket} (config {self.config_path})")
        await self._shutdown.wait()
        log("shutting down: stopping every unit")
        self.notify()
        scheduler.cancel()
        server.close()
        if web_server is not None:
            web_server.close()
        await asyncio.gather(*(unit.stop("supervisor shut down") for unit in self.units.values()),
                             return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.opts.socket)
        for unit_log in self.logs.values():
            unit_log.close()
        log("stopped")
        return EXIT_OK

    async def _reload_on_hup(self) -> None:
        try:
            await self.reload()
        except RequestError as exc:
            log(f"reload on SIGHUP refused: {exc}")

    async def open_socket(self) -> asyncio.AbstractServer | None:
        path = self.opts.socket
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # left behind by a daemon that died
            else:
                log(f"another agentbox-ctl daemon already answers on {path}; not starting a second one")
                return None
            finally:
                probe.close()
        previous = os.umask(0o117)  # the socket is born 0660: no window where others can connect
        try:
            server = await asyncio.start_unix_server(self.handle_client, path=path, limit=1 << 20)
        finally:
            os.umask(previous)
        os.chmod(path, 0o660)
        return server
