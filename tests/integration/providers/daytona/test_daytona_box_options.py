"""agentbox_box's Daytona options through the module itself, against the emulator and the real SDK (issue 19):
disk, network (block_all, an allow list), ephemeral and auto_delete, and the region (daytona_target) with
region-scoped checkpoint snapshots. What the sandbox got is read back through the SDK, as a user of the live
service would read it; bad values fail before anything is made.

The modules run as Ansible runs them on the target, their own main in a fresh Python
(tests/conftest.py (run_module_direct)): these tests are about what the options do. Through Ansible: the
refused calls (one playbook, every case a task) and the unpinned image's warning, as Ansible prints it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, make_repo, run_module, run_module_direct
from tests.daytona_emulator import TEST_IMAGE, ensure_test_image, remove_test_image, running_emulator

pytestmark = pytest.mark.integration


class Emu:
    def __init__(self, api_url: str, api_key: str, root: Path) -> None:
        self.api_url, self.api_key, self.root = api_url, api_key, root
        self.home = root / "home"
        self.home.mkdir()
        self.workspace = make_repo(root / "ws")

    def env(self) -> dict[str, str]:
        env = {"HOME": str(self.home), "DAYTONA_API_URL": self.api_url, "DAYTONA_API_KEY": self.api_key,
               "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}  # fmt: skip
        return env

    def box(self, check_mode: bool = False, **args) -> dict:
        """agentbox_box with provider daytona: no seeding, no in-box start sequence (only the create matters)."""
        options = {"provider": "daytona", "workspace": str(self.workspace), "seed": False, "boot": False, **args}
        saved = os.environ.pop("DAYTONA_TARGET", None)
        try:
            return run_module_direct("agentbox_box", options, check_mode=check_mode, env=self.env())
        finally:
            if saved is not None:
                os.environ["DAYTONA_TARGET"] = saved

    def sdk(self):
        from daytona import Daytona, DaytonaConfig

        return Daytona(DaytonaConfig(api_key=self.api_key, api_url=self.api_url, target="us"))

    def exists(self, name: str) -> bool:
        from daytona import DaytonaNotFoundError

        try:
            self.sdk().get(name)
        except DaytonaNotFoundError:
            return False
        return True

    def destroy(self, *names: str) -> None:
        """Clean-up through the provider library (no Ansible start a box): the module's own destroy is proven
        where a test asserts on it."""
        from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

        provider = DaytonaProvider(api_key=self.api_key, api_url=self.api_url)
        try:
            for name in names:
                provider.destroy(name)
        finally:
            provider.close()


@pytest.fixture(scope="module")
def emu(box_image: str) -> Iterator[Emu]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-dtopt-", dir="/tmp"))
    root.chmod(0o755)
    try:
        with running_emulator(image=box_image) as (api_url, api_key, _admin):
            yield Emu(api_url, api_key, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def registry_image() -> Iterator[str]:
    """A registry reference (a box made from an image, not a snapshot: disk applies only there)."""
    client = docker.from_env()
    built = ensure_test_image(client)
    reference = f"localhost/agentbox-opts-{uuid.uuid4().hex[:6]}/box:v1"
    client.images.get(TEST_IMAGE).tag(*reference.rsplit(":", 1))
    try:
        yield reference
    finally:
        client.images.remove(reference, force=True)
        if built:
            remove_test_image(client)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_disk_and_network_reach_the_sandbox(emu: Emu, registry_image: str) -> None:
    sealed, allowed = _unique("blk"), _unique("alw")
    try:
        done = emu.box(name=sealed, network="block_all")
        assert not done["failed"], done
        done = emu.box(name=allowed, image=registry_image, disk=20, network=["10.0.0.0/8", "192.168.1.0/24"])
        assert not done["failed"], done
        sdk = emu.sdk()
        assert sdk.get(sealed).network_block_all is True
        assert not sdk.get(sealed).network_allow_list
        got = sdk.get(allowed)
        assert (got.disk, got.network_allow_list, got.network_block_all) == (20, "10.0.0.0/8,192.168.1.0/24", False)
    finally:
        emu.destroy(sealed, allowed)


def test_the_projects_egress_none_is_the_sandboxs_network_block_all(emu: Emu) -> None:
    """agentbox.yaml's `egress: none` on Daytona (no gateway there): the create sends network_block_all, and a
    `network` create option wins over the file, with a warning (the plan, in check mode: what the option itself
    sends is test_disk_and_network_reach_the_sandbox's; docs/egress.md "Daytona and boxd")."""
    sealed = _unique("egn")
    workspace = make_repo(emu.root / f"ws-{sealed}", {"agentbox.yaml": "egress: none\n"})
    try:
        done = emu.box(name=sealed, workspace=str(workspace))
        assert not done["failed"] and done["egress"] == {"egress": "none", "egress_allow": []}, done
        got = emu.sdk().get(sealed)
        assert got.network_block_all is True and not got.network_allow_list
        planned = emu.box(check_mode=True, name=_unique("egw"), workspace=str(workspace), network=["10.0.0.0/8"])
        assert not planned["failed"] and planned["egress"] is None, planned
        said = str(planned["warnings"])
        assert "agentbox.yaml sets egress, and this box's network option wins over it" in said, planned
    finally:
        emu.destroy(sealed)


def test_an_image_the_controller_cannot_pin_is_sent_by_tag_with_a_warning(emu: Emu, registry_image: str) -> None:
    """No Docker engine on the controller (a common Daytona setup): the image cannot be pinned to a digest or an
    image id, so it goes by its tag and the task's output warns that a moved tag would not be picked up."""
    name = _unique("tag")
    try:
        done = run_module("agentbox_box", {"name": name, "provider": "daytona", "workspace": str(emu.workspace),
                                           "seed": False, "boot": False, "image": registry_image},
                          env={**emu.env(), "DOCKER_HOST": f"unix://{emu.root}/no-engine.sock"})  # fmt: skip
        assert not done["failed"], done
        warned = " ".join(done["_stderr"].split())  # ansible wraps a long [WARNING] line
        assert f"[WARNING]: image '{registry_image}' is not on this machine's Docker engine" in warned, warned
        assert "unpinned" in warned, warned
    finally:
        emu.destroy(name)


BAD_VALUES = [
    ({"network": "10.0.0.0"}, "needs a CIDR prefix"),
    ({"network": ["example.com/8"]}, "not an IPv4 network"),
    ({"network": [f"10.0.{n}.0/24" for n in range(11)]}, "at most 10 networks"),
    ({"disk": 0}, "disk must be a whole number of GiB"),
    ({"disk": 20}, "cannot apply to a box started from the Daytona snapshot"),  # the default image is one
    ({"ephemeral": True, "auto_delete": 5}, "drop auto_delete, or ephemeral"),
    ({"auto_delete": -2}, "auto_delete must be -1"),
    ({"daytona_target": "mars"}, "is only in region us, eu and this box would be made in mars"),
    ({"egress": "allowlist"}, "Daytona's network allow list takes IPv4 CIDRs only: create the box with network:"),
    ({"egress": "none", "network": "block_all"}, "egress and network were both given"),
]


@pytest.fixture(scope="module")
def refusals(emu: Emu) -> dict[str, dict]:
    """Every refused agentbox_box call of this module, made as tasks of one playbook (one Ansible start, not
    one a case): {box name: the task's result}, keyed "bad0".."bad9" (BAD_VALUES) and "docker"."""
    cases = {f"bad{n}": (_unique("bad"), {"provider": "daytona", "seed": False, "boot": False, **args})
             for n, (args, _message) in enumerate(BAD_VALUES)}  # fmt: skip
    cases["docker"] = (_unique("dock"), {"provider": "docker", "disk": 10, "network": "block_all"})
    tasks = [{"name": key, "agentbox.box.agentbox_box": {"name": name, "workspace": str(emu.workspace), **args},
              "register": key, "ignore_errors": True} for key, (name, args) in cases.items()]  # fmt: skip
    out = emu.root / f"refusals-{uuid.uuid4().hex[:6]}.json"
    saved = "{{ {" + ", ".join(f"'{key}': {key}" for key in cases) + "} | to_json }}"
    tasks.append({"ansible.builtin.copy": {"content": saved, "dest": str(out), "mode": "0600"}})
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"}, "tasks": tasks}]  # fmt: skip
    playbook = emu.root / f"refusals-{uuid.uuid4().hex[:6]}.yml"
    playbook.write_text(json.dumps(play))
    env = {k: v for k, v in os.environ.items() if k != "DAYTONA_TARGET"}
    done = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(playbook)], cwd=REPO,
                          env={**env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), **emu.env()},
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert out.exists(), f"the playbook failed before saving:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    results = json.loads(out.read_text())
    return {key: {**results[key], "_name": name} for key, (name, _args) in cases.items()}


