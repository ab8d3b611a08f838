# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Agents' credentials kept on the host for boxes with an egress policy (docs/egress.md, docs/agents.md).

The agent in such a box is given its API base URL at the gateway's in-box endpoint (plain HTTP on the
forwarder's port, a path per API: http://127.0.0.1:3128/anthropic) and a placeholder key. The host
writes the real credential to ~/.agentbox/gateway/credentials/<box id>.json (0600, in a 0700
directory) when it starts the agent; the gateway reads it for each request on that endpoint and adds it
on the way to the API host over TLS. Nothing of it is sent into the box.

An API's upstream is its vendor's (https://api.anthropic.com, https://api.openai.com/v1), or the host
user's base URL variable when the agent was started with one (an https URL); AGENTBOX_GATEWAY_UPSTREAM_<API>
in the relay's own environment overrides both (the tests point it at a stand-in on 127.0.0.1): settings
of the host, never of a box.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..core._host_files import ensure_private_dir, write_atomic
from ._egress_forwarder import PORT

PLACEHOLDER = "sk-ant-agentbox-placeholder-the-host-gateway-adds-the-key"  # Claude Code's (APIS)
# One entry per API the gateway carries credentials for: the path prefix of its in-box endpoint, the base
# URL variable the agent honours, its vendor's URL, the relay environment variable that overrides it.
APIS: dict[str, dict[str, str]] = {
    "anthropic": {"prefix": "/anthropic", "base_variable": "ANTHROPIC_BASE_URL",
                  "upstream": "https://api.anthropic.com", "override": "AGENTBOX_GATEWAY_UPSTREAM_ANTHROPIC",
                  "key_variable": "ANTHROPIC_API_KEY", "placeholder": "sk-ant-agentbox-placeholder-the-host-gateway-adds-the-key"},
    # The base URL includes /v1 (OPENAI_BASE_URL's convention): the in-box one stands for all of it.
    "openai": {"prefix": "/openai", "base_variable": "OPENAI_BASE_URL",
               "upstream": "https://api.openai.com/v1", "override": "AGENTBOX_GATEWAY_UPSTREAM_OPENAI",
               "key_variable": "OPENAI_API_KEY", "placeholder": "sk-agentbox-placeholder-the-host-gateway-adds-the-key"},
}
# The agents whose credentials go through the gateway. Codex only with an API key: its ChatGPT sign-in
# talks to another backend with tokens of its own, which keep today's tmpfs path.
AGENT_APIS = {"claude": ("anthropic",), "codex": ("openai",)}
# Variables that hold a credential of an API: never sent into a box with a policy.
SECRETS = {"anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"),
           "openai": ("OPENAI_API_KEY",)}
OAUTH_BETA = "oauth-2025-04-20"  # the API takes a sign-in's access token with this beta flag


def credentials_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".agentbox", "gateway", "credentials")


def credentials_file(box_id: str) -> str:
    if not box_id or not all(c.isalnum() or c in "-_" for c in box_id):
        raise ValueError(f"{box_id!r} is not a box id")
    return os.path.join(credentials_dir(), f"{box_id}.json")


def in_box_base_url(api: str) -> str:
    return f"http://127.0.0.1:{PORT}{APIS[api]['prefix']}"


def anthropic_credential(env: Mapping[str, str], files: Mapping[str, str]) -> dict[str, Any] | None:
    """The headers the gateway adds, from what the host has for Claude Code (first found wins: an API key,
    an auth token, a sign-in's access token); None when there is none."""
    if env.get("ANTHROPIC_API_KEY"):
        return {"headers": {"x-api-key": env["ANTHROPIC_API_KEY"]}, "kind": "ANTHROPIC_API_KEY"}
    for name in ("ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"):
        if env.get(name):
            return {"headers": {"authorization": f"Bearer {env[name]}"}, "kind": name,
                    "beta": OAUTH_BETA if name == "CLAUDE_CODE_OAUTH_TOKEN" else ""}
    try:
        signed_in = json.loads(files.get(".claude/.credentials.json") or "null")
    except ValueError:
        signed_in = None
    token = (signed_in or {}).get("claudeAiOauth", {}).get("accessToken") if isinstance(signed_in, dict) else None
    if isinstance(token, str) and token:
        return {"headers": {"authorization": f"Bearer {token}"}, "kind": "~/.claude/.credentials.json",
                "beta": OAUTH_BETA}
    return None


