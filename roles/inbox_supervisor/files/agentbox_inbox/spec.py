# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""agentbox.yaml as data: the specs the parser makes and the daemon runs."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Union


@dataclass
class ConfigIssue:
    severity: str  # "error" or "warning"
    key: str  # dotted path of the offending key, e.g. services.web.needs[1]
    line: int | None  # 1-based line in the file, None when the file as a whole is at fault
    message: str

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        key = f" {self.key}:" if self.key else ""
        return f"{where}: {self.severity}:{key} {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


Command = Union[str, list[str]]  # noqa: UP007 - a runtime alias; keeps Python 3.9 boxes working


@dataclass
class ReadyCheck:
    kind: str  # port | http | log_match
    port: int | None = None
    host: str = "127.0.0.1"
    url: str | None = None
    pattern: str | None = None
    expect_status: list[int] | None = None  # None: any 2xx or 3xx
    interval_ms: int = 500
    initial_delay_ms: int = 0
    timeout_ms: int = 60000
    on_timeout: str = "mark_unhealthy"

    def describe(self) -> str:
        if self.kind == "port":
            return f"port {self.host}:{self.port}"
        if self.kind == "http":
            return f"http {self.url}"
        return f"log_match /{self.pattern}/"


@dataclass
class Backoff:
    initial_ms: int = 500
    max_ms: int = 30000
    factor: float = 2.0

    def delay_ms(self, attempt: int) -> int:
        """Delay before restart number `attempt` (1-based)."""
        delay = self.initial_ms * (self.factor ** max(0, attempt - 1))
        return int(min(delay, self.max_ms))


@dataclass
class TaskSpec:
    name: str
    command: Command
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    needs: list[str] = field(default_factory=list)
    run_once: bool = False
    run_once_check: str | None = None
    timeout_ms: int | None = None
    line: int = field(default=0, compare=False)
    needs_lines: list[int] = field(default_factory=list, compare=False)

    kind = "task"

    def marker_key(self) -> str:
        """sha256 over what the task does: command, cwd and env. A change means it must run again."""
        blob = json.dumps({"command": self.command, "cwd": self.cwd or ".", "env": self.env}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class ServiceSpec:
    name: str
    command: Command
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    needs: list[str] = field(default_factory=list)
    autostart: bool = True
    restart: str = "on-failure"
    backoff: Backoff = field(default_factory=Backoff)
    ready_when: ReadyCheck | None = None
    expose_port: int | None = None
    stop_timeout_ms: int = 10000
    line: int = field(default=0, compare=False)
    needs_lines: list[int] = field(default_factory=list, compare=False)

    kind = "service"


@dataclass
class Config:
    source: str
    workspace: str
    tasks: dict[str, TaskSpec] = field(default_factory=dict)
    services: dict[str, ServiceSpec] = field(default_factory=dict)
    # The project's egress policy (the host applies it at create; None: not in the file) and the lines of
    # the keys and of each egress_allow entry, for the host's messages.
    egress: str | None = None
    egress_allow: list[str] | None = None
    egress_lines: dict[str, int] = field(default_factory=dict)
    egress_allow_lines: list[int] = field(default_factory=list)

    def unit(self, name: str) -> TaskSpec | ServiceSpec | None:
        return self.tasks.get(name) or self.services.get(name)

    def all_units(self) -> dict[str, TaskSpec | ServiceSpec]:
        merged: dict[str, TaskSpec | ServiceSpec] = dict(self.tasks)
        merged.update(self.services)
        return merged

    def exposed_service(self) -> ServiceSpec | None:
        for svc in self.services.values():
            if svc.expose_port:
                return svc
        return None
