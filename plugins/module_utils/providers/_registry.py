# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The providers there are, and how each is made: the one place that knows them all.

The interface (`_provider`) knows no implementation; workflows get a `Provider` from here (or from
the caller). Each factory imports its provider when called, so a task pays only for the one it uses
(the Daytona and boxd SDKs are slow to import), and spells the import out literally so that
Ansible's module packer ships the provider's files with a module.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from ..core._errors import ProviderError
from ..core._provider import Provider
from .daytona import _daytona_options as cloud  # the cloud providers' create options and their checks (no SDK)

# agentbox_box's create options that only some providers honour (disk, network, ephemeral, auto_delete):
# the one table the argument spec takes them from and box_options checks them against.
PROVIDER_BOX_OPTIONS: dict[str, dict[str, Any]] = cloud.BOX_OPTIONS


def _make_docker(**options: Any) -> Provider:
    from .docker._docker import DockerProvider

    return DockerProvider(**options)


def _make_docker_ssh(**options: Any) -> Provider:
    from .docker._docker import DockerProvider

    if not options.get("engine"):
        raise ProviderError("provider 'docker_ssh' needs 'engine': an SSH destination such as user@host:port")
    return DockerProvider(**options)


def _make_daytona(**options: Any) -> Provider:
    from .daytona._daytona import DaytonaProvider

    return DaytonaProvider(**options)


def _make_boxd(**options: Any) -> Provider:
    from .boxd._boxd import BoxdProvider

    return BoxdProvider(**options)


FACTORIES: dict[str, Callable[..., Provider]] = {
    "docker": _make_docker,
    "docker_ssh": _make_docker_ssh,
    "daytona": _make_daytona,
    "boxd": _make_boxd,
}
PROVIDERS = tuple(FACTORIES)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of a cloud provider, as each entry point spells it: the provider's keyword, the module
    and connection plugin option (`<provider>_<keyword>`, also the inventory's key under `<provider>:`
    as `keyword`), the host variable the inventory hands the connection, and the environment fallback."""

    provider: str
    keyword: str
    env: str
    secret: bool = False  # an API key: never a host variable, never written to a file

    @property
    def option(self) -> str:
        return f"{self.provider}_{self.keyword}"

    @property
    def host_var(self) -> str:
        return f"agentbox_{self.option}"


# The one table of the cloud providers' settings. The first is the API's address (the provider's engine).
CLOUD_SETTINGS: dict[str, tuple[Setting, ...]] = {
    "daytona": (
        Setting("daytona", "api_url", "DAYTONA_API_URL"),
        Setting("daytona", "api_key", "DAYTONA_API_KEY", secret=True),
        Setting("daytona", "target", "DAYTONA_TARGET"),
    ),
    "boxd": (
        Setting("boxd", "base_url", "BOXD_BASE_URL"),
        Setting("boxd", "api_key", "BOXD_API_KEY", secret=True),
        Setting("boxd", "org", "BOXD_ORG"),
    ),
}
# The providers whose engine is an SSH destination, with the SSH settings of the modules and plugins.
SSH_ENGINE_PROVIDERS = ("docker_ssh",)
# The providers whose boxes live on a Docker engine named by `engine` ('local' or an SSH destination).
ENGINE_PROVIDERS = ("docker", *SSH_ENGINE_PROVIDERS)


def where(provider: str, engine: str | None) -> str:
    """How a message names where a box lives: 'local engine', or '<provider> on <engine>'."""
    if provider in ENGINE_PROVIDERS and (engine or "local") == "local":
        return "local engine"
    return f"{provider} on {engine}"


def cloud_settings(provider: str, given: Callable[[Setting], Any]) -> dict[str, Any]:
    """{keyword: value} of a cloud provider's settings: what `given` answers for each (a module's parameter,
    a plugin's option), else its environment variable. {} for the Docker providers."""
    return {s.keyword: given(s) or os.environ.get(s.env) for s in CLOUD_SETTINGS.get(provider, ())}


def ssh_engine_options(key_file: str | None, strict_host_key_checking: bool | None) -> dict[str, Any]:
    """The `ssh_options` of a docker_ssh provider from the modules' and plugins' SSH settings (only what is set)."""
    options: dict[str, Any] = {}
    if key_file:
        options["private_key_file"] = key_file
    if strict_host_key_checking is False:
        options["strict_host_key_checking"] = False
    return options


def provider_settings(provider: str, option: Callable[[str], Any]) -> dict[str, Any]:
    """The provider's keyword arguments from an entry point's options by name (`ssh_private_key_file`,
    `daytona_api_url`...; a module's params.get, a plugin's get_option), with the environment fallbacks.
    The engine of an SSH engine is not among them: it comes with the box or the task."""
    if provider in SSH_ENGINE_PROVIDERS:
        ssh = ssh_engine_options(option("ssh_private_key_file"), option("ssh_strict_host_key_checking"))
        return {"ssh_options": ssh} if ssh else {}
    return cloud_settings(provider, lambda setting: option(setting.option))


def box_options(params: dict[str, Any]) -> dict[str, Any]:
    """The provider keyword arguments for agentbox_box's cloud create options (disk, network, ephemeral,
    auto_delete); ValueError when one is bad or given for a provider that cannot honour it."""
    # provider: (the options it honours, their check, how a message names its boxes)
    honoured: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], dict[str, Any]], str]] = {
        "daytona": (tuple(cloud.BOX_OPTIONS), cloud.daytona_options, "Daytona boxes (provider: daytona)"),
        "boxd": (cloud.BOXD_OPTIONS, cloud.boxd_options, "boxd boxes (provider: boxd)"),
    }
    given = sorted(key for key in cloud.BOX_OPTIONS if params.get(key) is not None)
    if not given:
        return {}
    provider = params.get("provider")
    names, check, _boxes = honoured.get(provider, ((), None, ""))
    cannot = [key for key in given if key not in names]
    if check is None or cannot:
        cannot = cannot or given
        able = [boxes for names, _check, boxes in honoured.values() if set(cannot) <= set(names)]
        raise ValueError(
            f"{', '.join(cannot)} can only be set for {' and '.join(able)}; "
            f"drop {'them' if len(cannot) > 1 else 'it'} for provider {provider}"
        )
    return check(params)


def get_provider(provider: str, **options: Any) -> Provider:
    """The provider called `provider`, configured from options (engine, daytona settings...)."""
    factory = FACTORIES.get(provider)
    if factory is None:
        raise ProviderError(f"unknown provider {provider!r}: use one of {', '.join(PROVIDERS)}")
    return factory(**options)


def forget_access(box: str) -> None:
    """Remove what a provider keeps on the host for `ssh agentbox-<box>` besides the alias entry (a
    Daytona box's gateway token); nothing for a box that has none."""
    from .daytona import _daytona_ssh

    _daytona_ssh.forget(box)
