# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`ssh agentbox-<box>` on a paused or stopped box: wake it, then make the alias's connection again.

The alias's ProxyCommand (see _access.waking_proxy_command) runs the box's sshd through the engine and,
only when that fails, this module through ~/.agentbox/bin/agentbox-wake:

    python -P -m ansible_collections.agentbox.box.plugins.module_utils.tasks._wake PROVIDER ENGINE BOX OPTIONS -- COMMAND...

(OPTIONS: the JSON object of the provider's `reopen_options`: a remote engine and its SSH settings, an API
URL, `{}` for the local engine, which is reached through DOCKER_HOST as the alias's own command. Never a
secret: API keys come from the environment ssh runs in.)

A paused box is resumed and a stopped one started through the collection's own start (boot sequence,
SSH keys written again to the box's tmpfs, agents resumed), then COMMAND (the same sshd through the
engine) replaces this process. A running box whose provider hands out SSH access that runs out
(Daytona's gateway token) gets new access (the gateway refused the old one: expired, or revoked by
a newer one); that needs DAYTONA_API_KEY where ssh runs. The direct path also "fails" after every
finished session (`sshd -i` exits 255 once ssh has closed its end): ssh normally kills its ProxyCommand
first, but not when it runs with SIGHUP ignored (`nohup ssh ...`), so a wake whose standard input ssh
has already closed does nothing at all. A box that was stopped gets new published
ports with its start: its new web URL is said on standard error. A running box means the connection failed for its own reasons: nothing is retried.
Standard output is the SSH stream, so nothing but COMMAND may write to it; every message goes to
standard error, which ssh shows.
"""

from __future__ import annotations

import json
import os
import select
import sys
from typing import Any

from ..box import _box
from ..providers._registry import get_provider

USAGE = "usage: agentbox-wake PROVIDER ENGINE BOX PROVIDER_OPTIONS_JSON -- COMMAND..."


def say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def ssh_has_gone() -> bool:
    """True when ssh has closed its end of our standard input: its session is over, nobody waits for a
    wake. (sshd sees that end of file first, so it is already there when the direct path's exit brings
    us here; while ssh waits for a connection it holds the pipe open.)"""
    poller = select.poll()
    poller.register(0, select.POLLIN)
    return any(mask & select.POLLHUP for _fd, mask in poller.poll(0))


def wake(provider_name: str, engine: str, box: str, options: dict[str, Any]) -> tuple[str, str | None]:
    """Resume or start the box: its state before ('running' when there was nothing to do), and its web URL
    when a start moved it (a stopped box's published port is gone, and the start publishes a new one).
    `options` are the provider's reopen_options, written into the alias; API keys come from the environment."""
    # ENGINE first: an alias written before OPTIONS carried the engine still names it there.
    provider = get_provider(provider_name, **{"engine": engine, **options})
    try:
        facts = provider.find(box)
        if facts is None:
            raise LookupError(f"no box called {box!r} on engine {engine}")
        if facts.state in ("paused", "stopped"):
            # The start writes the alias's entry again (keys, host key); a Daytona start renews its SSH access too.
            after = _box.set_state(provider, facts, "started")
            # A resume keeps the ports. A signed web URL (Daytona's preview link) is a credential: never on stderr.
            moved = facts.state == "stopped" and provider.port_urls != "signed" and after.web_url != facts.web_url
            return facts.state, after.web_url if moved else None
        if provider.ssh_access_expires:
            # Running, so the gateway refused the token (expired, or revoked by a newer one): a new one.
            access = _box.refresh_access(provider, facts)
            if access.get("warnings"):
                raise RuntimeError("; ".join(access["warnings"]))
            return "renewed", None
        return facts.state, None
    finally:
        provider.close()


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 4 or len(argv) < 6:
        say(USAGE)
        return 2
    if ssh_has_gone():
        return 255  # the direct path ended with a session it carried; nothing to wake, no one to tell
    provider_name, engine, box, raw_options = argv[:4]
    command = argv[5:]
    stream = os.dup(1)
    os.dup2(2, 1)  # until COMMAND runs, fd 1 (the SSH stream) gets nothing
    try:
        options = json.loads(raw_options)
        if not isinstance(options, dict):
            raise ValueError("PROVIDER_OPTIONS_JSON must be an object")
        before, web_url = wake(provider_name, engine, box, options)
    except Exception as exc:  # noqa: BLE001 - whatever it is, ssh shows it and gives up
        say(f"agentbox: cannot wake box {box!r}: {exc}")
        return 255
    finally:
        sys.stdout.flush()
        os.dup2(stream, 1)
        os.close(stream)
    if before == "renewed":
        say(f"agentbox: box {box!r}: its Daytona SSH access had run out; renewed")
    elif before not in ("paused", "stopped"):
        say(f"agentbox: box {box!r} is {before}: the connection failed for another reason")
        return 255
    else:
        say(f"agentbox: box {box!r} was {before}; it runs again")
        if web_url:
            say(f"agentbox: box {box!r}: web {web_url}")  # its port moved with the start
    os.execvp(command[0], command)
    return 255  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
