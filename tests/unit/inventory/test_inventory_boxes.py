"""The boxes inventory plugin over a fake provider listing: groups, host vars, compose,
keyed_groups, filters, unsafe values, one unreachable engine, and the cache of the raw listing.

The plugin runs for real (ansible-core's plugin loader, config reading, constructed helpers,
the jsonfile cache plugin); only the provider behind `provider_for` is a stand-in.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))
os.environ.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))

from ansible.inventory.data import InventoryData  # noqa: E402
from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.plugins.loader import init_plugin_loader, inventory_loader  # noqa: E402
from ansible.template import Templar, trust_as_template  # noqa: E402
from ansible.utils.display import Display  # noqa: E402

init_plugin_loader([str(REPO / ".collections")])

from ansible_collections.agentbox.box.plugins.module_utils.core._naming import project_id  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import (  # noqa: E402
    BoxFacts,
    EngineUnreachable,
    ExecResult,
)

WORKSPACE_A = "/home/dev/src/app"
WORKSPACE_B = "/home/dev/src/other"
EVIL = "{{ lookup('pipe', 'touch /tmp/agentbox-inventory-pwned') }}"


def box(
    name: str, state: str = "running", workspace: str = WORKSPACE_A, engine: str = "local", **labels: str
) -> BoxFacts:
    provider = "docker" if engine == "local" else "docker_ssh"
    all_labels = {"box": name, "kind": "box", "base_branch": "main", "project": project_id(workspace), **labels}
    return BoxFacts(
        name=name,
        id=f"id{len(name):06d}",
        provider=provider,
        engine=engine,
        state=state,
        container=f"agentbox-{name}",
        image="agentbox/box:latest",
        project=project_id(workspace),
        workspace=workspace,
        branch=f"agentbox/{name}",
        created="2026-11-29T09:00:00Z",
        ports={"80": 32768 + len(name)},
        labels=all_labels,
    )


# What `cat /run/agentbox/agents/*.state.json` and the progress lines print in a box (the box writes it: untrusted).
AGENT_FILES = {
    "fix-login": '{"name": "claude", "session": "claude", "state": "working", "since": "2026-11-30T10:00:00Z"}\n'
    "agentbox-progress claude 120\n",
    "remote-one": '{"name": "codex", "session": "codex", "state": "idle", "since": "2026-11-30T09:00:00Z"}\n'
    '{"name": "sh", "session": "helper", "state": "waiting", "since": "2026-11-30T09:30:00Z"}\n',
    "evil": '{"name": "' + EVIL + '", "session": "x", "state": "pwned", "since": "' + EVIL + '"}\nnot json\n',
}


class FakeProvider:
    """Answers list_boxes from a fixed listing and counts the calls; can be unreachable."""

    def __init__(self, engine: str, boxes: list[BoxFacts] | None, calls: list[str], execs: list[str]):
        self.engine = engine
        self.name = "docker" if engine == "local" else "docker_ssh"
        self._boxes = boxes
        self._calls = calls
        self._execs = execs

    def exec(self, name: str, argv: list[str], **_options: object) -> ExecResult:
        self._execs.append(name)
        return ExecResult(rc=0, stdout=AGENT_FILES.get(name, "").encode(), stderr=b"")

    def list_boxes(self, project: str | None = None) -> list[BoxFacts]:
        self._calls.append(self.engine)
        if self._boxes is None:
            raise EngineUnreachable(f"the Docker engine at {self.engine} does not answer")
        return list(self._boxes)


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    """Load the plugin with a fake provider per engine; returns a function that builds an inventory.
    HOME is the test's own: the relay's record of agent states (~/.agentbox/relay/agents.json) starts empty."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    plugin_module = sys.modules[type(inventory_loader.get("agentbox.box.boxes")).__module__]
    engines: dict[str, list[BoxFacts] | None] = {
        "local": [
            box("fix-login"),
            box("fix-logout", state="paused"),
            box("spike", state="stopped", workspace=WORKSPACE_B, base_branch="develop"),
            box("evil", branch_note=EVIL),
        ],
        "root@127.0.0.1:2201": [box("remote-one", engine="root@127.0.0.1:2201")],
    }
    calls: list[str] = []
    execs: list[str] = []

    def fake_provider_for(provider: str, engine: str | None = None, options=None):
        return FakeProvider(engine or "local", engines.get(engine or "local"), calls, execs)

    monkeypatch.setattr(plugin_module, "provider_for", fake_provider_for)

    def build(config: dict, cache: bool = True, name: str = "dev.agentbox.yml") -> InventoryData:
        path = tmp_path / name
        path.write_text(json.dumps(config))  # JSON is YAML
        plugin = inventory_loader.get("agentbox.box.boxes")
        inventory = InventoryData()
        assert plugin.verify_file(str(path))
        plugin.parse(inventory, DataLoader(), str(path), cache=cache)
        # What ansible-core's InventoryManager does after a Cacheable plugin parsed.
        if getattr(plugin, "_cache", None) is not None:
            plugin.update_cache_if_changed()
        return inventory

    build.engines = engines
    build.calls = calls
    build.execs = execs
    build.tmp_path = tmp_path
    return build


