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
    script = f"command -v {BOOT_COMMAND} >/dev/null 2>&1 || exit 3; exec {BOOT_COMMAND}"
    run = provider.exec(name, ["sh", "-c", script], user="root")
    if run.rc == 3:
        return None
    run.check("the in-box start sequence (agentbox-boot)", name)
    lines = [line for line in run.stdout.decode("utf-8", "replace").splitlines() if line.startswith("{")]
    try:
        return json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {"output": run.stdout.decode("utf-8", "replace")[-2000:]}
