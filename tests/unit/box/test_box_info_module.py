"""agentbox_box_info run in-process on the fake provider standing in for the local engine: it reports the
boxes of a project or one box by name (empty when there is none), changes nothing, and says the same in
check mode."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from tests.conftest import make_repo
from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import run_module_inprocess


def test_box_info_lists_a_project_and_finds_one_box(fake_docker: FakeProvider, home: Path, tmp_path: Path) -> None:
    repo, other = make_repo(tmp_path / "ws"), make_repo(tmp_path / "other")
    for name, where in (("b1", repo), ("b2", repo), ("c1", other)):
        _box.create_box(fake_docker, _box.CreateRequest(name=name, workspace=str(where), boot=False))
    for check_mode in (False, True):
        listed = run_module_inprocess("agentbox_box_info", {"workspace": str(repo)}, check_mode=check_mode)
        assert listed["failed"] is False and listed.get("changed") is False, listed
        assert [box["name"] for box in listed["boxes"]] == ["b1", "b2"] and listed["box"] == {}
        one = run_module_inprocess("agentbox_box_info", {"name": "c1"}, check_mode=check_mode)
        assert one["box"]["name"] == "c1" and one["box"]["state"] == "running" and one["box"]["workspace"] == str(other)
        assert [box["name"] for box in one["boxes"]] == ["c1"]
    every = run_module_inprocess("agentbox_box_info", {})
    assert [box["name"] for box in every["boxes"]] == ["b1", "b2", "c1"]
    missing = run_module_inprocess("agentbox_box_info", {"name": "nobox"})
    assert missing["failed"] is False and missing["box"] == {} and missing["boxes"] == [], missing
    invalid = run_module_inprocess("agentbox_box_info", {"name": "Bad Box"})
    assert invalid["failed"] is True and "invalid box name" in invalid["msg"], invalid
    states = {facts.name: facts.state for facts in fake_docker.list_boxes()}
    assert states == {"b1": "running", "b2": "running", "c1": "running"}