def members(inventory: InventoryData, group: str) -> list[str]:
    return sorted(h.name for h in inventory.groups[group].get_hosts())


def test_verify_file_accepts_only_agentbox_names(tmp_path):
    plugin = inventory_loader.get("agentbox.box.boxes")
    for name, expected in [("dev.agentbox.yml", True), ("agentbox.yaml", True), ("dev.yml", False), ("hosts", False)]:
        path = tmp_path / name
        path.write_text("plugin: agentbox.box.boxes\n")
        assert plugin.verify_file(str(path)) is expected, name


def test_groups_always_present_and_filled(fleet):
    inventory = fleet({"plugin": "agentbox.box.boxes", "engines": ["root@127.0.0.1:2201"]})
    for group in ("docker", "docker_ssh", "daytona", "running", "paused", "stopped"):
        assert group in inventory.groups, group
    assert members(inventory, "docker") == ["evil", "fix-login", "fix-logout", "spike"]
    assert members(inventory, "docker_ssh") == ["remote-one"]
    assert members(inventory, "daytona") == []
    assert members(inventory, "running") == ["evil", "fix-login", "remote-one"]
    assert members(inventory, "paused") == ["fix-logout"]
    assert members(inventory, "stopped") == ["spike"]
    assert members(inventory, "engine_local") == ["evil", "fix-login", "fix-logout", "spike"]
    assert members(inventory, "engine_root_127_0_0_1_2201") == ["remote-one"]
    assert members(inventory, f"project_{project_id(WORKSPACE_B)}") == ["spike"]
    assert len(members(inventory, f"project_{project_id(WORKSPACE_A)}")) == 4


def test_agent_state_groups_and_variable_asking_the_boxes(fleet):
    inventory = fleet({"plugin": "agentbox.box.boxes", "engines": ["root@127.0.0.1:2201"], "agent_state_source": "boxes"})
    assert members(inventory, "agent_working") == ["fix-login"]
    # The session whose state changed last is the box's agent.
    assert members(inventory, "agent_waiting") == ["remote-one"]
    assert members(inventory, "agent_idle") == [] and members(inventory, "agent_stalled") == []
    assert inventory.get_host("fix-login").vars["agentbox_agent_state"] == "working"
    # A box's garbage is dropped, never templated; boxes not running are not asked.
    assert inventory.get_host("evil").vars["agentbox_agent_state"] is None
    assert inventory.get_host("spike").vars["agentbox_agent_state"] is None
    assert sorted(fleet.execs) == ["evil", "fix-login", "remote-one"]
    assert not os.path.exists("/tmp/agentbox-inventory-pwned")


def test_working_without_progress_for_stalled_minutes_is_stalled(fleet):
    # fix-login's agent reports working and made no progress for 120 s.
    config = {"plugin": "agentbox.box.boxes", "agent_state_source": "boxes", "stalled_minutes": 1.5}
    inventory = fleet(config, cache=False)
    assert members(inventory, "agent_stalled") == ["fix-login"] and members(inventory, "agent_working") == []
    assert inventory.get_host("fix-login").vars["agentbox_agent_state"] == "stalled"
    inventory = fleet({**config, "stalled_minutes": 2.5}, cache=False, name="later.agentbox.yml")
    assert inventory.get_host("fix-login").vars["agentbox_agent_state"] == "working"


def write_record(home: Path, boxes: dict, interval: float = 30) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.agent import _agent_record

    os.makedirs(home, exist_ok=True)
    _agent_record.write(boxes, interval, path=str(home / ".agentbox" / "relay" / "agents.json"))


