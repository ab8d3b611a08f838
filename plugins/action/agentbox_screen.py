# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run agentbox_screen inside the controller's process when the task runs on the controller.

screen.yml is something a user waits on (issue 39: to a connected desktop in 2 s): a module round trip
(packaging, a new interpreter, the collection's imports) was most of its time past Ansible's own start.
A task sent to another host runs the module there.
"""

from __future__ import annotations

from typing import Any

# First: it makes the module_utils below load from Python's bytecode cache (plugin_utils/_bytecode.py).
from ansible_collections.agentbox.box.plugins.plugin_utils._local_action import InProcessAction

# isort: split

from ansible_collections.agentbox.box.plugins.module_utils.access._screen import screen
from ansible_collections.agentbox.box.plugins.module_utils.core._naming import validate_box_name
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    PROVIDER_ARGUMENT_SPEC,
    provider_from_params,
)


class ActionModule(InProcessAction):
    module_name = "agentbox.box.agentbox_screen"
    argument_spec = {"name": {"type": "str", "required": True}, **PROVIDER_ARGUMENT_SPEC}

    def work(self, params: dict[str, Any], check_mode: bool, host: str) -> tuple[dict[str, Any], list[str]]:
        return screen(provider_from_params(params), validate_box_name(params["name"]), check_mode), []
