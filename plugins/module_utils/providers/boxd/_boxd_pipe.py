# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ProxyCommand of a boxd box's SSH alias: ~/.agentbox/bin/agentbox-boxd-pipe BASE_URL BOX, a
launcher of `_boxd_ssh` (which pipes ssh to the box's `sshd -i` through boxd's streaming exec). The
provider answers with it (`BoxdProvider.ssh_proxy`); the pipe itself runs above, in `_boxd_ssh`.
"""

from __future__ import annotations

import os

from ...core import _host_files
from ...core._errors import ProviderError
from ...relay._relay_state import write_module_launcher

PIPE_MODULE = "ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd_ssh"


def launcher_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), "bin", "agentbox-boxd-pipe")


def write_launcher() -> bool:
    """~/.agentbox/bin/agentbox-boxd-pipe: runs _boxd_ssh (see write_module_launcher)."""
    return write_module_launcher(launcher_path(), PIPE_MODULE, "`ssh agentbox-<box>` into a boxd box (docs/access.md).")


def proxy_argv(base_url: str, box: str) -> list[str]:
    """The alias's direct command for a boxd box (the launcher is written when it can be)."""
    write_launcher()
    if not os.path.exists(launcher_path()):
        raise ProviderError(f"cannot write {launcher_path()}: run the playbook from the collection's files on disk",
                            box=box, operation="SSH access")
    return [launcher_path(), base_url, box]
