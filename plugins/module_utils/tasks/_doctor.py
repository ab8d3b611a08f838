# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""doctor.yml's checks: per configured engine and provider, what a create and a box need, one line each.

Every check answers `ok`, `WARN` (works, but worth knowing: an unisolated box, an agent nobody signed in
to, an image a first create will still send) or `FAIL` with what to do. A check that cannot run (a
Python package missing on the controller, an engine whose SSH does not answer) is a FAIL that says why
and what to install or fix first. Nothing is changed anywhere: every check only reads.

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from ..access import _access
from ..agent import _agent
from ..core._provider import EngineUnreachable, Provider, ProviderError
from ..providers._registry import cloud_settings, get_provider
from ..providers.docker import _box_engine, _engine_setup
from ..relay import _relay_state

OK, WARN, FAIL = "ok", "WARN", "FAIL"
DEFAULT_IMAGE = "agentbox/box:latest"
INSTALL_HINT = ("install the collection's Python requirements on this machine (scripts/setup-venv.sh, or "
                "pip install -r requirements.txt)")
# A cloud provider is configured when one of these is set (its API key; boxd also takes a token).
CLOUD_KEYS = {"daytona": ("DAYTONA_API_KEY",), "boxd": ("BOXD_API_KEY", "BOXD_TOKEN")}
# Programs this machine runs for boxes: (program, what needs it, the Debian package that has it).
LOCAL_PROGRAMS = (
    ("docker", "ssh agentbox-<box> and attach run it", "docker.io"),
    ("git", "every create reads the workspace's repository with it", "git"),
    ("ssh", "ssh agentbox-<box>, attach and scp/rsync into boxes run it", "openssh-client"),
)
RELAY_FIX = "ansible-playbook playbooks/relay.yml (a create starts it too)"


@dataclasses.dataclass
class Check:
    where: str  # "this machine", "box engine", "engine builder1", "daytona"...
    name: str
    status: str  # OK, WARN, FAIL
    detail: str = ""
    fix: str = ""

    @property
    def line(self) -> str:
        text = f"{self.status:<4}  {self.where}: {self.name}"
        text += f": {self.detail}" if self.detail else ""
        return text + (f" -> fix: {self.fix}" if self.fix else "")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "line": self.line}


Probe = Callable[[], tuple[str, str, str]]  # () -> (status, detail, fix)


def run_check(where: str, name: str, probe: Probe, fix_on_error: str = "") -> Check:
    """One check; an error is its FAIL line (the collection's errors say what to do; `fix_on_error` when
    they may not), a missing package says what to install."""
    try:
        status, detail, fix = probe()
    except ImportError as exc:
        return Check(where, name, FAIL, f"cannot run: {exc}", INSTALL_HINT)
    except (ProviderError, ValueError, OSError, RuntimeError) as exc:
        text = str(exc)
        if "package is required" in text:
            return Check(where, name, FAIL, f"cannot run: {text}", INSTALL_HINT)
        return Check(where, name, FAIL, text, fix_on_error)
    return Check(where, name, status, detail, fix)


def _unisolated(provider: Provider) -> tuple[str, str, str]:
    names = sorted(box.name for box in provider.list_boxes() if box.labels.get("isolation") == "none")
    if not names:
        return OK, "none", ""
    return (WARN, f"{len(names)}: {', '.join(names)} (root in them is root on their engine's host)",
            "when done with them, destroy_box.yml -e box=NAME and create them again (isolated)")


