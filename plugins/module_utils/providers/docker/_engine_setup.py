# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The box engine of a remote Docker engine (provider docker_ssh): what answers there, and setting it up.

A remote engine isolates its boxes the way this machine does: a box engine (scripts/ensure-box-engine.sh,
a userns-remapped dockerd at /run/agentbox-engine/docker.sock) next to the host's own Docker. Setting it
up sends that script and its OCI runtime (scripts/agentbox-runc) over the engine's SSH connection (the
one the boxes use: its SSH config, key and host key checks) and runs it as root there: as the SSH user
when that is root, else through `sudo -n`. A user who cannot become root without a password is told so,
and what to do instead. The Docker provider then finds the box engine by its socket (DockerProvider).

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shlex
import tarfile
from typing import Any

from ...core._errors import ProviderError
from ...ssh import _ssh
from . import _box_engine

SETUP_FILES = ("ensure-box-engine.sh", "agentbox-runc")
SETUP_TIMEOUT = 600.0  # the script waits up to 180 s for the daemon; apt is never run by it
OUTPUT_TAIL = 1500


@dataclasses.dataclass
class EngineStatus:
    """What answers on a remote engine, for this SSH user."""

    engine: str
    user: str
    box_engine: bool  # a daemon answers at the box engine's socket
    box_engine_remaps: bool  # ... and remaps user namespaces
    default_engine: bool  # the engine's default daemon answers this user
    default_remaps: bool  # the engine's default daemon remaps (its boxes are isolated without a box engine)

    @property
    def isolated(self) -> bool:
        """Whether boxes created here without isolation none are made at all (and isolated)."""
        return (self.box_engine and self.box_engine_remaps) or self.default_remaps

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "isolated": self.isolated, "socket": _box_engine.REMOTE_BOX_ENGINE}


def _root_dir(connection: _ssh.EngineConnection, host: str | None) -> str | None:
    """The DockerRootDir of the daemon at `host` on the engine (None: the default one), or None when
    no daemon answers there for this user."""
    if not connection.answers(host):
        return None
    rc, out, _err = connection.run(f"{connection.docker_command(host)} info --format '{{{{.DockerRootDir}}}}'",
                                   timeout=60)  # fmt: skip
    return out.decode("utf-8", "replace").strip() if rc == 0 else None


def status(engine: str, ssh_options: dict[str, Any] | None = None) -> EngineStatus:
    """What answers on `engine`; EngineUnreachable (its message says what to do) when SSH or Docker does not."""
    connection = _ssh.connection_for(engine, **(ssh_options or {}))
    box_root = _root_dir(connection, _box_engine.REMOTE_BOX_ENGINE)
    default_root = _root_dir(connection, None)
    return EngineStatus(
        engine=engine,
        user=connection.destination.user,
        box_engine=box_root is not None,
        box_engine_remaps=bool(box_root) and _box_engine.remapped_ids(box_root or "") is not None,
        default_engine=default_root is not None,
        default_remaps=bool(default_root) and _box_engine.remapped_ids(default_root or "") is not None,
    )


def _setup_archive(scripts_dir: str) -> bytes:
    """The set-up script and the runtime it installs, as one tar for the engine's `tar -x`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in SETUP_FILES:
            path = os.path.join(scripts_dir, name)
            if not os.path.isfile(path):
                raise ProviderError(
                    f"{path} is missing: point scripts_dir at the collection's scripts/ directory "
                    "(playbooks/box_engine.yml does)"
                )
            info = tar.gettarinfo(path, arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o755
            with open(path, "rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def set_up(engine: str, scripts_dir: str, ssh_options: dict[str, Any] | None = None,
           check_mode: bool = False) -> tuple[bool, EngineStatus]:
    """Make sure `engine` has a box engine that remaps user namespaces: (changed, the status after)."""
    before = status(engine, ssh_options)
    if before.box_engine and before.box_engine_remaps:
        return False, before
    archive = _setup_archive(scripts_dir)  # checked in check mode too: a wrong directory is said now
    if check_mode:
        return True, before
    connection = _ssh.connection_for(engine, **(ssh_options or {}))
    as_root = ""
    if before.user != "root":
        rc, out, err = connection.run("sudo -n true", timeout=30)
        if rc != 0:
            raise ProviderError(
                f"engine {engine}: the SSH user {before.user!r} cannot become root there without a password "
                f"({(err or out).decode('utf-8', 'replace').strip()[-300:] or 'sudo -n failed'}), and only root can "
                "start the box engine. Connect as root (engine: root@host), allow that user passwordless sudo, or "
                "run scripts/ensure-box-engine.sh there as root yourself (with scripts/agentbox-runc beside it); "
                "or create with isolation=none to accept that root in a box is root on that host"
            )
        as_root = "sudo -n "
    script = (
        'set -u; dir=$(mktemp -d) || exit 1; tar -x -o -C "$dir" || { rm -rf "$dir"; exit 1; }; '
        f'{as_root}bash "$dir/{SETUP_FILES[0]}"; rc=$?; rm -rf "$dir"; exit $rc'
    )
    rc, out, err = connection.run(f"sh -c {shlex.quote(script)}", stdin=archive, timeout=SETUP_TIMEOUT)
    said = (err + out).decode("utf-8", "replace").strip()
    connection.close()  # the docker CLI checks are cached per connection: look again afresh
    after = status(engine, ssh_options)
    if rc != 0 or not (after.box_engine and after.box_engine_remaps):
        why = ("it does not remap user namespaces" if after.box_engine else
               "it does not answer for this SSH user" if rc == 0 else f"the set-up exited {rc}")  # fmt: skip
        raise ProviderError(
            f"engine {engine}: setting up the box engine failed ({why}). What the set-up said: "
            f"{said[-OUTPUT_TAIL:] or 'nothing'}"
            + (f". {before.user!r} may need to be in the engine's docker group (usermod -aG docker {before.user})"
               if rc == 0 and not after.box_engine and before.user != "root" else "")
        )
    return True, after
