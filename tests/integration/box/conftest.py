"""What the box tests (and the git and playbook tests that import it) share: agentbox_box's task run in
the test's own process."""

from __future__ import annotations

import json
import os
from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.agentbox.box.plugins.module_utils.providers._module import failure
from ansible_collections.agentbox.box.plugins.module_utils.tasks._box_task import BOX_ARGUMENT_SPEC, run_box_task


def box_task(args: dict[str, Any], *, check_mode: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    """agentbox_box as its action plugin runs it on the controller (InProcessAction: the same argument
    spec, the same task, a failure reported the same way), here in the test's process: starting
    `ansible` costs more than most box operations. The result is shaped as `run_module` returns it
    (through JSON, with `failed`). `env` is set for the call only.

    Use `run_module` where the test is about what Ansible hands the task (check mode, argument
    handling) and for at least one run of each path a test proves."""
    validated = ArgumentSpecValidator(BOX_ARGUMENT_SPEC).validate(args)
    if validated.error_messages:
        return {"failed": True, "changed": False, "msg": "; ".join(validated.error_messages)}
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        outcome, warnings = run_box_task(validated.validated_parameters, check_mode)
        result: dict[str, Any] = {**outcome, "failed": False, "warnings": warnings}
    except Exception as exc:  # noqa: BLE001 - reported as the action plugin reports it
        result = {"failed": True, "changed": False, **failure(exc)}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return json.loads(json.dumps(result, default=str))
