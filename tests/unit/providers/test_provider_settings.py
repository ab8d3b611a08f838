"""The registry's one table of provider settings, and every place that declares them agrees with it:
the modules' argument spec and doc fragment, the connection plugin's options and host variables, the
inventory's options. A new cloud provider is one entry in the table plus its documentation."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from ansible_collections.agentbox.box.plugins.connection import box as connection_plugin
from ansible_collections.agentbox.box.plugins.doc_fragments.provider import ModuleDocFragment
from ansible_collections.agentbox.box.plugins.inventory import boxes as inventory_plugin
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import PROVIDER_ARGUMENT_SPEC
from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import (
    CLOUD_SETTINGS,
    PROVIDERS,
    box_options,
    cloud_settings,
    provider_settings,
)

SETTINGS = [setting for settings in CLOUD_SETTINGS.values() for setting in settings]


def test_every_cloud_provider_is_registered_and_every_setting_is_an_option_everywhere() -> None:
    assert set(CLOUD_SETTINGS) <= set(PROVIDERS)
    fragment = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    connection = yaml.safe_load(connection_plugin.DOCUMENTATION)["options"]
    inventory = yaml.safe_load(inventory_plugin.DOCUMENTATION)["options"]
    for setting in SETTINGS:
        assert PROVIDER_ARGUMENT_SPEC[setting.option].get("no_log", False) is setting.secret, setting
        assert setting.option in fragment, setting
        assert setting.env in str(fragment[setting.option]["description"]), setting
        host_vars = [entry["name"] for entry in connection[setting.option].get("vars", [])]
        # The inventory hands the non-secret ones over under host_var (a user may set a key there from a vault).
        assert setting.host_var in host_vars, setting
        assert setting.keyword in inventory[setting.provider]["suboptions"], setting


def test_given_values_win_over_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("DAYTONA_API_URL", "http://127.0.0.1:9/env")
    monkeypatch.setenv("DAYTONA_TARGET", "eu")
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    given = {"daytona_api_url": "http://127.0.0.1:9/given", "daytona_api_key": "k"}
    assert provider_settings("daytona", given.get) == {
        "api_url": "http://127.0.0.1:9/given", "api_key": "k", "target": "eu"}  # fmt: skip
    for variable in ("BOXD_BASE_URL", "BOXD_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("BOXD_ORG", "acme")
    assert cloud_settings("boxd", lambda setting: None) == {"base_url": None, "api_key": None, "org": "acme"}


def test_docker_settings() -> None:
    assert provider_settings("docker", {}.get) == {}
    assert provider_settings("docker_ssh", {"ssh_strict_host_key_checking": True}.get) == {}
    given = {"ssh_private_key_file": "/k", "ssh_strict_host_key_checking": False}
    assert provider_settings("docker_ssh", given.get) == {
        "ssh_options": {"private_key_file": "/k", "strict_host_key_checking": False}}  # fmt: skip


def provider_name_tests(source: str) -> list[str]:
    """Comparisons of something with a provider's name (`facts.provider == "docker"`, `name in ("docker",
    "docker_ssh")`): what differs between providers is asked of the provider (its capabilities) instead."""
    names = set(PROVIDERS)

    def names_one(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(names_one(item) for item in node.elts)

    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare) and any(names_one(side) for side in (node.left, *node.comparators))
    ]


def test_no_code_branches_on_a_provider_name() -> None:
    assert provider_name_tests('if facts.provider == "docker":\n    pass') == ["1: facts.provider == 'docker'"]
    assert provider_name_tests("ok = name in ('daytona', 'boxd')") == ["1: name in ('daytona', 'boxd')"]
    assert provider_name_tests("ok = provider in ENGINE_PROVIDERS") == []  # a registry table is the way
    plugins = Path(__file__).resolve().parents[3] / "plugins"
    found = {
        str(path.relative_to(plugins)): tests
        for path in sorted(plugins.rglob("*.py"))
        if (tests := provider_name_tests(path.read_text()))
    }
    assert found == {}


def test_cloud_box_options_are_checked_against_the_provider_that_honours_them() -> None:
    assert box_options({"provider": "docker"}) == {}
    assert box_options({"provider": "boxd", "disk": 20, "network": ["github.com"]}) == {
        "disk": 20, "egress_allow": ["github.com"]}  # fmt: skip
    assert box_options({"provider": "daytona", "ephemeral": True}) == {"auto_delete": 0}
    with pytest.raises(ValueError, match=r"^disk, network can only be set for Daytona boxes \(provider: daytona\) "
                       r"and boxd boxes \(provider: boxd\); drop them for provider docker$"):  # fmt: skip
        box_options({"provider": "docker", "disk": 5, "network": "block_all"})
    with pytest.raises(ValueError, match=r"^ephemeral can only be set for Daytona boxes \(provider: daytona\); "
                       r"drop it for provider boxd$"):  # fmt: skip
        box_options({"provider": "boxd", "ephemeral": True, "disk": 5})
    with pytest.raises(ValueError, match="boxd has no block_all"):
        box_options({"provider": "boxd", "network": "block_all"})
