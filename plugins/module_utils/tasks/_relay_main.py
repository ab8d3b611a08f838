# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""agentbox-relay's command line: serve (foreground), start, stop, restart, status, approvals.

    python -P -m ansible_collections.agentbox.box.plugins.module_utils.tasks._relay_main serve
    scripts/agentbox-relay start|stop|restart|status|approvals [--approve ID | --deny ID]

`start` runs `serve` detached in its own session and returns once the relay answers; a second
start finds it running and does nothing. playbooks/relay.yml and relay_approvals.yml do the same
through the agentbox_relay module.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from ..relay import _relay_server, _relay_state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentbox-relay", description="The agentbox host relay.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the relay in the foreground")
    sub.add_parser("start", help="start the relay in the background unless it runs")
    sub.add_parser("stop", help="stop the running relay")
    sub.add_parser("restart", help="stop, then start")
    sub.add_parser("status", help="is it running, and with what")
    approvals = sub.add_parser("approvals", help="list pending requests, or answer one")
    answer = approvals.add_mutually_exclusive_group()
    answer.add_argument("--approve", metavar="ID")
    answer.add_argument("--deny", metavar="ID")
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
            return asyncio.run(_relay_server.serve())
        if args.command == "start":
            _say(json.dumps(_relay_state.start()))
        elif args.command == "stop":
            _say(json.dumps(_relay_state.stop()))
        elif args.command == "restart":
            _relay_state.stop()
            _say(json.dumps(_relay_state.start()))
        elif args.command == "status":
            pid = _relay_state.running_pid()
            _say(json.dumps(_relay_state.control("status") if pid else {"running": False}))
            return 0 if pid else 3
        elif args.approve or args.deny:
            command = "approve" if args.approve else "deny"
            answered = _relay_state.control(command, id=args.approve or args.deny)["answered"]
            _say(f"{'approved' if args.approve else 'denied'}: {answered['line']}")
        else:
            for pending in _relay_state.control("list")["pending"]:
                _say(pending["line"])
    except _relay_state.RelayError as exc:
        sys.stderr.write(f"agentbox-relay: {exc}\n")
        return 1
    return 0


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    raise SystemExit(main())


RELAY_ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "state": {"type": "str", "choices": ["started", "stopped", "restarted"]},
    "approve": {"type": "str"},
    "deny": {"type": "str"},
}


def relay_task(params: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    """agentbox_relay's work: bring the relay to `state`, answer one approval, list what waits."""
    if params.get("approve") and params.get("deny"):
        raise _relay_state.RelayError("pass approve or deny, not both")
    state = params.get("state")  # None: leave the relay as it is (listing and answering only)
    pid = _relay_state.running_pid()
    before = {"running": pid is not None}
    result: dict[str, Any] = {"changed": False}
    if state == "stopped":
        result["changed"] = pid is not None
        if pid is not None and not check_mode:
            _relay_state.stop()
        pid = None if result["changed"] else pid
    elif state in ("started", "restarted"):
        restart = state == "restarted" and pid is not None
        result["changed"] = pid is None or restart
        if not check_mode:
            if restart:
                _relay_state.stop()
            if result["changed"]:
                pid = _relay_state.start()["pid"]
    answer = params.get("approve") or params.get("deny")
    if answer:
        if pid is None:
            raise _relay_state.RelayError("the relay is not running, so nothing waits for approval")
        if not check_mode:
            command = "approve" if params.get("approve") else "deny"
            result["answered"] = _relay_state.control(command, id=answer)["answered"]
            result["answered"]["decision"] = "approved" if command == "approve" else "denied"
        result["changed"] = True
    pending = _relay_state.control("list")["pending"] if pid is not None else []
    result.update(
        running=pid is not None,
        pid=pid,
        home=_relay_state.relay_home(),
        pending=pending,
        lines=[item["line"] for item in pending],
        diff={"before": before, "after": {"running": pid is not None}},
    )
    return result
