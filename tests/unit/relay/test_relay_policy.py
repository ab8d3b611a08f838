"""The relay's policy file and the CI configuration a push carries: which files count, which commits are new
(against the remote and the user's own branches, in a real repository), and the approval it asks for."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_ops, _relay_policy
from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_protocol import approval_reason, parse_request
from tests.conftest import git, make_repo

OWN = "agentbox/fix-login"


def push(**args: object):
    return parse_request(json.dumps({"v": 1, "op": "git.push", "args": args}).encode())


def test_ci_files_by_directory_name_and_pattern() -> None:
    paths = [".github/workflows/ci.yml", ".github/workflows/sub/x.yaml", ".github/CODEOWNERS", ".gitlab-ci.yml",
             "sub/.gitlab-ci.yml", "Jenkinsfile", "src/Jenkinsfile", "README.md", ".circleci/config.yml"]
    found = _relay_policy.ci_files(paths, _relay_policy.DEFAULT_CI_PATHS)
    assert found == [".circleci/config.yml", ".github/workflows/ci.yml", ".github/workflows/sub/x.yaml",
                     ".gitlab-ci.yml", "Jenkinsfile"]
    assert _relay_policy.ci_files(["deploy/prod.sh", "ci/a.sh", "x/Makefile"], ["deploy/", "*Makefile"]) == [
        "deploy/prod.sh", "x/Makefile"]


def test_the_policy_file_replaces_or_extends_the_list_and_bad_values_keep_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    default = _relay_policy.load(str(path))
    assert default["ci_paths"] == _relay_policy.DEFAULT_CI_PATHS and default["problems"] == []
    assert (default["box_checkpoints"], default["box_checkpoint_bytes"]) == (5, 20 << 30)
    path.write_text(json.dumps({"ci_paths_extra": ["deploy/"], "box_checkpoints": 2, "box_checkpoint_bytes": 1000}))
    extended = _relay_policy.load(str(path))
    assert extended["ci_paths"] == (*_relay_policy.DEFAULT_CI_PATHS, "deploy/")
    assert (extended["box_checkpoints"], extended["box_checkpoint_bytes"]) == (2, 1000)
    path.write_text(json.dumps({"ci_paths": ["ci/"], "ci_paths_extra": ["deploy/"]}))
    assert _relay_policy.load(str(path))["ci_paths"] == ("ci/", "deploy/")
    path.write_text(json.dumps({"ci_paths": "ci/", "box_checkpoints": -1, "box_checkpoint_bytes": True, "x": 1}))
    bad = _relay_policy.load(str(path))
    assert bad["ci_paths"] == _relay_policy.DEFAULT_CI_PATHS and bad["box_checkpoints"] == 5
    assert bad["box_checkpoint_bytes"] == 20 << 30 and len(bad["problems"]) == 4
    path.write_text("not json")
    assert _relay_policy.load(str(path))["problems"] and _relay_policy.load(str(path))["ci_paths"]


def test_ci_changes_counts_only_what_the_remote_and_the_users_branches_lack(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "ws", {"README.md": "hello\n", ".github/workflows/ci.yml": "on: push\n"})
    patterns = _relay_policy.DEFAULT_CI_PATHS

    def commit(branch: str, files: dict[str, str], message: str) -> str:
        git(repo, "checkout", "-q", branch)
        for name, text in files.items():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message)
        return git(repo, "rev-parse", "HEAD").strip()

    git(repo, "branch", OWN)
    plain = commit(OWN, {"src.py": "x = 1\n"}, "code only")
    assert _relay_ops.ci_changes(str(repo), plain, "origin", patterns) == []
    # The user changes CI on main; the box merges main: what main has is the user's, nothing to ask.
    commit("main", {".github/workflows/ci.yml": "on: [push, pull_request]\n"}, "the user's CI change")
    git(repo, "checkout", "-q", OWN)
    git(repo, "merge", "-q", "--no-edit", "main")
    merged = git(repo, "rev-parse", "HEAD").strip()
    assert _relay_ops.ci_changes(str(repo), merged, "origin", patterns) == []
    # The box's own change to a workflow, and a new one: asked, whatever the commits after them do.
    changed = commit(OWN, {".github/workflows/ci.yml": "on: push\njobs: {steal: {}}\n",
                           ".github/workflows/new.yml": "on: push\n"}, "the box's CI change")
    later = commit(OWN, {"src.py": "x = 2\n"}, "more code")
    workflows = [".github/workflows/ci.yml", ".github/workflows/new.yml"]
    assert _relay_ops.ci_changes(str(repo), later, "origin", patterns) == workflows
    # Once the remote has that commit (pushed, approved), later pushes bring nothing new of CI.
    git(repo, "update-ref", f"refs/remotes/origin/{OWN}", changed)
    assert _relay_ops.ci_changes(str(repo), later, "origin", patterns) == []
    assert _relay_ops.ci_changes(str(repo), later, "upstream", patterns) != []  # another remote has not
    # Another box's branch is no vouching for a commit: it is not the user's.
    git(repo, "update-ref", "-d", f"refs/remotes/origin/{OWN}")
    git(repo, "branch", "-f", "agentbox/other", changed)
    assert _relay_ops.ci_changes(str(repo), later, "origin", patterns) != []
    assert _relay_ops.ci_changes(str(repo), later, "origin", ()) == []  # an empty list asks nothing


def test_a_push_that_changes_ci_waits_for_the_user_with_the_files_named() -> None:
    assert approval_reason(push(), OWN, [".github/workflows/ci.yml"]) == (
        "adds or changes CI configuration (.github/workflows/ci.yml)")
    many = [f".github/workflows/{n}.yml" for n in range(7)]
    assert approval_reason(push(), OWN, many).endswith("/4.yml and 2 more)")
    both = approval_reason(push(**{"as": "main"}), OWN, [".gitlab-ci.yml"])
    assert both == (f"pushes to main, which is not the box's own branch {OWN}; "
                    "adds or changes CI configuration (.gitlab-ci.yml)")
    assert approval_reason(push(), OWN, []) is None
    assert approval_reason(push(delete=True, **{"as": "x"}), OWN, [".gitlab-ci.yml"]) == "deletes the remote branch x"
