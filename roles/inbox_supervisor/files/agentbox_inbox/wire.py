# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The daemon's socket and web-port plumbing: peer checks, JSON lines, byte pipes."""
from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import socket
import struct
from typing import Any


def peer_refusal(writer: asyncio.StreamWriter) -> str | None:
    """Root, the daemon's own user and members of its group may talk to it; the socket mode says the same."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, gid = struct.unpack("3i", creds)
    if uid in (0, os.getuid()) or gid == os.getgid():
        return None
    try:
        if pwd.getpwuid(uid).pw_name in grp.getgrgid(os.getgid()).gr_mem:
            return None
    except KeyError:
        pass
    return f"uid {uid} may not use this supervisor"


async def send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode("utf-8") + b"\n")
    await writer.drain()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still be answering
    except (ConnectionError, OSError):
        writer.close()


async def http_error(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    reason = {502: "Bad Gateway", 503: "Service Unavailable"}[status]
    body = f"agentbox: {message}\n".encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("ascii")
    writer.write(head + body)
    await writer.drain()
