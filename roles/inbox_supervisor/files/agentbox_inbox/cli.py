# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The command line: every subcommand but `daemon`, `validate` and `init` is a client of the socket."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import socket
import sys
import time
from typing import Any

from .common import (
    DEFAULT_CONFIG,
    DEFAULT_LOG_DIR,
    DEFAULT_LOG_MAX_BYTES,
    DEFAULT_SOCKET,
    DEFAULT_STATE_DIR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
)
from .config import load_config_file
from .spec import ConfigIssue
from .supervisor import DaemonOptions, Supervisor
from .wizard import add_parser as add_init_parser


class Unreachable(Exception):
    pass


def connect(path: str, timeout: float | None) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(timeout)
    try:
        client.connect(path)
    except FileNotFoundError:
        client.close()
        raise Unreachable(f"no supervisor socket at {path}; is the daemon running? "
                          "(agentbox-boot starts it; `agentbox-ctl daemon` runs it by hand)") from None
    except PermissionError:
        client.close()
        raise Unreachable(f"permission denied on {path}: run this as the box user (vscode) or root") from None
    except OSError as exc:
        client.close()
        raise Unreachable(f"cannot reach the supervisor on {path}: {exc}") from None
    return client


def call(path: str, request: dict[str, Any], timeout: float | None = 30.0) -> dict[str, Any]:
    client = connect(path, timeout)
    try:
        client.sendall(json.dumps(request).encode("utf-8") + b"\n")
        line = client.makefile("rb").readline()
    except TimeoutError:
        raise Unreachable(f"the supervisor on {path} did not answer within {timeout:g}s") from None
    finally:
        client.close()
    if not line:
        raise Unreachable(f"the supervisor on {path} closed the connection without an answer")
    return json.loads(line)


def data_or_exit(reply: dict[str, Any]) -> Any:
    if not reply.get("ok"):
        sys.stderr.write(f"agentbox-ctl: {reply.get('error', 'request failed')}\n")
        sys.exit(EXIT_FAILED)
    return reply.get("data")


def print_status(data: dict[str, Any]) -> None:
    config = data["config"]
    print(f"config: {config['path']} ({'valid' if config['valid'] else 'INVALID'})"
          + (f" - {config['note']}" if config.get("note") else ""))
    for issue in config["issues"]:
        print(f"  {ConfigIssue(**issue).render(os.path.basename(config['path']))}")
    web = data["web"]
    if web.get("listen") is not None:
        target = f"-> {web['service']} on 127.0.0.1:{web['target_port']}" if web.get("service") else "(nothing exposed)"
        print(f"web: :{web['listen']} {target}")
    elif web.get("error"):
        print(f"web: {web['error']}")
    rows = [("UNIT", "KIND", "STATE", "PID", "RESTARTS", "DETAIL")]
    for unit in data["tasks"] + data["services"]:
        rows.append((unit["name"], unit["kind"], unit["state"], str(unit["pid"] or "-"),
                     str(unit.get("restarts", "-")), unit["blocked"] or unit["detail"]))
    if len(rows) == 1:
        print("no units")
        return
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5])


def agent_states(run_dir: str = "/run/agentbox/agents") -> list[dict[str, Any]]:
    """The coding agents' states as `agent-state` records them (one file per tmux session, on the tmpfs), each
    with the credential its requests carry as the host named it when it started the agent (`credential`:
    kind and source, e.g. through the host's egress gateway; never a value)."""
    states = []
    for path in sorted(glob.glob(os.path.join(run_dir, "*.state.json"))):
        with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as handle:
            state = json.load(handle)
            if isinstance(state, dict):
                state["credential"] = None
                with contextlib.suppress(OSError, UnicodeDecodeError), open(
                        path.removesuffix(".state.json") + ".credential", encoding="utf-8") as note:
                    state["credential"] = note.read(400).strip() or None
                states.append(state)
    return states


def print_agents(agents: list[dict[str, Any]]) -> None:
    for agent in agents:
        print(f"agent: {agent.get('name')} (tmux session {agent.get('session')}) {agent.get('state')} "
              f"since {agent.get('since')}")
        if agent.get("credential"):
            print(f"  credential: {agent['credential']}")


