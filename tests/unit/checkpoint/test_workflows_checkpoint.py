"""Checkpoint capture, listing, defaults, removal, prune and restore on the fake provider.

The fake keeps checkpoints as snapshots (fake_provider.FakeSnapshots over the shared snapshot
workflow, _snapshot_store), as Daytona and boxd do; its boxes cannot see the host's files, so a
restore ships the host's state in (_restore_clones). Two fakes with different names and engines
stand for two providers. The boxes are made once per module (a create is the slow part); each test
takes and removes its own checkpoints and puts the host repository back as it found it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint, _checkpoint_records, _restore
from ansible_collections.agentbox.box.plugins.module_utils.checkpoint._checkpoint_records import CheckpointError
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError
from tests.conftest import git, make_repo
from tests.unit.support.fake_provider import FakeProvider

IDENTITY = ["-c", "user.name=box", "-c", "user.email=box@example.invalid"]
# Values a user passes to the source box; a checkpoint must hold neither.
ENV_VALUE = "sk-env-4f1d0c9a7b2e"
SECRET_VALUE = "sk-secret-93be01d6a5c4"


@dataclasses.dataclass
class World:
    home: Path
    repo: Path
    project: str
    a: FakeProvider  # provider "fake" on one engine
    b: FakeProvider  # provider "fake-b" on another
    source: str  # a checkpoint of box b1 on `a`, taken after the box's own work


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the fake provider mounts and chroots")
    tmp = tmp_path_factory.mktemp("ckpt")
    # Too long a path for a unix socket: a create takes its no-relay path (see conftest.home).
    home = tmp / ("home-" + "h" * 80)
    home.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        repo = make_repo(tmp / "ws", {"README.md": "hello\n", "src/app.py": "print('app')\n"})
        a = FakeProvider(tmp / "engine-a", shares_host_filesystem=False)
        b = FakeProvider(tmp / "engine-b", shares_host_filesystem=False, name="fake-b")
        try:
            created = _box.create_box(a, _box.CreateRequest(
                name="b1", workspace=str(repo), boot=False, env={"API_KEY": ENV_VALUE},
                secrets={"token": SECRET_VALUE},
            ))  # fmt: skip
            _box.create_box(b, _box.CreateRequest(name="b1", workspace=str(repo), boot=False))
            # The box's own work: one commit, and an uncommitted edit.
            box_sh(a, "b1", "echo box > box.txt && git add box.txt && git commit -qm 'box work'")
            box_sh(a, "b1", "echo \"print('box')\" > src/app.py")
            take(a, "b1", "source")
            yield World(home, repo, created.facts.project, a, b, "source")
        finally:
            for provider in (a, b):
                for name in list(provider.boxes):
                    provider.destroy(name)


def box_sh(provider: FakeProvider, box: str, script: str) -> str:
    script = script.replace("git ", "git " + " ".join(IDENTITY) + " ")
    return provider.exec(box, ["sh", "-c", f"cd /workspace && {script}"]).check(script, box).text


def take(provider: FakeProvider, box: str, name: str | None = None, replace: bool = False) -> dict:
    plan = _checkpoint.plan_capture(provider, provider.find(box), name, replace=replace)
    return _checkpoint.capture(provider, plan)


def remove(provider: FakeProvider, project: str, name: str) -> dict:
    return _checkpoint.remove(provider, _checkpoint.find_checkpoint(provider, project, name))


def names(provider: FakeProvider, project: str) -> list[str]:
    return [c.name for c in _checkpoint.list_checkpoints(provider, project)]


def host_state(repo: Path) -> dict[str, str]:
    return {
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "status": git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
    }


def journals(home: Path) -> list[str]:
    root = home / ".agentbox" / "creating"
    return [str(path.relative_to(root)) for path in root.rglob("*.json")] if root.exists() else []


def test_numbered_checkpoints_count_up_and_never_reuse_a_number(world: World):
    a, project = world.a, world.project
    before = names(a, project)
    # Other tests in this module may have numbered b1 already (on this engine or another): count from
    # the first name handed out here.
    first = take(a, "b1")
    match = re.fullmatch(r"b1-(\d+)", first["name"])
    assert match, first["name"]
    n = int(match.group(1))
    second = take(a, "b1")
    assert second["name"] == f"b1-{n + 1}"
    record = first
    head = box_sh(a, "b1", "git rev-parse HEAD").strip()
    assert record["commit"] == head and record["branch"] == "agentbox/b1"
    assert record["engine"] == f"fake:{a.engine}" and record["provider"] == "fake"
    assert record["source_box"] == "b1" and record["project"] == project
    assert record["image"] in a.images and not record["broken"]
    manifest = world.home / ".agentbox" / "fake" / "checkpoints" / project / first["name"] / "manifest.json"
    assert manifest.is_file()
    # The highest number removed: the next one is still above it, never a reused name.
    remove(a, project, second["name"])
    third = take(a, "b1")
    assert third["name"] == f"b1-{n + 2}"
    assert names(a, project) == sorted([*before, first["name"], third["name"]])
    # A name taken is refused without replace, and nothing is made.
    images = set(a.images)
    with pytest.raises(CheckpointError, match="already exists"):
        take(a, "b1", first["name"])
    assert set(a.images) == images
    for name in (first["name"], third["name"]):
        remove(a, project, name)
    assert names(a, project) == before


def test_a_checkpoint_name_and_the_default_belong_to_one_provider_and_engine(world: World):
    a, b, project = world.a, world.b, world.project
    on_a = take(a, "b1", "base")
    on_b = take(b, "b1", "base")  # the same name on another provider is no clash
    assert on_a["image"] != on_b["image"]
    assert _checkpoint.find_checkpoint(a, project, "base").image == on_a["image"]
    assert _checkpoint.find_checkpoint(b, project, "base").image == on_b["image"]
    assert world.source in names(a, project) and world.source not in names(b, project)
    _checkpoint_records.set_project_default(project, "base", provider=a)
    assert _checkpoint.project_default(a, project) == "base"
    assert _checkpoint.project_default(b, project) is None
    _checkpoint_records.set_project_default(project, "base", provider=b)
    # Removing one provider's checkpoint clears its default only: the other's stays, and stays usable.
    removed = remove(a, project, "base")
    assert removed["image"] == on_a["image"] and removed.get("default_cleared") is True
    assert _checkpoint.project_default(a, project) is None
    assert _checkpoint.project_default(b, project) == "base"
    assert _restore.plan_restore(b, project, "base").image == on_b["image"]
    # Prune removes what no manifest refers to, on its own provider only.
    orphan = take(a, "b1", "orphan")
    os.unlink(world.home / ".agentbox" / "fake" / "checkpoints" / project / "orphan" / "manifest.json")
    pruned = _checkpoint.prune(a, project=project)
    assert [entry["image"] for entry in pruned["removed"]] == [orphan["image"]]
    assert orphan["image"] not in a.images and on_b["image"] in b.images
    assert _checkpoint.prune(b, project=project) == {"removed": [], "failed": []}
    assert _checkpoint.project_default(b, project) == "base"
    remove(b, project, "base")
    assert _checkpoint.project_default(b, project) is None


def test_another_engine_of_the_provider_neither_sees_nor_takes_its_checkpoints(world: World, tmp_path: Path):
    a, project = world.a, world.project
    # Provider "fake" again, on another engine (another Daytona API, another boxd org): one manifest directory.
    c = FakeProvider(tmp_path / "engine-c", shares_host_filesystem=False)
    try:
        _box.create_box(c, _box.CreateRequest(name="b1", workspace=str(world.repo), boot=False))
        assert world.source not in names(c, project)
        assert _checkpoint.find_checkpoint(c, project, world.source) is None
        # Not "broken, remove it": a removal there would delete this engine's good manifest.
        with pytest.raises(CheckpointError, match=f"no checkpoint {world.source!r} in this project"):
            _restore.plan_restore(c, project, world.source)
        with pytest.raises(CheckpointError, match="already exists on fake:fake:"):
            take(c, "b1", world.source)
        numbered = take(c, "b1")
        assert numbered["engine"] == f"fake:{c.engine}" and numbered["name"] not in names(a, project)
        _checkpoint_records.set_project_default(project, numbered["name"], provider=c)
        assert _checkpoint.project_default(a, project) is None
        remove(c, project, numbered["name"])
        assert _checkpoint.project_default(c, project) is None
        assert _restore.plan_restore(a, project, world.source).image in a.images
    finally:
        for name in list(c.boxes):
            c.destroy(name)


def test_the_box_env_and_secrets_never_reach_a_checkpoint(world: World):
    a = world.a
    # The source box had both: the env in its processes, the secret in its tmpfs.
    assert a.exec("b1", ["printenv", "API_KEY"]).check("printenv").text.strip() == ENV_VALUE
    assert (a.box_root("b1") / "run/agentbox/secrets/token").read_text() == SECRET_VALUE
    found = _checkpoint.find_checkpoint(a, world.project, world.source)
    labels, root = a.images[found.image]
    stored = [path for path in root.rglob("*") if path.is_file() and not path.is_symlink()]
    stored += [path for path in (world.home / ".agentbox").rglob("*") if path.is_file()]
    assert len(stored) > 10 and any(path.name == "seed.json" for path in stored)
    for value in (ENV_VALUE, SECRET_VALUE):
        assert [str(path) for path in stored if value.encode() in path.read_bytes()] == []
        assert value not in repr(labels) and value not in repr(found.record)


def test_restore_brings_the_box_files_and_the_host_later_work_onto_a_new_branch(world: World):
    a, repo = world.a, world.repo
    # The host's work after the checkpoint, not committed: an edit and a new file.
    (repo / "README.md").write_text("hello, later on the host\n")
    (repo / "later.txt").write_text("host, untracked\n")
    try:
        created = _box.create_box(a, _box.CreateRequest(
            name="b2", workspace=str(repo), boot=False, checkpoint=world.source, env={"API_KEY": "b2's own"},
        ))  # fmt: skip
        assert created.facts.checkpoint == world.source and created.seed.checkpoint == world.source
        assert created.seed.conflicts == []
        assert box_sh(a, "b2", "git symbolic-ref --short HEAD").strip() == "agentbox/b2"
        tree = a.box_root("b2") / "workspace"
        assert (tree / "box.txt").read_text() == "box\n"  # committed in the source box
        assert (tree / "src/app.py").read_text() == "print('box')\n"  # its uncommitted edit
        assert (tree / "README.md").read_text() == "hello, later on the host\n"
        assert (tree / "later.txt").read_text() == "host, untracked\n"
        assert "box work" in box_sh(a, "b2", "git log --format=%s")
        assert a.exec("b2", ["printenv", "API_KEY"]).check("printenv").text.strip() == "b2's own"
        # The source box is left as it was.
        assert box_sh(a, "b1", "git symbolic-ref --short HEAD").strip() == "agentbox/b1"
        assert not (a.box_root("b1") / "workspace/later.txt").exists()
    finally:
        if a.find("b2") is not None:
            _box.destroy_box(a, a.find("b2"), delete_branch=True)
        git(repo, "checkout", "-q", "--", "README.md")
        (repo / "later.txt").unlink()


# A restore's side effects in order: the box from the snapshot, the staging directory (exec 1), the
# host's state streamed in, the in-box restore program (exec 2), the host's untracked file it lacks,
# the seed record (exec 3, last).
RESTORE_STAGES = [("create", 1), ("exec", 1), ("put_archive", 1), ("exec", 2), ("put_archive", 2), ("exec", 3)]


@pytest.mark.parametrize(("method", "call"), RESTORE_STAGES, ids=[f"{m}-{c}" for m, c in RESTORE_STAGES])
def test_a_restore_failing_midway_leaves_nothing(world: World, method: str, call: int):
    a, repo, project = world.a, world.repo, world.project
    (repo / "later.txt").write_text("host, untracked\n")
    before = host_state(repo)
    images = dict(a.images)
    manifest = (world.home / ".agentbox" / "fake" / "checkpoints" / project / world.source / "manifest.json").read_bytes()
    a.fail_on(method, call)
    try:
        with pytest.raises(ProviderError, match=f"injected failure of {method}|restoring the workspace"):
            _box.create_box(a, _box.CreateRequest(name="b3", workspace=str(repo), boot=False, checkpoint=world.source))
        assert method not in a._failures, "the failure was never injected: the stage list is stale"
        assert sorted(a.boxes) == ["b1"] and sorted(os.listdir(a.base / "boxes")) == ["b1"]
        assert host_state(repo) == before
        assert journals(world.home) == []
        # The checkpoint is whole and still restorable.
        assert a.images == images
        assert _restore.plan_restore(a, project, world.source).record["commit"]
        assert manifest == (world.home / ".agentbox" / "fake" / "checkpoints" / project / world.source /
                            "manifest.json").read_bytes()  # fmt: skip
    finally:
        a._failures.pop(method, None)
        if a.find("b3") is not None:
            a.destroy("b3")
        (repo / "later.txt").unlink()
