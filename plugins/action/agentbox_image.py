# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run agentbox_image and, while it builds, print a progress line every few seconds.

A first build takes minutes and the module answers only at the end; meanwhile it writes the
build's output to its build log. This plugin runs the module as usual and watches that log from
a thread: once the module has started writing it, a line is printed every PROGRESS_SECONDS with
the build step, how much output there is so far, the time taken and where the log is. The final
figures (tag, size, seconds, log) come from the role's report task.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

PROGRESS_SECONDS = float(os.environ.get("AGENTBOX_PROGRESS_SECONDS", "5"))
DEFAULT_LOG = "~/.agentbox/logs/box-image.log"
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_TAIL_BYTES = 64 * 1024


def _stage(path: str) -> str:
    """The build's current stage, from the end of its log: 'step 3/7: RUN ...' or its last line."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - _TAIL_BYTES))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return "starting"
    for line in reversed(lines):
        found = _STEP.match(line.strip())
        if found:
            number, total, instruction = found.groups()
            return f"step {number}/{total}: {instruction[:70]}"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last[:80] or "starting"


def _watch(path: str, started: float, done: threading.Event, host: str) -> None:
    while not done.wait(PROGRESS_SECONDS):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if info.st_mtime < started:  # not (yet) this run's log: the image may be up to date
            continue
        elapsed = int(time.time() - started)
        display.display(
            f"[{host}] box image build: {_stage(path)} | {info.st_size / 1e6:.1f} MB of output, {elapsed} s (log {path})"
        )


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        log = os.path.abspath(os.path.expanduser(str(self._task.args.get("build_log") or DEFAULT_LOG)))
        done = threading.Event()
        host = (task_vars or {}).get("inventory_hostname", "localhost")
        watcher = threading.Thread(target=_watch, args=(log, time.time() - 1, done, host), daemon=True)
        if not self._task.check_mode:
            watcher.start()
        try:
            result.update(self._execute_module(module_name="agentbox.box.agentbox_image", task_vars=task_vars))
        finally:
            done.set()
        return result
