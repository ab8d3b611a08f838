"""The project's egress policy in agentbox.yaml (`egress:`, `egress_allow:`), as agentbox_box's create reads it,
run in-process on the fake provider standing in for the local engine: each create option wins over the same
key of the file; a bad word, a malformed host pattern or a list that blocks an agent's own API host in the
file is refused at create naming the file's line and what to write instead, and nothing is made; a provider
that cannot hold a box to the gateway says the file's policy does not apply there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import git, make_repo
from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import run_module_inprocess

PROJECT = "egress: open\negress_allow:\n  - pypi.corp.example\n  - '*.corp.example'\ntasks:\n  hello: echo hello\n"


def workspace(tmp_path: Path, project: str) -> Path:
    return make_repo(tmp_path / "ws", {"README.md": "hello\n", "agentbox.yaml": project})


def plan(repo: Path, **options: object) -> dict:
    """The create in check mode: the policy it would give the box, nothing made."""
    return run_module_inprocess("agentbox_box", {"name": "b1", "workspace": str(repo), **options}, check_mode=True)


def nothing_made(fake: FakeProvider, home: Path, repo: Path) -> None:
    assert fake.boxes == {}
    journals = home / ".agentbox" / "creating"
    assert not journals.exists() or not list(journals.rglob("*.json"))
    assert not (home / ".agentbox" / "relay" / "boxes").exists()
    assert git(repo, "for-each-ref", "refs/heads/agentbox/") == ""


@pytest.fixture
def holding(fake_docker: FakeProvider) -> FakeProvider:
    fake_docker.holds_egress = True  # as the local box engine answers
    return fake_docker


def test_the_files_policy_is_the_boxs_and_each_create_option_wins_over_its_key(
    holding: FakeProvider, home: Path, tmp_path: Path
) -> None:
    repo = workspace(tmp_path, PROJECT)
    planned = plan(repo)
    assert planned["failed"] is False, planned
    assert planned["egress"] == {"egress": "open", "egress_allow": ["pypi.corp.example", "*.corp.example"]}
    # The option's key wins; the file's other key stays.
    planned = plan(repo, egress="none")
    assert planned["egress"] == {"egress": "none", "egress_allow": ["pypi.corp.example", "*.corp.example"]}
    planned = plan(repo, egress_allow=["registry.corp.example"])
    assert planned["egress"] == {"egress": "open", "egress_allow": ["registry.corp.example"]}
    # One string of names in the file; no file key: no policy (the open network; allowlist when the default).
    (repo / "agentbox.yaml").write_text("egress_allow: a.corp.example, b.corp.example\n")
    assert plan(repo)["egress"] == {"egress": "allowlist", "egress_allow": ["a.corp.example", "b.corp.example"]}
    (repo / "agentbox.yaml").write_text("tasks: {hello: echo hello}\n")
    assert plan(repo)["egress"] is None
    nothing_made(holding, home, repo)


BAD_FILES = [
    ("egress: opne\n", "agentbox.yaml:1: error: egress: expected allowlist (the default list plus egress_allow), "
                       "open (any public host, audited) or none (no network), got str 'opne'; did you mean 'open'?"),
    ("egress_allow:\n  - pypi.org\n  - https://github.com/org/repo\n",
     "agentbox.yaml:3: egress_allow: 'https://github.com/org/repo' is a URL, not a host name: write github.com"),
    ("egress_allow: [pypi.org, '*github.com']\n",
     "agentbox.yaml:1: egress_allow: '*github.com': a wildcard is only `*.` at the start of a name: write *.github.com"),
    ("egress_allow: [registry.corp.example:8443]\n",
     "agentbox.yaml:1: egress_allow: 'registry.corp.example:8443' names a port: write registry.corp.example"),
    ("egress: allowlist\negress_allow:\n  - pypi.corp.example\n  - -api.anthropic.com\n",
     "agentbox.yaml:4: egress_allow takes the agent's own API host off the list (api.anthropic.com): remove "
     "-api.anthropic.com from egress_allow"),
    ("egress_allow:\n  - pypi.org\n  - 8080\n", "agentbox.yaml:3: error: egress_allow[1]: expected a string"),
]


@pytest.mark.parametrize(("project", "said"), BAD_FILES, ids=[said.split(": ", 2)[1][:30] for _p, said in BAD_FILES])
def test_a_bad_policy_in_the_file_is_refused_at_create_naming_its_line_and_nothing_is_made(
    holding: FakeProvider, home: Path, tmp_path: Path, project: str, said: str
) -> None:
    repo = workspace(tmp_path, project)
    refused = run_module_inprocess("agentbox_box", {"name": "b1", "workspace": str(repo)})
    assert refused["failed"] and f"{repo}/{said}" in refused["msg"], refused["msg"]
    nothing_made(holding, home, repo)


def test_an_option_that_fixes_the_files_bad_entry_wins_and_a_bad_option_names_no_line(
    holding: FakeProvider, home: Path, tmp_path: Path
) -> None:
    repo = workspace(tmp_path, "egress_allow: ['*github.com']\n")
    assert plan(repo, egress_allow=["*.github.com"])["egress"] == {"egress": "allowlist", "egress_allow": ["*.github.com"]}
    refused = run_module_inprocess("agentbox_box", {"name": "b1", "workspace": str(repo), "egress": "open"})
    assert refused["failed"] and refused["msg"].startswith(f"{repo}/agentbox.yaml:1: egress_allow: '*github.com'"), refused
    refused = run_module_inprocess("agentbox_box", {"name": "b1", "workspace": str(repo), "egress": "closed"})
    assert refused["failed"] and refused["msg"].startswith("egress: 'closed' is not a policy"), refused["msg"]
    nothing_made(holding, home, repo)


def test_a_provider_that_cannot_hold_a_box_to_the_gateway_says_the_files_policy_does_not_apply(
    fake_docker: FakeProvider, home: Path, tmp_path: Path
) -> None:
    """As a docker_ssh box, or one with isolation none (Daytona and boxd hold it with their own allow lists:
    tests/unit/providers/test_provider_egress.py): the file is the project's, not refused; still checked (a bad entry is refused wherever the box goes)."""
    repo = workspace(tmp_path, PROJECT)
    planned = plan(repo)
    assert planned["failed"] is False and planned["egress"] is None, planned
    assert any("agentbox.yaml sets egress and egress_allow, which only boxes on this machine's box engine, "
               "Daytona and boxd are held to" in warning and "this box has the open network" in warning for warning in planned["warnings"])
    (repo / "agentbox.yaml").write_text("egress: opne\n")
    assert plan(repo)["failed"]
    nothing_made(fake_docker, home, repo)
