"""`scripts/daytona-emulator --port PORT`: serve the emulator in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import sys
import threading
from typing import Any

from .config import DEFAULT_IMAGE, DESIRED_STATE_SECONDS, LIST_LAG_SECONDS, EmulatorConfig
from .faults import FaultInjector, FaultRuleError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="daytona-emulator",
        description="A local emulator of the Daytona API (as daytona==0.226.1 speaks it); each sandbox is a "
                    "local Docker container. Serves http://127.0.0.1:PORT/api in the foreground.",
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick a free one, printed)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument("--api-key", default=None,
                        help="the Bearer key clients must send (default: $DAYTONA_EMULATOR_API_KEY, else "
                             "$DAYTONA_API_KEY, else a random key that is printed once)")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help=f"image behind the default snapshot ({DEFAULT_IMAGE})")
    parser.add_argument("--default-snapshot", default="", help="name of the default snapshot (default: the image)")
    parser.add_argument("--default-user", default="",
                        help="user for toolbox calls when create names none (default: the image's USER, else root)")
    parser.add_argument("--toolbox-as-os-user", action="store_true",
                        help="run toolbox calls as the create's user (os_user); by default they run as the image's "
                             "USER (root without one), as on Daytona, whose runner sets no container user")
    parser.add_argument("--instance-id", default=None, help="value of the io.agentbox.emulator label (random)")
    parser.add_argument("--transition-seconds", type=float, default=0.0,
                        help="hold starting/stopping/archiving/... this long (0: answer with the final state)")
    parser.add_argument("--desired-state-seconds", type=float, default=DESIRED_STATE_SECONDS,
                        help="create/start/stop/archive first only set the desired state; the state moves this "
                             "many seconds later (a create sits in `unknown`), as on Daytona (0: at once)")
    parser.add_argument("--list-lag", type=float, default=LIST_LAG_SECONDS,
                        help="seconds before list() shows a new sandbox and after it drops a deleted one")
    parser.add_argument("--proxy-timeout", type=float, default=300.0,
                        help="cut toolbox calls that run longer than this many seconds (default 300)")
    parser.add_argument("--proxy-cut-mode", choices=("504", "drop"), default="504",
                        help="how a cut call ends: a 504 from the proxy, or a dropped connection")
    parser.add_argument("--minute-seconds", type=float, default=60.0,
                        help="real seconds per emulated minute for auto-stop/archive/delete (default 60)")
    parser.add_argument("--enforce-resources", action="store_true", help="apply cpu/memory limits to containers")
    parser.add_argument("--no-box-capabilities", action="store_true",
                        help="run containers without SYS_ADMIN/NET_ADMIN, /dev/fuse and unconfined profiles")
    parser.add_argument("--no-events", action="store_true",
                        help="do not serve Socket.IO events (the SDK then polls for state changes)")
    parser.add_argument("--keep-on-exit", action="store_true",
                        help="leave containers and snapshot images when the emulator stops")
    parser.add_argument("--fault", action="append", default=[], metavar="JSON",
                        help='a fault rule, e.g. \'{"path": "^/api/sandbox$", "method": "POST", "status": 429}\'')
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> tuple[EmulatorConfig, bool]:
    if args.host not in LOOPBACK:
        raise SystemExit(f"daytona-emulator: --host must be a loopback address ({', '.join(LOOPBACK)}), "
                         f"not {args.host}")
    faults: list[dict[str, Any]] = []
    probe = FaultInjector()
    for raw in args.fault:
        try:
            spec = json.loads(raw)
            probe.add(spec)
        except (ValueError, FaultRuleError) as exc:
            raise SystemExit(f"daytona-emulator: bad --fault {raw!r}: {exc}") from exc
        faults.append(spec)
    api_key = args.api_key or os.environ.get("DAYTONA_EMULATOR_API_KEY") or os.environ.get("DAYTONA_API_KEY")
    generated = not api_key
    config = EmulatorConfig(
        host="127.0.0.1" if args.host == "localhost" else args.host, port=args.port,
        api_key=api_key or secrets.token_urlsafe(24), image=args.image, default_snapshot=args.default_snapshot,
        default_user=args.default_user, toolbox_as_image_user=not args.toolbox_as_os_user,
        transition_seconds=args.transition_seconds, desired_state_seconds=args.desired_state_seconds,
        list_lag_seconds=args.list_lag, proxy_timeout_seconds=args.proxy_timeout,
        proxy_cut_mode=args.proxy_cut_mode, minute_seconds=args.minute_seconds,
        enforce_resources=args.enforce_resources, box_capabilities=not args.no_box_capabilities,
        keep_on_exit=args.keep_on_exit, faults=faults, events=not args.no_events,
    )
    if args.instance_id:
        config.instance_id = args.instance_id
    return config, generated


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s daytona-emulator %(levelname)s %(message)s")
    config, generated_key = build_config(args)

    from .core import Emulator
    from .server import EmulatorHTTPServer

    try:
        emulator = Emulator(config)
    except Exception as exc:  # noqa: BLE001 - most likely no Docker engine
        print(f"daytona-emulator: cannot start: {exc} (is a Docker engine running? DOCKER_HOST is honoured)",
              file=sys.stderr)
        return 1
    try:
        server = EmulatorHTTPServer(emulator)
    except OSError as exc:
        emulator.shutdown()
        print(f"daytona-emulator: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    emulator.start_background()
    stopping = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # First stdout line: machine-readable, for launchers that pass --port 0.
    print(json.dumps({"event": "ready", "api_url": emulator.api_url, "instance_id": config.instance_id}), flush=True)
    print(f"daytona-emulator: serving {emulator.api_url} (instance {config.instance_id}, image {config.image})",
          file=sys.stderr)
    print(f"  export DAYTONA_API_URL={emulator.api_url}", file=sys.stderr)
    if generated_key:
        # A throw-away local key, made up now; shown so the user can point the SDK at this emulator.
        print(f"  export DAYTONA_API_KEY={config.api_key}", file=sys.stderr)
    else:
        print("  (clients must send the API key given to the emulator)", file=sys.stderr)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        print("daytona-emulator: stopping; removing its containers and images"
              if not config.keep_on_exit else "daytona-emulator: stopping; containers kept", file=sys.stderr)
        emulator.shutdown()
    return 0