# -- this machine ---------------------------------------------------------------------------------------
def local_checks(image: str, agents: list[str]) -> list[Check]:
    from ..providers.docker._docker import DockerProvider  # loaded here: the cloud checks must not need it

    here = "this machine"
    box_engine = _box_engine.box_engine_host()
    user_engine = _box_engine.user_engine_host()
    checks = [
        run_check(here, f"{program} CLI", lambda program=program, why=why, package=package:
                  program_on_path(program, why, package))
        for program, why, package in LOCAL_PROGRAMS
    ]

    def box_engine_remaps() -> tuple[str, str, str]:
        DockerProvider(isolation="userns").check_can_create("doctor")  # answers, and remaps user namespaces
        return OK, f"{box_engine} answers and remaps user namespaces (root in a box is nobody on the host)", ""

    checks.append(run_check("box engine", "answers and isolates", box_engine_remaps))
    box_engine_ok = checks[-1].status == OK

    def box_image() -> tuple[str, str, str]:
        if not box_engine_ok:
            return FAIL, "cannot run: the box engine does not answer (see above)", ""
        if DockerProvider(isolation="userns").image_exists(image):
            return OK, f"{image} is there", ""
        return (FAIL, f"{image} is not on the box engine",
                "ansible-playbook playbooks/build_image.yml (create_box.yml builds it too)")

    checks.append(run_check("box engine", "box image", box_image))
    if user_engine != box_engine:
        def user_engine_answers() -> tuple[str, str, str]:
            try:
                DockerProvider(isolation="none").list_boxes()
            except EngineUnreachable as exc:
                return (WARN, f"{user_engine} does not answer ({exc}); only boxes made with isolation=none need it",
                        "scripts/ensure-docker.sh starts it, or point DOCKER_HOST at your engine")
            return OK, f"{user_engine} answers (isolation=none boxes live there)", ""

        checks.append(run_check("your engine", "answers", user_engine_answers))
    checks.append(run_check(here, "unisolated boxes", lambda: _unisolated(DockerProvider())))
    checks.append(run_check(here, "relay", _relay))
    checks.append(run_check(here, "egress gateway", gateway_check))
    checks.append(run_check(here, "keys", _keys))
    checks += [run_check(here, f"{agent} sign-in", lambda agent=agent: sign_in_check(agent, agent in agents))
               for agent in _agent.AGENTS]
    return checks


def program_on_path(program: str, needed_for: str, package: str) -> tuple[str, str, str]:
    found = shutil.which(program)
    if found:
        return OK, found, ""
    return FAIL, f"not on PATH ({needed_for})", f"apt-get install {package}"


def _relay() -> tuple[str, str, str]:
    pid = _relay_state.running_pid()
    if pid:
        return OK, f"runs (pid {pid}, {_relay_state.relay_home()})", ""
    return FAIL, "does not run: boxes cannot push, fetch or checkpoint through it", RELAY_FIX


def gateway_check() -> tuple[str, str, str]:
    try:
        answer = _relay_state.control("status", timeout=2.0)
    except (_relay_state.RelayError, ValueError):
        return FAIL, "cannot run: the gateway runs in the relay, which does not run (see above)", RELAY_FIX
    wanted = {box_id: str(entry.get("name", box_id)) for box_id, entry in _relay_state.registered_boxes().items()
              if "egress" in entry and _relay_state.channel_of(entry) == "socket"}
    return gateway_verdict(answer.get("gateway"), wanted)


def gateway_verdict(serving: Any, wanted: dict[str, str]) -> tuple[str, str, str]:
    """The relay's gateway against the boxes of this machine made with an egress policy ({box id: name}):
    each needs its gateway socket, or it reaches nothing."""
    restart = "ansible-playbook playbooks/relay.yml -e state=restarted"
    if not isinstance(serving, list):
        return (WARN, "the running relay is older than this collection and does not say whether it serves the "
                      "egress gateway", restart)
    missing = sorted(name for box_id, name in wanted.items() if box_id not in serving)
    if missing:
        return (FAIL, f"no gateway socket for {', '.join(missing)}: they have an egress policy and reach nothing "
                      "(the relay's log, ~/.agentbox/relay/relay.log, says why)", restart)
    if not wanted:
        return OK, "runs in the relay (no box with an egress policy now)", ""
    return OK, f"runs in the relay, serving {len(wanted)} box(es) with an egress policy", ""


def _keys() -> tuple[str, str, str]:
    keys = _access.identity_files()
    if keys:
        return OK, ", ".join(path for path, _line in keys) + " (authorised in every box)", ""
    return (FAIL, f"no key for ssh into boxes (~/.ssh/id_ed25519, id_ecdsa, id_rsa with a .pub, or "
                  f"{_access.box_key_path()})",
            "the next create makes ~/.agentbox/ssh/id_ed25519; or ssh-keygen -t ed25519")


