# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agentbox_init task, shared by the module and its action plugin: inspect the workspace, render the
commented agentbox.yaml, validate it with the supervisor's validator, and write it unless one exists
(without `force`)."""

from __future__ import annotations

import os
from typing import Any

from ..core import _host_files, _preflight
from ..project import _project_plan, _project_scan

INIT_ARGUMENT_SPEC: dict[str, Any] = {
    "workspace": {"type": "path", "required": True},
    "force": {"type": "bool", "default": False},
}


def run_init_task(params: dict[str, Any], check_mode: bool) -> tuple[dict[str, Any], list[str]]:
    """The result and warnings of agentbox_init for validated `params`; ValueError says what to do."""
    workspace = os.path.abspath(os.path.expanduser(params["workspace"]))
    if not os.path.isdir(workspace):
        raise ValueError(f"workspace {workspace} is not a directory: pass the project's directory (-e workspace=PATH)")
    path = os.path.join(workspace, _project_plan.PROJECT_FILE)
    plan = _project_scan.scan_workspace(workspace)
    text = _project_plan.render(plan)
    result: dict[str, Any] = {
        "changed": False, "path": path, "content": text, "found": plan.found,
        "tasks": [unit.name for unit in plan.tasks], "services": [unit.name for unit in plan.services],
        "web_port": plan.web_port, "tests": plan.tests, "classified": plan.classified,
        "fill_in": _project_plan.fill_in(plan), "issues": [],
    }
    warnings = []
    verdict = _preflight.project_text_issues(text, path)
    if verdict is None:  # the module sent to another host, away from the collection's roles
        warnings.append("not validated: the supervisor's validator (roles/inbox_supervisor) is not on this host; "
                        "run agentbox-ctl validate in a box")
    else:
        valid, result["issues"] = verdict
        if not valid:  # the wizard's own mistake: never write a file no box would run
            raise RuntimeError(f"the proposed {path} is invalid, nothing written (please report it):\n"
                               + "\n".join(result["issues"]))
    old = _host_files.read_text(path) if os.path.lexists(path) else None
    if old == text:
        return result, warnings
    if old is not None and not params["force"]:
        raise ValueError(f"{path} exists; nothing written: pass force=true (-e force=true) to replace it "
                         "(--check --diff -e force=true shows what would change)")
    # Shown by Ansible under --diff only.
    result.update(changed=True, diff={"before": old or "", "after": text, "after_header": path,
                                      "before_header": path if old is not None else "/dev/null"})
    if not check_mode:
        _host_files.write_atomic(path, text, 0o644)
    return result, warnings
