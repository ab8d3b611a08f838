# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The providers there are, and how each is made: the one place that knows them all.

The interface (`_provider`) knows no implementation; workflows get a `Provider` from here (or from
the caller). Each factory imports its provider when called, so a task pays only for the one it uses
(the Daytona and boxd SDKs are slow to import), and spells the import out literally so that
Ansible's module packer ships the provider's files with a module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import ProviderError
from ._provider import Provider


def _make_docker(**options: Any) -> Provider:
    from ._docker import DockerProvider

    return DockerProvider(**options)


def _make_docker_ssh(**options: Any) -> Provider:
    from ._docker import DockerProvider

    if not options.get("engine"):
        raise ProviderError("provider 'docker_ssh' needs 'engine': an SSH destination such as user@host:port")
    return DockerProvider(**options)


def _make_daytona(**options: Any) -> Provider:
    from ._daytona import DaytonaProvider

    return DaytonaProvider(**options)


def _make_boxd(**options: Any) -> Provider:
    from ._boxd import BoxdProvider

    return BoxdProvider(**options)


FACTORIES: dict[str, Callable[..., Provider]] = {
    "docker": _make_docker,
    "docker_ssh": _make_docker_ssh,
    "daytona": _make_daytona,
    "boxd": _make_boxd,
}
PROVIDERS = tuple(FACTORIES)


def get_provider(provider: str, **options: Any) -> Provider:
    """The provider called `provider`, configured from options (engine, daytona settings...)."""
    factory = FACTORIES.get(provider)
    if factory is None:
        raise ProviderError(f"unknown provider {provider!r}: use one of {', '.join(PROVIDERS)}")
    return factory(**options)
