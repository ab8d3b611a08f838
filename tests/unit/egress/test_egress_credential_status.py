"""`agentbox-ctl status` names the credential an agent's requests carry (docs/egress.md, "Agents' credentials"):
for a box with an egress policy, the kind and source of what the host's gateway adds, read from the host's
file for the gateway, never its value. The host's request to the box, the in-box agent program's note
(agentbox-agent, its own code) and the status lines (agentbox_inbox.cli) are run in-process here;
tests/integration/egress/test_egress_agent.py runs `agentbox-ctl status` in a real box."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.agent._agent import Credentials, boxed_credentials
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxFacts
from ansible_collections.agentbox.box.plugins.module_utils.egress import _egress_credentials

FILES = Path(__file__).resolve().parents[3] / "roles" / "inbox_supervisor" / "files"
SECRET = "sk-ant-api03-the-value-nobody-prints-0123456789"


def load(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    loader.exec_module(module)
    return module


AGENT = load("agentbox_agent_program", FILES / "agentbox-agent")
sys.path.insert(0, str(FILES))
try:
    from agentbox_inbox import cli  # the in-box package, as agentbox-ctl imports it
finally:
    sys.path.remove(str(FILES))


def facts(box_id: str, egress: str | None) -> BoxFacts:
    labels = {"egress": egress} if egress else {}
    return BoxFacts(name="b1", id=box_id, provider="docker", engine="local", state="running", container="agentbox-b1",
                    image="agentbox/box:latest", project="p", workspace="/nonexistent", branch="agentbox/b1",
                    created="2026-12-06T00:00:00Z", labels=labels)


def status_lines(run_dir: Path, session: str, note: object) -> str:
    """What `agentbox-ctl status` prints of the agents after agentbox-agent started `session` with the host's note."""
    AGENT.RUN_DIR = str(run_dir)
    AGENT.note_credential(session, note)
    AGENT.record_state(session, "running", name=session)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.print_agents(cli.agent_states(str(run_dir)))
    return out.getvalue()


@pytest.mark.parametrize(("env", "files", "said"), [
    ({"ANTHROPIC_API_KEY": SECRET}, {},
     "Claude Code: API key from the host's ANTHROPIC_API_KEY via the gateway, to https://api.anthropic.com"),
    ({"CLAUDE_CODE_OAUTH_TOKEN": SECRET}, {},
     "Claude Code: OAuth token from the host's CLAUDE_CODE_OAUTH_TOKEN via the gateway"),
    ({"ANTHROPIC_API_KEY": SECRET, "ANTHROPIC_BASE_URL": "https://llm.corp.example/anthropic"}, {},
     "Claude Code: API key from the host's ANTHROPIC_API_KEY via the gateway, to https://llm.corp.example/anthropic"),
    ({}, {".claude/.credentials.json": json.dumps({"claudeAiOauth": {"accessToken": SECRET, "refreshToken": SECRET}})},
     "Claude Code: access token of the host's Claude sign-in (~/.claude/.credentials.json) via the gateway"),
], ids=["api-key", "oauth-token", "base-url", "sign-in"])
def test_status_names_the_credential_the_gateway_adds_and_never_its_value(short_home: Path, tmp_path: Path,
                                                                          env: dict, files: dict, said: str) -> None:  # fmt: skip
    request, _kind = boxed_credentials(facts("id-status", "allowlist"), "claude", Credentials(env, files, None, []))
    assert said in request["gateway_credential"], request["gateway_credential"]
    assert SECRET not in json.dumps(request)  # the request to the box: neither the key nor the sign-in
    printed = status_lines(tmp_path / "agents", "claude", request["gateway_credential"])
    assert f"  credential: {said}" in printed and SECRET not in printed, printed
    assert SECRET not in "".join(path.read_text() for path in (tmp_path / "agents").iterdir())
    # The host's file for the gateway holds it, and only it.
    assert SECRET in Path(_egress_credentials.credentials_file("id-status")).read_text()


def test_status_says_when_the_gateway_has_no_credential_and_where_other_agents_keep_theirs(
    short_home: Path, tmp_path: Path
) -> None:
    request, _kind = boxed_credentials(facts("id-bare", "allowlist"), "claude", Credentials({}, {}, None, []))
    assert request["gateway_credential"].startswith("Claude Code: none: the gateway sends its requests without a "
                                                    "credential"), request
    assert "set ANTHROPIC_API_KEY or sign in with playbooks/agent_login.yml" in request["gateway_credential"]
    signed_in = {".codex/auth.json": '{"tokens": {}}'}
    request, _kind = boxed_credentials(facts("id-codex", "allowlist"), "codex", Credentials({}, signed_in, None, []))
    assert request["gateway_credential"].startswith("Codex: its own ChatGPT sign-in on the box's tmpfs")
    request, _kind = boxed_credentials(facts("id-open", None), "claude",
                                       Credentials({"ANTHROPIC_API_KEY": SECRET}, {}, None, []))
    assert request["gateway_credential"] == ("Claude Code: the host's credentials copied to the box's tmpfs "
                                             "(/run/agentbox/agents; no egress policy)")
    printed = status_lines(tmp_path / "agents", "claude", request["gateway_credential"])
    assert "credential: Claude Code: the host's credentials copied" in printed and SECRET not in printed
    # A start without a note (an older host) leaves none behind.
    assert "credential:" not in status_lines(tmp_path / "agents", "claude", None)