def test_agent_states_come_from_the_relays_record_without_an_exec(fleet):
    import time

    now = time.time()
    working = {"name": "claude", "session": "claude", "state": "working", "since": "2026-11-30T10:00:00Z",
               "quiet_seconds": 30}  # fmt: skip
    write_record(fleet.tmp_path / "home", {
        "id000009": {"name": "fix-login", "provider": "docker", "engine": "local", "read": now - 5, "agent": working},
        # Read 100 s ago with 30 s passes: older than three passes (and 90 s), so unknown.
        "id000004": {"name": "evil", "provider": "docker", "engine": "local", "read": now - 100,
                     "agent": {**working, "state": "idle"}},
        # Read, no agent in it: null (not unknown).
        "id000010": {"name": "remote-one", "provider": "docker_ssh", "engine": "root@127.0.0.1:2201", "read": now - 5,
                     "agent": None},
    })  # fmt: skip
    inventory = fleet({"plugin": "agentbox.box.boxes", "engines": ["root@127.0.0.1:2201"]}, cache=False)
    assert fleet.execs == []
    state = {host: inventory.get_host(host).vars["agentbox_agent_state"] for host in inventory.hosts}
    assert state == {"fix-login": "working", "evil": "unknown", "remote-one": None, "fix-logout": None, "spike": None}
    assert members(inventory, "agent_working") == ["fix-login"]
    # The quiet time the relay read grows with the record's age: 30 s + 5 s, stalled at half a minute.
    inventory = fleet({"plugin": "agentbox.box.boxes", "stalled_minutes": 0.5}, cache=False, name="s.agentbox.yml")
    assert inventory.get_host("fix-login").vars["agentbox_agent_state"] == "stalled"
    # A record entry of another box under the same id (another name) is not this box's.
    fleet.engines["local"] = [box("fix-login"), box("fix-lagin")]  # both id000009
    inventory = fleet({"plugin": "agentbox.box.boxes"}, cache=False, name="t.agentbox.yml")
    assert inventory.get_host("fix-lagin").vars["agentbox_agent_state"] == "unknown"
    assert fleet.execs == []


def test_a_record_entry_not_of_the_expected_shape_is_unknown(fleet):
    """The record is the host's own file, but what it holds came from the boxes: each agent is checked again."""
    import time

    now = time.time()
    good = {"name": "claude", "session": "claude", "state": "working", "since": "2026-11-30T10:00:00Z"}
    write_record(fleet.tmp_path / "home", {
        "id000009": {"name": "fix-login", "read": now, "agent": {**good, "state": "pwned"}},
        "id000004": {"name": "evil", "read": now, "agent": {**good, "session": "x; rm -rf /", "quiet_seconds": 9999}},
        # A quiet time that is not a whole number of seconds in range is no figure: never stalled.
        "id000010": {"name": "remote-one", "read": now, "agent": {**good, "quiet_seconds": "99999"}},
        "id000005": {"name": "spike", "read": now, "agent": {**good, "quiet_seconds": 10**12, "name": EVIL}},
    })  # fmt: skip
    fleet.engines["local"] = [box("fix-login"), box("evil"), box("spike")]  # all running
    inventory = fleet({"plugin": "agentbox.box.boxes", "engines": ["root@127.0.0.1:2201"], "stalled_minutes": 0,
                       "verbose_output": True}, cache=False)  # fmt: skip
    state = {host: inventory.get_host(host).vars["agentbox_agent_state"] for host in inventory.hosts}
    assert state == {"fix-login": "unknown", "evil": "unknown", "remote-one": "working", "spike": "working"}
    # The agent's name, not of the expected form, is its session's.
    assert inventory.get_host("spike").vars["agentbox_agent"]["name"] == "claude"
    assert fleet.execs == []


def test_no_relay_record_means_unknown_not_an_exec(fleet):
    inventory = fleet({"plugin": "agentbox.box.boxes"}, cache=False)
    assert inventory.get_host("fix-login").vars["agentbox_agent_state"] == "unknown"
    assert inventory.get_host("fix-logout").vars["agentbox_agent_state"] is None  # not running
    assert fleet.execs == []


def test_agent_state_off_asks_no_box(fleet):
    inventory = fleet({"plugin": "agentbox.box.boxes", "agent_state": False}, cache=False)
    assert inventory.get_host("fix-login").vars["agentbox_agent_state"] is None
    assert fleet.execs == []


