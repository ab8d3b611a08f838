"""Run a collection module in the pytest process, the way Ansible runs it on a host.

`run_module_inprocess("agentbox_idle", {...}, check_mode=True)` imports
plugins/modules/agentbox_idle.py and calls its main(): AnsibleModule reads the arguments Ansible
would send (ansible-core's own `patch_module_args`, the JSON `ANSIBLE_MODULE_ARGS` with
`_ansible_check_mode` and `_ansible_diff`), validates them against the module's argument spec,
and the module answers with exit_json or fail_json, whose JSON is read back from stdout. What
`tests/conftest.py::run_module` gets from an `ansible localhost -m` process, without the process:
a result dict with `failed`, `msg`, `changed`, the module's return keys and its `warnings` (each the text
Ansible prints after "[WARNING]: ").

The action plugins of agentbox_box, agentbox_agent and agentbox_relay validate the same argument
spec (BOX_ARGUMENT_SPEC, AGENT_ARGUMENT_SPEC, RELAY_ARGUMENT_SPEC and its approve/deny rule) and
call the same task function (run_box_task, run_agent_task, relay_task) as the module's main();
agentbox_image's only adds a progress thread. So a module run here proves what those tasks do with
their input; the action plugins' own wiring is proven by the playbooks of the integration layer.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import Provider
from ansible_collections.agentbox.box.plugins.module_utils.providers import _registry

MODULES = "ansible_collections.agentbox.box.plugins.modules"


def run_module_inprocess(module: str, args: dict[str, Any], *, check_mode: bool = False,
                         diff: bool = False) -> dict[str, Any]:  # fmt: skip
    """The result of the collection module `module` (agentbox_box...) run on `args`, as Ansible returns it
    to the controller: `failed` is always there (False when the module exited normally)."""
    main: Callable[[], None] = importlib.import_module(f"{MODULES}.{module}").main
    internal = {"_ansible_check_mode": check_mode, "_ansible_diff": diff, "_ansible_module_name": f"agentbox.box.{module}"}
    out = io.StringIO()
    code: object = None
    # As in a module process on a target: not the controller (which would print a module's warnings on the
    # spot instead of returning them), and no warnings or deprecations yet (process-wide dicts here).
    with (
        patch_module_args({**args, **internal}),
        mock.patch.object(ansible_internal, "is_controller", False),
        mock.patch.dict(vars(ansible_warnings)["_global_warnings"], clear=True),
        mock.patch.dict(vars(ansible_warnings)["_global_deprecations"], clear=True),
        contextlib.redirect_stdout(out),
    ):
        try:
            main()
        except SystemExit as done:
            code = done.code
        else:
            raise AssertionError(f"{module} returned without exit_json or fail_json:\n{out.getvalue()}")
    text = out.getvalue().strip()
    try:
        result: dict[str, Any] = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise AssertionError(f"no JSON result from {module} (exit {code}):\n{text}") from exc
    result["failed"] = bool(result.get("failed")) or code != 0
    # What the controller prints after "[WARNING]: " for each (the module sends them as events).
    result["warnings"] = [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]
    return result


@contextlib.contextmanager
def provider_as(name: str, provider: Provider) -> Iterator[Provider]:
    """Every task that asks for provider `name` (docker, daytona...) gets `provider` (the fake provider
    of tests/unit/support), whatever its other options: the module's own code runs unchanged on it."""
    with mock.patch.dict(_registry.FACTORIES, {name: lambda **_options: provider}):
        yield provider
