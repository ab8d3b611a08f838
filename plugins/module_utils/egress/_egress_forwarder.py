# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The in-box half of the egress gateway: a forwarder on the box's loopback, run in the box as
`python3 -c <this file's source> --socket /run/agentbox/relay/gateway.sock --port 3128`.

Programs in the box reach it through HTTP_PROXY and HTTPS_PROXY (box_environment): it carries each
connection, unchanged, to the gateway's unix socket, which the host bound into the box. When the
gateway does not answer it says so in an HTTP answer (and how to start it on the host) and closes:
nothing is ever sent any other way. The box's own python3 and the standard library only: nothing here
imports the collection; the host reads this source with inspect.getsource (as _restore_program's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import shlex
import sys

PORT = 3128  # the forwarder's port on the box's loopback
GATEWAY_SOCKET = "/run/agentbox/relay/gateway.sock"
CHUNK = 64 * 1024
CONNECT_TIMEOUT = 5.0
HEAD_TIMEOUT = 2.0  # waited for the head of a request the forwarder can only refuse
START_HINT = "ansible-playbook playbooks/relay.yml (or scripts/agentbox-relay start)"
LOOPBACK_NAMES = "localhost,127.0.0.1,::1"
LOG = "/run/agentbox/egress-forwarder.log"  # on the box's tmpfs
APT_FILE = "/etc/apt/apt.conf.d/80agentbox-egress"  # apt as root (sudo drops the variables)
SUDO_FILE = "/etc/sudoers.d/agentbox-egress"  # sudo keeps the proxy variables
PROFILE_FILE = "/etc/profile.d/agentbox-egress.sh"  # SSH logins, whose environment is sshd's, not the container's


def box_environment(port: int = PORT, no_proxy: str = "") -> dict[str, str]:
    """The proxy variables every process in the box gets, upper- and lower-case (curl reads only
    http_proxy in lower case; Go and Python read either). NO_PROXY keeps the box's own loopback direct."""
    proxy = f"http://127.0.0.1:{port}"
    exempt = ",".join(part for part in (LOOPBACK_NAMES, no_proxy) if part)
    values = {"http_proxy": proxy, "https_proxy": proxy, "no_proxy": exempt}
    return {**values, **{key.upper(): value for key, value in values.items()}}


def setup_command(port: int = PORT, socket_path: str = GATEWAY_SOCKET) -> str:
    """Root shell lines, run in the box at create and after each start: the proxy settings of the
    programs that do not take the container's environment (apt, sudo, SSH logins), then the forwarder,
    detached (a running one keeps the port: a second start fails to bind and ends). Nothing here goes
    into the image: the box's own files, written by exec (docs/egress.md)."""
    source = inspect.getsource(sys.modules[__name__])
    proxy = f"http://127.0.0.1:{port}"
    names = " ".join(sorted(box_environment(port)))
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in sorted(box_environment(port).items()))
    apt = f'Acquire::http::Proxy "{proxy}";\nAcquire::https::Proxy "{proxy}";\n'
    files = ((APT_FILE, "0644", apt), (SUDO_FILE, "0440", f'Defaults env_keep += "{names}"\n'),
             (PROFILE_FILE, "0644", exports))
    lines = [f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && printf %s {shlex.quote(text)} > {shlex.quote(path)} "
             f"&& chmod {mode} {shlex.quote(path)}" for path, mode, text in files]
    lines.append(f"(setsid python3 -c {shlex.quote(source)} --port {port} --socket {shlex.quote(socket_path)} "
                 f">{LOG} 2>&1 </dev/null &)")
    return "\n".join(lines)


def clear_command() -> str:
    """Root shell line that removes those settings: a box without a policy made from a checkpoint of a box
    with one (the checkpoint holds its files) must not point its programs at a forwarder it does not run."""
    return f"rm -f {APT_FILE} {SUDO_FILE} {PROFILE_FILE}"


def unreachable(problem: str, socket_path: str) -> bytes:
    body = (f"agentbox egress gateway: the host's gateway does not answer on {socket_path} ({problem}). No "
            f"connection leaves this box without it. On the host, start the relay: {START_HINT}.\n").encode()
    head = (f"HTTP/1.1 503 agentbox egress gateway not reachable: start it on the host\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body


async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while chunk := await source.read(CHUNK):
        sink.write(chunk)
        await sink.drain()
    if sink.can_write_eof():
        with contextlib.suppress(OSError):
            sink.write_eof()


async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, socket_path: str) -> None:
    try:
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_unix_connection(socket_path), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            with contextlib.suppress(Exception):  # read the request first: a client that is still sending sees the answer
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            writer.write(unreachable(str(exc) or "timed out", socket_path))
            with contextlib.suppress(OSError):
                await writer.drain()
            return
        out = asyncio.ensure_future(pump(reader, up_writer))
        back = asyncio.ensure_future(pump(up_reader, writer))
        try:
            # The gateway's end ends the connection; the client's end only half-closes toward it.
            done = (await asyncio.wait({out, back}, return_when=asyncio.FIRST_COMPLETED))[0]
            if back not in done and out.exception() is None:
                await asyncio.wait({back})
        finally:
            for task in (out, back):
                task.cancel()
            await asyncio.gather(out, back, return_exceptions=True)
            up_writer.close()
    finally:
        writer.close()


async def serve(port: int, socket_path: str, host: str = "127.0.0.1") -> None:
    server = await asyncio.start_server(lambda r, w: carry(r, w, socket_path), host, port, limit=CHUNK)
    bound = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"agentbox egress forwarder on {host}:{bound} -> {socket_path}\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="agentbox-egress-forwarder")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--socket", default=GATEWAY_SOCKET)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.socket))


if __name__ == "__main__":
    main(sys.argv[1:])
