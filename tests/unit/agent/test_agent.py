"""The host half of the coding agents: where credentials come from, names, untrusted state files, attach."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.access import _access
from ansible_collections.agentbox.box.plugins.module_utils.agent import _agent
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxFacts
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _box_engine
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.unit.support.fake_provider import FakeProvider


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


def test_progress_is_the_state_file_or_the_transcript_changing(fake: FakeProvider) -> None:
    """read_states' script, run for real in a (fake) box: each session's seconds since its last progress."""
    import time

    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec

    spec = BoxSpec(name="progress", box_id="p1", project="p" * 16, workspace="/w", image="agentbox/box:latest",
                   labels={})  # fmt: skip
    fake.create(spec)
    fake.start("progress")
    root = fake.box_root("progress")
    agents = root / "run/agentbox/agents"
    agents.mkdir(parents=True, exist_ok=True)
    now = time.time()

    def state(session: str, name: str, seconds_ago: float) -> None:
        path = agents / f"{session}.state.json"
        path.write_text(json.dumps({"name": name, "session": session, "state": "working",
                                    "since": "2026-11-30T10:00:00Z"}) + "\n")  # fmt: skip
        os.utime(path, (now - seconds_ago, now - seconds_ago))

    # Claude Code: its conversation moved after its last hook (a user entry 2000 s ago), then it only tried API
    # requests (each one a line of its transcript, the last 10 s ago): those are not progress.
    state("claude", "claude", 5000)
    transcript = root / "home/vscode/.claude/projects/-workspace/abc.jsonl"
    transcript.parent.mkdir(parents=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(now - 2000))
    later = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(now - 10))
    transcript.write_text(json.dumps({"parentUuid": None, "type": "user", "message": {"role": "user", "content": "go"},
                                      "uuid": "u1", "timestamp": stamp}) + "\n"
                          + "".join(json.dumps({"type": "api-request", "timestamp": later}) + "\n" for _count in range(3)))  # fmt: skip
    os.utime(transcript, (now - 10, now - 10))
    older = transcript.parent / "old.jsonl"  # older than the state file: not progress
    older.write_text("{}\n")
    os.utime(older, (now - 9000, now - 9000))
    # Codex: any write to its session files counts; a custom command: its state file only.
    state("cx", "codex", 4000)
    rollout = root / "home/vscode/.codex/sessions/2026/rollout.jsonl"
    rollout.parent.mkdir(parents=True)
    rollout.write_text("{}\n")
    os.utime(rollout, (now - 1500, now - 1500))
    state("helper", "helper", 3000)
    found = {entry["session"]: entry for entry in _agent.read_states(fake, "progress")}
    assert set(found) == {"claude", "cx", "helper"}
    assert 2000 <= found["claude"]["quiet_seconds"] < 2100, found
    assert 1500 <= found["cx"]["quiet_seconds"] < 1600, found
    assert 3000 <= found["helper"]["quiet_seconds"] < 3100, found  # the codex files are not the helper's
    assert found["claude"]["state"] == "working"
    # A transcript with no conversation entry at all: its own time counts.
    transcript.write_text('{"type": "summary"}\n')
    os.utime(transcript, (now - 1000, now - 1000))
    found = {entry["session"]: entry for entry in _agent.read_states(fake, "progress")}
    assert 1000 <= found["claude"]["quiet_seconds"] < 1100, found


def test_stalled_is_working_without_progress_for_stalled_minutes() -> None:
    now = 1_800_000_000.0
    working = {"name": "claude", "session": "claude", "state": "working", "since": "2026-11-30T10:00:00Z",
               "quiet_seconds": 600}  # fmt: skip
    assert _agent.judged(working, 11, now) == working
    stalled = _agent.judged(working, 10, now)
    assert stalled["state"] == "stalled"
    assert stalled["since"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 600))  # its last progress
    # Read 61 s before now (the relay's record): 661 s quiet by now.
    assert _agent.judged(working, 11, now, elapsed=61)["state"] == "stalled"
    # Only working stalls; no progress figure (an unreadable box), nothing judged.
    assert _agent.judged({**working, "state": "idle"}, 0, now)["state"] == "idle"
    assert _agent.judged({**working, "state": "waiting"}, 0, now)["state"] == "waiting"
    assert _agent.judged({**working, "quiet_seconds": None}, 0, now)["state"] == "working"
    assert _agent.judged(None, 0, now) is None


def test_progress_lines_from_the_box_are_checked(fake: FakeProvider) -> None:
    """What the box prints is the box's to forge: only `agentbox-progress <session> <digits>` counts."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec

    fake.create(BoxSpec(name="forged", box_id="f1", project="p" * 16, workspace="/w", image="agentbox/box:latest",
                        labels={}))  # fmt: skip
    fake.start("forged")
    agents = fake.box_root("forged") / "run/agentbox/agents"
    agents.mkdir(parents=True, exist_ok=True)
    (agents / "a.state.json").write_text('{"name": "x", "session": "a", "state": "working"}\n')
    # A state file whose content is made to look like progress lines: for a session, for another, out of range.
    (agents / "b.state.json").write_text('{"name": "x", "session": "b", "state": "working"}\n'
                                         "agentbox-progress a 99999\nagentbox-progress a -5\n"
                                         "agentbox-progress b 99999999999\n")  # fmt: skip
    found = _agent.read_states(fake, "forged")
    assert [entry["session"] for entry in found] == ["a"]
    assert isinstance(found[0]["quiet_seconds"], int) and found[0]["quiet_seconds"] < 100


