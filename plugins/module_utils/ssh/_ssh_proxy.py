# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How `ssh agentbox-<box>` reaches the sshd of a box on a Docker engine: the command an SSH alias's
ProxyCommand runs, whose standard input and output are the box's `sshd -i`.

On the local engine it is `docker exec -i ... sshd -i`; on a remote engine the same `docker exec`
over `ssh <engine>`, with what the collection uses to reach the engine (its key, host key checking,
jump host) and one shared connection per engine. The Docker provider answers with these
(`DockerProvider.ssh_proxy`); the alias itself is written by `_access`.
"""

from __future__ import annotations

import os
import shlex
import shutil
from typing import Any

from ..core import _host_files
from ..core._naming import container_name

ALIAS_PREFIX = "agentbox-"
SSHD = "/usr/sbin/sshd"


def alias(box: str) -> str:
    return ALIAS_PREFIX + box


def control_dir() -> str:
    return os.path.join(_host_files.agentbox_dir(), "cm")


def local_proxy_argv(box: str, docker_host: str | None = None, command: list[str] | None = None) -> list[str]:
    """`docker exec ... sshd -i` on this machine's engine (`docker_host`, else DOCKER_HOST); `command`
    instead of `sshd -i` (agentbox_forward's relay to a port of the box)."""
    docker = shutil.which("docker") or "docker"
    argv = [docker]
    docker_host = docker_host or os.environ.get("DOCKER_HOST")
    if docker_host:
        argv += ["-H", docker_host]
    return [*argv, "exec", "-i", "-u", "root", container_name(box), *(command or [SSHD, "-i"])]


def engine_proxy_argv(
    box: str, engine: str, ssh_options: dict[str, Any], docker_host: str | None = None, command: list[str] | None = None
) -> list[str]:
    """`ssh <engine> docker exec ... sshd -i` with what the collection uses to reach the engine
    (`docker_host`: the daemon's socket there, its box engine's; None for the CLI's default); `command`
    instead of `sshd -i`, as local_proxy_argv."""
    from . import _ssh  # the SSH transport is loaded only for boxes on remote engines

    destination = _ssh.resolve_destination(
        engine,
        private_key_file=ssh_options.get("private_key_file"),
        strict_host_key_checking=ssh_options.get("strict_host_key_checking", True),
    )
    docker = _ssh.connection_for(engine, **ssh_options).docker_command(docker_host)
    config = _ssh.config_path()
    argv = ["ssh", "-F", config if os.path.exists(config) else "none", "-T", "-o", "BatchMode=yes"]
    argv += ["-p", str(destination.port), "-l", destination.user]
    for path in destination.identity_files:
        argv += ["-i", path]
    if destination.identities_only:
        argv += ["-o", "IdentitiesOnly=yes"]
    if destination.strict:
        argv += ["-o", "StrictHostKeyChecking=yes"]
        if destination.known_hosts_files:
            argv += ["-o", "UserKnownHostsFile=" + " ".join(destination.known_hosts_files)]
        if destination.host_key_alias:
            argv += ["-o", "HostKeyAlias=" + destination.host_key_alias]
    else:
        argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    if destination.proxy_jump:
        argv += ["-J", destination.proxy_jump]
    elif destination.proxy_command:
        argv += ["-o", "ProxyCommand=" + destination.proxy_command]
    control = os.path.join(control_dir(), "%C")
    if len(control) + 40 < 100:  # a unix socket path must fit in sun_path (%C is 40 characters)
        # One SSH session per engine, kept 10 minutes: every later box connection skips its handshake.
        argv += ["-o", "ControlMaster=auto", "-o", "ControlPath=" + control, "-o", "ControlPersist=600"]
    argv.append(destination.host)
    words = ["exec", "-i", "-u", "root", container_name(box), *(command or [SSHD, "-i"])]
    argv.append(" ".join([docker, *(shlex.quote(word) for word in words)]))
    return argv  # quoted once for the config (_config_quote): %C reaches the inner ssh as %C
