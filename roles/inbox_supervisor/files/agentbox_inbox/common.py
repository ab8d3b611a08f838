# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Constants of the supervisor and its command line, shared by every module."""
from __future__ import annotations

import datetime
import os
import re
import sys

PROTOCOL_VERSION = 1
DEFAULT_SOCKET = "/run/agentbox/ctl.sock"
DEFAULT_CONFIG = "/workspace/agentbox.yaml"
DEFAULT_LOG_DIR = "/var/log/agentbox"
DEFAULT_STATE_DIR = "/var/lib/agentbox"
DEFAULT_LOG_MAX_BYTES = 5 * 1024 * 1024

# Exit codes of the CLI (documented in docs/supervisor.md).
EXIT_OK = 0
EXIT_FAILED = 1  # a unit failed, the file is invalid, the daemon refused the request
EXIT_USAGE = 2  # bad command line (argparse uses 2 as well)
EXIT_TIMEOUT = 3  # wait-ready ran out of time
EXIT_UNREACHABLE = 4  # no daemon answers on the socket

TASK_STATES = ("pending", "running", "done", "failed", "skipped")
SERVICE_STATES = ("pending", "waiting", "starting", "running", "ready", "unhealthy", "crashed", "backoff", "stopped")

UNIT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Log files the box itself writes into the log directory; a unit of the same name would share them.
RESERVED_UNIT_NAMES = frozenset({"agentbox-ctl", "agentbox-boot", "dockerd", "vnc", "novnc", "sshd"})
RESTART_POLICIES = ("always", "on-failure", "never")
ON_TIMEOUT_ACTIONS = ("kill", "mark_unhealthy")
# Top-level keys other parts of agentbox read; the supervisor ignores them without a warning.
PASSTHROUGH_TOP_KEYS = frozenset({"carry", "ide", "defaults", "replacements"})
# The project's egress policy (docs/egress.md): read by the host at create, checked here for its shape
# (the host checks the host names, with the file's lines, before any box is made).
EGRESS_POLICIES = ("allowlist", "open", "none")
EGRESS_POLICY_MEANINGS = ("allowlist (the default list plus egress_allow), open (any public host, audited) "
                          "or none (no network)")


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def log(message: str) -> None:
    sys.stderr.write(f"{utc_now()} agentbox-ctl[{os.getpid()}]: {message}\n")
    sys.stderr.flush()
