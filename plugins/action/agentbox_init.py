# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run agentbox_init inside the controller's process when the task runs on the controller.

The workspace is the controller's, and the file is checked with the supervisor's validator, which sits
in the collection's roles beside this plugin (a module packed for another process cannot reach it).
"""

from __future__ import annotations

from typing import Any

# First: it makes the module_utils below load from Python's bytecode cache (plugin_utils/_bytecode.py).
from ansible_collections.agentbox.box.plugins.plugin_utils._local_action import InProcessAction

# isort: split

from ansible_collections.agentbox.box.plugins.module_utils.tasks._init_task import INIT_ARGUMENT_SPEC, run_init_task


class ActionModule(InProcessAction):
    module_name = "agentbox.box.agentbox_init"
    argument_spec = INIT_ARGUMENT_SPEC

    def work(self, params: dict[str, Any], check_mode: bool, host: str) -> tuple[dict[str, Any], list[str]]:
        return run_init_task(params, check_mode)
