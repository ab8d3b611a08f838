"""Fault injection: rules matched against each request before the emulator handles it.

A rule (JSON) has:
  method   optional, an HTTP method ("POST") or a regex over it; default: any
  path     regex searched in the request path without the query, e.g. "^/api/sandbox$" or "/process/execute$"
  action   "status"      answer `status` (+ `body`, `headers`) without doing anything
           "drop"        close the connection before doing anything (no side effect)
           "drop_after"  do the work, then close the connection without answering (an ambiguous failure)
           "truncate"    do the work, send the headers and half of the body, then close (a drop mid-call)
           "delay"       only wait `delay` seconds, then answer normally
           "hold"        wait until the rule is released (POST /_emulator/faults/{id}/release, or its removal),
                         then answer normally: a test acts while a client's call is in flight, on an event
  status   for "status" (default 500); body defaults to the API's error envelope
  delay    seconds to wait before the action (any action)
  times    how many matching calls the rule fires for (default 1; 0 means every call)
  skip     let this many matching calls through before firing (default 0)
"""

from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass, field
from typing import Any

ACTIONS = ("status", "drop", "drop_after", "truncate", "delay", "hold")
# A held request is let go after this long even if nobody releases it (a test that failed first).
HOLD_LIMIT_SECONDS = 300.0


class FaultRuleError(ValueError):
    """A rule that cannot be used; the message says which field is wrong."""


@dataclass
class FaultRule:
    rule_id: int
    path: str
    method: str | None = None
    action: str = "status"
    status: int = 500
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    times: int = 1
    skip: int = 0
    matched: int = 0
    fired: int = 0
    released: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._path_re = re.compile(self.path)
        self._method_re = re.compile(self.method, re.IGNORECASE) if self.method else None

    def matches(self, method: str, path: str) -> bool:
        if self._method_re is not None and not self._method_re.fullmatch(method):
            return False
        return self._path_re.search(path) is not None

    @property
    def exhausted(self) -> bool:
        return self.times > 0 and self.fired >= self.times

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.rule_id, "method": self.method, "path": self.path, "action": self.action,
            "status": self.status, "body": self.body, "headers": self.headers, "delay": self.delay,
            "times": self.times, "skip": self.skip, "matched": self.matched, "fired": self.fired,
            "released": self.released.is_set(),
            "remaining": None if self.times == 0 else max(0, self.times - self.fired),
        }


def _number(spec: dict[str, Any], key: str, default: float, kind: type) -> Any:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise FaultRuleError(f"fault rule field {key!r} must be a non-negative number, got {value!r}")
    return kind(value)


class FaultInjector:
    """Holds the rules; `pick` is called once per request and returns the rule that fires, if any."""

    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def add(self, spec: dict[str, Any]) -> FaultRule:
        if not isinstance(spec, dict):
            raise FaultRuleError("a fault rule is a JSON object")
        unknown = set(spec) - {"method", "path", "action", "status", "body", "headers", "delay", "times", "skip"}
        if unknown:
            raise FaultRuleError(f"unknown fault rule fields: {', '.join(sorted(unknown))}")
        path = spec.get("path")
        if not isinstance(path, str) or not path:
            raise FaultRuleError("fault rule needs 'path', a regex searched in the request path")
        action = spec.get("action", "status")
        if action not in ACTIONS:
            raise FaultRuleError(f"fault rule 'action' must be one of {', '.join(ACTIONS)}, got {action!r}")
        status = _number(spec, "status", 500, int)
        if action == "status" and not 100 <= status <= 599:
            raise FaultRuleError(f"fault rule 'status' must be an HTTP status, got {status}")
        headers = spec.get("headers") or {}
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise FaultRuleError("fault rule 'headers' must map header names to strings")
        try:
            rule = FaultRule(
                rule_id=next(self._ids), path=path, method=spec.get("method"), action=action, status=status,
                body=spec.get("body"), headers=dict(headers), delay=_number(spec, "delay", 0, float),
                times=_number(spec, "times", 1, int), skip=_number(spec, "skip", 0, int),
            )
        except re.error as exc:
            raise FaultRuleError(f"fault rule regex does not compile: {exc}") from exc
        with self._lock:
            self._rules.append(rule)
        return rule

    def pick(self, method: str, path: str) -> FaultRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.exhausted or not rule.matches(method, path):
                    continue
                rule.matched += 1
                if rule.matched <= rule.skip:
                    continue
                rule.fired += 1
                return rule
        return None

    def release(self, rule_id: int) -> bool:
        """Let the requests a "hold" rule holds (and any it would hold later) go on."""
        with self._lock:
            rule = next((rule for rule in self._rules if rule.rule_id == rule_id), None)
        if rule is None:
            return False
        rule.released.set()
        return True

    def remove(self, rule_id: int) -> bool:
        with self._lock:
            kept = [rule for rule in self._rules if rule.rule_id != rule_id]
            gone = [rule for rule in self._rules if rule.rule_id == rule_id]
            self._rules = kept
        for rule in gone:
            rule.released.set()  # a removed rule holds nothing any more
        return bool(gone)

    def clear(self) -> None:
        with self._lock:
            gone, self._rules = self._rules, []
        for rule in gone:
            rule.released.set()

    def to_json(self) -> list[dict[str, Any]]:
        with self._lock:
            return [rule.to_json() for rule in self._rules]
