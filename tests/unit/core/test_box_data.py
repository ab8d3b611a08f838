"""Host-side checks of what a box wrote (seed record, git's answers, the restore's answer): hostile
values are refused with a message, well-formed ones come through unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._box_data import (
    BoxDataError,
    head_line,
    object_id,
    own_branch,
    restore_answer,
    seed_record,
)

SHA1 = "a" * 40
SHA256 = "b" * 64


def record(**worktree: Any) -> dict[str, Any]:
    entry = {"sub": "", "path": "/home/vscode/.agentbox-worktrees/b1", "branch": "agentbox/b1", "base": SHA1,
             **worktree}
    return {"mode": "worktree", "branch": "agentbox/b1", "base_commit": SHA1, "worktrees": [entry], "warnings": []}


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


def test_a_well_formed_seed_record_comes_through() -> None:
    good = record(sub="libs/core", base=SHA256)
    assert seed_record(encoded(good), "b1") == good
    assert seed_record(encoded({"mode": "copy", "branch": None, "base_commit": None, "worktrees": []}), "b1")


@pytest.mark.parametrize("hostile", [
    {"branch": "main:refs/heads/main"},  # a refspec: would move the host's main
    {"branch": "refs/heads/main"},
    {"branch": "--delete"},
    {"branch": "a..b"},
    {"branch": 7},
    {"base": "HEAD~3"},
    {"base": "--output=/etc/passwd"},
    {"base": SHA1[:39]},
    {"sub": "../../etc"},
    {"sub": "/etc"},
    {"sub": "a/../../b"},
    {"path": "relative/path"},
    {"path": "/x\n/y"},
])
def test_hostile_seed_record_values_are_refused(hostile: dict[str, Any]) -> None:
    with pytest.raises(BoxDataError, match=r"the seed record.*written by the box"):
        seed_record(encoded(record(**hostile)), "b1")


@pytest.mark.parametrize("data", [
    b"not json", b"[1, 2]", b'"text"', b"\xff\xfe",
    encoded({"mode": "worktree", "worktrees": [{}] * 300}),
    encoded({"mode": "sideways", "worktrees": []}),
    encoded({"mode": "copy", "worktrees": "all"}),
    encoded({"mode": "copy", "worktrees": [], "warnings": ["x" * 10000]}),
    b"{" + b" " * (5 << 20) + b"}",
])
def test_malformed_or_oversized_seed_records_are_refused(data: bytes) -> None:
    with pytest.raises(BoxDataError):
        seed_record(data, "b1")


def test_only_the_box_own_branch_may_be_named() -> None:
    assert own_branch({"branch": "agentbox/b1"}, "agentbox/b1", "b1") == "agentbox/b1"
    with pytest.raises(BoxDataError, match="names branch 'main', not the box's own"):
        own_branch({"branch": "main"}, "agentbox/b1", "b1")
    with pytest.raises(BoxDataError):
        own_branch({"branch": ""}, "", "b1")


@pytest.mark.parametrize("value", ["-d", "HEAD", "main", SHA1.upper(), SHA1 + "a", " " + SHA1, "", None, 12])
def test_object_ids_are_full_lowercase_hex(value: Any) -> None:
    with pytest.raises(BoxDataError, match="is not a git object id"):
        object_id(value, "the tip", "b1")


def test_head_lines_from_the_box() -> None:
    assert head_line(SHA1, "-", "w", "b1") == (SHA1, "")
    assert head_line(SHA256, "feature/x", "w", "b1") == (SHA256, "feature/x")
    for commit, branch in (("--all", "-"), (SHA1, "--force"), (SHA1, "x:y"), (SHA1, "has space")):
        with pytest.raises(BoxDataError):
            head_line(commit, branch, "w", "b1")


def outcome(**fields: Any) -> dict[str, Any]:
    return {"sub": "", "physical": "/home/vscode/.agentbox-worktrees/b1", "merge": "merged", "merge_commit": SHA1,
            "head": SHA1, "conflicts": [{"path": "a.txt", "kind": "merge", "kept": "box", "detail": "both"}],
            "untracked_existing": {"notes.txt": SHA1}, "untracked_blocked": ["dir/x"], "seconds": {"merge": 0.1},
            **fields}


def answer(*outcomes: dict[str, Any]) -> bytes:
    return b"progress line\n" + encoded({"worktrees": list(outcomes)}) + b"\n"


def test_a_well_formed_restore_answer_comes_through() -> None:
    asked = {"": ["notes.txt", "dir/x", "other.txt"]}
    [got] = restore_answer(answer(outcome()), asked, "b1")
    assert got == outcome()


@pytest.mark.parametrize("hostile", [
    {"sub": "elsewhere"},  # a repository the host did not ask about
    {"untracked_existing": {"/etc/shadow": SHA1}},  # the host would hash its own file at that path
    {"untracked_existing": {"../../.ssh/id_rsa": SHA1}},
    {"untracked_blocked": ["not-asked.txt"]},
    {"untracked_existing": {"notes.txt": "; rm -rf /"}},
    {"head": "HEAD"},
    {"merge_commit": "main"},
    {"conflicts": [{"path": "a", "repo": ["override"], "kind": 1}]},
    {"conflicts": "many"},
    {"physical": "relative"},
])
def test_hostile_restore_answers_are_refused(hostile: dict[str, Any]) -> None:
    with pytest.raises(BoxDataError, match="written by the box"):
        restore_answer(answer(outcome(**hostile)), {"": ["notes.txt", "dir/x"]}, "b1")


def test_a_restore_answer_must_cover_each_repository_once() -> None:
    asked: dict[str, list[str]] = {"": ["notes.txt", "dir/x"], "sub": []}
    with pytest.raises(BoxDataError, match="leaves out sub"):
        restore_answer(answer(outcome()), asked, "b1")
    with pytest.raises(BoxDataError, match="did not ask about"):
        restore_answer(answer(outcome(), outcome()), asked, "b1")
    with pytest.raises(BoxDataError, match="is not JSON"):
        restore_answer(b"", asked, "b1")


def test_conflicts_keep_only_their_four_texts() -> None:
    [got] = restore_answer(answer(outcome(conflicts=[{"path": "a", "kind": "merge", "repo": "forged"}])),
                           {"": ["notes.txt", "dir/x"]}, "b1")
    assert got["conflicts"] == [{"path": "a", "kind": "merge", "kept": "", "detail": ""}]
