"""The Molecule scenario whose instances are boxes (docs/molecule.md), without an engine: the collection's own
inbox_supervisor gate runs the documented scenario's create.yml and destroy.yml byte for byte, and molecule.yml
as molecule_init.yml writes it is a scenario molecule accepts, for the local engine and a docker_ssh engine
(tests/integration/playbooks/test_molecule_scenario.py runs it on a sample role in a real box)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.unit.support.templating import render

TEMPLATES = REPO / "playbooks/templates/molecule"
GATE = REPO / "roles/inbox_supervisor/molecule/default"


def validate_v3(scenario: dict) -> Any:
    """The schema molecule checks a scenario with. Imported here, with the environment put back after: importing
    molecule sets ANSIBLE_FORCE_COLOR=1 in this process, and every Ansible a later test of the worker starts
    would print colour codes around its JSON."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANSIBLE_FORCE_COLOR", "0")  # recorded as not set: taken away again at the end
        from molecule.model.schema_v3 import validate  # pylint: disable=import-outside-toplevel

        return validate(scenario)


@pytest.mark.parametrize("name", ["create.yml", "destroy.yml"])
def test_the_collections_own_scenario_runs_the_documented_create_and_destroy(name: str) -> None:
    assert (GATE / name).read_bytes() == (TEMPLATES / name).read_bytes()
    [play] = yaml.safe_load((TEMPLATES / name).read_text())
    assert play["ansible.builtin.import_playbook"] == f"agentbox.box.molecule_{name.removesuffix('.yml')}"
    assert (REPO / f"playbooks/molecule_{name}").is_file()


def written(provider: str, engine: str) -> dict:
    text = render((TEMPLATES / "molecule.yml.j2").read_text(), {
        "agentbox_molecule_platform": "molecule-myrole", "agentbox_molecule_provider": provider,
        "agentbox_molecule_engine": engine})
    return yaml.safe_load(text)


@pytest.mark.parametrize(("provider", "engine"), [("docker", ""), ("docker_ssh", "root@127.0.0.1:2201")])
def test_the_written_scenario_reaches_its_boxes_through_the_box_connection(provider: str, engine: str) -> None:
    scenario = written(provider, engine)
    assert validate_v3(scenario) == []  # no schema errors
    [platform] = scenario["platforms"]
    assert platform == {"name": "molecule-myrole", "groups": ["boxes"]}
    box_vars = scenario["provisioner"]["inventory"]["group_vars"]["boxes"]
    assert box_vars["ansible_connection"] == "agentbox.box.box"
    assert box_vars["agentbox_provider"] == provider
    assert box_vars.get("agentbox_engine") == (engine or None)
    # The gate's own molecule.yml sets the same connection for its platform's group.
    gate = yaml.safe_load((GATE / "molecule.yml").read_text())
    assert validate_v3(gate) == []
    assert gate["provisioner"]["inventory"]["group_vars"]["boxes"]["ansible_connection"] == "agentbox.box.box"
    assert [p["groups"] for p in gate["platforms"]] == [["boxes"]]


def test_converge_runs_the_role_by_its_directory_name() -> None:
    text = render((TEMPLATES / "converge.yml.j2").read_text(), {"agentbox_molecule_role": "myrole"})
    [play] = yaml.safe_load(text)
    assert play["hosts"] == "all"
    assert play["tasks"][0]["ansible.builtin.include_role"] == {"name": "myrole"}


def test_create_and_destroy_read_the_platforms_settings_the_connection_reads() -> None:
    """Where a box is made is where the connection looks for it: both playbooks take the provider, engine, box
    name and SSH settings from the platform's inventory host (hostvars), the variables the connection reads."""
    for name in ("molecule_create.yml", "molecule_destroy.yml"):
        [play] = yaml.safe_load((REPO / "playbooks" / name).read_text())
        assert play["vars"]["ansible_connection"] == "local"  # never the platforms' agentbox.box.box
        [task] = [t for t in play["tasks"] if "agentbox.box.agentbox_box" in t]
        args = task["agentbox.box.agentbox_box"]
        for option, variable in (("name", "agentbox_box"), ("provider", "agentbox_provider"),
                                 ("engine", "agentbox_engine"), ("ssh_private_key_file", "agentbox_ssh_private_key_file"),
                                 ("ssh_strict_host_key_checking", "agentbox_ssh_strict_host_key_checking")):
            assert f"hostvars[item.name].{variable}" in args[option], (name, option)
    connection = (REPO / "plugins/connection/box.py").read_text()
    for variable in ("agentbox_box", "agentbox_provider", "agentbox_engine", "agentbox_ssh_private_key_file",
                     "agentbox_ssh_strict_host_key_checking"):
        assert f"- name: {variable}\n" in connection
