# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The relay's files under ~/.agentbox/relay/ and the host side's way of talking to the relay.

    ~/.agentbox/relay/            0700, the host user's only
        relay.lock  relay.pid     the running daemon holds an flock on relay.lock for its lifetime
        relay.log                 its log
        audit.jsonl               append-only: one JSON object per request
        control.sock              0600: status, approvals, reload, stop (the host user only)
        boxes/<id>.json           one registration per box: name, id, provider, engine
        sock/<id>/relay.sock      the box's socket; sock/<id>/ is bind-mounted into the box

A box's directory, not its socket file, is bind-mounted: a relay that restarts makes a new socket
in the same directory and the box sees it, where a bind of the old socket file would go stale.

What is in sock/<id>/ is the box's to replace (root in a box on the user's engine, isolation none, is
the host's root and can remount its bind writable; on the box engine it is nobody on the host): the
host opens that directory with O_NOFOLLOW and works under its descriptor only, removes whatever
stands at the socket's name (a file, a symlink, a directory tree) without following anything, and
binds each socket in sock/ (the host user's only) with its mode set there, then renames it in. No
path operation ever follows a name the box made.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from ..core._host_files import ensure_private_dir, read_text, write_atomic
from ..core._naming import now_iso

BOX_SOCKET_DIR = "/run/agentbox/relay"  # where the box sees its sock/<id>/ directory
SOCKET_NAME = "relay.sock"
CONTROL_TIMEOUT = 10.0
START_TIMEOUT = 15.0
STOP_TIMEOUT = 15.0
MAX_SOCKET_PATH = 107
REGISTRATION_GRACE = 600.0  # a registration younger than this may belong to a create in progress


class RelayError(RuntimeError):
    pass


def relay_home() -> str:
    return os.path.join(os.path.expanduser("~"), ".agentbox", "relay")


def path(*parts: str) -> str:
    return os.path.join(relay_home(), *parts)


def ensure_home() -> str:
    home = relay_home()
    os.makedirs(home, mode=0o700, exist_ok=True)
    os.chmod(home, 0o700)
    for sub in ("boxes", "sock"):
        os.makedirs(os.path.join(home, sub), mode=0o700, exist_ok=True)
    return home


def box_socket_dir(box_id: str) -> str:
    return path("sock", box_id)


def box_socket(box_id: str) -> str:
    return os.path.join(box_socket_dir(box_id), SOCKET_NAME)


def check_socket_path(file: str) -> str:
    # sun_path holds 107 bytes and a NUL: a longer path cannot be bound at all.
    if len(os.fsencode(file)) > MAX_SOCKET_PATH:
        raise RelayError(
            f"the relay's socket path {file} is longer than {MAX_SOCKET_PATH} bytes, which unix sockets allow: "
            "use a shorter home directory (HOME) for the user who runs the relay"
        )
    return file


# -- registrations --------------------------------------------------------------------------------
def register_box(name: str, box_id: str, provider: str, engine: str, options: dict[str, Any] | None = None,
                 channel: str | None = None, egress: dict[str, Any] | None = None) -> str:
    """Record a box and make its socket directory; returns the directory to bind into the box."""
    ensure_home()
    check_socket_path(box_socket(box_id))
    directory = box_socket_dir(box_id)
    # 0755: the box user must reach the socket through the bind mount; the parent stays 0700.
    with box_dir(box_id) as made:
        os.fchmod(made, 0o755)
    record = {"name": name, "id": box_id, "provider": provider, "engine": engine, "registered": now_iso(),
              "registered_at": time.time(), "options": options or {}}
    if channel:
        record["channel"] = channel  # the provider's relay_channel: socket, tunnel or poll
    if egress is not None:
        record["egress"] = egress  # the box's egress policy (_egress_policy.EgressPolicy.record), for the gateway
    write_json(path("boxes", f"{box_id}.json"), record)
    return directory


def forget_box(box_id: str) -> str | None:
    """Drop the box's registration and its socket directory, whatever the box put in it; None, or
    why something could not be removed (a caller reports it: forgetting a box never fails)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path("boxes", f"{box_id}.json"))
    try:
        with _sock_dir() as parent:
            remove_entry(parent, _component(box_id))
    except FileNotFoundError:
        return None
    except (OSError, RelayError) as exc:
        return f"the relay's directory of box id {box_id} ({box_socket_dir(box_id)}) could not be removed: {exc}"
    return None


# -- what a box can replace: its socket directory ---------------------------------------------------
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
REMOVE_TRIES = 3  # a box that keeps re-making its entry while the host removes it


def _component(name: str) -> str:
    """A box id as one name inside sock/ (never a path)."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise RelayError(f"{name!r} is not a box id")
    return name


@contextlib.contextmanager
def _sock_dir() -> Iterator[int]:
    """sock/ (the host user's only), opened without following a link."""
    descriptor = os.open(path("sock"), OPEN_DIR)
    try:
        yield descriptor
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def box_dir(box_id: str) -> Iterator[int]:
    """sock/<id>/ opened with O_NOFOLLOW (made when missing): a link in its place is refused, never followed."""
    with _sock_dir() as parent:
        name = _component(box_id)
        try:
            descriptor = os.open(name, OPEN_DIR, dir_fd=parent)
        except FileNotFoundError:
            os.mkdir(name, 0o755, dir_fd=parent)
            descriptor = os.open(name, OPEN_DIR, dir_fd=parent)
        try:
            yield descriptor
        finally:
            os.close(descriptor)


def remove_entry(directory: int, name: str) -> None:
    """Remove whatever is at `name` under the open `directory`: a file, a socket, a symlink (itself,
    never what it points to) or a directory tree (shutil.rmtree under the descriptor, which follows
    no link). FileNotFoundError when nothing is there."""
    for attempt in range(REMOVE_TRIES):
        found = os.stat(name, dir_fd=directory, follow_symlinks=False)
        try:
            if stat.S_ISDIR(found.st_mode):
                shutil.rmtree(name, dir_fd=directory)
            else:
                os.unlink(name, dir_fd=directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            if attempt == REMOVE_TRIES - 1:
                raise  # replaced again in between, every time: the caller says so


def bind_box_socket(box_id: str, name: str = SOCKET_NAME) -> socket.socket:
    """A unix socket bound at sock/<id>/<name> (relay.sock; the egress gateway's gateway.sock) with mode
    0666 (the box user connects through the bind mount), whatever the box left at that name. Bound and
    given its mode in sock/, which no box sees, then renamed into the box's directory under its descriptor."""
    check_socket_path(os.path.join(box_socket_dir(box_id), name))
    # Shorter than <id>/<name>, so it fits where that does; the name's first three letters keep the
    # staging names of one box's sockets apart (relay.sock and gateway.sock are made side by side).
    staging = f".{_component(box_id)}.{name[:3]}"
    with box_dir(box_id) as directory, _sock_dir() as parent:
        with contextlib.suppress(FileNotFoundError):
            remove_entry(directory, name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging, dir_fd=parent)  # a relay that died between bind and rename
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path("sock", staging))
            os.chmod(staging, 0o666, dir_fd=parent)  # in sock/: nothing there is the box's to swap
            os.rename(staging, name, src_dir_fd=parent, dst_dir_fd=directory)
        except BaseException:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(staging, dir_fd=parent)
            raise
    return listener


# Registrations written before the channel was recorded in them.
LEGACY_CHANNELS = {"docker": "socket", "docker_ssh": "tunnel", "daytona": "poll"}


def channel_of(registration: dict[str, Any]) -> str | None:
    """How the relay reaches a registered box: 'socket', 'tunnel' or 'poll'."""
    return registration.get("channel") or LEGACY_CHANNELS.get(str(registration.get("provider")))


def registered_boxes() -> dict[str, dict[str, Any]]:
    """{box id: registration} of every box the relay serves."""
    found: dict[str, dict[str, Any]] = {}
    directory = path("boxes")
    for entry in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if not entry.endswith(".json"):
            continue
        record = read_json(os.path.join(directory, entry))
        if record and record.get("id") == entry[: -len(".json")]:
            found[record["id"]] = record
    return found


def read_json(file: str) -> dict[str, Any] | None:
    try:
        with open(file, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(file: str, data: dict[str, Any]) -> None:
    temporary = f"{file}.{os.getpid()}.tmp"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as handle:
        json.dump(data, handle, sort_keys=True)
    os.replace(temporary, file)


def load_pending() -> list[dict[str, Any]]:
    """The requests that were waiting for the user when the relay last wrote pending.json."""
    rows = (read_json(path("pending.json")) or {}).get("pending")
    return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []


def save_pending(rows: list[dict[str, Any]]) -> None:
    write_json(path("pending.json"), {"pending": rows})


# -- audit log ------------------------------------------------------------------------------------
def audit(entry: dict[str, Any]) -> None:
    """Append one line to audit.jsonl."""
    append_line(path("audit.jsonl"), entry)


def append_line(file: str, entry: dict[str, Any]) -> None:
    """One JSON line (with the time) appended to `file` (0600): one write with O_APPEND, lines never interleave."""
    line = (json.dumps({"time": now_iso(), **entry}, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)


def read_lines(file: str) -> list[dict[str, Any]]:
    """The JSON lines of an audit log; [] when there is none."""
    try:
        with open(file, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def read_audit() -> list[dict[str, Any]]:
    return read_lines(path("audit.jsonl"))


# -- talking to the running relay -----------------------------------------------------------------
def control(command: str, timeout: float = CONTROL_TIMEOUT, **fields: Any) -> dict[str, Any]:
    """One request on the control socket; RelayError when no relay answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path("control.sock"))
        sock.sendall((json.dumps({"cmd": command, **fields}) + "\n").encode("utf-8"))
        line = sock.makefile("rb").readline()
    except OSError as exc:
        raise RelayError(f"the relay does not answer on {path('control.sock')} ({exc})") from exc
    finally:
        sock.close()
    if not line:
        raise RelayError("the relay closed the control connection without answering")
    answer = json.loads(line)
    if not answer.get("ok"):
        raise RelayError(answer.get("error", "the relay refused the request"))
    return answer


def running_pid() -> int | None:
    """The pid of the relay that answers, or None."""
    try:
        return int(control("status", timeout=2.0)["pid"])
    except (RelayError, ValueError, KeyError):
        return None


def lock_is_held() -> bool:
    """True while a relay holds relay.lock (released when its process exits, zombie or not)."""
    try:
        descriptor = os.open(path("relay.lock"), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def code_root() -> str | None:
    """The directory holding ansible_collections/, when this file is on disk (not in a module's zip)."""
    here = os.path.abspath(__file__)
    root = here
    # One directory per part of the module's name (ansible_collections.agentbox.box.plugins...._relay_state).
    for _level in range(__name__.count(".") + 1):
        root = os.path.dirname(root)
    if not os.path.isfile(here) or not os.path.isdir(os.path.join(root, "ansible_collections")):
        return None
    return root


def module_argv(module: str, python: str | None = None) -> list[str]:
    """`python -m module` that never imports from the current directory. Plain `-m` (and `-c`) put it
    first on sys.path, so a file named like any module imported later, in whatever directory the
    command runs from (the user's, ssh's for a ProxyCommand), would run on the host. -P (3.11+) leaves
    it out; an older interpreter drops it ('' under -c) before anything is imported."""
    python = python or sys.executable
    if python == sys.executable and sys.version_info < (3, 11):
        code = (
            "import sys; sys.path[:1] == [''] and sys.path.pop(0); import runpy; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
        )
        return [python, "-c", code]
    return [python, "-P", "-m", module]


def write_module_launcher(path: str, module: str, purpose: str) -> bool:
    """A 0700 shell script at path that runs `module` with this Python and the collection's files on disk
    (for a ProxyCommand: agentbox-wake, agentbox-boxd-pipe); whether it changed. From a module's zip (no
    files on disk) it is left as a controller-side run last wrote it."""
    root = code_root()
    if root is None:
        return False
    # -P (module_argv): ssh runs the ProxyCommand in the user's current directory, which must not be on sys.path.
    command = " ".join(shlex.quote(word) for word in module_argv(module))
    text = f'#!/bin/sh\n# Written by agentbox.box: {purpose}\nPYTHONPATH={shlex.quote(root)} exec {command} "$@"\n'
    if read_text(path) == text:
        return False
    ensure_private_dir(os.path.dirname(path))
    write_atomic(path, text, mode=0o700)
    return True


def start(python: str | None = None, root: str | None = None, wait: float = START_TIMEOUT) -> dict[str, Any]:
    """Start the daemon unless one answers; {'changed', 'pid'}. A second start is a no-op."""
    pid = running_pid()
    if pid is not None:
        return {"changed": False, "pid": pid}
    root = root or code_root()
    if root is None:
        raise RelayError("cannot find the collection's files to run the relay from; run playbooks/relay.yml on the host")
    ensure_home()
    env = {**os.environ, "PYTHONPATH": root, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ANSIBLE_MODULE_ARGS", None)
    log = os.open(path("relay.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # A new session: the daemon outlives the playbook and its process group's signals.
        subprocess.Popen(
            [*module_argv("ansible_collections.agentbox.box.plugins.module_utils.tasks._relay_main", python), "serve"],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        pid = running_pid()
        if pid is not None:
            return {"changed": True, "pid": pid}
        time.sleep(0.05)
    raise RelayError(f"the relay did not come up within {wait:.0f} s: see {path('relay.log')}")


def stop(wait: float = STOP_TIMEOUT) -> dict[str, Any]:
    """Ask the relay to stop and wait until it is gone; {'changed', 'pid'}."""
    pid = running_pid()
    if pid is None:
        return {"changed": False, "pid": None}
    with contextlib.suppress(RelayError):
        control("stop")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not lock_is_held():
            return {"changed": True, "pid": pid}
        time.sleep(0.05)
    raise RelayError(f"the relay (pid {pid}) did not stop within {wait:.0f} s")


def notify(box_id: str) -> bool:
    """Tell a running relay about a new box so its socket exists before the box needs it."""
    try:
        control("reload", box=box_id)
    except RelayError:
        return False
    return True


def attach_box(provider: Any, name: str, box_id: str, egress: dict[str, Any] | None = None) -> dict[str, str]:
    """At create: register the box, make sure a relay serves it; {host dir: path in the box} to bind.

    Local engine: a socket directory bound into the box. Remote engine (docker_ssh): no bind; the
    relay opens a channel over the engine's SSH connection (_relay_tunnel). Daytona and boxd: the
    relay polls a queue in the box through their exec (_relay_poll).
    `egress`: the box's egress policy record, for the gateway (docs/egress.md); None: the box has none.
    Creating a box never fails for the relay's sake: when the relay cannot be started here (the
    collection runs from a module's zip), the box's commands say how to start it, and a relay
    started later serves the box (it scans the registrations).
    """
    options = provider.reopen_options()  # no secret: the relay reads API keys from its own environment
    try:
        directory = register_box(name, box_id, provider.name, provider.engine, options, provider.relay_channel, egress)
    except RelayError:
        return {}  # a HOME too long for a unix socket path: the box is made without a relay channel
    if not notify(box_id) and code_root() is not None:
        with contextlib.suppress(RelayError, OSError):
            start()
    return {directory: BOX_SOCKET_DIR} if provider.shares_host_filesystem else {}
