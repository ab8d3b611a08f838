"""Checkpoints on the real engine: capture (layered, flattened), restore, secrets, removal, prune.

Boxes are made and checkpointed by the modules themselves (agentbox_box, agentbox_checkpoint,
agentbox_checkpoint_info), run as Ansible runs them: the module file with its arguments file.
HOME points at a temp dir, so manifests and project config never touch the real ~/.agentbox.
Every test removes its boxes, checkpoint images and temp dirs, failed or not.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.core import _naming  # noqa: E402

pytestmark = pytest.mark.integration
IMAGE = os.environ.get("AGENTBOX_TEST_BOX_IMAGE", "agentbox/box:latest")
GIT = ["git", "-c", "safe.directory=*", "-c", "user.name=Host", "-c", "user.email=host@example.invalid"]


@pytest.fixture(scope="module")
def client(docker_client: docker.DockerClient, box_image: str) -> docker.DockerClient:
    """The engine, with the box image on it (conftest fails the test when either is missing)."""
    return docker_client


class Lab:
    """One test's world: a temp HOME, workspaces, and everything made in it (removed at the end)."""

    def __init__(self, client: Any, root: Path):
        self.client = client
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.tag = secrets.token_hex(3)
        self.boxes: list[str] = []
        self.projects: set[str] = set()

    # -- host side --------------------------------------------------------------------------
    def workspace(self, name: str = "ws") -> Path:
        path = self.root / name
        path.mkdir()
        self.git(path, "init", "-q", "-b", "main")
        (path / ".gitignore").write_text("node_modules/\n.env\n")
        (path / "README.md").write_text("line 1\nline 2\nline 3\nline 4\nline 5\n")
        (path / "app.js").write_text("console.log('v1')\n")
        self.git(path, "add", ".")
        self.git(path, "commit", "-q", "-m", "init")
        # The host is mid-work: a tracked edit and an untracked note are carried into every box.
        with open(path / "app.js", "a") as handle:
            handle.write("// host edit in progress\n")
        (path / "notes.txt").write_text("host notes\n")
        subprocess.run(["chown", "-R", "1000:1000", str(path)], check=True)
        self.projects.add(_naming.project_id(str(path)))
        return path

    def git(self, repo: Path, *args: str) -> str:
        done = subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    def host_git_state(self, repo: Path) -> dict[str, str]:
        """What a box must never change in the host's .git: refs (stash included), HEAD, index, config."""
        dot_git = repo / ".git"
        return {
            "refs": self.git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
            "HEAD": (dot_git / "HEAD").read_text(),
            "index": hashlib.sha256((dot_git / "index").read_bytes()).hexdigest(),
            "config": (dot_git / "config").read_text(),
        }

    def chown(self, path: Path) -> None:
        subprocess.run(["chown", "-R", "1000:1000", str(path)], check=True)

    # -- modules ----------------------------------------------------------------------------
    def module(self, name: str, args: dict[str, Any], *, check_mode: bool = False) -> dict[str, Any]:
        payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode, "_ansible_diff": True}}
        fd, args_file = tempfile.mkstemp(suffix=".json", dir=self.root)
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
        pythonpath = os.pathsep.join(p for p in (str(REPO / ".collections"), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "HOME": str(self.home), "PYTHONPATH": pythonpath}
        done = subprocess.run(
            [sys.executable, "-m", f"ansible_collections.agentbox.box.plugins.modules.{name}", args_file],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=self.root,
            check=False,
        )
        os.unlink(args_file)
        try:
            return json.loads(done.stdout)
        except ValueError:
            raise AssertionError(f"{name} did not answer JSON:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}") from None

    def box(self, name: str, workspace: Path, **extra: Any) -> dict[str, Any]:
        full = f"ckt-{self.tag}-{name}"
        self.boxes.append(full)
        result = self.module("agentbox_box", {"name": full, "workspace": str(workspace), "image": IMAGE, **extra})
        return result

    def ok_box(self, name: str, workspace: Path, **extra: Any) -> dict[str, Any]:
        result = self.box(name, workspace, **extra)
        assert not result.get("failed"), result.get("msg")
        return result

    def checkpoint(self, **args: Any) -> dict[str, Any]:
        return self.module("agentbox_checkpoint", args, check_mode=args.pop("_check", False))

    def ok_checkpoint(self, **args: Any) -> dict[str, Any]:
        result = self.checkpoint(**args)
        assert not result.get("failed"), result.get("msg")
        return result

    # -- in the box -------------------------------------------------------------------------
    def sh(self, box: str, script: str, user: str = "vscode") -> str:
        container = self.client.containers.get(_naming.container_name(box))
        code, output = container.exec_run(["bash", "-c", script], user=user, demux=True)
        out, err = output
        assert code == 0, f"{script!r} in {box} exited {code}: {(err or b'').decode()} {(out or b'').decode()}"
        return (out or b"").decode()

    def cleanup(self) -> None:
        for box in self.boxes:
            for container in self.client.containers.list(all=True, filters={"name": f"^/agentbox-{box}$"}):
                container.remove(force=True, v=True)
            for volume in self.client.volumes.list(filters={"name": f"agentbox-{box}-"}):
                try:
                    volume.remove(force=True)
                except docker.errors.APIError:
                    pass
        for project in self.projects:
            repository = _naming.CHECKPOINT_IMAGE_PREFIX + project
            for image in self.client.images.list(name=repository):
                for tag in image.tags:
                    if tag.startswith(repository + ":"):
                        try:
                            self.client.images.remove(tag, force=True)
                        except docker.errors.APIError:
                            pass
            for image in self.client.images.list(filters={"label": f"io.agentbox.project={project}", "dangling": True}):
                try:
                    self.client.images.remove(image.id, force=True)
                except docker.errors.APIError:
                    pass


@pytest.fixture
def lab(client: Any) -> Iterator[Lab]:
    # Not pytest's tmp_path: its parents are private to root, and host git runs as the repo's owner
    # (uid 1000), who must be able to reach the workspace.
    root = Path(tempfile.mkdtemp(prefix="agentbox-ckpt-test-"))
    root.chmod(0o755)
    world = Lab(client, root)
    try:
        yield world
    finally:
        try:
            world.cleanup()
        finally:
            shutil.rmtree(root, ignore_errors=True)


def image_exists(client: Any, reference: str) -> bool:
    try:
        client.images.get(reference)
        return True
    except docker.errors.ImageNotFound:
        return False


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


def _same_config(image_config: dict[str, Any], container_config: dict[str, Any]) -> None:
    for key in ("User", "WorkingDir", "Cmd", "Entrypoint"):
        assert (image_config.get(key) or None) == (container_config.get(key) or None), key
    # The environment is the image's own: the box's (AGENTBOX_*, its `env`) is not kept.
    assert image_config.get("Env") == docker.from_env().images.get(IMAGE).attrs["Config"]["Env"]
    assert sorted(image_config.get("ExposedPorts") or {}) == sorted(container_config.get("ExposedPorts") or {})


def test_three_layered_in_a_chain_then_the_fourth_is_flattened(lab: Lab) -> None:
    workspace = lab.workspace()
    box = lab.ok_box("g0", workspace)["box"]["name"]
    names: list[str] = []
    for generation in range(1, 5):
        lab.sh(
            box,
            f"cd /workspace && mkdir -p node_modules/gen{generation} && echo {generation} > node_modules/gen{generation}/v",
        )
        saved = lab.ok_checkpoint(box=box, name=f"gen{generation}")["checkpoint"]
        names.append(saved["name"])
        assert saved["parents"] == list(reversed(names[:-1])), saved
        if generation < 4:
            assert saved["type"] == "layered" and saved["layers"] == generation
            box = lab.ok_box(f"g{generation}", workspace, checkpoint=saved["name"])["box"]["name"]
    assert saved["type"] == "flattened" and saved["layers"] == 0

    flat = lab.client.images.get(saved["image"])
    history = flat.history()
    assert len(history) == 1 and len(flat.attrs["RootFS"]["Layers"]) == 1, history
    layered = lab.client.images.get(_naming.checkpoint_image(_naming.project_id(str(workspace)), "gen3"))
    assert len(layered.attrs["RootFS"]["Layers"]) > 1
    container = lab.client.containers.get(_naming.container_name(box))
    source_config = container.attrs["Config"]
    _same_config(flat.attrs["Config"], source_config)
    expected_labels = dict(source_config["Labels"])
    expected_labels.update({k: v for k, v in flat.labels.items() if k.startswith("io.agentbox.")})
    assert flat.labels == expected_labels
    assert {k: v for k, v in flat.labels.items() if not k.startswith("io.agentbox.")} == {
        k: v for k, v in source_config["Labels"].items() if not k.startswith("io.agentbox.")
    }
    # Everything the chain accumulated is in the single layer, and a box starts from it.
    last = lab.ok_box("g4", workspace, checkpoint="gen4")["box"]["name"]
    assert lab.sh(last, "cat /workspace/node_modules/gen*/v").split() == ["1", "2", "3", "4"]


def _filesystem_contains(client: Any, image: str, needles: list[bytes]) -> list[bytes]:
    """Which needles occur anywhere in the image's exported filesystem (streamed, never on disk)."""
    container = client.containers.create(image, command=["true"])
    try:
        found: set[bytes] = set()
        keep = max(len(n) for n in needles)
        tail = b""
        for chunk in client.api.export(container.id, chunk_size=1 << 20):
            window = tail + chunk
            found.update(n for n in needles if n in window)
            tail = window[-keep:]
        return sorted(found)
    finally:
        container.remove(force=True, v=True)


def test_secrets_are_in_neither_kind_of_checkpoint(lab: Lab) -> None:
    workspace = lab.workspace()
    token = "relay-" + secrets.token_hex(16)
    api_key = "sk-ant-fake-" + secrets.token_hex(20)
    made = lab.ok_box(
        "sec", workspace, secrets={"RELAY_TOKEN": token, "ANTHROPIC_API_KEY": api_key}, env={"HARMLESS": "visible"}
    )
    box = made["box"]["name"]
    # The secrets are really in the box (so the search below can fail), and not in its environment.
    assert lab.sh(box, "cat /run/agentbox/secrets/ANTHROPIC_API_KEY") == api_key
    assert api_key not in lab.sh(box, "env") and token not in lab.sh(box, "env")
    # An agent copying a secret into the environment of its own processes does not matter: only files count.
    # Positive control: a random token in a file of the box, which the search must find (a plain word
    # could also match inside other files and prove nothing).
    work_marker = f"work-{secrets.token_hex(12)}".encode()
    lab.sh(box, f"cd /workspace && echo '{work_marker.decode()}' > work.txt")
    needles = [token.encode(), api_key.encode()]
    for merged in (False, True):
        saved = lab.ok_checkpoint(box=box, name=f"sec-{int(merged)}", merged=merged)["checkpoint"]
        assert saved["type"] == ("flattened" if merged else "layered")
        inspect = subprocess.run(["docker", "image", "inspect", saved["image"]], capture_output=True, check=True).stdout
        assert b"visible" not in inspect  # the box's env is not the checkpoint's (see the test below)
        assert not any(n in inspect for n in needles), saved["type"]
        # One pass over the exported filesystem: the marker is found, no secret is.
        assert _filesystem_contains(lab.client, saved["image"], [*needles, work_marker]) == [work_marker], saved["type"]

    # A box whose environment holds one of its secrets is refused, and nothing is made.
    leaky = lab.ok_box("leak", workspace, secrets={"API_KEY": api_key}, env={"COPIED": api_key})["box"]["name"]
    refused = lab.checkpoint(box=leaky, name="leaky")
    assert refused.get("failed") and "COPIED" in refused["msg"] and api_key not in refused["msg"]
    assert not image_exists(lab.client, _naming.checkpoint_image(_naming.project_id(str(workspace)), "leaky"))


def test_box_env_is_in_neither_kind_of_checkpoint(lab: Lab) -> None:
    """Users pass API keys in `env` out of habit: a checkpoint keeps the image's own environment, and
    a box restored from it gets its own `env`."""
    workspace = lab.workspace()
    key = "sk-env-" + secrets.token_hex(20)
    box = lab.ok_box("env", workspace, env={"MY_API_KEY": key})["box"]["name"]
    assert lab.sh(box, "printenv MY_API_KEY") == key + "\n"  # it is really there, so the searches can fail
    work_marker = f"work-{secrets.token_hex(12)}".encode()
    lab.sh(box, f"cd /workspace && echo '{work_marker.decode()}' > work.txt")
    for merged in (False, True):
        saved = lab.ok_checkpoint(box=box, name=f"env-{int(merged)}", merged=merged)["checkpoint"]
        inspect = subprocess.run(["docker", "image", "inspect", saved["image"]], capture_output=True, check=True).stdout
        assert key.encode() not in inspect, saved["type"]
        # Exactly the image's own environment: no key the box added, not even a blanked one.
        assert json.loads(inspect)[0]["Config"]["Env"] == lab.client.images.get(IMAGE).attrs["Config"]["Env"]
        assert _filesystem_contains(lab.client, saved["image"], [key.encode(), work_marker]) == [work_marker]
        own = "sk-own-" + secrets.token_hex(8)
        restored = lab.ok_box(f"env-r{int(merged)}", workspace, checkpoint=saved["name"], env={"MY_API_KEY": own})
        name = restored["box"]["name"]
        assert lab.sh(name, "printenv MY_API_KEY; printenv AGENTBOX_BOX_NAME") == f"{own}\n{name}\n"


def test_the_default_checkpoint_belongs_to_one_provider_and_engine(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint, _checkpoint_records
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider
    from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider

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
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxFacts

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


def test_checkpoint_playbook(lab: Lab) -> None:
    workspace = lab.workspace()
    box = lab.ok_box("pb", workspace)["box"]["name"]
    env = {**os.environ, "HOME": str(lab.home)}
    # The controller's own Python (it has the docker SDK); discovery would look under the temp HOME.
    playbook = [
        str(REPO / ".venv" / "bin" / "ansible-playbook"),
        "-i",
        "localhost,",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    done = subprocess.run(
        [
            *playbook,
            "playbooks/checkpoint.yml",
            "-e",
            f"box={box}",
            "-e",
            "checkpoint=pb-flat",
            "-e",
            "merged=true",
            "-e",
            "set_default=true",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "checkpoint: pb-flat (flattened, project default)" in done.stdout
    listed = lab.module("agentbox_checkpoint_info", {"box": box})
    assert [c["name"] for c in listed["checkpoints"]] == ["pb-flat"] and listed["default"] == "pb-flat"
    missing = subprocess.run(
        [*playbook, "playbooks/checkpoint.yml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert missing.returncode != 0 and "-e box=NAME" in missing.stdout


def test_max_layers_and_cleanup_false(lab: Lab) -> None:
    workspace = lab.workspace()
    box = lab.ok_box("ml", workspace)["box"]["name"]
    note = f"session-{secrets.token_hex(6)}"
    lab.sh(box, f"echo {note} > /var/tmp/session-note", user="root")  # the in-box cleanup empties /var/tmp

    first = lab.ok_checkpoint(box=box, name="ml1", cleanup=False, max_layers=1)["checkpoint"]
    assert first["type"] == "layered" and first["layers"] == 1
    restored = lab.ok_box("ml-r", workspace, checkpoint="ml1")["box"]["name"]
    assert lab.sh(restored, "cat /var/tmp/session-note") == f"{note}\n"  # captured as it was: no cleanup ran

    # The restored box already stacks one checkpoint layer: with max_layers=1 the next one is flattened.
    second = lab.ok_checkpoint(box=restored, name="ml2", max_layers=1)["checkpoint"]
    assert second["type"] == "flattened" and second["layers"] == 0 and second["parents"] == ["ml1"]
    assert "session-note" not in lab.sh(restored, "ls -A /var/tmp")  # the default cleanup ran this time
