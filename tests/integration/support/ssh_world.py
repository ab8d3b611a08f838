"""The set-up of the `ssh agentbox-<box>` tests of the cloud providers (test_boxd_ssh.py, test_daytona_ssh.py):
a private HOME (its own ed25519 key, ~/.agentbox), a workspace repository and one box made on the provider's
emulator; the real OpenSSH client reads the alias with `-F`.

    class World(SshWorld):
        provider_name, credentials_prefix = "boxd", "BOXD_"
        def provider_env(self): ...

    with running_emulator(...) as emu, box_world(lambda root: World(root, "bssh", "readme\\n")) as world: ...
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from tests.conftest import make_repo, run_module

# A guard against a hung client, not a timing: an ssh that wakes a box waits for its start.
OPENSSH_TIMEOUT = 180


class SshWorld:
    """One provider's HOME, workspace and box for OpenSSH. Subclasses name the provider, the prefix of its
    credential variables (kept out of the environment ssh runs in unless given) and those credentials."""

    provider_name = ""
    credentials_prefix = ""

    def __init__(self, root: Path, prefix: str, readme: str) -> None:
        self.root = root
        self.home = root / "h"
        (self.home / ".ssh").mkdir(parents=True, mode=0o700)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{prefix}-test", "-f",
                        str(self.home / ".ssh" / "id_ed25519")], check=True)  # fmt: skip
        self.workspace = make_repo(root / "ws", {"README.md": readme})
        self.box = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.created: dict[str, Any] = {}

    def provider_env(self) -> dict[str, str]:
        """The provider's URL and credentials, as the modules read them from the environment."""
        raise NotImplementedError

    def ssh_env(self) -> dict[str, str]:
        """What the alias's ProxyCommand needs in the environment ssh runs in (none by default)."""
        return {}

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), **self.provider_env(), "SSH_AUTH_SOCK": "", "GIT_CONFIG_COUNT": "1",
                "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}  # fmt: skip

    def module(self, module: str, **args: Any) -> dict:
        return run_module(module, {"provider": self.provider_name, **args}, env=self.env())

    @property
    def config(self) -> Path:
        return self.home / ".agentbox" / "ssh_config"

    def openssh(self, argv: list[str], **env: str) -> subprocess.CompletedProcess:
        base = {k: v for k, v in os.environ.items() if not k.startswith(self.credentials_prefix)}
        return subprocess.run(argv, capture_output=True, text=True, timeout=OPENSSH_TIMEOUT, check=False,
                              env={**base, "HOME": str(self.home), **self.ssh_env(), **env})  # fmt: skip

    def ssh(self, command: str, **env: str) -> subprocess.CompletedProcess:
        return self.openssh(
            ["ssh", "-F", str(self.config), "-o", "BatchMode=yes", f"agentbox-{self.box}", command], **env
        )

    def scp(self, source: str, target: str) -> subprocess.CompletedProcess:
        return self.openssh(["scp", "-F", str(self.config), "-o", "BatchMode=yes", source, target])


World = TypeVar("World", bound=SshWorld)


@contextmanager
def box_world(make: Callable[[Path], World]) -> Iterator[World]:
    """`make(root)`'s world with its box created (not booted) under a fresh /tmp root; the box destroyed and
    the root removed afterwards."""
    # Short: OpenSSH's paths stay well inside its limits.
    root = Path(tempfile.mkdtemp(prefix="ssh-", dir="/tmp"))
    root.chmod(0o755)
    try:
        world = make(root)
        created = world.module("agentbox_box", name=world.box, workspace=str(world.workspace), boot=False)
        assert not created["failed"], created
        world.created = created
        try:
            yield world
        finally:
            world.module("agentbox_box", name=world.box, state="absent")
    finally:
        shutil.rmtree(root, ignore_errors=True)