def sign_in_check(agent: str, wanted: bool) -> tuple[str, str, str]:
    credentials = _agent.collect_credentials(agent)
    fix = f"ansible-playbook playbooks/agent_login.yml -e agent={agent}"
    if not credentials.found:
        if wanted:
            return FAIL, "not signed in, no API key in the environment", fix
        return WARN, f"not signed in (needed only to run {agent} in a box)", fix
    usable = [name for name in credentials.found if not name.startswith("~/")]  # API keys in the environment
    problems = []
    for relative, text in sorted(credentials.files.items()):
        good, said = sign_in_verdict(relative, text, time.time())
        (usable if good else problems).append(said)
    if usable:
        return OK, ", ".join(usable + problems), ""
    if wanted:
        return FAIL, "; ".join(problems), fix
    return WARN, "; ".join(problems) + f" (needed only to run {agent} in a box)", fix


# -- sign-in files: present, and not expired where the file says when -------------------------------------
def _epoch(value: Any) -> float | None:
    """Seconds since the epoch, from seconds or milliseconds (Claude Code and OpenCode write milliseconds)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return value / 1000 if value > 1e11 else float(value)


def _jwt_expiry(token: Any) -> float | None:
    """A JSON web token's `exp`, read (never verified: the vendor does that); None when it is not one."""
    if not isinstance(token, str) or token.count(".") != 2:
        return None
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return None
    return _epoch(claims.get("exp")) if isinstance(claims, dict) else None


def sign_in_tokens(relative: str, data: dict[str, Any]) -> list[tuple[str, float | None, bool]]:
    """(what, when it expires or None, renewable by a refresh token) of each credential a sign-in file holds."""
    tokens: list[tuple[str, float | None, bool]] = []
    if relative == ".claude/.credentials.json":
        oauth = data.get("claudeAiOauth")
        if isinstance(oauth, dict) and oauth.get("accessToken"):
            tokens.append(("Claude sign-in", _epoch(oauth.get("expiresAt")), bool(oauth.get("refreshToken"))))
    elif relative == ".codex/auth.json":
        if isinstance(data.get("OPENAI_API_KEY"), str) and data["OPENAI_API_KEY"]:
            tokens.append(("OpenAI API key", None, False))
        own = data.get("tokens")
        if isinstance(own, dict) and own.get("access_token"):
            tokens.append(("ChatGPT sign-in", _jwt_expiry(own["access_token"]), bool(own.get("refresh_token"))))
    else:  # OpenCode's auth.json: one entry per model provider
        for name, entry in sorted(data.items()):
            if isinstance(entry, dict) and entry.get("type") == "oauth" and entry.get("access"):
                tokens.append((f"{name} sign-in", _epoch(entry.get("expires")), bool(entry.get("refresh"))))
            elif isinstance(entry, dict) and entry.get("key"):
                tokens.append((f"{name} API key", None, False))
    return tokens


