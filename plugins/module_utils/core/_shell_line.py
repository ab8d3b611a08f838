# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One shell line for a remote API that runs a command string (Daytona's toolbox, boxd's Exec): the argv
quoted exactly, as a user, in a directory, with env and a time bound; and sizes in whole GiB."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from ._errors import ProviderError

AS_USER_SCRIPT = (
    'u=$1; shift; [ "$(id -un 2>/dev/null)" = "$u" ] && exec "$@"; '
    'command -v sudo >/dev/null 2>&1 || { echo "agentbox: running as $u needs sudo in the box (the toolbox runs '
    'as $(id -un))" >&2; exit 126; }; exec sudo -n -E -H -u "$u" -- "$@"'
)


def command_line(
    argv: list[str],
    *,
    user: str | None,
    sandbox_user: str | None = None,
    workdir: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> str:
    """One shell line running argv as `user`.

    With `sandbox_user` (the user the daemon is known to run as) sudo is added when they differ; without
    it the line checks in the box and switches only when needed (AS_USER_SCRIPT).
    """
    if not argv:
        raise ProviderError("exec needs a command (argv is empty)")
    inner = " ".join(shlex.quote(str(arg)) for arg in argv)
    if env:
        pairs = " ".join(shlex.quote(f"{key}={value}") for key, value in env.items())
        inner = f"exec env {pairs} {inner}"
    else:
        inner = f"exec {inner}"
    if workdir:
        inner = f"cd {shlex.quote(workdir)} && {inner}"
    words = ["sh", "-c", inner]
    if timeout:
        words = ["timeout", "-s", "KILL", str(max(1, math.ceil(timeout))), *words]
    if user and sandbox_user is None:
        words = ["sh", "-c", AS_USER_SCRIPT, "agentbox-as", user, *words]
    elif user and user != sandbox_user:
        words = ["sudo", "-n", "-E", "-H", *([] if user == "root" else ["-u", user]), "--", *words]
    return " ".join(shlex.quote(word) for word in words)


def gib(value: Any) -> int:
    """Memory as whole GiB (Daytona's unit) from bytes or '2g' / '512m' / '2GiB'."""
    if isinstance(value, (int, float)):
        return max(1, math.ceil(value / (1 << 30)))
    text = str(value).strip().lower().removesuffix("ib").removesuffix("b")
    match = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)", text)
    if not match:
        raise ProviderError(f"memory {value!r} is not a size: use bytes or a number with k, m, g or t (e.g. 4g)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[match.group(2)]
    return max(1, math.ceil(float(match.group(1)) * scale / (1 << 30)))
