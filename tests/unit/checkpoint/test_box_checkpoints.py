"""Checkpoints a box takes itself (agentbox-ctl checkpoint, through the relay) on the fake provider: reserved
names refused, a per-box quota of count and bytes (the policy file), and removal with the box unless the
user kept them (or made one the project's default)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint, _checkpoint_records
from ansible_collections.agentbox.box.plugins.module_utils.checkpoint._checkpoint_records import CheckpointError
from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_ops
from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_protocol import RequestError, parse_request
from tests.conftest import make_repo
from tests.unit.support.fake_provider import FakeProvider, FakeSnapshots


class SizedSnapshots(FakeSnapshots):
    def size_bytes(self, snapshot: Any) -> int:  # the fake's Snapshot
        return sum(os.lstat(os.path.join(top, name)).st_size for top, _dirs, names in os.walk(snapshot.root)
                   for name in names)


class SizedFake(FakeProvider):
    """The fake provider, its snapshots sized as the files they hold (the fake's own say 0)."""

    def checkpoint_store(self) -> SizedSnapshots:
        return SizedSnapshots(self)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the fake provider mounts and chroots")
    home = tmp_path / ("home-" + "h" * 80)  # too long a path for a relay socket: no relay is started
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    repo = make_repo(tmp_path / "ws", {"README.md": "hello\n"})
    provider = SizedFake(tmp_path / "engine", shares_host_filesystem=False)
    try:
        yield {"home": home, "repo": repo, "provider": provider}
    finally:
        for name in list(provider.boxes):
            provider.destroy(name)


def make(world: dict, name: str):
    return _box.create_box(world["provider"], _box.CreateRequest(name=name, workspace=str(world["repo"]),
                                                                 boot=False)).facts


def ask(world: dict, box: str, name: str) -> _relay_ops.Outcome:
    """`agentbox-ctl checkpoint --name NAME` from the box, as the relay carries it out."""
    provider = world["provider"]
    request = parse_request(json.dumps({"v": 1, "op": "checkpoint", "args": {"name": name}}).encode())
    return _relay_ops.carry_out(provider, provider.find(box), request)


def policy(world: dict, **values: int) -> None:
    path = world["home"] / ".agentbox" / "relay" / "policy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values))


def names(world: dict, project: str) -> list[str]:
    return [found.name for found in _checkpoint.list_checkpoints(world["provider"], project)]


@pytest.mark.parametrize("name", ["default", "none"])
def test_a_box_cannot_take_a_reserved_checkpoint_name(world: dict, name: str) -> None:
    with pytest.raises(RequestError, match=f"checkpoint name '{name}' is reserved"):
        parse_request(json.dumps({"v": 1, "op": "checkpoint", "args": {"name": name}}).encode())
    facts = make(world, "rsv")
    with pytest.raises(CheckpointError, match="is reserved"):  # nor can anyone else
        _checkpoint.plan_capture(world["provider"], facts, name)
    assert names(world, facts.project) == []


def test_a_box_keeps_at_most_its_quota_of_checkpoints_by_count_and_by_bytes(world: dict) -> None:
    facts = make(world, "qb")
    policy(world, box_checkpoints=2)
    assert ask(world, "qb", "one").rc == 0 and ask(world, "qb", "two").rc == 0
    third = ask(world, "qb", "three")
    assert third.rc == 1 and "this box has 2 checkpoint(s) of its own, the most it may keep" in third.stderr
    assert "the box's own now: one, two" in third.stderr
    # A checkpoint the user took of the box is the user's: not in the box's count.
    _checkpoint.capture(world["provider"], _checkpoint.plan_capture(world["provider"], facts, "users"))
    assert ask(world, "qb", "three").rc == 1
    # One the user keeps leaves the box's count.
    _checkpoint.keep(world["provider"], facts.project, "one")
    assert ask(world, "qb", "three").rc == 0
    assert sorted(found.name for found in _checkpoint.box_checkpoints(world["provider"], facts)) == ["three", "two"]

    # Bytes: room for what the box has, not for one more of the same size; that one is taken, then removed.
    own = _checkpoint.box_checkpoints(world["provider"], facts)
    used = sum(found.size for found in own)
    assert used > 0
    policy(world, box_checkpoints=10, box_checkpoint_bytes=used + own[0].size // 2)
    over = ask(world, "qb", "four")
    assert over.rc == 1 and "was taken, and removed again" in over.stderr and "bytes, over the" in over.stderr
    assert "four" not in names(world, facts.project)
    policy(world, box_checkpoint_bytes=used)
    full = ask(world, "qb", "five")  # at the quota already: refused before anything is taken
    assert full.rc == 1 and "was taken" not in full.stderr and "over the" in full.stderr


def test_checkpoints_a_box_took_go_with_it_unless_kept_or_the_project_default(world: dict) -> None:
    provider = world["provider"]
    facts = make(world, "gone")
    for name in ("mine-kept", "mine-default", "mine-dropped"):
        assert ask(world, "gone", name).rc == 0, name
    _checkpoint.capture(provider, _checkpoint.plan_capture(provider, facts, "users"))
    _checkpoint.keep(provider, facts.project, "mine-kept")
    _checkpoint_records.set_project_default(facts.project, "mine-default", provider=provider)
    other = make(world, "other")
    assert ask(world, "other", "others").rc == 0
    # What agentbox_checkpoint_info (and checkpoints.yml) list as kept: the user's, and the box's once kept
    # (mine-default is not kept: it stays at the destroy below as the project's default).
    kept = _checkpoint.kept_checkpoints(provider, facts.project)
    staying = {found.name: _checkpoint.is_kept(found, kept)
               for found in _checkpoint.list_checkpoints(provider, facts.project)}  # fmt: skip
    assert staying == {"mine-kept": True, "mine-default": False, "mine-dropped": False, "users": True, "others": False}

    done = _box.destroy_box(provider, provider.find("gone"))
    assert done["checkpoints_removed"] == ["mine-dropped"]
    assert done["checkpoints_kept"] == ["mine-default"]
    assert names(world, facts.project) == ["mine-default", "mine-kept", "others", "users"]

    kept_all = _box.destroy_box(provider, provider.find("other"), keep_checkpoints=True)
    assert "checkpoints_removed" not in kept_all and "others" in names(world, other.project)
