# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run agentbox_relay in the controller's process: the relay is a daemon of the host user who runs
Ansible, started from the collection's files on disk (a module's temporary zip would vanish)."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

# First: the module_utils below then load from Python's bytecode cache (plugin_utils/_bytecode.py).
from ansible_collections.agentbox.box.plugins.plugin_utils import _bytecode

_bytecode.install()

# isort: split

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import failure  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.tasks._relay_main import RELAY_ARGUMENT_SPEC, relay_task  # noqa: E402


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        _validation, params = self.validate_argument_spec(
            argument_spec=RELAY_ARGUMENT_SPEC, mutually_exclusive=[["approve", "deny"]]
        )
        try:
            result.update(relay_task(params, bool(self._task.check_mode)))
        except Exception as exc:  # noqa: BLE001 - report like a module would
            return {**result, "failed": True, "changed": False, **failure(exc)}
        return result
