"""agentbox_init: writes the proposed agentbox.yaml, never replaces one without force, writes nothing in
check mode and returns the diff; in-process (the task) and through Ansible (module and action plugin)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.tasks._init_task import run_init_task
from tests.conftest import REPO, run_module

NODE_APP = {"package.json": json.dumps({"name": "a", "scripts": {"dev": "vite"}}), "package-lock.json": "{}"}


def workspace(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_writes_the_file_then_is_unchanged_on_a_second_run(tmp_path: Path) -> None:
    root = workspace(tmp_path, NODE_APP)
    result, warnings = run_init_task({"workspace": str(root), "force": False}, check_mode=False)
    assert result["changed"] and warnings == [] and result["classified"]
    assert (root / "agentbox.yaml").read_text() == result["content"]
    assert result["diff"]["before"] == "" and result["diff"]["before_header"] == "/dev/null"
    assert oct((root / "agentbox.yaml").stat().st_mode & 0o777) == "0o644"
    again, _warnings = run_init_task({"workspace": str(root), "force": False}, check_mode=False)
    assert not again["changed"] and "diff" not in again


def test_never_replaces_an_existing_file_without_force(tmp_path: Path) -> None:
    root = workspace(tmp_path, {**NODE_APP, "agentbox.yaml": "services:\n  mine: exec ./serve\n"})
    with pytest.raises(ValueError, match=r"agentbox\.yaml exists; nothing written: pass force=true"):
        run_init_task({"workspace": str(root), "force": False}, check_mode=False)
    assert (root / "agentbox.yaml").read_text() == "services:\n  mine: exec ./serve\n"
    result, _warnings = run_init_task({"workspace": str(root), "force": True}, check_mode=True)
    assert result["changed"] and result["diff"]["before"] == "services:\n  mine: exec ./serve\n"
    assert (root / "agentbox.yaml").read_text() == "services:\n  mine: exec ./serve\n"  # check mode: untouched
    result, _warnings = run_init_task({"workspace": str(root), "force": True}, check_mode=False)
    assert (root / "agentbox.yaml").read_text() == result["content"] != result["diff"]["before"]


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    root = workspace(tmp_path, NODE_APP)
    result, _warnings = run_init_task({"workspace": str(root), "force": False}, check_mode=True)
    assert result["changed"] and "exec npm run dev" in result["diff"]["after"]
    assert not (root / "agentbox.yaml").exists()


def test_a_workspace_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory: pass the project's directory"):
        run_init_task({"workspace": str(tmp_path / "gone"), "force": False}, check_mode=False)


def test_through_ansible_the_module_reports_and_refuses_like_the_task(tmp_path: Path) -> None:
    root = workspace(tmp_path, NODE_APP)
    result = run_module("agentbox_init", {"workspace": str(root)})
    assert not result["failed"] and result["changed"] and result["web_port"] == 5173
    assert result["tasks"] == ["install"] and result["services"] == ["web"]
    assert "not validated" not in result["_stderr"]  # the action plugin ran it beside the supervisor's validator
    refused = run_module("agentbox_init", {"workspace": str(root), "force": False})
    assert not refused["failed"] and not refused["changed"]  # the same text: nothing to do
    (root / "agentbox.yaml").write_text("tasks: {}\n")
    refused = run_module("agentbox_init", {"workspace": str(root)})
    assert refused["failed"] and "exists; nothing written: pass force=true" in refused["msg"]


def test_the_playbook_shows_the_diff_in_check_mode_and_writes_nothing(tmp_path: Path) -> None:
    root = workspace(tmp_path, NODE_APP)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "PWD": str(root)}
    ran = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/init.yml"), "--check", "--diff"],
                         cwd=root, env=env, capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"+++ after: {root}/agentbox.yaml" in ran.stdout and "+    command: exec npm run dev" in ran.stdout
    assert f"would write: {root}/agentbox.yaml" in ran.stdout and "--check: no box made" not in ran.stdout
    assert not (root / "agentbox.yaml").exists()


def test_the_playbook_on_an_unclassifiable_workspace_writes_a_minimal_file_and_makes_no_box(tmp_path: Path) -> None:
    root = workspace(tmp_path, {"notes.txt": "nothing to build\n"})
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "PWD": str(root)}
    ran = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), str(REPO / "playbooks/init.yml"),
                          "-e", "checkpoint=true"], cwd=root, env=env, capture_output=True, text=True, check=False)
    printed = " ".join(ran.stdout.split())
    assert f"wrote: {root}/agentbox.yaml" in printed
    assert "fill in: could not tell how to install or run this project: fill in tasks.install" in printed
    assert "# tasks:\n#   install:" in (root / "agentbox.yaml").read_text()  # the commented example
    # checkpoint=true stops before any box is made, and says why.
    assert ran.returncode != 0 and "agentbox.yaml has no install task to keep in a checkpoint" in printed
    assert "Create the set-up box" not in ran.stdout
