"""What the box tests (and the git and playbook tests that import it) share: agentbox_box run in the
test's own process."""

from __future__ import annotations

import os
from typing import Any

from tests.unit.support.inprocess import run_module_inprocess


def box_task(args: dict[str, Any], *, check_mode: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    """agentbox_box's main() run in the test's process by run_module_inprocess (the same argument spec
    and task as its action plugin, a failure reported the same way): starting `ansible` costs more
    than most box operations. `env` is set for the call only.

    Use `run_module` where the test is about what Ansible hands the task (check mode, argument
    handling) and for at least one run of each path a test proves."""
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        return run_module_inprocess("agentbox_box", args, check_mode=check_mode)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