@pytest.mark.parametrize(("case", "message"), [(f"bad{n}", message) for n, (_a, message) in enumerate(BAD_VALUES)])
def test_bad_values_fail_before_anything_is_made(emu: Emu, refusals: dict[str, dict], case: str, message: str) -> None:
    done = refusals[case]
    assert done["failed"] and message in done["msg"], done
    assert not emu.exists(done["_name"])


def test_daytona_options_are_refused_for_other_providers(refusals: dict[str, dict]) -> None:
    done = refusals["docker"]
    assert done["failed"] and "disk, network can only be set for Daytona boxes" in done["msg"], done
    assert not docker.from_env().containers.list(all=True, filters={"name": f"agentbox-{done['_name']}"})


def test_an_ephemeral_box_is_deleted_when_it_stops_and_never_paused(emu: Emu) -> None:
    short, kept = _unique("eph"), _unique("ad")
    try:
        assert not emu.box(name=short, ephemeral=True)["failed"]
        assert not emu.box(name=kept, auto_delete=30)["failed"]
        sdk = emu.sdk()
        assert sdk.get(short).auto_delete_interval == 0
        assert sdk.get(kept).auto_delete_interval == 30
        refused = emu.box(name=short, state="paused")
        assert refused["failed"] and "the box is ephemeral" in refused["msg"], refused
        assert sdk.get(short).state == "started"  # the refusal changed nothing
        refused = run_module_direct("agentbox_checkpoint", {"box": short, "name": "never", "provider": "daytona"},
                                    env=emu.env())  # fmt: skip
        assert refused["failed"] and "the box is ephemeral" in refused["msg"], refused
        sdk.get(short).stop()  # as Daytona's own auto-stop would: an ephemeral sandbox goes with its stop
        assert not emu.exists(short)
        assert emu.box(name=short, state="absent")["changed"] is False
    finally:
        emu.destroy(short, kept)


