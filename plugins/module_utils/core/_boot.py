# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The in-box start sequence (`agentbox-boot`: dockerd, supervisor, VNC, sshd), run through the Provider
interface. A workflow runs it after create; a provider whose machines lose their processes on a restart
runs it after resume, so it sits below the providers (_box re-exports it).
"""

from __future__ import annotations

import json
from typing import Any

from ._provider import Provider

BOOT_COMMAND = "agentbox-boot"


def boot_box(provider: Provider, name: str) -> dict[str, Any] | None:
    """Run the in-box start sequence (dockerd, supervisor, VNC, sshd) if the image has it."""
    return boot_box_then(provider, name)[0]


def boot_box_then(provider: Provider, name: str, after: str = "", flags: str = "") -> tuple[dict[str, Any] | None, str]:
    """boot_box, then `after` (root shell lines that never fail the boot and say how they went on stdout)
    in the same exec, one exec less: (the boot's summary, the exec's stdout). `flags`: the boot's own
    (--no-supervisor: a pooled box, whose supervisor starts at its claim)."""
    script = f"command -v {BOOT_COMMAND} >/dev/null 2>&1 || exit 3\n{BOOT_COMMAND} {flags}; rc=$?\n{after}\nexit $rc"
    run = provider.exec(name, ["sh", "-c", script], user="root", what=f"output of {BOOT_COMMAND}")
    output = run.stdout.decode("utf-8", "replace")
    if run.rc == 3:
        return None, output
    run.check("the in-box start sequence (agentbox-boot)", name)
    lines = [line for line in output.splitlines() if line.startswith("{")]
    try:
        return (json.loads(lines[-1]) if lines else {}), output
    except ValueError:
        return {"output": output[-2000:]}, output
