"""Bad input to a create: each is a clear error before any side effect (real engine, real git)."""

from __future__ import annotations

import secrets
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, git, make_repo, run_module

pytestmark = pytest.mark.integration


def box_name() -> str:
    return f"bad-{secrets.token_hex(3)}"


def nothing_made(name: str, repo: Path | None) -> None:
    """No container, no volume, no agentbox branch and no worktree registration was left."""
    client = docker.from_env()
    assert not client.containers.list(all=True, filters={"name": f"^agentbox-{name.strip()}$"})
    assert not client.volumes.list(filters={"label": f"io.agentbox.box={name.strip()}"})
    if repo is not None:
        assert git(repo, "for-each-ref", "refs/heads/agentbox/") == ""
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def create(workspace: Path | str, name: str | None, **extra: object) -> dict:
    args: dict[str, object] = {"workspace": str(workspace), "state": "started", **extra}
    if name is not None:
        args["name"] = name
    return run_module("agentbox_box", args)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    made = make_repo(tmp_path / "ws", {"README.md": "hello\n", "a.txt": "base\n"})
    chown_tree(made)
    return made


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("fix\n", "use 1-63 characters"),
        ("fix.lock", "ending in '.lock'"),
        ("fix..login", "containing '..'"),
        ("fix.", "or '.'"),
    ],
)
def test_box_names_git_refuses_fail_before_any_side_effect(repo: Path, name: str, why: str) -> None:
    result = create(repo, name)
    assert result["failed"], result
    assert "invalid box name" in result["msg"] and why in result["msg"]
    nothing_made(name, repo)


def test_an_empty_box_name_says_so(repo: Path) -> None:
    result = create(repo, "")
    assert result["failed"], result
    assert "the box name is empty" in result["msg"] and "leave it out" in result["msg"]
    nothing_made("", repo)


def test_a_bare_repository_is_refused_not_copied(repo: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    origin = make_repo(tmp_path / "origin")  # the controller's own: cloning it needs no safe.directory
    git(tmp_path, "clone", "-q", "--bare", str(origin), str(bare))
    name = box_name()
    result = create(bare, name)
    assert result["failed"], result
    assert "is a bare git repository" in result["msg"] and "worktree add" in result["msg"]
    nothing_made(name, repo)
    # Passing the .git directory of a normal checkout is the same mistake.
    result = create(repo / ".git", name)
    assert result["failed"] and "bare git repository (or a .git directory)" in result["msg"], result
    nothing_made(name, repo)


@pytest.mark.parametrize(("directory", "why"), [("with:colon", "contains ':'"), ("with\nnewline", "line break")])
def test_workspace_paths_docker_or_git_would_cut_apart_are_refused(tmp_path: Path, directory: str, why: str) -> None:
    workspace = make_repo(tmp_path / directory)
    chown_tree(workspace)
    name = box_name()
    result = create(workspace, name)
    assert result["failed"], result
    assert why in result["msg"] and "move or clone" in result["msg"]
    nothing_made(name, workspace)


def test_a_repository_in_the_middle_of_a_merge_says_what_to_do(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "a.txt").write_text("side\n")
    git(repo, "commit", "-q", "-am", "side")
    git(repo, "checkout", "-q", "main")
    (repo / "a.txt").write_text("main\n")
    git(repo, "commit", "-q", "-am", "main")
    git(repo, "merge", "-q", "side", check=False)  # conflicts: MERGE_HEAD stays
    assert (repo / ".git" / "MERGE_HEAD").exists()
    index_before = (repo / ".git" / "index").read_bytes()
    name = box_name()
    result = create(repo, name)
    assert result["failed"], result
    assert "in the middle of a merge" in result["msg"] and "git merge --abort" in result["msg"]
    nothing_made(name, repo)
    assert (repo / ".git" / "index").read_bytes() == index_before


def test_a_repository_in_the_middle_of_a_rebase_says_what_to_do(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "topic")
    (repo / "a.txt").write_text("topic\n")
    git(repo, "commit", "-q", "-am", "topic")
    git(repo, "checkout", "-q", "main")
    (repo / "a.txt").write_text("main\n")
    git(repo, "commit", "-q", "-am", "main")
    git(repo, "checkout", "-q", "topic")
    git(repo, "rebase", "-q", "main", check=False)  # conflicts: rebase-merge/ stays
    assert (repo / ".git" / "rebase-merge").is_dir() or (repo / ".git" / "rebase-apply").is_dir()
    name = box_name()
    result = create(repo, name)
    assert result["failed"], result
    assert "in the middle of a rebase" in result["msg"] and "git rebase --continue" in result["msg"]
    nothing_made(name, repo)


def test_an_invalid_agentbox_yaml_fails_create_with_every_problem(repo: Path) -> None:
    (repo / "agentbox.yaml").write_text(
        "tasks:\n  install:\n    command: 5\n    needs: [nothere]\n"
        "services:\n  web:\n    command: ./web\n    restart: sometimes\n    needs: [ghost]\n"
    )
    chown_tree(repo)
    name = box_name()
    result = create(repo, name)
    assert result["failed"], result
    message = result["msg"]
    assert "agentbox.yaml is invalid (4 errors)" in message, message
    for expected in (
        "agentbox.yaml:3: error: tasks.install.command",
        "agentbox.yaml:4: error: tasks.install.needs[0]: unknown unit 'nothere'",
        "agentbox.yaml:8: error: services.web.restart",
        "agentbox.yaml:9: error: services.web.needs[0]: unknown unit 'ghost'",
    ):
        assert expected in message, message
    nothing_made(name, repo)


def test_a_name_too_long_for_the_container_hostname_fails_before_any_side_effect(repo: Path) -> None:
    """The name rule allows 63 characters, but a Docker box's hostname is agentbox-<box> and Linux takes
    at most 64 (runc: `sethostname: invalid argument`): 55 is the longest name a Docker box can take."""
    stem = f"long-{secrets.token_hex(3)}-"
    too_long = stem + "x" * (56 - len(stem))
    result = create(repo, too_long)
    assert result["failed"], result
    assert f"box name '{too_long}' is 56 characters" in result["msg"], result["msg"]
    assert "hostname" in result["msg"] and "at most 55" in result["msg"], result["msg"]
    nothing_made(too_long, repo)
    longest = stem + "y" * (55 - len(stem))
    try:
        made = create(repo, longest, boot=False, checkpoint="none")
        assert not made.get("failed"), made.get("msg")
        hostname = docker.from_env().containers.get(f"agentbox-{longest}").attrs["Config"]["Hostname"]
        assert hostname == f"agentbox-{longest}"  # the contract's "hostname the same" holds
    finally:
        run_module("agentbox_box", {"name": longest, "state": "absent", "delete_branch": True})
