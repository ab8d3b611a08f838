"""The registry's one table of provider settings, and every place that declares them agrees with it:
the modules' argument spec and doc fragment, the connection plugin's options and host variables, the
inventory's options. A new cloud provider is one entry in the table plus its documentation."""

from __future__ import annotations

import yaml

from ansible_collections.agentbox.box.plugins.connection import box as connection_plugin
from ansible_collections.agentbox.box.plugins.doc_fragments.provider import ModuleDocFragment
from ansible_collections.agentbox.box.plugins.inventory import boxes as inventory_plugin
from ansible_collections.agentbox.box.plugins.module_utils._module import PROVIDER_ARGUMENT_SPEC
from ansible_collections.agentbox.box.plugins.module_utils._registry import (
    CLOUD_SETTINGS,
    PROVIDERS,
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
