# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run agentbox_agent inside the controller's process when the task runs on the controller.

As for agentbox_box: the module round trip costs more than starting the agent; a task sent to
another host runs the module there.
"""

from __future__ import annotations

from typing import Any

# First: it makes the module_utils below load from Python's bytecode cache (plugin_utils/_bytecode.py).
from ansible_collections.agentbox.box.plugins.plugin_utils._local_action import InProcessAction

# isort: split

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    PROVIDER_ARGUMENT_SPEC,
    provider_from_params,
)
from ansible_collections.agentbox.box.plugins.module_utils.tasks._agent_task import AGENT_ARGUMENT_SPEC, run_agent_task


class ActionModule(InProcessAction):
    module_name = "agentbox.box.agentbox_agent"
    argument_spec = {**AGENT_ARGUMENT_SPEC, **PROVIDER_ARGUMENT_SPEC}

    def work(self, params: dict[str, Any], check_mode: bool, host: str) -> tuple[dict[str, Any], list[str]]:
        return run_agent_task(params, provider_from_params(params), check_mode)
