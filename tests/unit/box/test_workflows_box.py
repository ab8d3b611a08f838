"""_box.create_box and destroy_box on the fake provider: real git, real files, a real box root.

A create that fails at any step after its first side effect leaves nothing: no box, no branch,
no worktree registration in the host repo, no journal. A second create of a taken name is
refused without harming the first box. Destroy removes everything and brings the box's commits
home first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.core import _journal
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError
from ansible_collections.agentbox.box.plugins.module_utils.egress import _egress_forwarder
from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import EgressPolicy
from tests.conftest import git, make_repo
from tests.unit.support.fake_provider import FakeProvider


def workspace(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "ws", {"README.md": "hello\n", "src/app.py": "print('app')\n"})
    (repo / "README.md").write_text("hello, edited\n")
    (repo / "notes.txt").write_text("untracked\n")
    return repo


def host_state(repo: Path) -> dict[str, str]:
    """Everything of the host repo a create may touch: refs, worktree registrations, status, index."""
    return {
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
        "admin": " ".join(sorted(os.listdir(repo / ".git" / "worktrees"))) if (repo / ".git" / "worktrees").exists() else "",
        "status": git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
        "index": (repo / ".git" / "index").read_bytes().hex(),
    }


def journals(home: Path) -> list[str]:
    root = home / ".agentbox" / "creating"
    return [str(path.relative_to(root)) for path in root.rglob("*.json")] if root.exists() else []


def create(fake: FakeProvider, repo: Path, name: str = "b1") -> _box.Created:
    return _box.create_box(fake, _box.CreateRequest(name=name, workspace=str(repo)))


def test_create_seeds_the_box_and_leaves_the_host_repo_as_it_was(fake: FakeProvider, tmp_path: Path, home: Path):
    repo = workspace(tmp_path)
    before = host_state(repo)
    created = create(fake, repo)
    root = fake.box_root("b1")
    assert created.facts.branch == "agentbox/b1"
    assert (root / "workspace").is_symlink()
    tree = root / os.readlink(root / "workspace").lstrip("/")
    assert (tree / "README.md").read_text() == "hello, edited\n"
    assert (tree / "notes.txt").read_text() == "untracked\n"
    record = json.loads((root / "etc/agentbox/seed.json").read_text())
    assert record["mode"] == "worktree" and record["branch"] == "agentbox/b1"
    after = host_state(repo)
    # Only the reserved branch is new; the box's worktree is registered in its own git layer.
    assert after["refs"].replace(f"refs/heads/agentbox/b1 {created.facts.labels['base_commit']}\n", "") == before["refs"]
    assert {k: v for k, v in after.items() if k != "refs"} == {k: v for k, v in before.items() if k != "refs"}
    assert journals(home) == []


# Each side effect of a create in order: the container, the worktree script's exec (which prepares
# the git layer and starts the early boot first), the untracked files' stream that ends with the
# seed record, the boot.
STAGES = [("create", 1), ("exec", 1), ("put_archive", 1), ("exec", 2)]


@pytest.mark.parametrize(("method", "call"), STAGES, ids=[f"{m}-{c}" for m, c in STAGES])
def test_a_failure_at_each_stage_leaves_nothing(fake: FakeProvider, tmp_path: Path, home: Path, method: str, call: int):
    repo = workspace(tmp_path)
    before = host_state(repo)
    fake.fail_on(method, call)
    with pytest.raises(ProviderError, match=f"injected failure of {method}"):
        create(fake, repo)
    assert method not in fake._failures, "the failure was never injected: the stage list is stale"
    assert fake.boxes == {}
    assert os.listdir(fake.base / "boxes") == []
    assert host_state(repo) == before
    assert journals(home) == []


def test_a_second_create_of_the_name_is_refused_and_the_first_box_kept(fake: FakeProvider, tmp_path: Path, home: Path):
    repo = workspace(tmp_path)
    first = create(fake, repo)
    state = host_state(repo)
    record = (fake.box_root("b1") / "etc/agentbox/seed.json").read_bytes()
    with pytest.raises(ProviderError, match="already exists"):
        create(fake, repo)
    assert fake.find("b1").id == first.facts.id
    assert (fake.box_root("b1") / "etc/agentbox/seed.json").read_bytes() == record
    # The second run reserved agentbox/b1-2 and gave it back; the first box's branch is untouched.
    assert host_state(repo) == state
    assert journals(home) == []


def test_an_egress_policy_on_a_provider_that_cannot_hold_it_is_refused_before_anything(
    fake: FakeProvider, tmp_path: Path, home: Path
):
    """Only boxes on this machine's box engine go through the gateway (holds_egress); elsewhere a policy would
    be a promise the box does not keep: refused, nothing made."""
    repo = workspace(tmp_path)
    state = host_state(repo)
    with pytest.raises(_box.BoxError, match=r"egress: a policy holds boxes on this machine's box engine \(its gateway\), "
                       r"Daytona and boxd \(their own allow lists\) only, not fake"):
        _box.create_box(fake, _box.CreateRequest(name="eg", workspace=str(repo), egress=EgressPolicy("none")))
    assert fake.boxes == {} and host_state(repo) == state and journals(home) == []


def test_a_policy_the_provider_holds_with_its_own_allow_list_gets_none_of_the_gateways_parts(
    fake: FakeProvider, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
):
    """A provider that maps the policy onto its own network setting (Daytona, boxd: Provider.egress_network) is
    asked once, and its box gets none of the gateway's parts: no egress label (a start would run the
    forwarder), no proxy variables, no gateway network, no forwarder settings in the box."""
    asked: list[EgressPolicy] = []
    monkeypatch.setattr(fake, "egress_network", lambda policy: asked.append(policy) or True)
    policy = EgressPolicy("none")
    created = _box.create_box(fake, _box.CreateRequest(name="eg", workspace=str(workspace(tmp_path)), egress=policy))
    assert asked == [policy]
    box = fake.boxes["eg"]
    assert "egress" not in created.facts.labels and "HTTPS_PROXY" not in box.spec.env and not box.spec.egress
    assert not (fake.box_root("eg") / _egress_forwarder.PROFILE_FILE.lstrip("/")).exists()


def test_destroy_brings_the_box_commits_home_then_removes_everything(fake: FakeProvider, tmp_path: Path, home: Path):
    repo = workspace(tmp_path)
    before = host_state(repo)
    created = create(fake, repo)
    work = ["git", "-c", "user.name=box", "-c", "user.email=box@example.invalid", "-C", "/workspace"]
    fake.exec("b1", [*work, "commit", "-qam", "work in the box"]).check("commit")
    tip = fake.exec("b1", ["git", "-C", "/workspace", "rev-parse", "HEAD"]).check("rev-parse").text.strip()
    report = _box.destroy_box(fake, fake.find("b1"))
    assert fake.boxes == {} and os.listdir(fake.base / "boxes") == []
    assert "warnings" not in report
    assert git(repo, "rev-parse", "agentbox/b1").strip() == tip
    assert git(repo, "show", f"{tip}:README.md") == "hello, edited\n"
    assert git(repo, "log", "-1", "--format=%s", tip).strip() == "work in the box"
    # delete_branch: the branch goes too, and the host repo is exactly as before the create.
    created = create(fake, repo, "b2")
    _box.destroy_box(fake, created.facts, delete_branch=True)
    git(repo, "branch", "-q", "-D", "agentbox/b1")
    assert host_state(repo) == before
    assert journals(home) == []
    assert _journal.journal_dir(fake.name, fake.engine).startswith(str(home))
