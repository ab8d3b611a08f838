# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What `init.yml` proposes for a project (install tasks, services, the test command), and that proposal
written out as a commented `agentbox.yaml`.

Pure: the workspace is read by `_project_scan`; the file is validated and written by the module.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

PROJECT_FILE = "agentbox.yaml"
# A unit name the supervisor accepts (docs/agentbox-yaml.md, "Top level").
_UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# Scalars written without quotes: nothing YAML reads as another type, no ': ' or ' #'.
_PLAIN = re.compile(r"[A-Za-z0-9_./@~$-][A-Za-z0-9_./@~$=+, -]*")
_NOT_PLAIN = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}
INSTALL_TIMEOUT_MS = 1_800_000
READY_TIMEOUT_MS = 120_000


@dataclass
class Unit:
    """One task or service of the proposal."""

    name: str
    command: str
    why: list[str]  # comment lines written above it: what was found and what it does
    cwd: str = ""  # relative to the workspace; "" is the workspace
    check: str = ""  # a task's run_once check (the marker guard)
    port: int = 0  # a service's ready_when port
    expose: bool = False  # the box's web port 80 forwards to `port`
    needs: list[str] = field(default_factory=list)
    timeout_ms: int = 0
    stop_timeout_ms: int = 0


@dataclass
class Plan:
    """The proposal for one workspace."""

    found: list[str] = field(default_factory=list)  # "npm (package-lock.json)", "vite dev server (port 5173)"
    tasks: list[Unit] = field(default_factory=list)
    services: list[Unit] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)  # "npm test", "cd api && go test ./..."
    notes: list[str] = field(default_factory=list)  # what to check or fill in by hand

    @property
    def classified(self) -> bool:
        return bool(self.tasks or self.services)

    @property
    def web_port(self) -> int:
        return next((unit.port for unit in self.services if unit.expose), 0)


def unit_name(*parts: str) -> str:
    """A valid, readable unit name from parts such as ("install", "frontend")."""
    words = [re.sub(r"[^A-Za-z0-9_.-]+", "-", part).strip("-._") for part in parts if part]
    name = "-".join(word for word in words if word)[:63].rstrip("-._")
    return name if _UNIT_NAME.fullmatch(name) else "unit"


def marker_guard(install: str, inputs: list[str], marker: str) -> tuple[str, str]:
    """An install command that records the checksum of its inputs in `marker` once it succeeded, and the
    run_once check that skips it while the inputs still have that checksum (a changed lock file runs it
    again; removing the installed directory, where the marker lives, too)."""
    files = " ".join(_shell_word(name) for name in inputs)
    target = _shell_word(marker)
    summed = f"cat {files} | sha256sum"
    folder = marker.rpartition("/")[0]
    command = "set -e\n" + install.rstrip("\n") + "\n"
    command += f"mkdir -p {_shell_word(folder)}\n" if folder else ""
    command += f"{summed} > {target}\n"
    return command, f"{summed} | cmp -s - {target}"


def _shell_word(word: str) -> str:
    """A word for the shell; `$HOME/...` keeps its expansion (double quotes), anything odd is quoted."""
    if re.fullmatch(r"[A-Za-z0-9_./@%+=:,-]+", word):
        return word
    if word.startswith("$HOME/") and re.fullmatch(r"[A-Za-z0-9_./@%+=:,-]+", word[6:]):
        return f'"{word}"'
    return "'" + word.replace("'", "'\"'\"'") + "'"


def _scalar(value: str, indent: str) -> str:
    """A YAML scalar: plain when safe, a literal block for several lines, else a JSON string (valid YAML)."""
    if "\n" in value.rstrip("\n"):
        lines = value.rstrip("\n").split("\n")
        return "|\n" + "\n".join((indent + line) if line else "" for line in lines)
    value = value.rstrip("\n")
    if _PLAIN.fullmatch(value) and value.lower() not in _NOT_PLAIN and not re.fullmatch(r"[-+.0-9]+", value):
        return value
    return json.dumps(value)


