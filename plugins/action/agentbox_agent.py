# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run agentbox_agent inside the controller's process when the task runs on the controller.

As for agentbox_box: the module round trip costs more than starting the agent; a task sent to
another host runs the module there.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.agentbox.box.plugins.module_utils._agent_task import AGENT_ARGUMENT_SPEC, run_agent_task
from ansible_collections.agentbox.box.plugins.module_utils._module import (
    PROVIDER_ARGUMENT_SPEC,
    failure,
    provider_from_params,
)

LOCAL_TRANSPORTS = ("local", "ansible.builtin.local")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._connection.transport not in LOCAL_TRANSPORTS:
            return self._execute_module(module_name="agentbox.box.agentbox_agent", task_vars=task_vars)
        result = super().run(tmp, task_vars)
        _validation, params = self.validate_argument_spec(
            argument_spec={**AGENT_ARGUMENT_SPEC, **PROVIDER_ARGUMENT_SPEC}
        )
        try:
            outcome, warnings = run_agent_task(params, provider_from_params(params), bool(self._task.check_mode))
        except Exception as exc:  # noqa: BLE001 - report like the module would
            return {**result, "failed": True, "changed": False, **failure(exc)}
        result.update(outcome)
        if warnings:
            result["warnings"] = warnings
        return result
