"""agentbox_box run in-process (tests/unit/support/inprocess.py) on the fake provider standing in for the
local engine: bad input fails with a message saying what to do and leaves nothing (no box, no branch, no
worktree registration, no journal); check mode reports the change and makes none; diff; state: present
creates a missing box and then leaves its run state alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import git, make_repo
from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import run_module_inprocess


def repo_at(path: Path) -> Path:
    return make_repo(path, {"README.md": "hello\n", "a.txt": "base\n"})


def nothing_made(fake: FakeProvider, home: Path, repo: Path | None) -> None:
    """No box, no journal, no agentbox branch and no worktree registration was left."""
    assert fake.boxes == {}
    journals = home / ".agentbox" / "creating"
    assert not journals.exists() or not list(journals.rglob("*.json"))
    if repo is not None:
        assert git(repo, "for-each-ref", "refs/heads/agentbox/") == ""
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def create(workspace: Path | str, name: str | None, **extra: object) -> dict:
    args: dict[str, object] = {"workspace": str(workspace), "state": "started", **extra}
    if name is not None:
        args["name"] = name
    return run_module_inprocess("agentbox_box", args)


BAD_NAMES = [
    ("fix\n", "use 1-63 characters"),
    ("fix.lock", "ending in '.lock'"),
    ("fix..login", "containing '..'"),
    ("fix.", "or '.'"),
    ("../x", "a-z, 0-9"),
    ("a;rm -rf", "a-z, 0-9"),
    ("UPPER", "a-z, 0-9"),
    ("x" * 70, "a-z, 0-9"),
    ("-lead", "a-z, 0-9"),
]


@pytest.mark.parametrize(("name", "why"), BAD_NAMES, ids=[repr(name)[:20] for name, _why in BAD_NAMES])
def test_invalid_box_names_fail_before_any_side_effect(fake_docker: FakeProvider, home: Path, tmp_path: Path,
                                                       name: str, why: str) -> None:  # fmt: skip
    repo = repo_at(tmp_path / "ws")
    result = create(repo, name)
    assert result["failed"], result
    assert "invalid box name" in result["msg"] and why in result["msg"], result["msg"]
    nothing_made(fake_docker, home, repo)


def test_an_empty_box_name_says_so(fake_docker: FakeProvider, home: Path, tmp_path: Path) -> None:
    repo = repo_at(tmp_path / "ws")
    result = create(repo, "")
    assert result["failed"], result
    assert "the box name is empty" in result["msg"] and "leave it out" in result["msg"]
    nothing_made(fake_docker, home, repo)


@pytest.mark.parametrize("state", ["stopped", "paused", "absent"])
def test_a_state_change_without_a_name_says_name_is_required(fake_docker: FakeProvider, home: Path,
                                                             state: str) -> None:  # fmt: skip
    result = run_module_inprocess("agentbox_box", {"state": state})
    assert result["failed"] and f"'name' is required with state={state}" in result["msg"], result


@pytest.mark.parametrize("state", ["stopped", "paused"])
def test_stopping_a_box_that_does_not_exist_says_create_it_first(fake_docker: FakeProvider, home: Path,
                                                                 state: str) -> None:  # fmt: skip
    result = run_module_inprocess("agentbox_box", {"name": "nobox", "state": state})
    assert result["failed"] and "no box called 'nobox'" in result["msg"] and "create it first" in result["msg"]
    assert fake_docker.boxes == {}


def test_a_bare_repository_is_refused_not_copied(fake_docker: FakeProvider, home: Path, tmp_path: Path) -> None:
    repo = repo_at(tmp_path / "ws")
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    result = create(bare, "b1")
    assert result["failed"], result
    assert "is a bare git repository" in result["msg"] and "worktree add" in result["msg"]
    nothing_made(fake_docker, home, repo)
    # Passing the .git directory of a normal checkout is the same mistake.
    result = create(repo / ".git", "b1")
    assert result["failed"] and "bare git repository (or a .git directory)" in result["msg"], result
    nothing_made(fake_docker, home, repo)


@pytest.mark.parametrize(("directory", "why"), [("with:colon", "contains ':'"), ("with\nnewline", "line break")])
def test_workspace_paths_docker_or_git_would_cut_apart_are_refused(fake_docker: FakeProvider, home: Path,
                                                                   tmp_path: Path, directory: str,
                                                                   why: str) -> None:  # fmt: skip
    workspace = repo_at(tmp_path / directory)
    result = create(workspace, "b1")
    assert result["failed"], result
    assert why in result["msg"] and "move or clone" in result["msg"], result["msg"]
    nothing_made(fake_docker, home, workspace)


def test_a_missing_workspace_or_one_without_commits_is_refused(fake_docker: FakeProvider, home: Path,
                                                               tmp_path: Path) -> None:  # fmt: skip
    missing = create(tmp_path / "nope", "b1")
    assert missing["failed"] and "is not a directory" in missing["msg"], missing
    empty = tmp_path / "norepo"
    empty.mkdir()
    git(empty, "init", "-q")
    no_commits = create(empty, "b1")
    assert no_commits["failed"] and "no commits yet" in no_commits["msg"], no_commits
    nothing_made(fake_docker, home, None)


def test_a_repository_in_the_middle_of_a_merge_says_what_to_do(fake_docker: FakeProvider, home: Path,
                                                               tmp_path: Path) -> None:  # fmt: skip
    repo = repo_at(tmp_path / "ws")
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "a.txt").write_text("side\n")
    git(repo, "commit", "-q", "-am", "side")
    git(repo, "checkout", "-q", "main")
    (repo / "a.txt").write_text("main\n")
    git(repo, "commit", "-q", "-am", "main")
    git(repo, "merge", "-q", "side", check=False)  # conflicts: MERGE_HEAD stays
    assert (repo / ".git" / "MERGE_HEAD").exists()
    index_before = (repo / ".git" / "index").read_bytes()
    result = create(repo, "b1")
    assert result["failed"], result
    assert "in the middle of a merge" in result["msg"] and "git merge --abort" in result["msg"]
    nothing_made(fake_docker, home, repo)
    assert (repo / ".git" / "index").read_bytes() == index_before


def test_a_repository_in_the_middle_of_a_rebase_says_what_to_do(fake_docker: FakeProvider, home: Path,
                                                                tmp_path: Path) -> None:  # fmt: skip
    repo = repo_at(tmp_path / "ws")
    git(repo, "checkout", "-q", "-b", "topic")
    (repo / "a.txt").write_text("topic\n")
    git(repo, "commit", "-q", "-am", "topic")
    git(repo, "checkout", "-q", "main")
    (repo / "a.txt").write_text("main\n")
    git(repo, "commit", "-q", "-am", "main")
    git(repo, "checkout", "-q", "topic")
    git(repo, "rebase", "-q", "main", check=False)  # conflicts: rebase-merge/ stays
    assert (repo / ".git" / "rebase-merge").is_dir() or (repo / ".git" / "rebase-apply").is_dir()
    result = create(repo, "b1")
    assert result["failed"], result
    assert "in the middle of a rebase" in result["msg"] and "git rebase --continue" in result["msg"]
    nothing_made(fake_docker, home, repo)


def test_an_invalid_agentbox_yaml_fails_create_with_every_problem(fake_docker: FakeProvider, home: Path,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    repo = repo_at(tmp_path / "ws")
    (repo / "agentbox.yaml").write_text(
        "tasks:\n  install:\n    command: 5\n    needs: [nothere]\n"
        "services:\n  web:\n    command: ./web\n    restart: sometimes\n    needs: [ghost]\n"
    )
    result = create(repo, "b1")
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
    nothing_made(fake_docker, home, repo)


def test_check_mode_reports_the_box_it_would_make_and_makes_nothing(fake_docker: FakeProvider, home: Path,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    repo = repo_at(tmp_path / "ws")
    planned = run_module_inprocess("agentbox_box", {"name": "b1", "workspace": str(repo)}, check_mode=True, diff=True)
    assert planned["failed"] is False and planned["changed"] is True, planned
    box = planned["box"]
    assert (box["name"], box["state"], box["provider"], box["branch"]) == ("b1", "running", fake_docker.name, "agentbox/b1")
    assert box["workspace"] == str(repo) and box["container"] == "agentbox-b1"
    assert planned["diff"] == {"before": {}, "after": box}
    nothing_made(fake_docker, home, repo)


def test_state_present_creates_then_leaves_the_run_state_alone(fake_docker: FakeProvider, home: Path,
                                                               tmp_path: Path) -> None:  # fmt: skip
    """Moved from the integration layer (test_box_options.py): the module's state logic on the fake provider;
    with check mode and diff at each step, and absent at the end."""
    repo = repo_at(tmp_path / "ws")
    present = {"name": "b1", "workspace": str(repo), "state": "present", "boot": False}
    created = run_module_inprocess("agentbox_box", present, diff=True)
    assert created["failed"] is False and created["changed"] is True, created
    assert created["box"]["state"] == "running" and fake_docker.find("b1").state == "running"  # made and started
    assert created["diff"]["before"] == {} and created["diff"]["after"]["name"] == "b1"
    for key in ("box", "seed", "boot", "access", "ssh_command", "carried_secret"):  # RETURN's keys of a create
        assert key in created, key

    again = run_module_inprocess("agentbox_box", present)
    assert again["changed"] is False and again["box"]["state"] == "running", again

    would_stop = run_module_inprocess("agentbox_box", {"name": "b1", "state": "stopped"}, check_mode=True, diff=True)
    assert would_stop["changed"] is True and would_stop["box"]["state"] == "stopped", would_stop
    assert would_stop["diff"]["before"]["state"] == "running" and would_stop["diff"]["after"]["state"] == "stopped"
    assert fake_docker.find("b1").state == "running"  # check mode stopped nothing

    stopped = run_module_inprocess("agentbox_box", {"name": "b1", "state": "stopped"})
    assert stopped["changed"] is True and stopped["box"]["state"] == "stopped", stopped
    still = run_module_inprocess("agentbox_box", present)
    assert still["changed"] is False and still["box"]["state"] == "stopped", still
    assert fake_docker.find("b1").state == "stopped"  # present does not start it
    assert run_module_inprocess("agentbox_box", {"name": "b1", "state": "stopped"})["changed"] is False

    would_go = run_module_inprocess("agentbox_box", {"name": "b1", "state": "absent"}, check_mode=True, diff=True)
    assert would_go["changed"] is True and would_go["box"] == {} and "destroyed" not in would_go, would_go
    assert would_go["diff"]["before"]["name"] == "b1" and would_go["diff"]["after"] == {}
    assert fake_docker.find("b1") is not None  # check mode destroyed nothing

    gone = run_module_inprocess("agentbox_box", {"name": "b1", "state": "absent", "delete_branch": True})
    assert gone["changed"] is True and gone["destroyed"]["box_removed"] is True, gone
    nothing_made(fake_docker, home, repo)
    assert run_module_inprocess("agentbox_box", {"name": "b1", "state": "absent"})["changed"] is False


def test_a_box_name_taken_by_another_project_is_refused(fake_docker: FakeProvider, home: Path, tmp_path: Path) -> None:
    repo, other = repo_at(tmp_path / "ws"), repo_at(tmp_path / "other")
    assert create(repo, "b1", boot=False)["changed"] is True
    taken = create(other, "b1", boot=False)
    assert taken["failed"] and "already used by another project" in taken["msg"], taken
    assert git(other, "for-each-ref", "refs/heads/agentbox/") == ""


def test_an_engine_that_does_not_answer_is_named_with_what_to_do(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Docker provider, pointed at a box engine socket where nothing listens: its own script and
    isolation=none are named. (A create with isolation=none also looks for the name on the box engine, so the
    user's engine down is proven in the integration layer, with a box engine that answers.)"""
    repo = repo_at(tmp_path / "ws")
    monkeypatch.setenv("AGENTBOX_ENGINE", "unix:///nonexistent.sock")
    down = create(repo, "b1")
    assert down["failed"] and "box engine at unix:///nonexistent.sock does not answer" in down["msg"], down
    assert "ensure-box-engine.sh" in down["msg"] and "isolation=none" in down["msg"]
    assert git(repo, "for-each-ref", "refs/heads/agentbox/") == ""
