# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""agentbox.yaml: parsing and validation with line numbers."""
from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .common import (
    EGRESS_POLICIES,
    EGRESS_POLICY_MEANINGS,
    ON_TIMEOUT_ACTIONS,
    PASSTHROUGH_TOP_KEYS,
    RESERVED_UNIT_NAMES,
    RESTART_POLICIES,
    UNIT_NAME_RE,
)
from .spec import Backoff, Command, Config, ConfigIssue, ReadyCheck, ServiceSpec, TaskSpec

try:
    import yaml
except ImportError:  # pragma: no cover - the box image installs python3-yaml
    sys.stderr.write("agentbox-ctl: PyYAML is missing; install python3-yaml (apt-get install python3-yaml)\n")
    sys.exit(2)


UnitSpec = TypeVar("UnitSpec", TaskSpec, ServiceSpec)


class _Invalid(Exception):
    """Raised inside the walker once an error is recorded, to skip the rest of that value."""


_SCALAR_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def _line(node: Any) -> int | None:
    return node.start_mark.line + 1 if node is not None and node.start_mark else None


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    value = _scalar(node)
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def _scalar(node: yaml.Node) -> Any:
    return _SCALAR_CONSTRUCTOR.construct_object(node, deep=True)


class _Walker:
    """Turns a composed YAML node tree into specs, recording every problem with its line."""

    def __init__(self) -> None:
        self.issues: list[ConfigIssue] = []
        # Units with errors of their own: not run, but their needs are still checked, so one pass
        # reports every problem in the file.
        self.invalid_units: dict[str, TaskSpec | ServiceSpec] = {}

    def error(self, key: str, node: Any, message: str) -> None:
        self.issues.append(ConfigIssue("error", key, _line(node), message))

    def warn(self, key: str, node: Any, message: str) -> None:
        self.issues.append(ConfigIssue("warning", key, _line(node), message))

    def fail(self, key: str, node: Any, message: str) -> _Invalid:
        self.error(key, node, message)
        return _Invalid()

    # -- primitives ------------------------------------------------------------------------

    def mapping(self, node: yaml.Node, key: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(key, node, f"expected a mapping, got {_describe(node)}")
        _SCALAR_CONSTRUCTOR.flatten_mapping(node)  # resolves YAML merge keys (<<: *anchor)
        seen: dict[str, yaml.Node] = {}
        items = []
        for key_node, value_node in node.value:
            name = _scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(name, str):
                self.error(key, key_node, f"keys must be strings, got {_describe(key_node)}")
                continue
            child = f"{key}.{name}" if key else name
            if name in seen:
                self.error(child, key_node, f"duplicate key (first defined on line {_line(seen[name])})")
                continue
            seen[name] = key_node
            items.append((name, key_node, value_node))
        return items

    def string(self, node: yaml.Node, key: str, allow_empty: bool = False) -> str:
        value = _scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, str):
            raise self.fail(key, node, f"expected a string, got {_describe(node)}")
        if not allow_empty and not value.strip():
            raise self.fail(key, node, "must not be empty")
        return value

    def boolean(self, node: yaml.Node, key: str) -> bool:
        value = _scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, bool):
            raise self.fail(key, node, f"expected true or false, got {_describe(node)}")
        return value

    def integer(self, node: yaml.Node, key: str, minimum: int, maximum: int | None = None) -> int:
        value = _scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, node, f"expected an integer, got {_describe(node)}")
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise self.fail(key, node, f"must be {bounds}, got {value}")
        return value

    def number(self, node: yaml.Node, key: str, minimum: float) -> float:
        value = _scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, node, f"expected a number, got {_describe(node)}")
        if value < minimum:
            raise self.fail(key, node, f"must be at least {minimum}, got {value}")
        return float(value)

    def choice(self, node: yaml.Node, key: str, choices: tuple[str, ...]) -> str:
        value = _scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if value not in choices:
            raise self.fail(key, node, f"expected one of {', '.join(choices)}, got {_describe(node)}")
        return value

    def command(self, node: yaml.Node, key: str) -> Command:
        if isinstance(node, yaml.SequenceNode):
            if not node.value:
                raise self.fail(key, node, "an argv list must not be empty")
            return [self.string(item, f"{key}[{i}]", allow_empty=True) for i, item in enumerate(node.value)]
        if isinstance(node, yaml.ScalarNode) and isinstance(_scalar(node), str):
            return self.string(node, key)
        raise self.fail(key, node, f"expected a shell string or an argv list of strings, got {_describe(node)}")

    def env(self, node: yaml.Node, key: str) -> dict[str, str]:
        result: dict[str, str] = {}
        for name, key_node, value_node in self.mapping(node, key):
            child = f"{key}.{name}"
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                self.error(child, key_node, "not a valid environment variable name")
                continue
            value = _scalar(value_node) if isinstance(value_node, yaml.ScalarNode) else None
            if isinstance(value, bool):
                result[name] = "true" if value else "false"
            elif isinstance(value, (str, int, float)):
                result[name] = str(value)
            else:
                self.error(child, value_node, f"expected a string, number or boolean, got {_describe(value_node)}")
        return result

    def needs(self, node: yaml.Node, key: str) -> tuple[list[str], list[int]]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(key, node, f"expected a list of unit names (e.g. needs: [install]), got {_describe(node)}")
        names: list[str] = []
        lines: list[int] = []
        for i, item in enumerate(node.value):
            try:
                name = self.string(item, f"{key}[{i}]")
            except _Invalid:
                continue
            if name in names:
                self.warn(f"{key}[{i}]", item, f"'{name}' is listed twice")
                continue
            names.append(name)
            lines.append(_line(item) or 0)
        return names, lines

    def fields(self, node: yaml.Node, key: str, known: tuple[str, ...]):
        """Yield (name, child_key, value_node) for known fields; warn about the rest."""
        for name, key_node, value_node in self.mapping(node, key):
            child = f"{key}.{name}"
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
                self.warn(child, key_node, f"unknown key, ignored{suggestion}")
                continue
            yield name, child, value_node

    # -- units -----------------------------------------------------------------------------

    TASK_KEYS = ("command", "cwd", "env", "needs", "run_once", "timeout_ms")
    SERVICE_KEYS = ("command", "cwd", "env", "needs", "autostart", "restart", "backoff", "ready_when", "expose",
                    "stop_timeout_ms")

    def task(self, name: str, key_node: yaml.Node, node: yaml.Node, key: str) -> TaskSpec | None:
        return self.unit(TaskSpec, self.TASK_KEYS, self.task_field, name, key_node, node, key)

    def service(self, name: str, key_node: yaml.Node, node: yaml.Node, key: str) -> ServiceSpec | None:
        return self.unit(ServiceSpec, self.SERVICE_KEYS, self.service_field, name, key_node, node, key)

    def unit(self, kind: Callable[..., UnitSpec], known: tuple[str, ...],
             own_field: Callable[[Any, str, yaml.Node, str], None],
             name: str, key_node: yaml.Node, node: yaml.Node, key: str) -> UnitSpec | None:
        """A task or a service: the keys both kinds have here, the kind's own ones in `own_field`."""
        if isinstance(node, yaml.ScalarNode) and isinstance(_scalar(node), str):
            node = yaml.MappingNode("tag:yaml.org,2002:map", [
                (yaml.ScalarNode("tag:yaml.org,2002:str", "command", node.start_mark, node.end_mark), node)],
                node.start_mark, node.end_mark)  # shorthand: `install: npm ci`
        if not isinstance(node, yaml.MappingNode):
            self.error(key, node, f"expected a mapping with a command, or a command string, got {_describe(node)}")
            return None
        spec = kind(name=name, command="", line=_line(key_node) or 0)
        got_command = False
        errors_before = self._error_count()
        for fname, child, value in self.fields(node, key, known):
            try:
                if fname == "command":
                    got_command = True  # present: a bad value gets its own error, not "missing" too
                    spec.command = self.command(value, child)
                elif fname == "cwd":
                    spec.cwd = self.string(value, child)
                elif fname == "env":
                    spec.env = self.env(value, child)
                elif fname == "needs":
                    spec.needs, spec.needs_lines = self.needs(value, child)
                else:
                    own_field(spec, fname, value, child)
            except _Invalid:
                pass
        if not got_command and isinstance(node, yaml.MappingNode):
            self.error(key, node, "missing required key 'command'")
        if self._error_count() != errors_before:
            self.invalid_units[name] = spec
            return None
        return spec

    def task_field(self, spec: TaskSpec, fname: str, value: yaml.Node, child: str) -> None:
        if fname == "timeout_ms":
            spec.timeout_ms = self.integer(value, child, 1)
        elif fname == "run_once":
            if isinstance(value, yaml.MappingNode):
                for _rname, rchild, rvalue in self.fields(value, child, ("check",)):
                    spec.run_once_check = self.string(rvalue, rchild)
                if spec.run_once_check is None:
                    self.error(child, value, "expected true, false or {check: <command>}")
                spec.run_once = True
            else:
                try:
                    spec.run_once = self.boolean(value, child)
                except _Invalid:
                    self.issues[-1].message = f"expected true, false or {{check: <command>}}, got {_describe(value)}"

    def service_field(self, spec: ServiceSpec, fname: str, value: yaml.Node, child: str) -> None:
        if fname == "autostart":
            spec.autostart = self.boolean(value, child)
        elif fname == "restart":
            spec.restart = self.choice(value, child, RESTART_POLICIES)
        elif fname == "stop_timeout_ms":
            spec.stop_timeout_ms = self.integer(value, child, 0)
        elif fname == "backoff":
            spec.backoff = self.backoff(value, child)
        elif fname == "ready_when":
            spec.ready_when = self.ready_when(value, child)
        elif fname == "expose":
            spec.expose_port = self.expose(value, child)

    def backoff(self, node: yaml.Node, key: str) -> Backoff:
        result = Backoff()
        for fname, child, value in self.fields(node, key, ("initial_ms", "max_ms", "factor")):
            try:
                if fname == "factor":
                    result.factor = self.number(value, child, 1.0)
                else:
                    setattr(result, fname, self.integer(value, child, 0))
            except _Invalid:
                pass
        if result.max_ms < result.initial_ms:
            self.error(f"{key}.max_ms", node, f"max_ms ({result.max_ms}) is smaller than initial_ms ({result.initial_ms})")
        return result

    def ready_when(self, node: yaml.Node, key: str) -> ReadyCheck | None:
        check = ReadyCheck(kind="")
        known = ("port", "http", "log_match", "host", "expect_status", "interval_ms", "initial_delay_ms", "timeout_ms",
                 "on_timeout")
        http_node = None
        errors_before = self._error_count()
        for fname, child, value in self.fields(node, key, known):
            try:
                if fname == "port":
                    check.port = self.integer(value, child, 1, 65535)
                elif fname == "http":
                    check.url = self.string(value, child)
                    http_node = value
                    if not (check.url.startswith("/") or re.match(r"^https?://", check.url)):
                        raise self.fail(child, value, "expected a URL (http://127.0.0.1:8000/health) or a path (/health)")
                elif fname == "log_match":
                    check.pattern = self.string(value, child)
                    try:
                        re.compile(check.pattern)
                    except re.error as exc:
                        raise self.fail(child, value, f"not a valid regular expression: {exc}") from None
                elif fname == "host":
                    check.host = self.string(value, child)
                elif fname == "expect_status":
                    if isinstance(value, yaml.SequenceNode):
                        codes = [self.integer(item, f"{child}[{i}]", 100, 599) for i, item in enumerate(value.value)]
                        if not codes:
                            raise self.fail(child, value, "must list at least one status code")
                        check.expect_status = codes
                    else:
                        check.expect_status = [self.integer(value, child, 100, 599)]
                elif fname == "on_timeout":
                    check.on_timeout = self.choice(value, child, ON_TIMEOUT_ACTIONS)
                elif fname == "interval_ms":
                    check.interval_ms = self.integer(value, child, 1)
                else:  # initial_delay_ms, timeout_ms
                    setattr(check, fname, self.integer(value, child, 0))
            except _Invalid:
                pass
        if self._error_count() != errors_before:
            return None  # the field errors say enough; a follow-up "needs one of port..." would only confuse
        if check.pattern is not None and (check.port is not None or check.url is not None):
            self.error(key, node, "use either log_match or port/http, not both")
            return None
        if check.pattern is not None:
            check.kind = "log_match"
        elif check.url is not None:
            check.kind = "http"
            if check.url.startswith("/"):
                if check.port is None:
                    self.error(f"{key}.http", http_node, "a path needs the port too: ready_when: {http: /health, port: 8000}")
                    return None
                check.url = f"http://{check.host}:{check.port}{check.url}"
        elif check.port is not None:
            check.kind = "port"
        else:
            self.error(key, node, "needs one of port, http or log_match")
            return None
        if check.expect_status is not None and check.kind != "http":
            self.warn(f"{key}.expect_status", node, "only used with http, ignored")
        return check

    def expose(self, node: yaml.Node, key: str) -> int:
        port = None
        for fname, child, value in self.fields(node, key, ("port", "as")):
            if fname == "port":
                port = self.integer(value, child, 1, 65535)
            else:
                as_port = self.integer(value, child, 1, 65535)
                if as_port != 80:
                    raise self.fail(child, value, "the box publishes only its web port 80; use as: 80 or leave it out")
        if port is None:
            raise self.fail(key, node, "missing required key 'port' (e.g. expose: {port: 8000})")
        return port

    # -- the project's egress policy ------------------------------------------------------------

    def egress(self, config: Config, name: str, node: yaml.Node) -> None:
        """`egress: <policy>` or `egress_allow: [hosts]` (a list, or one string of names separated by commas
        or spaces): their shape; the host names are checked by the host at create."""
        value = _scalar(node) if isinstance(node, yaml.ScalarNode) else None
        config.egress_lines[name] = _line(node) or 0
        if name == "egress":
            if value not in EGRESS_POLICIES:
                close = difflib.get_close_matches(str(value), EGRESS_POLICIES, n=1) if isinstance(value, str) else []
                hint = f"; did you mean '{close[0]}'?" if close else ""
                self.error(name, node, f"expected {EGRESS_POLICY_MEANINGS}, got {_describe(node)}{hint}")
                return
            config.egress = value
            return
        example = "e.g. egress_allow: [pypi.corp.example, '*.corp.example']"
        if isinstance(node, yaml.ScalarNode) and (value is None or isinstance(value, str)):
            words = re.split(r"[\s,]+", value or "")
            config.egress_allow = [word for word in words if word]
            config.egress_allow_lines = [_line(node) or 0] * len(config.egress_allow)
            return
        if not isinstance(node, yaml.SequenceNode):
            self.error(name, node, f"expected a list of host names ({example}), got {_describe(node)}")
            return
        entries: list[str] = []
        lines: list[int] = []
        for i, item in enumerate(node.value):
            try:
                entries.append(self.string(item, f"{name}[{i}]").strip())
                lines.append(_line(item) or 0)
            except _Invalid:
                self.issues[-1].message += f" (a host name, {example})"
        config.egress_allow, config.egress_allow_lines = entries, lines

    def _error_count(self) -> int:
        return sum(1 for issue in self.issues if issue.severity == "error")


