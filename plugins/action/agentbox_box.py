# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run agentbox_box inside the controller's process when the task runs on the controller.

A module round trip (packaging, a new interpreter, importing the Docker SDK again, temp files)
costs more than creating and seeding a box on the local engine; boxes are always managed from
the controller, so the task runs here. A task sent to another host runs the module there.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.agentbox.box.plugins.module_utils import _image_transfer
from ansible_collections.agentbox.box.plugins.module_utils._box_task import BOX_ARGUMENT_SPEC, run_box_task
from ansible_collections.agentbox.box.plugins.module_utils._module import failure

LOCAL_TRANSPORTS = ("local", "ansible.builtin.local")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._connection.transport not in LOCAL_TRANSPORTS:
            return self._execute_module(module_name="agentbox.box.agentbox_box", task_vars=task_vars)
        result = super().run(tmp, task_vars)
        _validation, params = self.validate_argument_spec(argument_spec=BOX_ARGUMENT_SPEC)
        # A first image streamed to a remote engine takes about a minute: say how it goes meanwhile.
        host = (task_vars or {}).get("inventory_hostname", "localhost")
        _image_transfer.progress = lambda text: Display().display(f"[{host}] {text}")
        try:
            outcome, warnings = run_box_task(params, bool(self._task.check_mode))
        except Exception as exc:  # noqa: BLE001 - report like the module would
            return {**result, "failed": True, "changed": False, **failure(exc)}
        finally:
            _image_transfer.progress = None
        result.update(outcome)
        if warnings:
            result["warnings"] = warnings
        return result
