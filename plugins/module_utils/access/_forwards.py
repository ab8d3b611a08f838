# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Forwards of boxes' ports to this machine (agentbox_forward): started, recorded, found again, removed.

A forward is a detached process on this machine's 127.0.0.1:<local port>. For a port the box did not publish
at create it is _port_relay's forwarder, which runs the provider's `port_relay_argv` per connection (the box's
own loopback, reached through the engine: never a container's IP); for a port a remote engine published, the
SSH forward (`Provider.forward_port`). Each is recorded in `~/.agentbox/forwards.json` (provider, engine, box,
port, local port, pid and the pid's start time, so that a pid the system gave to another process since is never
taken for the forward nor killed). list_boxes.yml shows them; a stop or destroy of the box removes them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Any

from ..core import _host_files
from ..core._errors import ProviderError
from ..core._provider import BoxFacts, Provider
from . import _port_relay

START_TIMEOUT = 10.0


def records_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), "forwards.json")


def process_start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22); '' when it is gone or a
    zombie (ended, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[-1].split()
    except OSError:
        return ""
    return "" if fields[0] in ("Z", "X") else fields[19]


def _read() -> list[dict[str, Any]]:
    try:
        records = json.loads(_host_files.read_text(records_path()) or "[]")
    except ValueError:
        return []
    return [item for item in records if isinstance(item, dict)] if isinstance(records, list) else []


def _alive(record: dict[str, Any]) -> bool:
    started = process_start_time(int(record.get("pid") or 0)) if record.get("pid") else ""
    return bool(started) and started == record.get("started")


def _same_box(record: dict[str, Any], provider: str, engine: str, box: str) -> bool:
    return (record.get("provider"), record.get("engine"), record.get("box")) == (provider, engine, box)


def _change(keep: Any) -> list[dict[str, Any]]:
    """Rewrite the records under the lock, keeping the live ones keep(record) accepts; the dropped ones."""
    dropped: list[dict[str, Any]] = []

    def change(text: str | None) -> str:
        kept = []
        for record in _read():
            (kept if _alive(record) and keep(record) else dropped).append(record)
        return json.dumps(kept, indent=1, sort_keys=True) + "\n"

    _host_files.ensure_private_dir(_host_files.agentbox_dir())
    _host_files.update(records_path(), change)
    return dropped


def forwards_of(provider: str, engine: str, box: str | None = None) -> list[dict[str, Any]]:
    """The live forwards of a box (of every box of the engine when `box` is None)."""
    return [
        record
        for record in _read()
        if (record.get("provider"), record.get("engine")) == (provider, engine)
        and (box is None or record.get("box") == box)
        and _alive(record)
    ]


def live_forward(provider: Provider, box: str, port: int) -> dict[str, Any] | None:
    return next((r for r in forwards_of(provider.name, provider.engine, box) if r.get("port") == port), None)


def url_of_port(provider: Provider, facts: BoxFacts, port: int, local_port: int = 0,
                check_mode: bool = False) -> dict[str, Any]:  # fmt: skip
    """A URL on this machine for `port` of a running box on a Docker engine: the port the local engine published,
    else the live forward of it, else a new forward (not in check mode: `url` None). `url`, `local_port`, `pid`
    (of a forward) and `changed`."""
    published = facts.ports.get(str(port))
    if published and provider.port_urls == "published":  # on this machine's 127.0.0.1 already
        return {"changed": False, "url": f"http://127.0.0.1:{published}/", "local_port": published}
    live = live_forward(provider, facts.name, port)
    if live and local_port in (0, live["local_port"]):
        return {"changed": False, "url": live["url"], "local_port": live["local_port"], "pid": live["pid"]}
    if check_mode:
        return {"changed": True, "url": None}
    if live:  # asked on another local port: the new one replaces it
        remove(provider.name, provider.engine, facts.name, port)
    # A port published on a remote engine: the SSH forward to it; any other: a relay into the box per connection.
    record = start(provider, facts.name, port, local_port, published or None)
    return {"changed": True, "url": record["url"], "local_port": record["local_port"], "pid": record["pid"]}


def start(provider: Provider, box: str, port: int, local_port: int, published: int | None) -> dict[str, Any]:
    """Start a forward of the box's `port` on this machine's 127.0.0.1:`local_port` (0 = free) and record it.

    `published`: the engine's port the box published for it on a remote engine (an SSH forward), None for a
    port reached through the engine (_port_relay). The record is returned (pid, local_port, url)."""
    if published:
        pid, bound = provider.forward_port(box, published, local_port)
    else:
        pid, bound = start_forwarder(box, provider.port_relay_argv(box, port), local_port)
    record = {"provider": provider.name, "engine": provider.engine, "box": box, "port": port, "local_port": bound,
              "pid": pid, "started": process_start_time(pid), "url": f"http://127.0.0.1:{bound}/"}  # fmt: skip
    _change(lambda item: not (_same_box(item, provider.name, provider.engine, box) and item.get("port") == port))

    def add(text: str | None) -> str:
        return json.dumps([*_read(), record], indent=1, sort_keys=True) + "\n"

    _host_files.update(records_path(), add)
    return record


def start_forwarder(box: str, relay_argv: list[str], local_port: int) -> tuple[int, int]:
    """_port_relay's forwarder, detached (its own session, outliving this process): (pid, local port)."""
    if not shutil.which(relay_argv[0]):
        raise ProviderError(f"{relay_argv[0]} is not on this machine: a forward of box {box!r} runs it for each "
                            "connection; install it (the docker CLI: apt-get install docker.io)")  # fmt: skip
    source = inspect.getsource(_port_relay)
    argv = [sys.executable, "-c", source, "--box", box, "--port", str(local_port), "--", *relay_argv]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               start_new_session=True, close_fds=True)  # fmt: skip
    if process.stdout is None:  # stdout=PIPE always gives one; the type says Optional
        raise RuntimeError("the forwarder started without its stdout pipe")
    line = process.stdout.readline(1000).decode("utf-8", "replace").strip()
    process.stdout.close()
    if not line.startswith("ok "):
        with contextlib.suppress(OSError):
            process.kill()
        process.wait(START_TIMEOUT)
        raise ProviderError(f"the forward of box {box!r} did not start: {line.removeprefix('error ') or 'no answer'}")
    return process.pid, int(line.split()[1])


def _kill(record: dict[str, Any]) -> None:
    if _alive(record):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(record["pid"]), signal.SIGTERM)


def remove(provider: str, engine: str, box: str, port: int | None = None) -> list[dict[str, Any]]:
    """End the box's forwards (of `port` only, when given) and drop their records; the ones ended."""

    def keep(record: dict[str, Any]) -> bool:
        return not (_same_box(record, provider, engine, box) and (port is None or record.get("port") == port))

    ended = [record for record in _change(keep) if not keep(record) and _alive(record)]
    for record in ended:
        _kill(record)
    return ended