def test_minimal_host_vars_and_connection_hand_off(fleet):
    inventory = fleet({"plugin": "agentbox.box.boxes", "engines": ["root@127.0.0.1:2201"]})
    local = inventory.get_host("fix-login").vars
    assert local["agentbox_box"] == "fix-login"
    assert local["agentbox_state"] == "running"
    assert local["agentbox_branch"] == "agentbox/fix-login"
    assert local["agentbox_workspace"] == WORKSPACE_A
    assert local["agentbox_provider"] == "docker"
    assert local["agentbox_engine"] == "local"
    assert local["agentbox_ports"] == {"80": 32768 + len("fix-login")}
    assert local["ansible_connection"] == "agentbox.box.box"
    # Minimal by default: no labels, ids or images as host vars.
    assert "agentbox_labels" not in local and "agentbox_id" not in local
    remote = inventory.get_host("remote-one").vars
    assert (remote["agentbox_provider"], remote["agentbox_engine"]) == ("docker_ssh", "root@127.0.0.1:2201")


def test_verbose_output_sets_every_fact(fleet):
    inventory = fleet({"plugin": "agentbox.box.boxes", "verbose_output": True})
    host_vars = inventory.get_host("spike").vars
    assert host_vars["agentbox_project"] == project_id(WORKSPACE_B)
    assert host_vars["agentbox_labels"]["base_branch"] == "develop"
    assert host_vars["agentbox_base_branch"] == "develop"
    assert host_vars["agentbox_container"] == "agentbox-spike"


def test_compose_groups_keyed_groups_see_full_facts(fleet):
    inventory = fleet(
        {
            "plugin": "agentbox.box.boxes",
            "compose": {"box_upper": "agentbox_box | upper", "ansible_connection": "'ansible.builtin.local'"},
            "groups": {"logins": "agentbox_box is match('fix-log')"},
            "keyed_groups": [{"key": "agentbox_labels.base_branch", "prefix": "base"}],
        }
    )
    assert inventory.get_host("fix-login").vars["box_upper"] == "FIX-LOGIN"
    # The user's compose wins over the plugin's ansible_connection.
    assert inventory.get_host("fix-login").vars["ansible_connection"] == "ansible.builtin.local"
    assert members(inventory, "logins") == ["fix-login", "fix-logout"]
    assert members(inventory, "base_develop") == ["spike"]
    assert members(inventory, "base_main") == ["evil", "fix-login", "fix-logout"]


def test_connection_plugin_is_loaded_before_workers_fork(fleet, monkeypatch):
    """With configure_connection the inventory loads the box connection plugin in the controller."""
    plugin_module = sys.modules[type(inventory_loader.get("agentbox.box.boxes")).__module__]
    loader = plugin_module.connection_loader
    real_get = loader.get
    asked: list[tuple[str, dict, object]] = []

    def get_and_record(name: str, **kwargs):  # the real loader does the work
        loaded = real_get(name, **kwargs)
        asked.append((name, kwargs, loaded))
        return loaded

    monkeypatch.setattr(loader, "get", get_and_record)
    fleet({"plugin": "agentbox.box.boxes"})
    assert [(name, kwargs) for name, kwargs, _loaded in asked] == [("agentbox.box.box", {"class_only": True})]
    assert asked[0][2].transport == "agentbox.box.box"  # the plugin's class, loaded in this process
    asked.clear()
    fleet({"plugin": "agentbox.box.boxes", "configure_connection": False}, name="off.agentbox.yml")
    assert asked == []


def test_configure_connection_false_leaves_ansible_connection_alone(fleet):
    inventory = fleet({"plugin": "agentbox.box.boxes", "configure_connection": False})
    assert "ansible_connection" not in inventory.get_host("fix-login").vars


def test_strict_compose_error_fails(fleet):
    from ansible.errors import AnsibleError

    with pytest.raises(AnsibleError, match="no_such_var"):
        fleet({"plugin": "agentbox.box.boxes", "strict": True, "compose": {"x": "no_such_var.attr"}})
    # Not strict: the entry is skipped, the inventory loads.
    inventory = fleet({"plugin": "agentbox.box.boxes", "compose": {"x": "no_such_var.attr"}})
    assert "x" not in inventory.get_host("fix-login").vars


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"states": ["paused", "stopped"]}, ["fix-logout", "spike"]),
        ({"projects": [project_id(WORKSPACE_B)]}, ["spike"]),
        ({"projects": [WORKSPACE_B + "/"]}, ["spike"]),
        ({"include": ["fix-*"]}, ["fix-login", "fix-logout"]),
        ({"include": ["fix-*"], "exclude": ["*-logout"]}, ["fix-login"]),
        ({"exclude": ["*"]}, []),
    ],
)
def test_filters(fleet, filters, expected):
    inventory = fleet({"plugin": "agentbox.box.boxes", **filters})
    assert sorted(inventory.hosts) == expected