def _key_near(text: str, line_index: int) -> str:
    """Best-effort dotted key path of a line in a file that does not parse, from indentation alone."""
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines()[: line_index + 1]:
        match = re.match(r"^(\s*)(?:- )?([^\s#'\"\[{][^:#]*?|'[^']*'|\"[^\"]*\"):(?:\s|$)", raw)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2).strip("'\"")))
    return ".".join(name for _indent, name in stack)


def parse_config(text: str, source: str, workspace: str | None = None) -> tuple[Config | None, list[ConfigIssue]]:
    """Parse agentbox.yaml text. Returns (config or None when any error, issues sorted by line)."""
    walker = _Walker()
    workspace = workspace or os.path.dirname(os.path.abspath(source))
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or "invalid YAML"
        if exc.context and exc.context_mark:
            problem = f"{exc.context} (line {exc.context_mark.line + 1}): {problem}"
        anchor = exc.context_mark or mark
        key = _key_near(text, anchor.line) if anchor else ""
        return None, [ConfigIssue("error", key, mark.line + 1 if mark else None, f"YAML syntax error: {problem}")]
    except yaml.YAMLError as exc:
        return None, [ConfigIssue("error", "", None, f"YAML error: {exc}")]
    config = Config(source=source, workspace=workspace)
    if root is None:
        walker.warn("", None, "the file is empty: no tasks and no services to run")
        return config, walker.issues
    try:
        top = walker.mapping(root, "")
    except _Invalid:
        walker.issues[-1].message = f"the top level must be a mapping with 'tasks' and/or 'services', got {_describe(root)}"
        return None, walker.issues
    key_lines: dict[str, int] = {}
    for name, key_node, value_node in top:
        if name in ("tasks", "services"):
            if isinstance(value_node, yaml.ScalarNode) and _scalar(value_node) is None:
                continue  # `services:` with nothing under it
            try:
                entries = walker.mapping(value_node, name)
            except _Invalid:
                continue
            for unit_name, unit_key_node, unit_node in entries:
                unit_key = f"{name}.{unit_name}"
                if not UNIT_NAME_RE.match(unit_name):
                    walker.error(unit_key, unit_key_node,
                                 "unit names use letters, digits, '_', '.' and '-' (at most 63, first a letter or digit)")
                    continue
                if unit_name in RESERVED_UNIT_NAMES:
                    walker.error(unit_key, unit_key_node, f"'{unit_name}' is reserved for the box's own logs; rename it")
                    continue
                if unit_name in key_lines:
                    walker.error(unit_key, unit_key_node,
                                 f"'{unit_name}' is already defined on line {key_lines[unit_name]}; task and service "
                                 "names share one namespace because needs refers to both")
                    continue
                key_lines[unit_name] = _line(unit_key_node) or 0
                if name == "tasks":
                    task = walker.task(unit_name, unit_key_node, unit_node, unit_key)
                    if task:
                        config.tasks[unit_name] = task
                else:
                    svc = walker.service(unit_name, unit_key_node, unit_node, unit_key)
                    if svc:
                        config.services[unit_name] = svc
        elif name in ("egress", "egress_allow"):
            walker.egress(config, name, value_node)
        elif name in PASSTHROUGH_TOP_KEYS or name.startswith("x-"):
            continue  # x-*: room for YAML anchors shared by several units, as in compose files
        else:
            hint = difflib.get_close_matches(name, ("tasks", "services", "egress", "egress_allow"), n=1)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
            walker.warn(name, key_node, f"unknown top-level key, ignored{suggestion}")
    _check_graph(config, key_lines, walker, walker.invalid_units)
    issues = sorted(walker.issues, key=lambda i: (i.line or 0, i.severity))
    if any(i.severity == "error" for i in issues):
        return None, issues
    return config, issues


