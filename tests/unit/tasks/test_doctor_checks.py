"""doctor.yml's lines (module_utils/tasks/_doctor): the status, where, the check, what was found and the fix, and a
check that cannot run saying why and what to install. No engine: the probes here are plain functions."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import EngineUnreachable, ProviderError
from ansible_collections.agentbox.box.plugins.module_utils.tasks import _doctor
from tests.conftest import REPO


def test_a_check_line_says_status_where_what_and_the_fix() -> None:
    check = _doctor.run_check("this machine", "relay", lambda: (_doctor.FAIL, "does not run", "playbooks/relay.yml"))
    assert check.line == "FAIL  this machine: relay: does not run -> fix: playbooks/relay.yml"
    passed = _doctor.run_check("box engine", "box image", lambda: (_doctor.OK, "agentbox/box:latest is there", ""))
    assert passed.line == "ok    box engine: box image: agentbox/box:latest is there"
    assert passed.to_dict()["line"] == passed.line and passed.to_dict()["status"] == "ok"


def test_a_check_that_cannot_run_says_why_and_what_to_install() -> None:
    def needs_a_package() -> tuple[str, str, str]:
        raise ImportError("No module named 'paramiko'")

    missing = _doctor.run_check("engine e1", "SSH answers", needs_a_package)
    assert missing.status == _doctor.FAIL and "cannot run: No module named 'paramiko'" in missing.line
    assert "requirements.txt" in missing.fix
    said = _doctor.run_check("engine e1", "SSH answers", lambda: (nothing for nothing in ()).throw(
        ProviderError("the Python 'paramiko' package is required on the controller")))  # fmt: skip
    assert said.detail.startswith("cannot run:") and said.fix == _doctor.INSTALL_HINT


def test_an_error_is_its_fail_line_with_the_fix_given_for_it() -> None:
    def refused() -> tuple[str, str, str]:
        raise EngineUnreachable("engine e1 (127.0.0.1:9) refused the connection")

    check = _doctor.run_check("engine e1", "SSH answers", refused, "make `ssh e1 true` work")
    assert check.line == ("FAIL  engine e1: SSH answers: engine e1 (127.0.0.1:9) refused the connection "
                          "-> fix: make `ssh e1 true` work")


# -- sign-ins: present and not expired where the file says when -------------------------------------------------
NOW = 1_800_000_000.0  # 2027-01-15
HOUR = 3600


def jwt(claims: dict[str, object]) -> str:
    """A JSON web token as Codex keeps one (header.claims.signature); only its claims are read."""
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


CLAUDE = ".claude/.credentials.json"
CODEX = ".codex/auth.json"
OPENCODE = ".local/share/opencode/auth.json"


@pytest.mark.parametrize(("relative", "data", "usable", "said"), [
    (CLAUDE, {"claudeAiOauth": {"accessToken": "a", "refreshToken": "r", "expiresAt": (NOW + HOUR) * 1000}}, True,
     "~/.claude/.credentials.json (Claude sign-in, expires 2027-01-15 09:00 UTC)"),
    (CLAUDE, {"claudeAiOauth": {"accessToken": "a", "refreshToken": "r", "expiresAt": (NOW - HOUR) * 1000}}, True,
     "~/.claude/.credentials.json (Claude sign-in: expired 2027-01-15 07:00 UTC, renewed by its refresh token when used)"),
    (CLAUDE, {"claudeAiOauth": {"accessToken": "a", "expiresAt": (NOW - HOUR) * 1000}}, False,
     "~/.claude/.credentials.json: Claude sign-in expired 2027-01-15 07:00 UTC, with no refresh token"),
    (CODEX, {"OPENAI_API_KEY": None, "tokens": {"access_token": jwt({"exp": NOW - HOUR})}}, False,
     "~/.codex/auth.json: ChatGPT sign-in expired 2027-01-15 07:00 UTC, with no refresh token"),
    (CODEX, {"tokens": {"access_token": jwt({"exp": NOW + HOUR}), "refresh_token": "r"}}, True,
     "~/.codex/auth.json (ChatGPT sign-in, expires 2027-01-15 09:00 UTC)"),
    (CODEX, {"OPENAI_API_KEY": "sk-x", "tokens": {"access_token": jwt({"exp": NOW - HOUR})}}, True,
     "~/.codex/auth.json (OpenAI API key)"),
    (CODEX, {"tokens": {"access_token": "not-a-jwt"}}, True, "~/.codex/auth.json (ChatGPT sign-in)"),
    (OPENCODE, {"anthropic": {"type": "oauth", "access": "a", "refresh": "", "expires": (NOW - 1) * 1000}}, False,
     "~/.local/share/opencode/auth.json: anthropic sign-in expired 2027-01-15 07:59 UTC, with no refresh token"),
    (OPENCODE, {"anthropic": {"type": "oauth", "access": "a", "expires": (NOW - 1) * 1000},
                "openai": {"type": "api", "key": "sk-x"}}, True,
     "~/.local/share/opencode/auth.json (openai API key)"),
    (OPENCODE, {"something": "else"}, True, "~/.local/share/opencode/auth.json (no expiry readable)"),
])  # fmt: skip
def test_a_sign_in_file_is_usable_until_it_expires_or_while_a_refresh_token_renews_it(
        relative: str, data: dict[str, object], usable: bool, said: str) -> None:
    verdict = _doctor.sign_in_verdict(relative, json.dumps(data), NOW)
    assert verdict == (usable, said)
    assert "sk-x" not in said and "eyJ" not in said  # never a value


def test_a_sign_in_file_that_is_not_json_cannot_be_used() -> None:
    assert _doctor.sign_in_verdict(CLAUDE, "{oops", NOW) == (
        False, "~/.claude/.credentials.json is not valid JSON (the agent cannot read it)")
    assert _doctor.sign_in_verdict(CODEX, "[]", NOW)[0] is False


def test_the_sign_in_check_fails_on_an_expired_file_and_says_to_sign_in_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [key for key in os.environ if key.startswith(("ANTHROPIC_", "CLAUDE_CODE_", "OPENAI_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    sign_in = tmp_path / ".agentbox/agents/claude" / CLAUDE
    sign_in.parent.mkdir(parents=True)
    sign_in.write_text(json.dumps({"claudeAiOauth": {"accessToken": "a", "expiresAt": 1_000_000_000_000}}))
    check = _doctor.run_check("this machine", "claude sign-in", lambda: _doctor.sign_in_check("claude", True))
    assert check.line == ("FAIL  this machine: claude sign-in: ~/.claude/.credentials.json: Claude sign-in expired "
                          "2001-09-09 01:46 UTC, with no refresh token "
                          "-> fix: ansible-playbook playbooks/agent_login.yml -e agent=claude")
    assert _doctor.sign_in_check("claude", False)[0] == _doctor.WARN  # not asked for: worth knowing
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")  # an API key in the environment works all the same
    status, detail, _fix = _doctor.sign_in_check("claude", True)
    assert status == _doctor.OK and detail.startswith("ANTHROPIC_API_KEY, ~/.claude/.credentials.json: Claude")


# -- programs, the egress gateway ------------------------------------------------------------------------------
def test_a_missing_program_says_what_needs_it_and_the_package_to_install(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    lines = {program: _doctor.run_check("this machine", f"{program} CLI",
                                        lambda program=program, why=why, package=package:
                                        _doctor.program_on_path(program, why, package)).line
             for program, why, package in _doctor.LOCAL_PROGRAMS}  # fmt: skip
    assert lines["ssh"] == ("FAIL  this machine: ssh CLI: not on PATH (ssh agentbox-<box>, attach and scp/rsync into "
                            "boxes run it) -> fix: apt-get install openssh-client")
    assert lines["git"].endswith("-> fix: apt-get install git") and lines["docker"].endswith("apt-get install docker.io")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert _doctor.program_on_path("git", "", "git") == (_doctor.OK, shutil.which("git"), "")


def test_the_gateway_serves_every_box_with_an_egress_policy() -> None:
    wanted = {"id1": "web", "id2": "api"}
    assert _doctor.gateway_verdict(["id1", "id2"], wanted) == (
        _doctor.OK, "runs in the relay, serving 2 box(es) with an egress policy", "")
    status, detail, fix = _doctor.gateway_verdict(["id1"], wanted)
    assert status == _doctor.FAIL and detail.startswith("no gateway socket for api: they have an egress policy")
    assert fix == "ansible-playbook playbooks/relay.yml -e state=restarted"
    assert _doctor.gateway_verdict(None, wanted)[0] == _doctor.WARN  # a relay from before the field
    assert _doctor.gateway_verdict([], {}) == (_doctor.OK, "runs in the relay (no box with an egress policy now)", "")


def test_the_gateway_check_asks_the_running_relay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path(tempfile.mkdtemp(prefix="abg-", dir="/tmp"))  # short: the relay's sockets live under HOME
    monkeypatch.setenv("HOME", str(home))
    relay = [str(REPO / "scripts/agentbox-relay")]
    try:
        stopped = _doctor.run_check("this machine", "egress gateway", _doctor.gateway_check)
        assert stopped.line == ("FAIL  this machine: egress gateway: cannot run: the gateway runs in the relay, which "
                                "does not run (see above) -> fix: ansible-playbook playbooks/relay.yml (a create "
                                "starts it too)")
        subprocess.run([*relay, "start"], capture_output=True, check=True, timeout=60)
        running = _doctor.run_check("this machine", "egress gateway", _doctor.gateway_check)
        assert running.line == "ok    this machine: egress gateway: runs in the relay (no box with an egress policy now)"
    finally:
        subprocess.run([*relay, "stop"], capture_output=True, check=False, timeout=60)
        shutil.rmtree(home, ignore_errors=True)