def cmd_status(args: argparse.Namespace) -> int:
    data = data_or_exit(call(args.socket, {"op": "status"}))
    data["agents"] = agent_states()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_status(data)
        print_agents(data["agents"])
    return EXIT_OK


def cmd_wait_ready(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    units = [u for u in (args.units or "").split(",") if u]
    while True:  # the daemon may still be starting (agentbox-boot runs right before)
        try:
            remaining = max(0.0, deadline - time.monotonic())
            reply = call(args.socket, {"op": "wait-ready", "timeout": remaining, "units": units}, remaining + 15)
            break
        except Unreachable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
    data = data_or_exit(reply)
    if args.json:
        print(json.dumps({k: data[k] for k in ("result", "problems", "waiting")}))
    else:
        if data["result"] == "ready":
            print("ready")
        elif data["result"] == "timeout":
            print(f"not ready after {args.timeout:g}s; still waiting for:", file=sys.stderr)
        else:
            print("not ready; failed:", file=sys.stderr)
        for line in data["problems"] + data["waiting"]:
            print(f"  {line}", file=sys.stderr)
    return {"ready": EXIT_OK, "timeout": EXIT_TIMEOUT}.get(data["result"], EXIT_FAILED)


def cmd_logs(args: argparse.Namespace) -> int:
    client = connect(args.socket, None if args.follow else 30.0)
    try:
        client.sendall(json.dumps({"op": "logs", "unit": args.unit, "tail": args.tail,
                                   "follow": args.follow}).encode("utf-8") + b"\n")
        for line in client.makefile("rb"):
            reply = json.loads(line)
            if not reply.get("ok"):
                sys.stderr.write(f"agentbox-ctl: {reply.get('error')}\n")
                return EXIT_FAILED
            sys.stdout.write(reply["data"]["text"])
            sys.stdout.flush()
            if not args.follow:
                break
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return EXIT_OK


def cmd_unit_op(args: argparse.Namespace) -> int:
    data = data_or_exit(call(args.socket, {"op": args.command, "unit": args.unit}, 120.0))
    print(f"{data['name']}: {data['state']}" + (f" ({data['detail']})" if data["detail"] else ""))
    return EXIT_OK


def cmd_run_task(args: argparse.Namespace) -> int:
    data = data_or_exit(call(args.socket, {"op": "run-task", "name": args.name, "force": args.force}, None))
    print(f"{data['name']}: {data['state']}" + (f" ({data['detail']})" if data["detail"] else ""))
    return EXIT_OK if data["state"] in ("done", "skipped") else EXIT_FAILED


def cmd_reload(args: argparse.Namespace) -> int:
    reply = call(args.socket, {"op": "reload"}, 120.0)
    data = data_or_exit(reply)
    for key in ("added", "removed", "changed", "unchanged"):
        print(f"{key}: {', '.join(data[key]) or '-'}")
    for warning in data.get("warnings", []):
        print(warning, file=sys.stderr)
    return EXIT_OK


def cmd_shutdown(args: argparse.Namespace) -> int:
    data = data_or_exit(call(args.socket, {"op": "shutdown"}))
    deadline = time.monotonic() + args.timeout
    while os.path.exists(args.socket) and time.monotonic() < deadline:  # the daemon removes it when done
        time.sleep(0.1)
    if os.path.exists(args.socket):
        sys.stderr.write(f"agentbox-ctl: the supervisor (pid {data['pid']}) is still stopping after {args.timeout:g}s\n")
        return EXIT_TIMEOUT
    print(f"supervisor pid {data['pid']} stopped")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    path = args.path
    if path is None:
        path = os.environ.get("AGENTBOX_CONFIG", DEFAULT_CONFIG)
        if not os.path.exists(path) and os.path.exists("agentbox.yaml"):
            path = "agentbox.yaml"
    config, issues = load_config_file(path)
    if args.json:
        print(json.dumps({"path": path, "valid": config is not None, "issues": [i.as_dict() for i in issues],
                          "tasks": sorted(config.tasks) if config else [],
                          "services": sorted(config.services) if config else []}))
    else:
        for issue in issues:
            print(issue.render(path), file=sys.stderr)
        if config is not None:
            print(f"{path}: valid ({len(config.tasks)} tasks, {len(config.services)} services)")
        else:
            errors = sum(1 for i in issues if i.severity == "error")
            print(f"{path}: invalid ({errors} error{'s' if errors != 1 else ''})", file=sys.stderr)
    return EXIT_OK if config is not None else EXIT_FAILED


def cmd_daemon(args: argparse.Namespace) -> int:
    web_port: int | None = None if args.web_port == "off" else int(args.web_port)
    opts = DaemonOptions(config=args.config, socket=args.socket, log_dir=args.log_dir, state_dir=args.state_dir,
                         markers_dir=args.markers_dir, web_port=web_port, web_fd=args.web_fd,
                         log_max_bytes=args.log_max_bytes)

    async def main() -> int:
        return await Supervisor(opts).run()

    return asyncio.run(main())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentbox-ctl", description="The agentbox in-box supervisor and its CLI.")
    parser.add_argument("--socket", default=os.environ.get("AGENTBOX_CTL_SOCKET", DEFAULT_SOCKET),
                        help="supervisor socket (env AGENTBOX_CTL_SOCKET; default %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("status", help="units, their states and why")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("wait-ready", help="block until tasks are done and services ready; exit 3 on timeout")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds (default %(default)s)")
    p.add_argument("--units", help="comma-separated unit names (default: every task and every started service)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_wait_ready)

    p = sub.add_parser("logs", help="print a unit's log")
    p.add_argument("unit")
    p.add_argument("--tail", type=int, default=100, help="last N lines (default %(default)s)")
    p.add_argument("--follow", "-f", action="store_true")
    p.set_defaults(func=cmd_logs)

    for name, text in (("start", "start a service (and what it needs)"), ("stop", "stop a unit"),
                       ("restart", "stop and start a service, resetting its backoff")):
        p = sub.add_parser(name, help=text)
        p.add_argument("unit")
        p.set_defaults(func=cmd_unit_op)

    p = sub.add_parser("run-task", help="run a task now and wait for it")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="run even when run_once says it already ran")
    p.set_defaults(func=cmd_run_task)

    p = sub.add_parser("reload", help="re-read agentbox.yaml and apply only what changed")
    p.set_defaults(func=cmd_reload)

    p = sub.add_parser("shutdown", help="stop every unit gracefully, then the daemon (before a box stops)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it (default %(default)s)")
    p.set_defaults(func=cmd_shutdown)

    p = sub.add_parser("agent-state", help="record the coding agent's state (the agent's hooks call this)")
    p.add_argument("state", choices=("working", "idle", "waiting", "stopped"))
    p.add_argument("--session", help="tmux session (default: $AGENTBOX_AGENT_SESSION)")

    p = sub.add_parser("validate", help="check an agentbox.yaml without running anything")
    p.add_argument("path", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

    add_init_parser(sub)

    p = sub.add_parser("daemon", help="run the supervisor in the foreground")
    p.add_argument("--config", default=os.environ.get("AGENTBOX_CONFIG", DEFAULT_CONFIG))
    p.add_argument("--log-dir", default=DEFAULT_LOG_DIR)
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    p.add_argument("--markers-dir", help="run_once markers (default: <state-dir>/markers)")
    p.add_argument("--web-port", default="80", help="port of the web forwarder, or 'off' (default %(default)s)")
    p.add_argument("--web-fd", type=int, help="an already listening socket to use as the web port (from agentbox-boot)")
    p.add_argument("--log-max-bytes", type=int, default=DEFAULT_LOG_MAX_BYTES,
                   help="rotate a unit's log at this size; one old file is kept (default %(default)s)")
    p.set_defaults(func=cmd_daemon)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Unreachable as exc:
        sys.stderr.write(f"agentbox-ctl: {exc}\n")
        return EXIT_UNREACHABLE
    except BrokenPipeError:
        return EXIT_OK