def _comment(lines: list[str], indent: str) -> list[str]:
    return [f"{indent}# {line}".rstrip() for line in lines]


def _unit_lines(unit: Unit, service: bool) -> list[str]:
    out = _comment(unit.why, "  ")
    out.append(f"  {unit.name}:")
    out.append(f"    command: {_scalar(unit.command, '      ')}")
    if unit.cwd:
        out.append(f"    cwd: {_scalar(unit.cwd, '      ')}")
    if unit.needs:
        out.append(f"    needs: [{', '.join(unit.needs)}]")
    if unit.check:
        out.append("    run_once:")
        out.append(f"      check: {_scalar(unit.check, '        ')}")
    if unit.timeout_ms:
        out.append(f"    timeout_ms: {unit.timeout_ms}")
    if service:
        out.append("    restart: on-failure")
        if unit.port:
            out += ["    ready_when:", f"      port: {unit.port}", f"      timeout_ms: {READY_TIMEOUT_MS}"]
        if unit.expose and unit.port:
            out.append(f"    expose: {{port: {unit.port}}}")
        if unit.stop_timeout_ms:
            out.append(f"    stop_timeout_ms: {unit.stop_timeout_ms}")
    return out


_HEADER = [
    "agentbox.yaml: what every box of this project installs and runs. Written by the set-up wizard",
    "(playbooks/init.yml, or agentbox-ctl init in a box); edit it freely and commit it. Each box's",
    "supervisor (agentbox-ctl) reads it at start: tasks run in the order `needs` gives, services are",
    "started, checked and restarted. Every key: docs/agentbox-yaml.md; check a change with",
    "`agentbox-ctl validate` in a box.",
]

_UNCLASSIFIED = [
    "Nothing in this workspace said how to install or run it (no package.json, pyproject.toml,",
    "requirements.txt, Pipfile, Cargo.toml, go.mod or compose file at its root or one level down).",
    "Fill in what a fresh box needs, for example:",
    "",
    "tasks:",
    "  install:",
    "    command: make deps            # installs the dependencies",
    "    run_once: true                # once per box (a checkpoint taken after it keeps the result)",
    "services:",
    "  web:",
    "    command: exec make serve      # stays in the foreground",
    "    needs: [install]",
    "    ready_when: {port: 8000}",
    "    expose: {port: 8000}          # the box's web port 80 forwards here",
]


def render(plan: Plan) -> str:
    """The commented agentbox.yaml for `plan`."""
    out = _comment(_HEADER, "")
    if plan.found:
        out += ["#", f"# Found: {'; '.join(plan.found)}."]
    if plan.tests:
        out.append(f"# Tests: {' ; '.join(plan.tests)}")
    if plan.notes:
        out += ["#", "# Check by hand:"] + [f"#   - {note}" for note in plan.notes]
    if not plan.classified:
        out += ["#", *_comment(_UNCLASSIFIED, "")]
        return "\n".join(out) + "\n\ntasks: {}\nservices: {}\n"
    out.append("")
    out.append("tasks:" if plan.tasks else "tasks: {}")
    for index, unit in enumerate(plan.tasks):
        out += ([""] if index else []) + _unit_lines(unit, service=False)
    out.append("")
    out.append("services:" if plan.services else "services: {}")
    for index, unit in enumerate(plan.services):
        out += ([""] if index else []) + _unit_lines(unit, service=True)
    return "\n".join(out) + "\n"


def fill_in(plan: Plan) -> str:
    """What the user still has to write, in one sentence (empty when the plan is complete)."""
    if not plan.classified:
        return (
            "could not tell how to install or run this project: fill in tasks.install (the command that installs "
            "its dependencies) and services.web (the command that serves it, with ready_when.port and expose.port)"
        )
    if plan.notes:
        return "check by hand: " + "; ".join(plan.notes)
    return ""