def _when(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def sign_in_verdict(relative: str, text: str, now: float) -> tuple[bool, str]:
    """(usable, what to say) of one sign-in file: it must be JSON; a credential whose expiry the file records is
    usable until then, or after when a refresh token renews it. Never a token's value."""
    where = f"~/{relative}"
    try:
        data = json.loads(text)
    except ValueError:
        return False, f"{where} is not valid JSON (the agent cannot read it)"
    if not isinstance(data, dict):
        return False, f"{where} is not a JSON object (the agent cannot read it)"
    tokens = sign_in_tokens(relative, data)
    if not tokens:
        return True, f"{where} (no expiry readable)"
    live = [token for token in tokens if token[1] is None or token[1] > now]
    if live:
        what, expiry, _renewable = live[0]
        return True, f"{where} ({what}{f', expires {_when(expiry)}' if expiry else ''})"
    renewable = [token for token in tokens if token[2]]
    if renewable:
        what, expiry, _renewable = renewable[0]
        return True, f"{where} ({what}: expired {_when(expiry or now)}, renewed by its refresh token when used)"
    what, expiry, _renewable = tokens[0]
    return False, f"{where}: {what} expired {_when(expiry or now)}, with no refresh token"


# -- remote engines --------------------------------------------------------------------------------
def engine_checks(engine: str, ssh_options: dict[str, Any], image: str) -> list[Check]:
    from ..providers.docker._docker import DockerProvider
    from ..ssh import _ssh

    where = f"engine {engine}"
    state: dict[str, Any] = {}

    def ssh_answers() -> tuple[str, str, str]:
        connection = _ssh.connection_for(engine, **ssh_options)
        state["connection"] = connection
        return OK, f"{connection.destination.address}", ""

    checks = [run_check(where, "SSH answers", ssh_answers,
                        f"make `ssh {engine} true` work from here: the machine up, its SSH server listening, "
                        "your key in its authorized_keys, its host key in your known_hosts")]
    if "connection" not in state:
        why = "cannot run: SSH does not answer (see above)"
        later = ("Docker answers", "isolation", "box image", "unisolated boxes")
        return checks + [Check(where, name, FAIL, why) for name in later]

    def docker_answers() -> tuple[str, str, str]:
        status = _engine_setup.status(engine, ssh_options)
        state["status"] = status
        if status.default_engine or status.box_engine:
            return OK, "the docker CLI and its daemon answer", ""
        state["connection"].docker_path()  # raises the reason (no CLI, daemon down, no permission) and its fix
        return FAIL, "no Docker daemon answers", "start Docker there (systemctl start docker)"

    checks.append(run_check(where, "Docker answers", docker_answers))
    status = state.get("status")
    if status is None or not (status.default_engine or status.box_engine):
        why = "cannot run: Docker does not answer (see above)"
        return checks + [Check(where, name, FAIL, why) for name in ("isolation", "box image", "unisolated boxes")]

    def isolation() -> tuple[str, str, str]:
        if status.box_engine and status.box_engine_remaps:
            return OK, f"box engine at {_box_engine.REMOTE_BOX_ENGINE} remaps user namespaces", ""
        if status.default_remaps:
            return OK, "its Docker daemon remaps user namespaces", ""
        return (FAIL, "no box engine there: creates are refused unless isolation=none is given, and then root in "
                      "the box is root on that host", f"ansible-playbook playbooks/box_engine.yml -e engine={engine}")

    checks.append(run_check(where, "isolation", isolation))
    provider = DockerProvider(engine=engine, ssh_options=ssh_options)

    def box_image() -> tuple[str, str, str]:
        if provider.image_exists(image):
            return OK, f"{image} is there", ""
        return (WARN, f"{image} is not there: the first create sends it from this machine (about 1 GB over SSH)",
                f"create a box there once (create_box.yml -e provider=docker_ssh -e engine={engine})")

    checks.append(run_check(where, "box image", box_image))
    checks.append(run_check(where, "unisolated boxes", lambda: _unisolated(provider)))
    return checks


# -- clouds ---------------------------------------------------------------------------------------
def cloud_checks(image: str = DEFAULT_IMAGE) -> list[Check]:
    """Daytona and boxd, each only when its credentials are configured (in the environment)."""
    checks = []
    for name, keys in CLOUD_KEYS.items():
        if any(os.environ.get(key) for key in keys):
            checks += _cloud(name, image)
    return checks


def _cloud(name: str, image: str) -> list[Check]:
    made: list[Provider] = []

    def answers() -> tuple[str, str, str]:
        provider = get_provider(name, **cloud_settings(name, lambda _setting: None))
        boxes = provider.list_boxes()
        made.append(provider)
        return OK, f"{provider.engine} answers ({len(boxes)} boxes)", ""

    checks = [run_check(name, "API answers", answers)]
    if not made:
        return [*checks, Check(name, "box image", FAIL, "cannot run: the API does not answer (see above)")]

    def cloud_image() -> tuple[str, str, str]:
        if made[0].image_exists(image):
            return OK, f"{image} is there", ""
        return (FAIL, f"{image} is not there: a create on {name} is refused",
                f"make it there (docs/providers/{name}.md), or name one that is with -e image=REF")

    return [*checks, run_check(name, "box image", cloud_image)]


def run_all(engines: list[dict[str, Any]], image: str = DEFAULT_IMAGE, agents: list[str] | None = None,
            local: bool = True, clouds: bool = True) -> list[Check]:
    """Every check: this machine's (local), each remote engine's ({engine, ssh_options}), the clouds'."""
    checks = local_checks(image, agents or []) if local else []
    for entry in engines:
        checks += engine_checks(entry["engine"], entry.get("ssh_options") or {}, image)
    return checks + (cloud_checks(image) if clouds else [])
