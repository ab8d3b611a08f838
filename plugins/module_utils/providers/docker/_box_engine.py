# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the local Docker boxes live: the box engine, or the user's own engine.

Root in a box must be nobody on the host, so local boxes run on the **box engine**: a Docker daemon
the collection starts and owns (scripts/ensure-box-engine.sh) with user-namespace remapping, its
own socket, data root, bridge and iptables chains. The user's engine (DOCKER_HOST) is left alone and
serves only boxes created with `isolation: none` (and boxes made before the box engine existed).

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import os
from typing import Any

ISOLATIONS = ("userns", "none")
DEFAULT_ISOLATION = "userns"
USER_ENGINE_SOCKET = "/var/run/docker.sock"
BOX_ENGINE_SOCKET = "/run/agentbox-engine/docker.sock"
START_HINT = "start it as root with scripts/ensure-box-engine.sh (scripts/up.sh does), or create with isolation=none"
# A remote engine's box engine: the same daemon, set up there by playbooks/box_engine.yml (as root).
REMOTE_BOX_ENGINE = f"unix://{BOX_ENGINE_SOCKET}"
# The box engine's network of boxes with an egress policy (docs/egress.md): its bridge's traffic may not
# leave it or reach the host (rules of scripts/ensure-box-engine.sh), only replies on connections the
# host opened (published ports). Made by that script, as root, after the rules; the label says so.
EGRESS_NETWORK = "agentbox-egress"
EGRESS_BRIDGE = "agentbox1"
EGRESS_LABEL = "agentbox.egress-enforced"


def egress_network_problem(network: dict[str, Any] | None) -> str | None:
    """Why a box with an egress policy cannot be put on `network` (the engine's inspect of EGRESS_NETWORK), or None."""
    setup = "run scripts/ensure-box-engine.sh as root (it adds the rules that hold a box's traffic to the gateway)"
    if network is None:
        return f"the box engine has no network {EGRESS_NETWORK}: {setup}"
    options = network.get("Options") or {}
    if (network.get("Labels") or {}).get(EGRESS_LABEL) != "1" or options.get("com.docker.network.bridge.name") != EGRESS_BRIDGE:
        return (f"the box engine's network {EGRESS_NETWORK} was not made by scripts/ensure-box-engine.sh (no "
                f"{EGRESS_LABEL} label or another bridge than {EGRESS_BRIDGE}): remove it, then {setup}")
    return None


def remote_setup_hint(engine: str) -> str:
    """What to do about a remote engine without a box engine."""
    return (f"set up its box engine (ansible-playbook playbooks/box_engine.yml -e engine={engine}, which runs "
            "scripts/ensure-box-engine.sh there as root over SSH), or create with isolation=none "
            "(-e isolation=none) to accept that root in the box is root on that host")


def box_engine_host(environ: dict[str, str] | None = None) -> str:
    """The box engine's address: AGENTBOX_ENGINE, else the root daemon's socket (root) or the one
    under $XDG_RUNTIME_DIR (a user's own box engine)."""
    env = os.environ if environ is None else environ
    if env.get("AGENTBOX_ENGINE"):
        return env["AGENTBOX_ENGINE"]
    runtime_dir = env.get("XDG_RUNTIME_DIR")
    if os.geteuid() != 0 and runtime_dir:
        return f"unix://{runtime_dir}/agentbox-engine/docker.sock"
    return f"unix://{BOX_ENGINE_SOCKET}"


def user_engine_host(environ: dict[str, str] | None = None) -> str:
    """The user's own engine: DOCKER_HOST, else the default socket."""
    env = os.environ if environ is None else environ
    return env.get("DOCKER_HOST") or f"unix://{USER_ENGINE_SOCKET}"


def engine_host(isolation: str, environ: dict[str, str] | None = None) -> str:
    """The address of the engine local boxes of this isolation live on."""
    return box_engine_host(environ) if isolation == "userns" else user_engine_host(environ)


def check_isolation(value: str | None) -> str:
    """The isolation asked for, checked (None: the default)."""
    if value is None or value == "":
        return DEFAULT_ISOLATION
    if value not in ISOLATIONS:
        raise ValueError(f"isolation {value!r} is not one of {', '.join(ISOLATIONS)}: "
                         "use userns (the default: root in the box is nobody on the host) or none")
    return value


def remapped_ids(root_dir: str) -> tuple[int, int] | None:
    """(uid, gid) on the host of root in a box, from the engine's DockerRootDir: a remapping daemon
    keeps its data under '<root>/<uid>.<gid>'. None when the engine does not remap."""
    stem = os.path.basename(root_dir.rstrip("/"))
    uid, dot, gid = stem.partition(".")
    if dot and uid.isdigit() and gid.isdigit():
        return int(uid), int(gid)
    return None
