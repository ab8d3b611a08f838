# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Mounts put into a running box's mount namespace from the host: how a claimed pooled box gets what a
normal create binds at `docker create` (its git layers' overlays, the relay's socket directory; docs/pool.md).

Each mount is made on the host, detached (Linux's mount API: `fsopen`/`fsmount` for an overlay with the
same options the engine gives a git layer's volume, `open_tree` for a bind), then attached at its path in
the box with `move_mount`, from a forked child that has joined the box's mount namespace. So:

- the host paths (a git view, the layer's upper and work directories) are resolved on the host, before the
  child joins the box; the box never sees them, as with the engine's own mounts;
- the mount point is opened in the box one component at a time with O_NOFOLLOW: a box that made a path
  component a symbolic link fails the attach instead of sending a host mount elsewhere;
- nothing of the box is executed on the host (no `nsenter mount`, which would run the box's mount binary).

The mounts live and die with the box's mount namespace: a restart loses them and the provider attaches
them again (_claimed.reattach); a destroy leaves nothing mounted on the host. Needs root on the host and
the engine on this machine (the local engine).

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import time
from typing import Any

# The new mount API's system calls: one number on every Linux architecture since 5.2.
_OPEN_TREE, _MOVE_MOUNT, _FSOPEN, _FSCONFIG, _FSMOUNT, _MOUNT_SETATTR = 428, 429, 430, 431, 432, 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_MOUNT_ATTR_RDONLY = 0x1
_CLONE_FS = 0x00000200
_CLONE_NEWNS = 0x20000
_MESSAGE_MAX = 4096
# The most the mount helper may take: a lookup in the box's tree can be made to hang (a FUSE mount the box made
# on the way), and the helper runs as host root: past this it is killed and the attach fails.
HELPER_SECONDS = 30.0


class MountError(OSError):
    """A mount that could not be put into the box; the message says which and why."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def overlay(lower: str, upper: str, work: str, target: str) -> dict[str, Any]:
    return {"kind": "overlay", "lowerdir": lower, "upperdir": upper, "workdir": work, "target": target}


def bind(source: str, target: str, read_only: bool = True) -> dict[str, Any]:
    return {"kind": "bind", "source": source, "target": target, "read_only": read_only}


def problem() -> str:
    """Why mounts cannot be put into a running box from here ('' when they can)."""
    if not hasattr(os, "fork") or os.uname().sysname != "Linux":
        return "attaching a workspace to a running box needs Linux"
    if os.geteuid() != 0:
        return "attaching the workspace's git layers to a running box needs root on this host"
    return ""


def attach(pid: int, mounts: list[dict[str, Any]]) -> None:
    """Put `mounts` into the mount namespace of process `pid` (a box's init, as the engine reports it).
    MountError when one could not be made; the ones made before it stay (the box is removed by the caller)."""
    if not mounts:
        return
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: the child only calls into it
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and never returns
        os.close(reader)
        code = 0
        try:
            _attach_here(libc, pid, mounts)
        except BaseException as exc:  # noqa: BLE001 - everything goes to the parent as one line
            os.write(writer, str(exc).encode("utf-8", "replace")[:_MESSAGE_MAX])
            code = 1
        os._exit(code)
    os.close(writer)
    message, deadline = b"", time.monotonic() + HELPER_SECONDS
    try:
        while True:
            ready, _w, _x = select.select([reader], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:  # the box's tree held the helper up: it never gets to finish
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                raise MountError(f"the mount helper did not finish within {HELPER_SECONDS:g} s (a path in the box hangs)")
            chunk = os.read(reader, _MESSAGE_MAX)
            if not chunk:
                break
            message = (message + chunk)[:_MESSAGE_MAX]
    finally:
        os.close(reader)
    _pid, status = os.waitpid(child, 0)
    if status != 0:
        raise MountError(message.decode("utf-8", "replace") or f"the mount helper ended with status {status}")


def _call(libc: Any, number: int, what: str, *args: Any) -> int:
    result = libc.syscall(number, *args)
    if result < 0:
        err = ctypes.get_errno()
        raise MountError(f"{what}: {os.strerror(err)}")
    return int(result)


def _detached(libc: Any, mount: dict[str, Any]) -> int:
    """The mount made on the host, attached nowhere yet: its descriptor."""
    if mount["kind"] == "overlay":
        fs = _call(libc, _FSOPEN, "overlay", b"overlay", 1)
        for key in ("lowerdir", "upperdir", "workdir"):
            _call(libc, _FSCONFIG, f"overlay {key} {mount[key]}", fs, _FSCONFIG_SET_STRING, key.encode(),
                  os.fsencode(mount[key]), 0)
        _call(libc, _FSCONFIG, f"overlay over {mount['lowerdir']}", fs, _FSCONFIG_CMD_CREATE, None, None, 0)
        return _call(libc, _FSMOUNT, "overlay mount", fs, 1, 0)
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE
    tree = _call(libc, _OPEN_TREE, f"bind of {mount['source']}", _AT_FDCWD, os.fsencode(mount["source"]), flags)
    if mount.get("read_only", True):
        attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY)
        _call(libc, _MOUNT_SETATTR, f"read-only bind of {mount['source']}", tree, b"",
              _AT_EMPTY_PATH | _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    return tree


def _open_in_box(path: str) -> int:
    """`path` in the box's tree (after setns), one component at a time, never through a symbolic link."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    for part in [p for p in path.split("/") if p]:
        if part in (".", ".."):
            raise MountError(f"mount point {path!r} in the box is not a plain path")
        try:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            raise MountError(f"mount point {path!r} in the box: {exc.strerror} at {part!r}") from exc
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _attach_here(libc: Any, pid: int, mounts: list[dict[str, Any]]) -> None:  # pragma: no cover - in the child
    detached = [_detached(libc, mount) for mount in mounts]
    namespace = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    # The kernel joins a mount namespace only for a task whose root and cwd (its fs_struct) no other task
    # shares, else EINVAL: seen in a forked test worker. A private copy first, whatever the parent did.
    if libc.unshare(_CLONE_FS) != 0:
        raise MountError(f"a private root and working directory for the mount helper: {os.strerror(ctypes.get_errno())}")
    if libc.setns(namespace, _CLONE_NEWNS) != 0:
        raise MountError(f"joining the box's mount namespace: {os.strerror(ctypes.get_errno())}")
    for mount, tree in zip(mounts, detached, strict=True):
        target = _open_in_box(mount["target"])
        _call(libc, _MOVE_MOUNT, f"mounting at {mount['target']} in the box", tree, b"", target, b"",
              _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH)
