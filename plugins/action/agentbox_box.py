# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run agentbox_box inside the controller's process when the task runs on the controller.

A module round trip (packaging, a new interpreter, importing the Docker SDK again, temp files)
costs more than creating and seeding a box on the local engine; boxes are always managed from
the controller, so the task runs here. A task sent to another host runs the module there.
"""

from __future__ import annotations

from typing import Any

from ansible.utils.display import Display

# First: it makes the module_utils below load from Python's bytecode cache (plugin_utils/_bytecode.py).
from ansible_collections.agentbox.box.plugins.plugin_utils._local_action import InProcessAction

# isort: split

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image_transfer
from ansible_collections.agentbox.box.plugins.module_utils.tasks._box_task import BOX_ARGUMENT_SPEC, run_box_task


class ActionModule(InProcessAction):
    module_name = "agentbox.box.agentbox_box"
    argument_spec = BOX_ARGUMENT_SPEC

    def work(self, params: dict[str, Any], check_mode: bool, host: str) -> tuple[dict[str, Any], list[str]]:
        # A first image streamed to a remote engine takes about a minute: say how it goes meanwhile.
        _image_transfer.progress = lambda text: Display().display(f"[{host}] {text}")
        try:
            return run_box_task(params, check_mode)
        finally:
            _image_transfer.progress = None
