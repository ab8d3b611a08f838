# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the action plugins that run their module's work in the controller's process share.

Note that this plugin util is PRIVATE to the collection: it can change at any time.

A module round trip (packaging, a new interpreter, importing the engine clients again, temp files)
costs more than the work itself, and boxes are always managed from the controller: a task that runs
on the controller does the work here, a task sent to another host runs the module there.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.agentbox.box.plugins.plugin_utils import _bytecode

# Before any module_util loads: the action plugins import this file first, so theirs come from .pyc.
_bytecode.install()

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import failure  # noqa: E402

LOCAL_TRANSPORTS = ("local", "ansible.builtin.local")


class InProcessAction(ActionBase):
    """Runs `module_name`'s work through `work` when the task's connection is the controller's own."""

    TRANSFERS_FILES = False
    _requires_connection = False
    #: The module a task on another host runs, and its argument spec.
    module_name = ""
    argument_spec: dict[str, Any] = {}

    def work(self, params: dict[str, Any], check_mode: bool, host: str) -> tuple[dict[str, Any], list[str]]:
        """The module's result and warnings for validated `params` (raise as the module would)."""
        raise NotImplementedError

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._connection.transport not in LOCAL_TRANSPORTS:
            return self._execute_module(module_name=self.module_name, task_vars=task_vars)
        result = super().run(tmp, task_vars)
        _validation, params = self.validate_argument_spec(argument_spec=self.argument_spec)
        host = (task_vars or {}).get("inventory_hostname", "localhost")
        try:
            outcome, warnings = self.work(params, bool(self._task.check_mode), host)
        except Exception as exc:  # noqa: BLE001 - report like the module would
            return {**result, "failed": True, "changed": False, **failure(exc)}
        result.update(outcome)
        if warnings:
            result["warnings"] = warnings
        return result
