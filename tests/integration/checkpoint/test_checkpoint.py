"""Checkpoints on the real engine: capture, restore, the project default, removal, bad input, prune
(lab.py: the modules run as Ansible runs them, under a temp HOME). The chain and flattening are in
test_checkpoint_chain.py; secrets, `env` and playbooks/checkpoint.yml in test_checkpoint_secrets.py.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint, _checkpoint_records
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxFacts
from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.integration.checkpoint.lab import IMAGE, Lab, image_exists

pytestmark = pytest.mark.integration


def test_warm_state_survives_restore_and_source_is_untouched(lab: Lab) -> None:
    workspace = lab.workspace()
    source = lab.ok_box("src", workspace)["box"]["name"]
    # The agent's warm state: a dependency tree, an in-box .env, a new file, a commit, an uncommitted edit.
    lab.sh(
        source,
        "cd /workspace && mkdir -p node_modules/left-pad/lib node_modules/.bin"
        ' && for i in $(seq 1 40); do echo "module.exports = $i" > node_modules/left-pad/lib/m$i.js; done'
        ' && printf \'{"name":"left-pad"}\' > node_modules/left-pad/package.json'
        " && ln -s ../left-pad/lib/m1.js node_modules/.bin/left-pad"
        " && echo 'TOKEN_FILE=local' > .env && echo 'made in the box' > box-notes.txt"
        " && sed -i 's/line 2/line 2 (box)/' README.md"
        " && git -c user.name=Box -c user.email=box@example.invalid commit -q -am 'box work'"
        " && echo '// box edit, uncommitted' >> app.js",
    )
    before_source = lab.sh(source, "cd /workspace && git rev-parse HEAD && git status --porcelain && cat .git && ls -A")
    host_git_before = lab.host_git_state(workspace)

    saved = lab.ok_checkpoint(box=source)
    checkpoint = saved["checkpoint"]
    assert saved["changed"] is True
    assert checkpoint["name"] == f"{source}-1" and checkpoint["type"] == "layered"
    assert checkpoint["layers"] == 1 and checkpoint["parents"] == []
    assert checkpoint["source_box"] == source and checkpoint["branch"] == f"agentbox/{source}"
    assert checkpoint["commit"] == lab.git(workspace, "rev-parse", f"agentbox/{source}")
    assert checkpoint["timings"]["cleanup_seconds"] >= 0 and checkpoint["timings"]["capture_seconds"] > 0
    assert saved["box"]["name"] == source
    project = _naming.project_id(str(workspace))
    manifest = json.loads(
        (lab.home / ".agentbox" / "checkpoints" / project / checkpoint["name"] / "manifest.json").read_text()
    )
    assert manifest["image"] == _naming.checkpoint_image(project, checkpoint["name"])
    for key in (
        "schema",
        "name",
        "type",
        "parents",
        "source_box",
        "branch",
        "commit",
        "base_fingerprint",
        "collection_version",
        "created",
        "engine",
        "base_image",
    ):
        assert key in manifest, key
    labels = lab.client.images.get(manifest["image"]).labels
    assert labels["io.agentbox.kind"] == "checkpoint" and labels["io.agentbox.checkpoint"] == checkpoint["name"]
    assert labels["io.agentbox.project"] == project and labels["io.agentbox.checkpoint.commit"] == manifest["commit"]
    # The cleanup ran in the box, but never reached the host .git mounted under /tmp: the changes
    # there are the ref the controller adds to keep the checkpoint's commit, and the box's own
    # branch, fetched from the box's git layer at the checkpoint.
    pin = f"refs/agentbox/checkpoints/{project}/{checkpoint['name']} {checkpoint['commit']}"
    own = f"refs/heads/agentbox/{source} "
    refs_before = [line for line in host_git_before["refs"].splitlines() if not line.startswith(own)]
    expected = {**host_git_before, "refs": "\n".join(sorted([*refs_before, pin, own + checkpoint["commit"]]))}
    after = lab.host_git_state(workspace)
    assert {**after, "refs": "\n".join(sorted(after["refs"].splitlines()))} == expected

    # The host moves on: a commit that touches the box's line too, new uncommitted work, a new untracked file.
    (workspace / "README.md").write_text("line 1\nline 2 (host)\nline 3\nline 4\nline 5 (host)\n")
    (workspace / "lib.js").write_text("one\n")
    lab.git(workspace, "add", "README.md", "lib.js")
    lab.git(workspace, "commit", "-q", "-m", "host work")
    (workspace / "later.txt").write_text("untracked on the host\n")
    # Staged work on the host: a new file, and lib.js partly staged (first edit staged, second not).
    (workspace / "staged.txt").write_text("staged on the host\n")
    (workspace / "lib.js").write_text("one\ntwo (staged)\n")
    lab.git(workspace, "add", "staged.txt", "lib.js")
    (workspace / "lib.js").write_text("one\ntwo (staged)\nthree (not staged)\n")
    lab.chown(workspace)

    restored = lab.ok_box("dst", workspace, checkpoint=checkpoint["name"])
    new_box = restored["box"]["name"]
    seed = restored["seed"]
    assert restored["box"]["checkpoint"] == checkpoint["name"]
    assert seed["mode"] == "checkpoint" and seed["checkpoint"] == checkpoint["name"]
    state = lab.sh(
        new_box,
        "cd /workspace && cat box-notes.txt .env node_modules/left-pad/lib/m40.js node_modules/left-pad/package.json"
        " && readlink node_modules/.bin/left-pad && git symbolic-ref --short HEAD && cat README.md app.js later.txt notes.txt",
    )
    assert "made in the box" in state and "TOKEN_FILE=local" in state and "module.exports = 40" in state
    assert "../left-pad/lib/m1.js" in state
    assert f"agentbox/{new_box}" in state
    # Box wins the conflicting line; the host's other hunk is merged; both uncommitted edits are there.
    assert "line 2 (box)" in state and "line 2 (host)" not in state and "line 5 (host)" in state
    assert "// box edit, uncommitted" in state and "// host edit in progress" in state
    assert "untracked on the host" in state and "host notes" in state
    assert any(c["path"] == "README.md" and c["kept"] == "box" for c in seed["conflicts"]), seed["conflicts"]
    # What the host had staged is staged in the box, partial staging included; the rest is not.
    staged = lab.sh(new_box, "cd /workspace && git diff --cached --name-only && echo -- && git show :lib.js")
    assert staged.split("--")[0].split() == ["lib.js", "staged.txt"], staged
    assert staged.split("--")[1].split("\n")[1:3] == ["one", "two (staged)"], staged
    unstaged = lab.sh(new_box, "cd /workspace && git diff --name-only && tail -n 1 lib.js")
    assert "app.js" in unstaged.split() and "lib.js" in unstaged.split() and "three (not staged)" in unstaged
    host_head = lab.git(workspace, "rev-parse", "main")
    # The restored box's merge commit is in its own git layer until the host fetches it.
    assert not lab.module("agentbox_worktree", {"box": new_box, "state": "fetched"}).get("failed")
    new_head = lab.git(workspace, "rev-parse", f"agentbox/{new_box}")
    lab.git(workspace, "merge-base", "--is-ancestor", host_head, new_head)
    lab.git(workspace, "merge-base", "--is-ancestor", checkpoint["commit"], new_head)

    # The source box is exactly as it was: same commit, same status, same gitfile, same files.
    assert (
        lab.sh(source, "cd /workspace && git rev-parse HEAD && git status --porcelain && cat .git && ls -A")
        == before_source
    )
    assert lab.git(workspace, "rev-parse", f"agentbox/{source}") == checkpoint["commit"]
    # Each box registers its worktree in its own git layer: the host's worktree list never shows them.
    worktrees = lab.git(workspace, "worktree", "list", "--porcelain")
    assert ".agentbox-worktrees/" not in worktrees
    assert lab.sh(new_box, "git -C /workspace worktree list --porcelain | grep -c agentbox-worktrees").strip() == "1"
    # Commits made in the restored box reach its own branch in the host repository by fetch (destroy does it).
    lab.sh(
        new_box, "cd /workspace && git add -A && git -c user.name=Box -c user.email=b@x commit -q -m 'after restore'"
    )
    gone = lab.module("agentbox_box", {"name": new_box, "state": "absent"})
    assert not gone.get("failed"), gone.get("msg")
    assert lab.git(workspace, "log", "-1", "--format=%s", f"agentbox/{new_box}") == "after restore"
    assert lab.git(workspace, "rev-parse", f"agentbox/{source}") == checkpoint["commit"]


def test_the_default_checkpoint_belongs_to_one_provider_and_engine(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    workspace = lab.workspace()
    project = _naming.project_id(str(workspace))
    box = lab.ok_box("dflt", workspace)["box"]["name"]
    saved = lab.ok_checkpoint(box=box, name="warm", set_default=True)["checkpoint"]
    assert saved["default"] is True
    monkeypatch.setenv("HOME", str(lab.home))
    local = DockerProvider()
    remote = DockerProvider(engine="builder@127.0.0.1:2201")
    daytona = DaytonaProvider(api_url="http://127.0.0.1:9/api", api_key="unused")
    # A Docker checkpoint is the local engine's default only: Daytona and a remote engine have none.
    assert [_checkpoint.project_default(p, project) for p in (local, remote, daytona)] == ["warm", None, None]
    # Clearing Daytona's default (what removing a Daytona checkpoint does) leaves the Docker one alone.
    _checkpoint_records.set_project_default(project, "snap", provider=daytona)
    _checkpoint_records.set_project_default(project, None, provider=daytona)
    assert [_checkpoint.project_default(p, project) for p in (local, daytona)] == ["warm", None]
    # The name of a checkpoint on another engine of the same kind is taken: say so, never clobber it.
    manifest = lab.home / ".agentbox" / "checkpoints" / project / "warm" / "manifest.json"
    assert json.loads(manifest.read_text())["engine"] == "docker:local"
    facts = BoxFacts(name=box, id="", provider="docker_ssh", engine=remote.engine, state="running",
                     container=f"agentbox-{box}", image=IMAGE, project=project, workspace=str(workspace),
                     branch="", created="")
    with pytest.raises(_checkpoint.CheckpointError, match="already exists on docker:local"):
        _checkpoint.plan_capture(remote, facts, "warm")
    # Removing the checkpoint on its own engine clears that engine's default.
    gone = lab.ok_checkpoint(name="warm", state="absent", workspace=str(workspace))
    assert gone["removed"]["default_cleared"] is True
    assert _checkpoint.project_default(local, project) is None


def test_absent_bad_input_check_mode_defaults_and_prune(lab: Lab) -> None:
    workspace = lab.workspace()
    other = lab.workspace("other")
    project = _naming.project_id(str(workspace))
    box = lab.ok_box("life", workspace)["box"]["name"]
    checkpoints = lab.home / ".agentbox" / "checkpoints" / project

    # Check mode: reports the plan, makes nothing, and does not even run the cleanup.
    lab.sh(box, "echo keep > /tmp/marker", user="root")
    planned = lab.checkpoint(box=box, _check=True)
    assert planned["changed"] is True and planned["checkpoint"]["name"] == f"{box}-1"
    assert not image_exists(lab.client, planned["checkpoint"]["image"]) and not checkpoints.exists()
    assert lab.sh(box, "cat /tmp/marker") == "keep\n"

    first = lab.ok_checkpoint(box=box, set_default=True)["checkpoint"]
    second = lab.ok_checkpoint(box=box)["checkpoint"]
    assert [first["name"], second["name"]] == [f"{box}-1", f"{box}-2"] and first["default"] is True
    config = json.loads((lab.home / ".agentbox" / "projects" / project / "config.json").read_text())
    assert config["default_checkpoints"] == {"docker:local": first["name"]}

    # Bad input fails clearly and changes nothing.
    images_before = sorted(
        t for i in lab.client.images.list(name=_naming.CHECKPOINT_IMAGE_PREFIX + project) for t in i.tags
    )
    unknown = lab.checkpoint(box="no-such-box-here")
    assert unknown["failed"] and "no box called 'no-such-box-here'" in unknown["msg"]
    invalid = lab.checkpoint(box=box, name="Bad Name!")
    assert invalid["failed"] and "invalid checkpoint name" in invalid["msg"]
    collision = lab.checkpoint(box=box, name=first["name"])
    assert collision["failed"] and "already exists" in collision["msg"] and "replace" in collision["msg"]
    assert lab.client.images.get(first["image"]).id == first["image_id"]
    foreign = lab.box("foreign", other, checkpoint=first["name"])
    assert foreign["failed"] and "another project" in foreign["msg"]
    foreign_ref = lab.box("foreign2", other, checkpoint=first["image"])
    assert foreign_ref["failed"] and "belongs to project" in foreign_ref["msg"]
    assert not lab.client.containers.list(all=True, filters={"name": f"agentbox-ckt-{lab.tag}-foreign"})
    assert "agentbox/ckt-" not in lab.git(other, "branch", "--list", "agentbox/*")
    assert (
        sorted(t for i in lab.client.images.list(name=_naming.CHECKPOINT_IMAGE_PREFIX + project) for t in i.tags)
        == images_before
    )

    # The info module sees both, the default, and none broken.
    listed = lab.module("agentbox_checkpoint_info", {"workspace": str(workspace)})
    assert [c["name"] for c in listed["checkpoints"]] == [first["name"], second["name"]]
    assert listed["default"] == first["name"] and not any(c["broken"] or c["stale"] for c in listed["checkpoints"])

    # A new box with no checkpoint given starts from the project default; 'none' starts fresh.
    warm = lab.ok_box("warm", workspace, checkpoint="default")
    assert warm["box"]["checkpoint"] == first["name"]
    cold = lab.ok_box("cold", workspace, checkpoint="none")
    assert not cold["box"]["checkpoint"] and cold["seed"]["mode"] == "worktree"

    # Replace keeps the name, makes a new image.
    replaced = lab.ok_checkpoint(box=box, name=second["name"], replace=True)["checkpoint"]
    assert replaced["image_id"] != second["image_id"] and replaced["name"] == second["name"]

    # Absent: check mode removes nothing; then image, manifest and commit ref go; a second run is a no-op.
    dry = lab.checkpoint(name=second["name"], state="absent", workspace=str(workspace), _check=True)
    assert dry["changed"] is True and image_exists(lab.client, second["image"])
    removed = lab.ok_checkpoint(name=second["name"], state="absent", workspace=str(workspace))
    assert removed["changed"] is True and not image_exists(lab.client, second["image"])
    assert not (checkpoints / second["name"]).exists()
    assert f"checkpoints/{project}/{second['name']}" not in lab.git(workspace, "for-each-ref", "refs/agentbox/")
    again = lab.ok_checkpoint(name=second["name"], state="absent", workspace=str(workspace))
    assert again["changed"] is False
    # Numbers are never handed out twice, even after a removal.
    assert lab.ok_checkpoint(box=box)["checkpoint"]["name"] == f"{box}-3"

    # A manifest whose image is gone is listed as broken and never used.
    lab.client.images.remove(_naming.checkpoint_image(project, f"{box}-3"))
    listed = lab.module("agentbox_checkpoint_info", {"workspace": str(workspace), "name": f"{box}-3"})
    assert listed["checkpoints"][0]["broken"] is True and listed["checkpoints"][0]["image_exists"] is False
    broken = lab.box("broken", workspace, checkpoint=f"{box}-3")
    assert broken["failed"] and "broken" in broken["msg"]

    # Prune: an image no box and no manifest refers to goes (check mode only lists it); the others stay.
    orphan = _naming.checkpoint_image(project, "orphan")
    lab.client.images.get(first["image"]).tag(_naming.CHECKPOINT_IMAGE_PREFIX + project, "orphan")
    listed_only = lab.checkpoint(prune=True, workspace=str(workspace), _check=True)
    assert not listed_only.get("failed"), listed_only.get("msg")
    assert [r["image"] for r in listed_only["removed"]["removed"]] == [orphan] and image_exists(lab.client, orphan)
    pruned = lab.ok_checkpoint(prune=True, workspace=str(workspace))
    assert [r["image"] for r in pruned["removed"]["removed"]] == [orphan]
    assert not image_exists(lab.client, orphan) and image_exists(lab.client, first["image"])
