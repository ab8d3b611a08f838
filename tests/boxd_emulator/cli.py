"""scripts/boxd-emulator: serve the emulator in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import threading
from typing import Any

from tests.daytona_emulator.config import DEFAULT_IMAGE

from .machines import PRODUCTION_START_SECONDS, PRODUCTION_STOP_SECONDS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="boxd-emulator", description="A local emulator of the boxd gRPC API: "
                                "plain HTTP/2 on 127.0.0.1, each machine a local container. BOXD_TOKEN: the token "
                                "clients send; BOXD_API_KEY (optional): the key they may exchange for a token.")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick a free one, printed)")
    p.add_argument("--image", default=DEFAULT_IMAGE, help=f"image of a machine created without one ({DEFAULT_IMAGE})")
    p.add_argument("--instance-id", default="", help="label value on every container and image (default: random)")
    p.add_argument("--start-seconds", type=float, default=0.3, help="how long a machine stays 'starting'")
    p.add_argument("--stop-seconds", type=float, default=0.2, help="how long a stop takes")
    p.add_argument("--production-timings", action="store_true",
                   help=f"a start takes {PRODUCTION_START_SECONDS:g} s, as measured on the production cluster, and a "
                        f"stop {PRODUCTION_STOP_SECONDS:g} s (overrides the two above)")
    p.add_argument("--no-box-capabilities", action="store_true",
                   help="plain containers (no SYS_ADMIN/NET_ADMIN, /dev/fuse, unconfined seccomp)")
    p.add_argument("--exchange-limit", type=int, default=10,
                   help="API key exchanges per address and window before a 429 (0: no limit; boxd's own figure "
                        "is not published)")
    p.add_argument("--exchange-window", type=float, default=60.0, help="the exchange limit's window, in seconds")
    p.add_argument("--fault", action="append", default=[], metavar="JSON",
                   help='a fault rule, e.g. \'{"method": "Exec", "action": "drop", "after": 1}\' (repeatable)')
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.production_timings:
        args.start_seconds, args.stop_seconds = PRODUCTION_START_SECONDS, PRODUCTION_STOP_SECONDS
    token = os.environ.get("BOXD_TOKEN", "")
    if not token:
        print("boxd-emulator: set BOXD_TOKEN to the token clients must send (any string)", file=sys.stderr)
        return 2
    from .server import Emulator

    try:
        emulator = Emulator(token=token, image=args.image, instance_id=args.instance_id or secrets.token_hex(6),
                            port=args.port, start_seconds=args.start_seconds, stop_seconds=args.stop_seconds,
                            box_capabilities=not args.no_box_capabilities,
                            faults=[json.loads(rule) for rule in args.fault],
                            api_key=os.environ.get("BOXD_API_KEY", ""), exchange_limit=args.exchange_limit,
                            exchange_window=args.exchange_window)
    except (OSError, ValueError) as exc:
        print(f"boxd-emulator: cannot start: {exc} (is a Docker engine running? DOCKER_HOST is honoured)",
              file=sys.stderr)
        return 1
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    parent = os.getppid()
    try:
        emulator.start()
        _say(json.dumps({"event": "ready", "base_url": emulator.base_url, "instance_id": emulator.instance_id}),
             sys.stdout)
        _say(f"boxd-emulator: serving {emulator.base_url} (instance {emulator.instance_id}, image {args.image})\n"
             f"  export BOXD_BASE_URL={emulator.base_url} BOXD_TOKEN=<the same token> (or BOXD_API_KEY=<the same "
             "key>, exchanged at /api/v1/auth/token)", sys.stderr)
        # A parent that died without stopping us (a killed test run) must not leave machines behind.
        while not done.wait(1.0):
            if os.getppid() != parent:
                break
        _say("boxd-emulator: stopping; removing its containers and snapshot images", sys.stderr)
    finally:
        emulator.stop()  # always: gRPC's server threads would keep the process alive, with its containers
    return 0


def _say(text: str, stream: Any) -> None:
    """Print, unless the reader is gone (its pipe closed): then the emulator still stops cleanly."""
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        pass
