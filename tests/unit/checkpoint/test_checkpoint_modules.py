"""agentbox_checkpoint and agentbox_checkpoint_info run in-process on the fake provider standing in for the
local engine (its checkpoints are snapshots): bad input fails with what to do and captures nothing; check
mode and diff report the capture, the replace and the removal without making them; a removal done is not
done again; the info module reports what the project has."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from tests.conftest import make_repo
from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import run_module_inprocess


@pytest.fixture
def lab(fake_docker: FakeProvider, home: Path, tmp_path: Path) -> dict:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    other = make_repo(tmp_path / "other", {"b.txt": "b\n"})
    _box.create_box(fake_docker, _box.CreateRequest(name="life", workspace=str(repo), boot=False))
    return {"fake": fake_docker, "repo": str(repo), "other": str(other), "home": home}


def checkpoint(args: dict, check_mode: bool = False) -> dict:
    return run_module_inprocess("agentbox_checkpoint", args, check_mode=check_mode, diff=True)


def captured(lab: dict) -> list[str]:
    """The checkpoint images the engine holds (the fake's snapshots)."""
    return sorted(image for image in lab["fake"].images if image.startswith(_naming.CHECKPOINT_IMAGE_PREFIX))


BAD = [
    ({"box": "no-such-box-here"}, "no box called 'no-such-box-here'"),
    ({"box": "Bad Box"}, "invalid box name"),
    ({"box": "life", "name": "Bad Name!"}, "invalid checkpoint name"),
    ({"state": "absent"}, "'name' is required with state=absent: the checkpoint to remove"),
    ({}, "'box' is required with state=present: the box to checkpoint"),
    ({"box": "life", "name": "warm", "keep": True}, "keep: true takes the checkpoint's name (and workspace), not a box"),
    ({"keep": True}, "keep: true takes the checkpoint's name"),
    ({"name": "never", "keep": True}, "no checkpoint 'never' in this project"),
    ({"prune": True, "all_projects": True, "workspace": "."}, "all_projects and workspace do not go together"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[message[:30] for _a, message in BAD])
def test_bad_checkpoint_input_fails_with_what_to_do_and_captures_nothing(lab: dict, args: dict, message: str) -> None:
    args = {"workspace": lab["repo"], **args} if "box" not in args and not args.get("prune") else args
    result = checkpoint(args)
    assert result["failed"] is True and message in result["msg"], result
    assert captured(lab) == [] and lab["fake"].find("life").state == "running"


def test_a_box_of_another_workspace_is_refused(lab: dict) -> None:
    result = checkpoint({"box": "life", "workspace": lab["other"]})
    assert result["failed"] is True and "box 'life' belongs to workspace" in result["msg"], result
    assert captured(lab) == []


def test_check_mode_plans_the_capture_the_replace_and_the_removal_and_makes_none(lab: dict) -> None:
    planned = checkpoint({"box": "life"}, check_mode=True)
    assert planned["failed"] is False and planned["changed"] is True, planned
    assert planned["checkpoint"]["name"] == "life-1" and planned["checkpoint"]["source_box"] == "life"
    assert planned["diff"]["before"] == {} and planned["diff"]["after"]["name"] == "life-1"
    assert captured(lab) == []  # check mode captured nothing

    first = checkpoint({"box": "life", "set_default": True})
    assert first["failed"] is False and first["changed"] is True, first
    assert first["checkpoint"]["name"] == "life-1" and first["checkpoint"]["default"] is True
    for key in ("box", "checkpoint"):  # RETURN's keys
        assert key in first, key
    assert captured(lab) == [first["checkpoint"]["image"]]

    collision = checkpoint({"box": "life", "name": "life-1"})
    assert collision["failed"] is True and "already exists" in collision["msg"] and "replace" in collision["msg"]
    would_replace = checkpoint({"box": "life", "name": "life-1", "replace": True}, check_mode=True)
    assert would_replace["changed"] is True and would_replace["diff"]["before"]["name"] == "life-1", would_replace
    assert would_replace["diff"]["before"]["default"] is True

    info = run_module_inprocess("agentbox_checkpoint_info", {"workspace": lab["repo"]})
    assert info["failed"] is False and info.get("changed") is False, info
    assert [c["name"] for c in info["checkpoints"]] == ["life-1"] and info["default"] == "life-1"
    for key in ("box", "project", "default", "checkpoints"):  # RETURN's keys
        assert key in info, key
    by_box = run_module_inprocess("agentbox_checkpoint_info", {"box": "life"})
    assert [c["name"] for c in by_box["checkpoints"]] == ["life-1"] and by_box["box"]["name"] == "life"

    would_remove = checkpoint({"name": "life-1", "state": "absent", "workspace": lab["repo"]}, check_mode=True)
    assert would_remove["changed"] is True and "removed" not in would_remove, would_remove
    assert would_remove["diff"]["before"]["name"] == "life-1" and would_remove["diff"]["after"] == {}
    assert captured(lab) == [first["checkpoint"]["image"]]  # check mode removed nothing

    removed = checkpoint({"name": "life-1", "state": "absent", "workspace": lab["repo"]})
    assert removed["changed"] is True and removed["removed"]["default_cleared"] is True, removed
    assert captured(lab) == []
    again = checkpoint({"name": "life-1", "state": "absent", "workspace": lab["repo"]})
    assert again["changed"] is False and again["checkpoint"] == {}, again
