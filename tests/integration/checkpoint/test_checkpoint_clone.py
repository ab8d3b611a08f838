"""Restore on an engine that does not share the host's files (remote Docker, Daytona): the box's
repository is a clone inside the checkpoint, and the host's HEAD and uncommitted state are shipped in.

The local engine stands in for a remote one: a DockerProvider that declares it cannot see the
host's files, so creation seeds by shipping a clone and restore takes the clone path. No SSH or
second engine is needed for the code path under test.
"""

from __future__ import annotations

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

from ansible_collections.agentbox.box.plugins.module_utils.box import _box  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.checkpoint import _checkpoint  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402

pytestmark = pytest.mark.integration
IMAGE = os.environ.get("AGENTBOX_TEST_BOX_IMAGE", "agentbox/box:latest")
GIT = ["git", "-c", "safe.directory=*", "-c", "user.name=Host", "-c", "user.email=host@example.invalid"]


class ShippedLocal(DockerProvider):
    """The local engine, treated like a remote one: nothing of the host is bind-mounted."""

    def __init__(self) -> None:
        super().__init__()
        self.shares_host_filesystem = False


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, box_image: str) -> Iterator[dict[str, Any]]:
    # box_image: conftest fails the test when the engine or the image is missing; a failing
    # provider set-up below is a failure too.
    provider = ShippedLocal()
    root = Path(tempfile.mkdtemp(prefix="agentbox-ckpt-clone-"))
    root.chmod(0o755)
    monkeypatch.setenv("HOME", str(root / "home"))
    # Shipping fetches from the uid-1000 repo into a root-owned staging repo; git's upload-pack
    # honours safe.directory only from global config, not from -c.
    (root / "home").mkdir()
    (root / "home" / ".gitconfig").write_text("[safe]\n\tdirectory = *\n")
    workspace = root / "ws"
    workspace.mkdir()
    git(workspace, "init", "-q", "-b", "main")
    (workspace / ".gitignore").write_text("node_modules/\n")
    (workspace / "README.md").write_text("one\ntwo\nthree\nfour\nfive\n")
    (workspace / "notes.txt").write_text("notes\n")
    git(workspace, "add", ".")
    git(workspace, "commit", "-q", "-m", "init")
    (workspace / "notes.txt").write_text("notes\nhost wip\n")  # carried into the first box
    subprocess.run(["chown", "-R", "1000:1000", str(workspace)], check=True)
    tag = secrets.token_hex(3)
    made: list[str] = []
    try:
        yield {"provider": provider, "workspace": workspace, "tag": tag, "boxes": made}
    finally:
        for box in made:
            facts = provider.find(box)
            if facts is not None:
                provider.destroy(box)
        project = _naming.project_id(str(workspace))
        for image in provider.client.images.list(filters={"label": f"io.agentbox.project={project}"}):
            try:
                provider.client.images.remove(image.id, force=True)
            except docker.errors.APIError:
                pass
        shutil.rmtree(root, ignore_errors=True)


def sh(provider: DockerProvider, box: str, script: str) -> str:
    run = provider.exec(box, ["bash", "-c", script])
    assert run.rc == 0, run.stderr.decode()
    return run.text


def test_restore_into_a_clone_merges_and_overlays_the_host(world: dict[str, Any]) -> None:
    provider, workspace, tag = world["provider"], world["workspace"], world["tag"]
    source = f"ckc-{tag}-src"
    world["boxes"].append(source)
    created = _box.create_box(provider, _box.CreateRequest(name=source, workspace=str(workspace), image=IMAGE))
    assert created.seed.mode == "shipped"
    sh(
        provider,
        source,
        "cd /workspace && mkdir -p node_modules/dep && echo 'module.exports = 7' > node_modules/dep/index.js"
        " && sed -i 's/^one$/one (box)/' README.md"
        " && git -c user.name=Box -c user.email=b@x commit -q -am 'box work' && echo 'box wip' > box.txt",
    )
    before = sh(provider, source, "cd /workspace && git rev-parse HEAD && git status --porcelain")

    plan = _checkpoint.plan_capture(provider, provider.find(source), "warm")
    saved = _checkpoint.capture(provider, plan)
    assert saved["type"] == "layered" and saved["commit"] == before.split()[0]

    (workspace / "README.md").write_text("one (host)\ntwo\nthree\nfour\nfive (host)\n")
    git(workspace, "commit", "-q", "-am", "host work")
    (workspace / "README.md").write_text("one (host)\ntwo\nthree (host wip)\nfour\nfive (host)\n")
    (workspace / "fresh.txt").write_text("untracked on the host\n")
    subprocess.run(["chown", "-R", "1000:1000", str(workspace)], check=True)
    host_head = git(workspace, "rev-parse", "HEAD")

    restored_name = f"ckc-{tag}-dst"
    world["boxes"].append(restored_name)
    restored = _box.create_box(
        provider, _box.CreateRequest(name=restored_name, workspace=str(workspace), image=IMAGE, checkpoint="warm")
    )
    seed = restored.seed
    assert seed.mode == "checkpoint" and seed.branch == f"agentbox/{restored_name}"
    assert seed.merges[0]["merge"] == "merged"
    state = sh(
        provider,
        restored_name,
        "cd /workspace && git symbolic-ref --short HEAD && cat node_modules/dep/index.js README.md fresh.txt box.txt"
        f" && git merge-base --is-ancestor {host_head} HEAD && echo host-merged"
        " && git for-each-ref refs/agentbox/restore | wc -l && ls /tmp | grep -c agentbox-restore || true",
    )
    assert f"agentbox/{restored_name}" in state and "module.exports = 7" in state
    assert "one (box)" in state and "five (host)" in state and "three (host wip)" in state
    assert "untracked on the host" in state and "box wip" in state and "host-merged" in state
    assert state.split()[-2:] == ["0", "0"]  # the shipped refs and staging repos are gone
    assert any(c["path"] == "README.md" for c in seed.conflicts)
    # The source box is as it was.
    assert sh(provider, source, "cd /workspace && git rev-parse HEAD && git status --porcelain") == before
