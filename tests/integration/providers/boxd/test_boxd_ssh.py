"""`ssh agentbox-<box>` for a boxd box, with the real OpenSSH client, on the boxd emulator (real SDK): the
alias's ProxyCommand runs the box's own `sshd -i` through boxd's streaming exec. Issues 16 and 20.

HOME is a private temp dir (its own key, ~/.agentbox); OpenSSH reads the alias with `-F`. The API token
reaches the ProxyCommand through the environment ssh runs in, never through a file.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator

import pytest

from tests.boxd_emulator import running_emulator
from tests.integration.support.ssh_world import SshWorld, box_world

pytestmark = pytest.mark.integration


class World(SshWorld):
    provider_name, credentials_prefix = "boxd", "BOXD_"

    def __init__(self, emu, root) -> None:
        super().__init__(root, "bssh", "boxd over ssh\n")
        self.emu = emu

    def provider_env(self) -> dict[str, str]:
        return {"BOXD_BASE_URL": self.emu.base_url, "BOXD_TOKEN": self.emu.token}

    def ssh_env(self) -> dict[str, str]:
        return {"BOXD_TOKEN": self.emu.token}  # the pipe reads the token from ssh's environment, never a file

    def provider(self):
        from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

        return BoxdProvider(token=self.emu.token, base_url=self.emu.base_url)


@pytest.fixture(scope="module")
def world(box_image: str) -> Iterator[World]:
    with running_emulator(image=box_image) as emu, box_world(lambda root: World(emu, root)) as made:
        yield made


def test_ssh_alias_lands_as_vscode_on_the_boxs_branch(world: World) -> None:
    access = world.created["access"]
    assert access["alias"] == f"agentbox-{world.box}" and access["warnings"] == [], access
    assert stat.S_IMODE(world.config.stat().st_mode) == 0o600
    branch = world.ssh("git -C /workspace rev-parse --abbrev-ref HEAD")
    assert branch.returncode == 0, branch.stderr
    assert branch.stdout.strip() == f"agentbox/{world.box}"
    assert world.ssh("id -un").stdout == "vscode\n"
    # The token is a credential: it is in no file the collection wrote.
    for path in (world.home / ".agentbox").rglob("*"):
        if path.is_file() and not path.is_socket():
            assert world.emu.token not in path.read_text(errors="replace"), path


def test_scp_in_and_out(world: World) -> None:
    payload = os.urandom(300_000)
    source = world.root / "in.bin"
    source.write_bytes(payload)
    done = world.scp(str(source), f"agentbox-{world.box}:/tmp/in.bin")
    assert done.returncode == 0, done.stderr
    assert world.ssh("stat -c %U /tmp/in.bin").stdout == "vscode\n"
    back = world.root / "out.bin"
    done = world.scp(f"agentbox-{world.box}:/tmp/in.bin", str(back))
    assert done.returncode == 0, done.stderr
    assert back.read_bytes() == payload


def test_the_alias_wakes_a_paused_box(world: World) -> None:
    provider = world.provider()
    provider.pause(world.box)
    assert provider.find(world.box).state == "paused"
    branch = world.ssh("git -C /workspace rev-parse --abbrev-ref HEAD")
    assert (branch.returncode, branch.stdout.strip()) == (0, f"agentbox/{world.box}"), branch.stderr
    assert "was paused; it runs again" in branch.stderr
    assert provider.find(world.box).state == "running"


def test_destroy_removes_the_alias(world: World) -> None:
    """A box of its own: destroying it removes its entry; the other box's entry stays."""
    name = f"bsx-{uuid.uuid4().hex[:6]}"
    made = world.module("agentbox_box", name=name, workspace=str(world.workspace), boot=False)
    assert not made["failed"], made
    assert f"Host agentbox-{name}\n" in world.config.read_text()
    gone = world.module("agentbox_box", name=name, state="absent")
    assert not gone["failed"] and gone["changed"], gone
    assert f"agentbox-{name}" not in world.config.read_text()
    assert f"Host agentbox-{world.box}\n" in world.config.read_text()
