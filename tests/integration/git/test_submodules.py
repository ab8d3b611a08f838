"""Repositories with submodules get a box on the local engine, clean and dirty.

Each checked-out submodule is carried like a nested repository: it gets its own worktree in the box
(at its path inside the workspace's worktree) on its own agentbox/<box> branch, from the .git the
superproject holds it in (.git/modules/<name>), with its uncommitted state carried over.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo, run_module

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    client = docker.from_env()
    if not any(IMAGE in image.tags for image in client.images.list(name="agentbox/box")):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    return client


@pytest.fixture
def boxes(engine: docker.DockerClient) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        run_module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})


def in_box(engine: docker.DockerClient, name: str, script: str) -> tuple[int, str]:
    result = engine.containers.get(f"agentbox-{name}").exec_run(["bash", "-c", script], user="vscode")
    return result.exit_code, result.output.decode("utf-8", "replace")


def superproject(tmp_path: Path) -> Path:
    """A workspace with a first-level submodule (mod) and a deeper one (libs/deep)."""
    library = make_repo(tmp_path / "library", {"lib.txt": "library v1\n", "src/core.c": "int core;\n"})
    repo = make_repo(tmp_path / "ws", {"README.md": "super\n"})
    for path in ("mod", "libs/deep"):
        git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), path)
    git(repo, "commit", "-q", "-m", "submodules")
    return repo


def test_clean_submodules_are_checked_out_in_the_box(engine, boxes, tmp_path):
    repo = superproject(tmp_path)
    chown_tree(tmp_path)
    name = f"sm-{secrets.token_hex(3)}"
    boxes.append(name)
    made = run_module("agentbox_box", {"name": name, "workspace": str(repo)})
    assert made.get("failed") is not True, made
    subs = sorted(worktree["sub"] for worktree in made["seed"]["worktrees"])
    assert subs == ["", "libs/deep", "mod"]
    rc, out = in_box(engine, name, """
        set -e
        cd /workspace
        cat mod/lib.txt libs/deep/src/core.c
        git status --porcelain
        git -C mod rev-parse --abbrev-ref HEAD
        git -C libs/deep status --porcelain
    """)
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[:2] == ["library v1", "int core;"], out
    assert lines[2] == f"agentbox/{name}", out  # the superproject's status is clean; mod is on the box's branch
    # A commit in a submodule reaches that submodule's repository on the host by fetch.
    rc, out = in_box(engine, name, "cd /workspace/mod && echo boxed >> lib.txt && "
                     "git -c user.email=a@b -c user.name=a commit -qam 'in the submodule'")
    assert rc == 0, out
    fetched = run_module("agentbox_worktree", {"box": name, "state": "fetched"})
    assert fetched.get("failed") is not True, fetched
    assert git(repo / "mod", "log", "-1", "--format=%s", f"agentbox/{name}").strip() == "in the submodule"


def test_dirty_submodules_carry_their_changes(engine, boxes, tmp_path):
    repo = superproject(tmp_path)
    (repo / "mod" / "lib.txt").write_text("library, edited on the host\n")
    (repo / "mod" / "new-in-mod.txt").write_text("untracked in the submodule\n")
    (repo / "libs" / "deep" / "src" / "core.c").write_text("int core = 2;\n")
    git(repo / "libs" / "deep", "add", "src/core.c")
    (repo / "README.md").write_text("super, edited\n")
    chown_tree(tmp_path)
    before = subprocess.run(["git", "-C", str(repo), "stash", "list"], capture_output=True, text=True,
                            env={**os.environ, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
                                 "GIT_CONFIG_VALUE_0": "*"}, check=False).stdout
    name = f"smd-{secrets.token_hex(3)}"
    boxes.append(name)
    made = run_module("agentbox_box", {"name": name, "workspace": str(repo)})
    assert made.get("failed") is not True, made
    rc, out = in_box(engine, name, """
        set -e
        cd /workspace
        cat README.md mod/lib.txt mod/new-in-mod.txt libs/deep/src/core.c
        git -C libs/deep diff --cached --name-only
    """)
    assert rc == 0, out
    assert out.splitlines() == [
        "super, edited",
        "library, edited on the host",
        "untracked in the submodule",
        "int core = 2;",
        "src/core.c",
    ], out
    # The host's trees are as they were.
    assert (repo / "mod" / "lib.txt").read_text() == "library, edited on the host\n"
    assert git(repo / "libs" / "deep", "diff", "--cached", "--name-only").strip() == "src/core.c"
    assert subprocess.run(["git", "-C", str(repo), "stash", "list"], capture_output=True, text=True,
                          env={**os.environ, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
                               "GIT_CONFIG_VALUE_0": "*"}, check=False).stdout == before