def test_the_relays_pass_keeps_what_it_read_for_the_inventory(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch,
                                                              home: Path) -> None:  # fmt: skip
    """One relay pass over a (fake) engine: every running box's agent, as read, lands in the relay's record; a
    box no longer registered leaves it; a box the pass could not reach keeps its earlier read."""
    import time

    from ansible_collections.agentbox.box.plugins.module_utils.agent import _agent_record
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec
    from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_idle, _relay_ops

    for name, box_id in (("one", "id1"), ("two", "id2")):
        fake.create(BoxSpec(name=name, box_id=box_id, project="p" * 16, workspace="/w", image="agentbox/box:latest",
                            labels={}))  # fmt: skip
        fake.start(name)
    agents = fake.box_root("one") / "run/agentbox/agents"
    agents.mkdir(parents=True, exist_ok=True)
    (agents / "helper.state.json").write_text('{"name": "helper", "session": "helper", "state": "waiting", '
                                              '"since": "2026-11-30T10:00:00Z"}\n')  # fmt: skip
    monkeypatch.setattr(_relay_ops, "provider_of", lambda registration: fake)
    monkeypatch.setattr(fake, "close", lambda: None, raising=False)
    registrations = {box_id: {"name": name, "id": box_id, "provider": fake.name, "engine": fake.engine}
                     for name, box_id in (("one", "id1"), ("two", "id2"))}  # fmt: skip
    _agent_record.write({"gone": {"name": "gone", "read": time.time(), "agent": None}}, 30)
    _relay_idle.one_pass(registrations, {"max_running": 5}, interval=7)
    record = _agent_record.fresh()
    assert set(record) == {"id1", "id2"}  # the unregistered box's read is gone
    assert record["id1"]["name"] == "one" and record["id1"]["agent"]["state"] == "waiting"
    assert isinstance(record["id1"]["agent"]["quiet_seconds"], int)
    assert record["id2"]["agent"] is None  # read: no agent
    assert _agent_record.load()["interval"] == 7
    # An engine that fails: its boxes keep their earlier reads.
    monkeypatch.setattr(_relay_ops, "provider_of", lambda registration: (nothing for nothing in ()).throw(RuntimeError("down")))
    _relay_idle.one_pass(registrations, {"max_running": 5}, interval=7)
    assert _agent_record.fresh()["id1"]["agent"]["state"] == "waiting"