def test_engine_values_are_never_templated(fleet, tmp_path):
    marker = Path("/tmp/agentbox-inventory-pwned")
    marker.unlink(missing_ok=True)
    inventory = fleet({"plugin": "agentbox.box.boxes", "verbose_output": True})
    host_vars = inventory.get_host("evil").vars
    templar = Templar(loader=DataLoader(), variables=host_vars)
    rendered = templar.template(trust_as_template("{{ agentbox_labels.branch_note }}"))
    assert rendered == EVIL
    assert not marker.exists()
    from ansible._internal._datatag._tags import TrustedAsTemplate

    assert not TrustedAsTemplate.is_tagged_on(host_vars["agentbox_labels"]["branch_note"])
    assert not TrustedAsTemplate.is_tagged_on(host_vars["agentbox_box"])


def test_unreachable_engine_warns_and_the_rest_loads(fleet, capsys):
    # Ansible prints a warning once per process: another test in this worker may have printed this one already.
    Display()._warns.clear()  # pylint: disable=protected-access
    fleet.engines["root@127.0.0.1:2201"] = None
    inventory = fleet({"plugin": "agentbox.box.boxes", "engines": ["root@127.0.0.1:2201"]})
    assert "fix-login" in inventory.hosts and "remote-one" not in inventory.hosts
    assert "engine_root_127_0_0_1_2201" in inventory.groups
    captured = capsys.readouterr()
    assert "root@127.0.0.1:2201" in captured.err and "could not be listed" in captured.err


def test_same_name_on_two_engines_gets_a_second_host(fleet):
    fleet.engines["root@127.0.0.1:2201"] = [box("fix-login", engine="root@127.0.0.1:2201")]
    inventory = fleet({"plugin": "agentbox.box.boxes", "engines": ["root@127.0.0.1:2201"]})
    assert inventory.get_host("fix-login").vars["agentbox_engine"] == "local"
    other = inventory.get_host("fix-login@root@127.0.0.1:2201").vars
    assert (other["agentbox_box"], other["agentbox_engine"]) == ("fix-login", "root@127.0.0.1:2201")


def cache_config(tmp_path: Path, **extra) -> dict:
    return {
        "plugin": "agentbox.box.boxes",
        "cache": True,
        "cache_plugin": "ansible.builtin.jsonfile",
        "cache_connection": str(tmp_path / "cache"),
        "cache_timeout": 600,
        **extra,
    }


def test_cache_keeps_the_raw_listing_not_the_built_inventory(fleet, tmp_path):
    first = fleet(cache_config(tmp_path))
    assert fleet.calls == ["local"]
    cached_files = list((tmp_path / "cache").iterdir())
    assert len(cached_files) == 1
    stored = json.loads(cached_files[0].read_text())
    if "__payload__" in stored:  # ansible-core 2.19's jsonfile envelope
        stored = json.loads(stored["__payload__"])
    assert [b["name"] for b in stored["sources"][0]["boxes"]] == ["fix-login", "fix-logout", "spike", "evil"]
    # Warm: no provider call; compose and groups (changed since) are evaluated again.
    fleet.engines["local"] = [box("brand-new")]
    second = fleet(
        cache_config(tmp_path, compose={"tag": "'warm-' + agentbox_box"}, groups={"held": "agentbox_state == 'paused'"})
    )
    assert fleet.calls == ["local"]
    assert sorted(second.hosts) == sorted(first.hosts)
    assert second.get_host("spike").vars["tag"] == "warm-spike"
    assert members(second, "held") == ["fix-logout"]
    # --flush-cache (cache=False) asks the engine again and stores the fresh listing.
    third = fleet(cache_config(tmp_path), cache=False)
    assert fleet.calls == ["local", "local"]
    assert sorted(third.hosts) == ["brand-new"]
    fourth = fleet(cache_config(tmp_path))
    assert sorted(fourth.hosts) == ["brand-new"] and fleet.calls == ["local", "local"]


def test_cache_never_stores_a_listing_with_a_failed_engine(fleet, tmp_path):
    fleet.engines["root@127.0.0.1:2201"] = None
    fleet(cache_config(tmp_path, engines=["root@127.0.0.1:2201"]))
    fleet(cache_config(tmp_path, engines=["root@127.0.0.1:2201"]))
    assert fleet.calls == ["local", "root@127.0.0.1:2201"] * 2


def test_bad_engines_entry_is_a_clear_error(fleet):
    from ansible.errors import AnsibleParserError

    with pytest.raises(AnsibleParserError, match="SSH destination"):
        fleet({"plugin": "agentbox.box.boxes", "engines": [""]})
