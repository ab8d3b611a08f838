# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`ssh agentbox-<box>` for a boxd box: the box's own sshd in inetd mode through boxd's streaming exec.

boxd offers no SSH endpoint of its own here, but its Exec is a bidirectional stream: the alias's
ProxyCommand is ~/.agentbox/bin/agentbox-boxd-pipe, which runs this module as

    python -m ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd_ssh BASE_URL BOX

and pipes its stdin and stdout to `sshd -i` run as root in the box (SDK `machines.stream_exec`), as local
boxes use `docker exec -i`. The session itself is with the box's sshd, as vscode, with the user's key and
the box's host key pinned in ~/.agentbox/known_hosts (see _access).

The API key is never written to a file: the pipe takes BOXD_API_KEY (or BOXD_TOKEN) from the environment
ssh runs in, as every module does, and uses the host's token for that key (_boxd_token); the entry holds
only the base URL. The pipe does not wake a box: an exec
would wake a suspended machine, but not through the collection's start (boot sequence, keys on the box's
tmpfs). A box that is not running makes it exit 255, and the alias's wake launcher starts or resumes it
through the collection and runs the pipe again (see _wake). Standard output is the SSH stream: messages
go to standard error, which ssh shows.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from ...core._shell_line import command_line
from ...ssh._ssh_proxy import SSHD
from .._registry import get_provider

READ_SIZE = 1 << 16
USAGE = "usage: agentbox-boxd-pipe BASE_URL BOX"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _feed(stream: Any) -> None:
    """ssh's bytes to sshd's stdin; ssh closing its side closes sshd's."""
    try:
        while True:
            data = os.read(0, READ_SIZE)
            if not data:
                break
            stream.write(data)
    except (OSError, RuntimeError):
        pass  # the stream ended (sshd exited) or ssh went away
    finally:
        stream.write_eof()


def pipe(base_url: str, box: str) -> int:
    """Run the box's `sshd -i` with this process's stdin and stdout; its exit code (255: not reached)."""
    provider: Any = get_provider("boxd", base_url=base_url)
    try:
        facts = provider.find(box)
        if facts is None:
            sys.stderr.write(f"agentbox: no boxd box called {box!r} at {base_url}\n")
            return 255
        if facts.state != "running":
            sys.stderr.write(f"agentbox: boxd box {box!r} is {facts.state}\n")
            return 255  # the wake launcher starts it through the collection
        line = command_line([SSHD, "-i"], user="root")
        stream = provider.sdk.machines.stream_exec(facts.container, command=line, close_stdin=False)
        threading.Thread(target=_feed, args=(stream,), daemon=True).start()
        for chunk in stream.iter_chunks():
            _write_all(2 if chunk.is_stderr else 1, chunk.data)
        return int(stream.exit_code or 0)
    finally:
        provider.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(USAGE + "\n")
        return 2
    try:
        return pipe(argv[0], argv[1])
    except Exception as exc:  # noqa: BLE001 - whatever it is, ssh shows it and gives up
        sys.stderr.write(f"agentbox: cannot reach boxd box {argv[1]!r}: {exc}\n")
        return 255


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
