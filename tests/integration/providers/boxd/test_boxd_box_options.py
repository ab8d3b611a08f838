"""agentbox_box's disk and network options on boxd, through the module itself against the emulator and the
real SDK: the disk and the egress allow list reach boxd (read back from the emulator's state and from the
SDK's machines.get), and an egress policy as boxd's own allow list. Daytona-only options and a block_all boxd cannot honour fail before the provider is asked:
tests/unit/providers/test_box_provider_options.py (its boxd: cases, with no boxd listening).
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.boxd_emulator import running_emulator
from tests.conftest import make_repo, run_module, run_module_direct

pytestmark = pytest.mark.integration


class World:
    def __init__(self, emu, root: Path) -> None:
        self.emu, self.root = emu, root
        self.home = root / "home"
        self.home.mkdir()
        self.workspace = make_repo(root / "ws")

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "BOXD_BASE_URL": self.emu.base_url, "BOXD_TOKEN": self.emu.token,
                "BOXD_API_KEY": "", "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
                "GIT_CONFIG_VALUE_0": "*"}  # fmt: skip

    def box(self, **args) -> dict:
        """agentbox_box with provider boxd: no seeding, no in-box start sequence (only the create matters)."""
        options = {"provider": "boxd", "workspace": str(self.workspace), "seed": False, "boot": False, **args}
        return run_module("agentbox_box", options, env=self.env())

    def machines(self, name: str) -> list[dict]:
        return [m for m in self.emu.control.state()["machines"] if m["labels"].get("io.agentbox.box") == name]


@pytest.fixture(scope="module")
def world(box_image: str) -> Iterator[World]:
    with running_emulator(image=box_image) as emu, tempfile.TemporaryDirectory(prefix="agentbox-bxo-") as root:
        os.chmod(root, 0o755)
        yield World(emu, Path(root))


def test_disk_and_network_reach_boxd(world: World) -> None:
    name = f"bxo-{secrets.token_hex(3)}"
    done = world.box(name=name, disk=30, network=["github.com", "10.1.0.0/16"])
    try:
        assert not done["failed"], done
        [machine] = world.machines(name)
        assert machine["disk_bytes"] == 30 << 30 and machine["egress_allow"] == ["github.com", "10.1.0.0/16"]
        from boxd import Boxd

        sdk = Boxd(token=world.emu.token, base_url=world.emu.base_url, max_retries=0)
        try:
            recorded = sdk.machines.get(machine["id"])
        finally:
            sdk.close()
        assert recorded.egress_allow == ["github.com", "10.1.0.0/16"] and recorded.resources.disk_bytes == 30 << 30
    finally:
        gone = world.box(name=name, state="absent")
        assert not gone["failed"], gone
    assert world.machines(name) == []


def test_an_egress_allowlist_is_boxds_allow_list_from_the_create(world: World) -> None:
    """egress: allowlist on boxd (no gateway there): the machine's allow list is the default list less the '-'
    entries plus egress_allow (set before the box boots, as the network option's list: test_boxd_snapshots proves
    the order); the module's own main, no Ansible start."""
    from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import DEFAULT_ALLOW

    name = f"bxe-{secrets.token_hex(3)}"
    options = {"provider": "boxd", "workspace": str(world.workspace), "seed": False, "boot": False, "name": name}
    done = run_module_direct("agentbox_box", {**options, "egress": "allowlist",
                                              "egress_allow": ["*.corp.example", "-registry.npmjs.org"]},
                             env=world.env())  # fmt: skip
    try:
        assert not done["failed"], done
        [machine] = world.machines(name)
        wanted = [host for host in DEFAULT_ALLOW if host != "registry.npmjs.org"] + ["*.corp.example"]
        assert machine["egress_allow"] == wanted
    finally:
        gone = run_module_direct("agentbox_box", {**options, "state": "absent"}, env=world.env())
        assert not gone["failed"], gone
    assert world.machines(name) == []
