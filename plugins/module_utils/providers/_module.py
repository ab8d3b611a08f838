# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the modules share: the provider options' argument spec and turning them into a Provider."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ..core._provider import Provider, ProviderError
from ._registry import (
    CLOUD_SETTINGS,
    ENGINE_PROVIDERS,
    PROVIDERS,
    SSH_ENGINE_PROVIDERS,
    get_provider,
    provider_settings,
)

PROVIDER_ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "provider": {"type": "str", "choices": list(PROVIDERS), "default": "docker"},
    "engine": {"type": "str"},
    "isolation": {"type": "str", "choices": ["userns", "none"]},
    "ssh_strict_host_key_checking": {"type": "bool", "default": True},
    "ssh_private_key_file": {"type": "path"},
    # The cloud providers' settings, from the registry's one table (an API key is no_log).
    **{
        setting.option: {"type": "str", **({"no_log": True} if setting.secret else {})}
        for settings in CLOUD_SETTINGS.values()
        for setting in settings
    },
}


def provider_from_params(params: dict[str, Any], **extra: Any) -> Provider:
    """The provider the task's options name; `extra` adds provider settings (agentbox_box's Daytona options)."""
    name = params["provider"]
    options: dict[str, Any] = {**extra, **provider_settings(name, params.get)}
    if name in SSH_ENGINE_PROVIDERS:
        options["engine"] = params.get("engine")
    if name in ENGINE_PROVIDERS and params.get("isolation"):
        options["isolation"] = params["isolation"]
    return get_provider(name, **options)


def failure(exc: Exception) -> dict[str, Any]:
    """How a task reports exc. A provider, naming or git error is its message (which says what to
    do); anything else is reported with its traceback, never as a crash without JSON."""
    if isinstance(exc, (ProviderError, ValueError, RuntimeError)):
        return {"msg": str(exc)}
    return {"msg": f"unexpected error: {exc}", "exception": traceback.format_exc()}


def run_module(module: Any, run: Callable[[Any], dict[str, Any]]) -> None:
    """Exit `module` with run(module)'s result: every module's one way of answering."""
    try:
        result = run(module)
    except Exception as exc:  # noqa: BLE001 - a module must always answer with JSON
        module.fail_json(**failure(exc))
    module.exit_json(**result)


def run_task_module(
    argument_spec: dict[str, Any],
    task: Callable[[dict[str, Any], bool], tuple[dict[str, Any], list[str]]],
    **constraints: Any,
) -> None:
    """main() of a module whose work is a task of module_utils/tasks: task(params, check_mode) returns
    its result and its warnings; check mode supported; answered by run_module."""
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **constraints)

    def answer(module: Any) -> dict[str, Any]:
        result, warnings = task(module.params, module.check_mode)
        for warning in warnings:
            module.warn(warning)
        return result

    run_module(module, answer)


def fail_on_errors(module: Any, what: str, errors: list[str], result: dict[str, Any]) -> dict[str, Any]:
    """`result`, or a failure naming each box's error ("<what> failed for a: ...; b: ...") that still
    carries `result`: one box that failed does not hide what was done to the others."""
    if errors:
        module.fail_json(msg=f"{what} failed for " + "; ".join(errors), **result)
    return result


def run_provider_module(options: dict[str, Any], run: Callable[[Any], dict[str, Any]], **constraints: Any) -> None:
    """main() of a module that works on a provider's boxes: its own `options` and the provider's, check
    mode supported, `constraints` (mutually_exclusive, ...) as AnsibleModule takes them; answered by run_module."""
    module = AnsibleModule(argument_spec={**options, **PROVIDER_ARGUMENT_SPEC}, supports_check_mode=True, **constraints)
    run_module(module, run)