def _check_graph(config: Config, defined: dict[str, int], walker: _Walker,
                 invalid: dict[str, TaskSpec | ServiceSpec] | None = None) -> None:
    """Unknown needs, more than one exposed service, and dependency cycles; `invalid` units (ones
    with errors of their own) take part too, so their needs are checked in the same pass."""
    units = {**config.all_units(), **(invalid or {})}
    for unit in units.values():
        section = "tasks" if unit.kind == "task" else "services"
        for i, (need, line) in enumerate(zip(unit.needs, unit.needs_lines, strict=False)):
            if need in defined:
                continue
            hint = difflib.get_close_matches(need, list(defined), n=1)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
            known = ", ".join(sorted(defined)) or "none"
            walker.issues.append(ConfigIssue("error", f"{section}.{unit.name}.needs[{i}]", line,
                                             f"unknown unit '{need}'{suggestion} (defined: {known})"))
    exposed = [s for s in config.services.values() if s.expose_port]
    for extra in exposed[1:]:
        walker.issues.append(ConfigIssue("error", f"services.{extra.name}.expose", extra.line,
                                         f"only one service can be exposed on the web port; '{exposed[0].name}' "
                                         f"(line {exposed[0].line}) already is"))
    # Cycle search over the units that parsed; each cycle is reported once, at its first edge.
    white, grey, black = 0, 1, 2
    colour = {name: white for name in units}
    reported = set()

    def visit(name: str, stack: list[str]) -> None:
        colour[name] = grey
        stack.append(name)
        unit = units[name]
        for need, line in zip(unit.needs, unit.needs_lines, strict=False):
            if need not in units:
                continue
            if colour[need] == grey:
                cycle = [*stack[stack.index(need):], need]
                signature = frozenset(cycle)
                if signature not in reported:
                    reported.add(signature)
                    section = "tasks" if unit.kind == "task" else "services"
                    walker.issues.append(ConfigIssue("error", f"{section}.{name}.needs", line,
                                                     "dependency cycle: " + " -> ".join(cycle)))
            elif colour[need] == white:
                visit(need, stack)
        stack.pop()
        colour[name] = black

    for name in sorted(units, key=lambda n: units[n].line):
        if colour[name] == white:
            visit(name, [])


def load_config_file(path: str) -> tuple[Config | None, list[ConfigIssue]]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None, [ConfigIssue("error", "", None, "no such file")]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [ConfigIssue("error", "", None, f"cannot read the file: {exc}")]
    return parse_config(text, path)


def topological_order(config: Config) -> list[str]:
    """Units in an order where needs come first; ties keep the file order (tasks, then services)."""
    units = config.all_units()
    order: list[str] = []
    seen: set = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for need in units[name].needs:
            visit(need)
        order.append(name)

    for name in units:
        visit(name)
    return order
