"""Every module refuses, before it does anything, what its documentation says it does not take: an option it
does not have, a value outside an option's documented choices, a value of the wrong type, a missing required
option. Run in-process (tests/unit/support/inprocess.py): AnsibleModule's own validation of each module's
argument spec, measured against the options `ansible-doc` shows (doc fragments merged)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from ansible.plugins.loader import fragment_loader
from ansible.utils.plugin_docs import get_docstring

from tests.conftest import REPO
from tests.unit.support.inprocess import run_module_inprocess

MODULES = sorted(path.stem for path in (REPO / "plugins" / "modules").glob("agentbox_*.py"))
CONVERTED = {"int": "int", "float": "float", "bool": "bool"}
# A value of the documented type, for the required options a case does not test.
SAMPLE = {"str": "x", "path": "/nonexistent/agentbox-test", "int": 1, "float": 1.0, "bool": True, "list": [], "dict": {}}
# What a module needs besides its required options before it looks at the others (required_one_of).
NEEDS = {"agentbox_image": {"dockerfile": "FROM scratch\n"}}


@cache
def options(module: str) -> dict[str, dict[str, Any]]:
    path = Path(REPO / "plugins" / "modules" / f"{module}.py").resolve()
    doc, *_rest = get_docstring(str(path), fragment_loader, collection_name="agentbox.box")
    return dict(doc["options"])


def required(module: str, but: str = "") -> dict[str, Any]:
    given = {name: SAMPLE[spec.get("type", "str")] for name, spec in options(module).items()
             if spec.get("required") and name != but}  # fmt: skip
    return {**NEEDS.get(module, {}), **given}


def cases(kind: str) -> list[tuple[str, str, Any]]:
    found = []
    for module in MODULES:
        for name, spec in options(module).items():
            if kind == "choices" and spec.get("choices"):
                found.append((module, name, spec["choices"]))
            elif kind == "type" and spec.get("type") in CONVERTED:
                found.append((module, name, spec["type"]))
            elif kind == "required" and spec.get("required"):
                found.append((module, name, None))
    return found


def test_every_module_is_covered() -> None:
    assert len(MODULES) == 19 and all(options(module) for module in MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_an_option_the_module_does_not_have_is_refused_by_name(module: str) -> None:
    result = run_module_inprocess(module, {**required(module), "colour": "blue"})
    assert result["failed"] is True, result
    assert "Unsupported parameters" in result["msg"] and "colour" in result["msg"], result["msg"]
    # The message lists what the module takes: every documented option.
    assert all(name in result["msg"] for name in options(module)), result["msg"]


@pytest.mark.parametrize(("module", "option", "choices"), cases("choices"), ids=lambda v: v if isinstance(v, str) else "")
def test_a_value_outside_the_documented_choices_is_refused(module: str, option: str, choices: list[str]) -> None:
    result = run_module_inprocess(module, {**required(module), option: "sideways"}, check_mode=True)
    assert result["failed"] is True, result
    assert f"value of {option} must be one of: {', '.join(map(str, choices))}, got: sideways" in result["msg"], result


@pytest.mark.parametrize(("module", "option", "kind"), cases("type"), ids=lambda v: v)
def test_a_value_of_the_wrong_type_is_refused(module: str, option: str, kind: str) -> None:
    result = run_module_inprocess(module, {**required(module), option: "lots"}, check_mode=True)
    assert result["failed"] is True, result
    assert f"'{option}'" in result["msg"] and f"unable to convert to {CONVERTED[kind]}" in result["msg"], result


@pytest.mark.parametrize(("module", "option", "_none"), cases("required"), ids=lambda v: v or "")
def test_a_missing_required_option_is_named(module: str, option: str, _none: None) -> None:
    result = run_module_inprocess(module, required(module, but=option), check_mode=True)
    assert result["failed"] is True, result
    assert result["msg"] == f"missing required arguments: {option}", result


def test_an_engine_entry_of_the_doctor_without_its_engine_is_refused() -> None:
    result = run_module_inprocess("agentbox_doctor", {"engines": [{"ssh_private_key_file": "/k"}]}, check_mode=True)
    assert result["failed"] is True
    assert "missing required arguments: engine found in engines" in result["msg"], result


EXCLUSIVE = [
    ("agentbox_idle", {"workspace": "/w", "project": "0123456789abcdef"}, "workspace|project"),
    ("agentbox_box_info", {"workspace": "/w", "project": "0123456789abcdef"}, "project|workspace"),
    ("agentbox_checkpoint", {"prune": True, "name": "warm"}, "prune|name"),
    ("agentbox_checkpoint", {"prune": True, "box": "b1"}, "prune|box"),
    ("agentbox_relay", {"approve": "a1", "deny": "a1"}, "approve|deny"),
    ("agentbox_image", {"dockerfile": "FROM scratch\n", "context": "/ctx"}, "dockerfile|context"),
]


@pytest.mark.parametrize(("module", "args", "pair"), EXCLUSIVE, ids=[f"{m}:{p}" for m, _a, p in EXCLUSIVE])
def test_options_that_exclude_each_other_are_refused_together(module: str, args: dict, pair: str) -> None:
    result = run_module_inprocess(module, args, check_mode=True)
    assert result["failed"] is True and result["msg"] == f"parameters are mutually exclusive: {pair}", result


def test_an_image_needs_a_dockerfile_or_a_context() -> None:
    result = run_module_inprocess("agentbox_image", {"tag": "agentbox-test/x"}, check_mode=True)
    assert result["failed"] is True and result["msg"] == "one of the following is required: dockerfile, context"