def openai_credential(env: Mapping[str, str], _files: Mapping[str, str]) -> dict[str, Any] | None:
    if env.get("OPENAI_API_KEY"):
        return {"headers": {"authorization": f"Bearer {env['OPENAI_API_KEY']}"}, "kind": "OPENAI_API_KEY"}
    return None


CREDENTIAL_OF = {"anthropic": anthropic_credential, "openai": openai_credential}


def upstream_of(env: Mapping[str, str], api: str) -> str:
    """The API's URL as the host user set it for the agent (an https base URL), else its vendor's."""
    given = env.get(APIS[api]["base_variable"], "").strip()
    return given.rstrip("/") if urlsplit(given).scheme == "https" and urlsplit(given).hostname else APIS[api]["upstream"]


def keep_on_host(
    box_id: str, agent: str, env: dict[str, str], files: dict[str, str]
) -> tuple[dict[str, str], dict[str, str], str]:
    """For an agent in a box with a policy: write its credential to the host's file for the gateway and
    return (env, files) to send into the box instead (base URL at the gateway, a placeholder key, no
    sign-in file) and what the gateway will use (a name, never a value). An agent the gateway carries no
    credential for (Codex signed in to ChatGPT, OpenCode) gets what it got before."""
    api = next(iter(AGENT_APIS.get(agent, ())), "")
    credential = CREDENTIAL_OF[api](env, files) if api else None
    if not api or (credential is None and api == "openai"):
        return env, files, ""
    path = credentials_file(box_id)
    record = read_credentials(path)
    # A run that finds none (a box started again from a shell without the key) keeps what an earlier one wrote.
    if credential is not None or api not in record:
        record[api] = {**(credential or {}), "upstream": upstream_of(env, api)}
        ensure_private_dir(credentials_dir())
        write_atomic(path, json.dumps(record, sort_keys=True) + "\n")
    spec = APIS[api]
    boxed = {key: value for key, value in env.items() if key not in SECRETS[api]}
    boxed.update({spec["base_variable"]: in_box_base_url(api), spec["key_variable"]: spec["placeholder"]})
    return boxed, {}, (credential or record[api]).get("kind", "none (the gateway sends requests without a credential)")


def read_credentials(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_credential(box_id: str, api: str) -> dict[str, Any] | None:
    """The gateway's read of what the host wrote for the box (None: nothing written)."""
    entry = read_credentials(credentials_file(box_id)).get(api)
    return entry if isinstance(entry, dict) else None


def forget(box_id: str) -> None:
    """The box is gone: its credential file goes too."""
    try:
        os.unlink(credentials_file(box_id))
    except (OSError, ValueError):
        pass


# What `agentbox-ctl status` says of an agent's credential: its kind and where the host took it, never its value.
AGENT_NAMES = {"claude": "Claude Code", "codex": "Codex", "opencode": "OpenCode"}
KINDS = {
    "ANTHROPIC_API_KEY": "API key from the host's ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN": "auth token from the host's ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN": "OAuth token from the host's CLAUDE_CODE_OAUTH_TOKEN",
    "~/.claude/.credentials.json": "access token of the host's Claude sign-in (~/.claude/.credentials.json)",
    "OPENAI_API_KEY": "API key from the host's OPENAI_API_KEY",
}


def describe(box_id: str, agent: str, gateway: bool) -> str:
    """One line on the credential the agent's requests carry: for a box with an egress policy, what the host's
    file for the gateway holds (its kind and source, and the API it goes to); else the box's own copy."""
    name = AGENT_NAMES.get(agent, agent)
    api = next(iter(AGENT_APIS.get(agent, ())), "")
    if not gateway:
        return f"{name}: the host's credentials copied to the box's tmpfs (/run/agentbox/agents; no egress policy)"
    if not api:
        return f"{name}: its own credentials on the box's tmpfs (the gateway adds none for {name})"
    entry = read_credential(box_id, api)
    if entry is None or entry.get("kind") not in KINDS:
        if agent == "codex":
            return f"{name}: its own ChatGPT sign-in on the box's tmpfs (the gateway adds only an OPENAI_API_KEY)"
        return (f"{name}: none: the gateway sends its requests without a credential (the host had none when the "
                f"agent started: set {APIS[api]['key_variable']} or sign in with playbooks/agent_login.yml, then "
                "start the agent again)")
    return f"{name}: {KINDS[entry['kind']]} via the gateway, to {entry.get('upstream') or APIS[api]['upstream']}"


def upstream(entry: Mapping[str, Any], api: str, environ: Mapping[str, str]) -> str:
    return environ.get(APIS[api]["override"]) or str(entry.get("upstream") or APIS[api]["upstream"])