def test_the_idle_policies_leave_an_ephemeral_box_to_daytona(emu: Emu) -> None:
    """An ephemeral box idle for an hour: agentbox_reap and agentbox_idle succeed and report it left alone (a
    pause would delete it); it is still started after both."""
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

    short = _unique("ephi")
    provider = DaytonaProvider(api_key=emu.api_key, api_url=emu.api_url)
    try:
        made = emu.box(name=short, ephemeral=True)
        assert not made["failed"], made
        old = int(time.time()) - 3600
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(old))
        # Both idle signals an hour old: the reaper's heartbeat (nothing changed under /workspace since) and the
        # agent's own idle state, as in test_daytona_provider_reap and test_autopause_daytona.
        script = ('mkdir -p ~/.agentbox && touch -d "@$1" ~/.agentbox/last-activity && echo x > /workspace/file && '
                  'find /workspace -exec touch -h -d "@$1" {} + && agentbox-ctl agent-state idle --session claude && '
                  'sed -i "s/\\"since\\": \\"[^\\"]*\\"/\\"since\\": \\"$2\\"/" '
                  "/run/agentbox/agents/claude.state.json")  # fmt: skip
        provider.exec(short, ["sh", "-c", script, "sh", str(old), since]).check("making the box idle")
        reaped = run_module_direct("agentbox_reap", {"provider": "daytona", "name": short, "idle_timeout": 1}, env=emu.env())
        assert not reaped["failed"], reaped
        assert reaped["paused"] == [] and reaped["boxes"][0]["action"] == "skipped", reaped
        assert "ephemeral" in reaped["boxes"][0]["reason"], reaped
        policy = run_module_direct("agentbox_idle", {"provider": "daytona", "project": made["box"]["project"],
                                                     "max_running": 0, "idle_minutes": 1,
                                                     "state_file": str(emu.root / "paused.json")}, env=emu.env())  # fmt: skip
        assert not policy["failed"], policy
        entry = next(e for e in policy["boxes"] if e["name"] == short)
        assert policy["paused"] == [] and entry["action"] == "keep" and "ephemeral" in entry["reason"], policy
        # Not even read: the box is outside the policy, and an exec would reset the auto-stop that ends it.
        assert entry["agent_state"] is None
        assert emu.sdk().get(short).state == "started"
    finally:
        provider.close()
        emu.destroy(short)


def test_a_box_lives_in_its_region_and_its_checkpoints_restore_only_there(emu: Emu) -> None:
    source, elsewhere, restored = _unique("eu"), _unique("us"), _unique("eur")
    checkpoint = _unique("cp")
    try:
        assert not emu.box(name=source, daytona_target="eu", seed=True)["failed"]
        sdk = emu.sdk()
        assert sdk.get(source).target == "eu"
        done = run_module_direct("agentbox_checkpoint", {"box": source, "name": checkpoint, "provider": "daytona",
                                                         "workspace": str(emu.workspace)}, env=emu.env())  # fmt: skip
        assert not done["failed"], done
        refused = emu.box(name=elsewhere, checkpoint=checkpoint, daytona_target="us")
        assert refused["failed"], refused
        assert "region-scoped" in refused["msg"] and "daytona_target eu" in refused["msg"], refused
        assert not emu.exists(elsewhere)
        done = emu.box(name=restored, checkpoint=checkpoint, daytona_target="eu", seed=True)
        assert not done["failed"], done
        assert sdk.get(restored).target == "eu"
    finally:
        emu.destroy(source, elsewhere, restored)
        run_module_direct("agentbox_checkpoint", {"name": checkpoint, "state": "absent", "provider": "daytona",
                                                  "workspace": str(emu.workspace)}, env=emu.env())  # fmt: skip
