"""The shipped-repository path (remote engines, Daytona) on the fake provider: the box's commits
come back to the host only onto the box's own branch, whatever the box writes about itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.core._box_data import BoxDataError
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError
from ansible_collections.agentbox.box.plugins.module_utils.git import _ship
from tests.conftest import git, make_repo
from tests.unit.support.fake_provider import FakeProvider

IDENTITY = ["-c", "user.name=box", "-c", "user.email=box@example.invalid"]


def refs(repo: Path) -> dict[str, str]:
    lines = git(repo, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
    return dict(line.split(" ", 1) for line in lines)


def shipped_box(provider: FakeProvider, tmp_path: Path, name: str = "shipped") -> tuple[Path, _box.Created]:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    # The host works on another branch, so main is a branch a fetch could move.
    git(repo, "checkout", "-q", "-b", "dev")
    created = _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(repo), boot=False))
    assert created.seed.mode == "shipped"
    return repo, created


def box_commit(provider: FakeProvider, box: str, message: str) -> str:
    script = f'echo "{message}" >> /workspace/a.txt && git -C /workspace commit -qam "{message}"'
    provider.exec(box, ["sh", "-c", script.replace("git ", "git " + " ".join(IDENTITY) + " ", 1)]).check(message, box)
    return provider.exec(box, ["git", "-C", "/workspace", "rev-parse", "HEAD"]).check("rev-parse", box).text.strip()


def test_the_box_commits_come_back_onto_its_own_branch_only(remote_fake: FakeProvider, tmp_path: Path):
    repo, created = shipped_box(remote_fake, tmp_path)
    before = refs(repo)
    box_commit(remote_fake, "shipped", "first")
    tip = box_commit(remote_fake, "shipped", "second")
    # Other branches in the box, one named like a host branch: none of them travels.
    remote_fake.exec("shipped", ["git", "-C", "/workspace", "branch", "-f", "main", "HEAD"]).check("branch")
    remote_fake.exec("shipped", ["git", "-C", "/workspace", "branch", "feature", "HEAD"]).check("branch")
    result = _ship.fetch_box_branch(remote_fake, created.facts)
    assert result["changed"] is True
    assert result["repos"][0]["new_commits"] == 2
    after = refs(repo)
    assert after.pop("refs/heads/agentbox/shipped") == tip
    before.pop("refs/heads/agentbox/shipped", None)
    assert after == before
    assert git(repo, "log", "-2", "--format=%s", tip).split() == ["second", "first"]
    again = _ship.fetch_box_branch(remote_fake, created.facts)
    assert again["changed"] is False


def test_a_seed_record_naming_another_branch_is_refused(remote_fake: FakeProvider, tmp_path: Path):
    repo, created = shipped_box(remote_fake, tmp_path)
    before = refs(repo)
    # The box (root in it) moves its own main ahead and rewrites its record to name main.
    remote_fake.exec("shipped", ["git", "-C", "/workspace", "checkout", "-q", "-b", "main"]).check("checkout")
    box_commit(remote_fake, "shipped", "planted")
    record_path = remote_fake.box_root("shipped") / "etc/agentbox/seed.json"
    record = json.loads(record_path.read_text())
    record["branch"] = "main"
    for entry in record["worktrees"]:
        entry["branch"] = "main"
    remote_fake.exec("shipped", ["sh", "-c", 'printf "%s\\n" "$1" > /etc/agentbox/seed.json', "forge",
                                 json.dumps(record)], user="root").check("forging the record")  # fmt: skip
    with pytest.raises(BoxDataError, match="not the box's own"):
        _ship.fetch_box_branch(remote_fake, created.facts)
    assert refs(repo) == before


def test_a_box_branch_made_a_link_to_another_branch_moves_only_its_own(remote_fake: FakeProvider, tmp_path: Path):
    repo, created = shipped_box(remote_fake, tmp_path)
    before = refs(repo)
    work = ["git", "-C", "/workspace"]
    remote_fake.exec("shipped", [*work, "checkout", "-q", "-b", "main"]).check("checkout")
    tip = box_commit(remote_fake, "shipped", "on main")
    # The box's own branch now names main: what comes back is main's commit, on the box's branch.
    remote_fake.exec("shipped", [*work, "symbolic-ref", "refs/heads/agentbox/shipped", "refs/heads/main"]).check("link")
    _ship.fetch_box_branch(remote_fake, created.facts)
    after = refs(repo)
    assert after.pop("refs/heads/agentbox/shipped") == tip
    before.pop("refs/heads/agentbox/shipped", None)
    assert after == before


def test_the_box_branch_checked_out_on_the_host_is_not_moved(remote_fake: FakeProvider, tmp_path: Path):
    repo, created = shipped_box(remote_fake, tmp_path)
    _ship.fetch_box_branch(remote_fake, created.facts)  # the branch now exists on the host
    git(repo, "checkout", "-q", "agentbox/shipped")
    before = refs(repo)
    box_commit(remote_fake, "shipped", "more")
    with pytest.raises(ProviderError, match="is checked out in"):
        _ship.fetch_box_branch(remote_fake, created.facts)
    assert refs(repo) == before
