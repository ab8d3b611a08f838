"""The set-up of the relay tests on a cloud provider's emulator (test_relay_boxd.py, test_relay_daytona.py):
the host's relay started with the provider's credentials in its environment, and one started box whose
requests it serves. The host and project fixtures are test_relay.py's.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import run_module
from tests.integration.relay import test_relay as shared


@contextmanager
def relay_with(host: shared.Host, env: dict[str, str]) -> Iterator[None]:
    """The host's relay, started again with `env`: it takes a provider's credentials from its environment
    (they are never written to its files)."""
    # Shipping fetches over file:// as root from a repo owned by uid 1000: git wants a global safe.directory.
    Path(host.home, ".gitconfig").write_text("[safe]\n\tdirectory = *\n")
    host.relay("stop")
    subprocess.run([shared.RELAY, "start"], env={**host.env, **env}, check=True, capture_output=True)
    try:
        yield
    finally:
        host.relay("stop")


@contextmanager
def started_box(
    host: shared.Host, project: dict[str, Path], provider: str, env: dict[str, str], prefix: str
) -> Iterator[str]:
    """The name of a started box of `provider` on the project's workspace; destroyed afterwards."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    env = {"HOME": host.home, **env}
    created = run_module(
        "agentbox_box",
        {"name": name, "workspace": str(project["workspace"]), "provider": provider, "state": "started"},
        env=env,
    )
    assert not created["failed"], created.get("msg")
    try:
        yield name
    finally:
        run_module("agentbox_box", {"name": name, "provider": provider, "state": "absent"}, env=env)
