"""Running a module of the collection as Ansible runs it on a host, without Ansible's executor.

Each `ansible` or `ansible-playbook` start costs 1-2 s; a test about what a module does (not how a
playbook reaches it) runs the module's own `main` in a fresh Python with its arguments in a file,
which is what Ansible itself does on the target (AnsiballZ). At least one test of each module still
goes through Ansible, so the path through the executor stays proven.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from tests.conftest import REPO


def run_module_direct(module: str, args: dict[str, Any], *, check_mode: bool = False,
                      env: dict[str, str] | None = None) -> dict[str, Any]:
    """The module's JSON result, with `failed` always there (True or False), as tests.conftest.run_module
    returns it; its warnings are in `warnings` (Ansible would print them on stderr)."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode, "_ansible_diff": True}}
    fd, args_file = tempfile.mkstemp(prefix="agentbox-module-args-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle)
    pythonpath = os.pathsep.join(p for p in (str(REPO / ".collections"), os.environ.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", f"ansible_collections.agentbox.box.plugins.modules.{module}", args_file],
            env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=REPO,
            check=False,
        )
    finally:
        os.unlink(args_file)
    try:
        result = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"{module} did not answer JSON (rc={done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}") from None  # fmt: skip
    result["failed"] = bool(result.get("failed"))
    return result
