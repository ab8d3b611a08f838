"""The host half of the coding agents: where credentials come from, names, untrusted state files, attach."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils import _access, _agent, _box_engine
from ansible_collections.agentbox.box.plugins.module_utils._docker import DockerProvider
from ansible_collections.agentbox.box.plugins.module_utils._provider import BoxFacts

from .fake_provider import FakeProvider


def facts(provider: str = "docker", engine: str = "local") -> BoxFacts:
    return BoxFacts(
        name="fix-login", id="abc", provider=provider, engine=engine, state="running", container="agentbox-fix-login",
        image="agentbox/box:latest", project="p" * 16, workspace="/w", branch="agentbox/fix-login", created="",
    )  # fmt: skip


def write(path: Path, text: str) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.read_bytes()


def test_credentials_order_options_env_login_store_host_files(tmp_path: Path) -> None:
    home = tmp_path
    host_file = write(home / ".claude/.credentials.json", '{"host": 1}')
    write(home / ".agentbox/agents/claude/.claude/.credentials.json", '{"boxes": 1}')
    write(home / ".claude.json", json.dumps({"oauthAccount": {"emailAddress": "me@x"}, "projects": {"/secret": {}}}))
    environ = {"ANTHROPIC_API_KEY": "from-env", "ANTHROPIC_BASE_URL": "http://gw", "OPENAI_API_KEY": "no", "PATH": "/x"}
    found = _agent.collect_credentials("claude", {"ANTHROPIC_API_KEY": "from-option"}, environ, str(home))
    assert found.env == {"ANTHROPIC_API_KEY": "from-option", "ANTHROPIC_BASE_URL": "http://gw"}
    # The boxes' own sign-in wins over the host CLI's; only the account of ~/.claude.json goes.
    assert found.files == {".claude/.credentials.json": '{"boxes": 1}'}
    assert found.claude_account == {"emailAddress": "me@x"}
    assert found.found == ["ANTHROPIC_API_KEY", "~/.claude/.credentials.json"]
    assert (home / ".claude/.credentials.json").read_bytes() == host_file  # read, never written


def test_credentials_per_agent_and_where_it_looked(tmp_path: Path) -> None:
    environ = {"OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "a", "CLAUDE_CODE_OAUTH_TOKEN": "t"}
    assert set(_agent.collect_credentials("codex", None, environ, str(tmp_path)).env) == {"OPENAI_API_KEY"}
    assert set(_agent.collect_credentials("opencode", None, environ, str(tmp_path)).env) == {
        "OPENAI_API_KEY", "ANTHROPIC_API_KEY"}  # fmt: skip
    nothing = _agent.collect_credentials("claude", None, {"HOME": "/x"}, str(tmp_path))
    assert nothing.found == []
    assert nothing.looked[0] == "environment ANTHROPIC_*/CLAUDE_CODE_*"
    assert f"{tmp_path}/.claude/.credentials.json" in nothing.looked
    assert f"{tmp_path}/.agentbox/agents/claude/.claude/.credentials.json" in nothing.looked
    blank = tmp_path / ".codex/auth.json"
    write(blank, "  \n")
    assert _agent.collect_credentials("codex", None, {}, str(tmp_path)).files == {}


def test_validate_names_before_any_side_effect() -> None:
    assert _agent.validate(None, None, None) == ("claude", "claude")
    assert _agent.validate("codex", None, "review") == ("codex", "review")
    assert _agent.validate("my-tool", "run it", None) == ("my-tool", "my-tool")
    with pytest.raises(ValueError, match="unknown agent 'aider'"):
        _agent.validate("aider", None, None)
    with pytest.raises(ValueError, match="'command' is empty"):
        _agent.validate("claude", "  ", None)
    for bad in ("-x", "a b", "x;rm", "é", "a" * 64):
        with pytest.raises(ValueError, match="session name"):
            _agent.validate("claude", None, bad)


def test_state_files_from_the_box_are_untrusted() -> None:
    good = {"name": "claude", "session": "claude", "state": "idle", "since": "2026-11-30T10:00:00Z", "x": 1}
    assert _agent.sanitize_state(good) == {k: good[k] for k in ("name", "session", "state", "since")}
    assert _agent.sanitize_state({**good, "state": "pwned"}) is None
    assert _agent.sanitize_state({**good, "session": "../../etc"}) is None
    cleaned = _agent.sanitize_state({**good, "since": "{{ lookup('pipe', 'id') }}", "name": "{{ x }}"})
    assert cleaned == {"name": "claude", "session": "claude", "state": "idle", "since": None}
    assert _agent.current([]) is None
    later = {**good, "session": "b", "since": "2026-11-30T11:00:00Z"}
    assert _agent.current([good, later]) == later


def test_attach_command_per_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    local = _agent.attach_command(DockerProvider(), facts(), "claude")
    box_engine = _box_engine.box_engine_host()
    assert local == f"docker -H {box_engine} exec -it -u vscode agentbox-fix-login tmux attach -t claude"
    unisolated = _agent.attach_command(DockerProvider(isolation="none"), facts(), "claude")
    assert unisolated == "docker exec -it -u vscode agentbox-fix-login tmux attach -t claude"
    engine = "root@127.0.0.1:2201"
    remote = _agent.attach_command(DockerProvider(engine=engine, isolation="none"), facts("docker_ssh", engine), "codex")
    assert remote == "docker -H ssh://root@127.0.0.1:2201 exec -it -u vscode agentbox-fix-login tmux attach -t codex"
    # A box on the remote engine's box engine: `docker -H ssh://` reaches only the default daemon there.
    isolated = DockerProvider(engine=engine, remote_socket=_box_engine.REMOTE_BOX_ENGINE)
    remote = _agent.attach_command(isolated, facts("docker_ssh", engine), "codex")
    assert remote == ("ssh -t ssh://root@127.0.0.1:2201 docker -H unix:///run/agentbox-engine/docker.sock exec -it "
                      "-u vscode agentbox-fix-login tmux attach -t codex")
    # A provider without a terminal of its own (Daytona, boxd, the fake) is reached through the SSH alias, in
    # the one form the other lines print: -F until ~/.ssh/config includes the aliases.
    monkeypatch.setenv("HOME", str(tmp_path))
    cloud = _agent.attach_command(FakeProvider(tmp_path), facts("daytona", "https://api"), "it's")
    assert cloud == "ssh -F ~/.agentbox/ssh_config -t agentbox-fix-login tmux attach -t 'it'\"'\"'s'"
    _access.answer_include(True)
    cloud = _agent.attach_command(FakeProvider(tmp_path), facts("daytona", "https://api"), "it's")
    assert cloud == "ssh -t agentbox-fix-login tmux attach -t 'it'\"'\"'s'"


def test_git_identity_is_the_workspace_effective_name_and_email_only(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_CONFIG_GLOBAL": str(tmp_path / "none"), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    for key, value in (("user.name", "Ada"), ("user.email", "ada@x"), ("credential.helper", "store")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True, env=env)
    assert _agent.git_identity(str(repo)) == {"name": "Ada", "email": "ada@x"}
