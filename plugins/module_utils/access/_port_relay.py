# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A forward of a port of a box to this machine, as a Python source file: the host runs it detached as
`python -c <this file's source> --port LOCAL -- <relay argv...>` (_forwards.start).

It listens on this machine's 127.0.0.1:LOCAL (0 = a free port, printed once as `ok <port>`) and, for each
connection, runs the relay argv (a command whose standard input and output are a TCP connection to the
box's own 127.0.0.1:<port>: `docker exec -i <box> python3 -c BOX_RELAY <port>`, over the engine's SSH
connection on a remote engine) and carries bytes both ways. The box is treated as hostile: what it
sends is only ever written to the connection it answers, never read as a command, and nothing it sends
makes this process connect anywhere. Standard library only; the host reads this source with
inspect.getsource (as _egress_forwarder's).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import threading

CHUNK = 64 * 1024
MARKER = "agentbox-port-forward"  # in the forwarder's command line, for `ps`

# Run in the box as `python3 -c BOX_RELAY <port>`: standard input and output are a TCP connection to the box's
# own loopback. Exit 3 without a byte when nothing listens there.
BOX_RELAY = r"""
import os, socket, sys, threading
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
except OSError:
    sys.exit(3)
s.settimeout(None)
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        s.sendall(data)
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up, daemon=True).start()
while True:
    try:
        data = s.recv(65536)
    except OSError:
        break
    if not data:
        break
    os.write(1, data)
"""


def _pump_in(client: socket.socket, process: subprocess.Popen) -> None:
    """The client's bytes to the relay's standard input; its end closes that input."""
    with contextlib.suppress(OSError, ValueError):
        while data := client.recv(CHUNK):
            process.stdin.write(data)
            process.stdin.flush()
    with contextlib.suppress(OSError, ValueError):
        process.stdin.close()


def _serve(client: socket.socket, argv: list[str]) -> None:
    """One connection: one relay into the box, bytes both ways, until either side ends."""
    try:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   bufsize=0, close_fds=True)  # fmt: skip
    except OSError:
        client.close()
        return
    threading.Thread(target=_pump_in, args=(client, process), daemon=True).start()
    try:
        with contextlib.suppress(OSError, ValueError):
            while data := process.stdout.read(CHUNK):
                client.sendall(data)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)
    finally:
        with contextlib.suppress(OSError):
            process.kill()
        process.wait()
        client.close()


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=MARKER)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--box", default="")  # only shown by `ps`
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    options = parser.parse_args(args)
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", options.port))
    except OSError as exc:
        os.write(1, f"error 127.0.0.1:{options.port} cannot be listened on: {exc.strerror}\n".encode())
        return 1
    listener.listen(64)
    os.write(1, f"ok {listener.getsockname()[1]}\n".encode())
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # the parent read its one line: nothing more goes there
    while True:
        client, _address = listener.accept()
        threading.Thread(target=_serve, args=(client, argv), daemon=True).start()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
