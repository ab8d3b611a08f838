# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`ssh agentbox-<box>` for a Daytona box: through Daytona's SSH gateway, with an SSH access token.

Daytona's gateway (`ssh <token>@<gateway>`) runs commands as the sandbox daemon's user, which for the box
image is root. The alias therefore uses the gateway only as a pipe, as local boxes use `docker exec`: its
ProxyCommand asks the gateway to run the box's own `sshd -i`, and the real session is with that sshd, as
vscode, with the user's key and the box's host key pinned in ~/.agentbox/known_hosts (see _access). The
gateway never sees the session's contents and the box's sshd decides who gets in.

The token is a credential: it lives only in ~/.agentbox/daytona-ssh/<box>.conf (0600, the `User` of a
private ssh config that the ProxyCommand reads), never on a command line. Each create, start, restore and
`agentbox_access` mints a new one (which revokes the box's older ones, as Daytona does), valid
AGENTBOX_DAYTONA_SSH_MINUTES (default 480). Once the recorded expiry has passed, the ProxyCommand says so
and how to get a new one instead of trying.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
from typing import Any

from ...core import _host_files
from ...core._errors import ProviderError

MINUTES_ENV = "AGENTBOX_DAYTONA_SSH_MINUTES"
DEFAULT_MINUTES = 480
GATEWAY_ALIAS = "agentbox-daytona-gateway"
# What the gateway runs in the sandbox: the box's sshd in inetd mode, as root (sudo when the daemon is not).
SSHD_COMMAND = 'if [ "$(id -u)" = 0 ]; then exec /usr/sbin/sshd -i; else exec sudo -n /usr/sbin/sshd -i; fi'
# Daytona's answer, `ssh [-p PORT] TOKEN@HOST`, checked for shape: it ends up in an ssh config.
_SSH_COMMAND = re.compile(r"^ssh (?:-p (\d{1,5}) )?([A-Za-z0-9]{8,256})@([A-Za-z0-9][A-Za-z0-9.-]{0,252})$")


def minutes() -> int:
    raw = os.environ.get(MINUTES_ENV, "")
    if not raw:
        return DEFAULT_MINUTES
    if not raw.isdigit() or int(raw) < 1:
        raise ProviderError(f"{MINUTES_ENV}={raw!r}: give the SSH access lifetime in whole minutes, at least 1")
    return int(raw)


def parse_ssh_command(command: str) -> tuple[str, int, str]:
    """(host, port, token) from Daytona's sshCommand; ValueError when it is not the expected shape."""
    match = _SSH_COMMAND.match(command.strip())
    if not match or not 0 < int(match.group(1) or 22) < 65536:
        raise ValueError("Daytona's SSH access command is not `ssh [-p PORT] TOKEN@HOST`")
    return match.group(3), int(match.group(1) or 22), match.group(2)


def expiry_epoch(expires_at: str) -> int:
    """Seconds since the epoch of the SDK's expiry (a datetime printed, or ISO 8601 text)."""
    moment = datetime.datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp())


def directory() -> str:
    return os.path.join(_host_files.agentbox_dir(), "daytona-ssh")


def paths(box: str) -> tuple[str, str]:
    """The box's private gateway config and its ProxyCommand script."""
    return os.path.join(directory(), f"{box}.conf"), os.path.join(directory(), f"{box}.sh")


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def gateway_config(box: str, host: str, port: int, token: str, expires: int) -> str:
    until = datetime.datetime.fromtimestamp(expires, datetime.UTC).isoformat()
    lines = [
        f"# Written by agentbox.box: Daytona's SSH gateway for box {box}. The User is an SSH access token,",
        f"# a credential valid until {until}. Rewritten at each start of the box; never edit.",
        f"Host {GATEWAY_ALIAS}",
        f"  HostName {host}",
        f"  Port {port}",
        f"  User {token}",
        "  BatchMode yes",
        # The gateway accepts the token alone ("none"): offer no key and no password to it.
        "  PubkeyAuthentication no",
        "  PasswordAuthentication no",
        "  KbdInteractiveAuthentication no",
        "  GSSAPIAuthentication no",
        "  ForwardAgent no",
        "  ForwardX11 no",
        "  ClearAllForwardings yes",
        "  ServerAliveInterval 30",
        "  LogLevel ERROR",
    ]
    if _is_loopback(host):
        # A local emulator gets a new host key each run; the box's own key is checked end to end anyway.
        lines += ["  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null"]
    else:
        known = os.path.join(_host_files.agentbox_dir(), "known_hosts_gateways")
        lines += ["  StrictHostKeyChecking accept-new", f"  UserKnownHostsFile {known}"]
    return "\n".join(lines) + "\n"


def proxy_script(box: str, config: str, expires: int) -> str:
    until = datetime.datetime.fromtimestamp(expires, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    renew = f"ansible-playbook playbooks/attach.yml -e provider=daytona -e box={box} -e ide=ssh"
    message = f"agentbox: the Daytona SSH access of box {box} expired at {until}: run `{renew}` for a new one"
    return (
        "#!/bin/sh\n"
        f"# Written by agentbox.box: ProxyCommand of `ssh agentbox-{box}` (Daytona's gateway runs the box's sshd).\n"
        f'if [ "$(date +%s)" -ge {expires} ]; then\n'
        f"  echo {shlex.quote(message)} >&2\n"
        "  exit 255\n"
        "fi\n"
        f"exec ssh -F {shlex.quote(config)} -T {GATEWAY_ALIAS} {shlex.quote(SSHD_COMMAND)}\n"
    )


def write_gateway(box: str, access: dict[str, Any]) -> tuple[list[str], str]:
    """Write the box's gateway config and ProxyCommand script from ssh_access()'s answer: (the command that
    runs the script, the token's expiry in ISO 8601)."""
    try:
        host, port, token = parse_ssh_command(str(access.get("command") or ""))
        expires = expiry_epoch(str(access.get("expires_at") or ""))
    except ValueError as exc:
        raise ProviderError(str(exc), box=box, operation="SSH access") from exc
    if token != access.get("token"):
        raise ProviderError("Daytona's SSH command does not carry its token", box=box, operation="SSH access")
    _host_files.ensure_private_dir(directory())
    config, script = paths(box)
    _host_files.write_atomic(config, gateway_config(box, host, port, token, expires), 0o600)
    _host_files.write_atomic(script, proxy_script(box, config, expires), 0o700)
    until = datetime.datetime.fromtimestamp(expires, datetime.UTC).isoformat().replace("+00:00", "Z")
    return ["/bin/sh", script], until


def proxy_argv(provider: Any, box: str) -> tuple[list[str], str]:
    """A fresh SSH access token for the box, written where its alias's ProxyCommand reads it: (the command
    that carries the box's sshd, the token's expiry)."""
    return write_gateway(box, provider.ssh_access(box, minutes()))


def forget(box: str) -> None:
    """Remove the box's gateway files (its token with them)."""
    for path in paths(box):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
