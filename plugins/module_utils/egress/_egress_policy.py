# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A box's egress policy (docs/egress.md): which hosts the gateway lets the box reach.

    egress: allowlist        the default list below plus egress_allow (the default)
            open             any host with a public address (still audited)
            none             nothing
    egress_allow: [pypi.internal.example, "*.corp.example"]   host names and `*.` wildcards added
                  ["-registry.npmjs.org"]                      `-` and a default host: taken off the default list

Pure: parsing, the checks at create (unknown words, malformed patterns, a list that would block the
agent's own API host), and the decision for one host. The gateway (_egress_gateway) resolves names and
refuses non-public addresses on top of this.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

MODES = ("allowlist", "open", "none")
DEFAULT_MODE = "allowlist"

# The default allow list, in one place (docs/egress.md lists it from here): what the box image, the
# package managers a developer runs in a box and the agents need. Each group: why, then its hosts.
DEFAULT_ALLOW_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Python packages (pip, uv)", ("pypi.org", "files.pythonhosted.org")),
    ("Node packages (npm, yarn)", ("registry.npmjs.org", "registry.yarnpkg.com")),
    ("Debian packages (apt)", ("deb.debian.org", "security.debian.org")),
    ("GitHub: git over HTTPS, archives, releases, raw files", (
        "github.com", "api.github.com", "codeload.github.com", "objects.githubusercontent.com",
        "raw.githubusercontent.com", "release-assets.githubusercontent.com",
    )),
    ("Docker Hub: the box's own dockerd pulls", (
        "registry-1.docker.io", "auth.docker.io", "production.cloudflare.docker.com",
    )),
    ("the agents' APIs and sign-in", (
        "api.anthropic.com", "console.anthropic.com", "api.openai.com", "auth.openai.com", "chatgpt.com",
        "models.dev",
    )),
)  # fmt: skip
DEFAULT_ALLOW: tuple[str, ...] = tuple(host for _why, hosts in DEFAULT_ALLOW_GROUPS for host in hosts)

# The API host each agent talks to, and the host variable that moves it (the agents honour it).
AGENT_API = {
    "claude": (("api.anthropic.com", "ANTHROPIC_BASE_URL"),),
    "codex": (("api.openai.com", "OPENAI_BASE_URL"),),
    "opencode": (("api.anthropic.com", "ANTHROPIC_BASE_URL"), ("api.openai.com", "OPENAI_BASE_URL")),
}
MAX_ALLOW = 256  # entries of egress_allow
MAX_HOST = 253  # DNS's limit on a name
LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")  # IDNA names come as xn-- labels


class EgressError(ValueError):
    """A policy refused at create: the message says what to write instead. `setting` is the one at fault
    ("egress", "egress_allow"; None: the policy as a whole), `entry` the index of the egress_allow entry as
    given, and `names` the normalized entries at fault when the index is not known here."""

    def __init__(self, message: str, setting: str | None = None, entry: int | None = None,
                 names: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.setting, self.entry, self.names = setting, entry, names


@dataclasses.dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    named: bool = False  # the host matched an entry the user wrote (egress_allow): it may have a private address


@dataclasses.dataclass(frozen=True)
class EgressPolicy:
    mode: str = DEFAULT_MODE
    allow: tuple[str, ...] = ()  # the user's entries, normalized (egress_allow); `-host` takes a default host off

    def record(self) -> dict[str, Any]:
        """What the host keeps of it (the relay's registration of the box): read back by from_record."""
        return {"egress": self.mode, "egress_allow": list(self.allow)}

    @classmethod
    def from_record(cls, record: Any) -> EgressPolicy:
        """The policy the host recorded; EgressError when the record is not understood (the gateway then
        treats the box as `none`)."""
        if not isinstance(record, Mapping) or not isinstance(record.get("egress"), str):
            raise EgressError(f"the recorded egress policy {record!r} is not an object with a word under 'egress'")
        return parse_policy(record["egress"], record.get("egress_allow"))

    def allowed_hosts(self) -> tuple[str, ...]:
        """The names and `*.` wildcards an allowlist lets through: the default list less its `-` entries, then
        the user's (what a provider's own allow list is given: docs/egress.md "Daytona and boxd")."""
        kept = [host for host in DEFAULT_ALLOW if f"-{host}" not in self.allow]
        return tuple(dict.fromkeys([*kept, *(entry for entry in self.allow if not entry.startswith("-"))]))

    def decide(self, host: str) -> Decision:
        """Whether the box may reach `host` (normalized by request_host), and why: the audit's reason."""
        if self.mode == "none":
            return Decision(False, "egress: none")
        if f"-{host}" in self.allow:
            return Decision(False, f"egress_allow: -{host}")
        user = matching(host, self.allow)
        if user:
            return Decision(True, f"egress_allow: {user}", named=True)
        if self.mode == "open":
            return Decision(True, "egress: open")
        if host in DEFAULT_ALLOW:
            return Decision(True, "default allow list")
        return Decision(False, "not in the allow list")


def matching(host: str, patterns: Iterable[str]) -> str | None:
    """The first pattern that matches `host`: a name matches itself, `*.example.com` every name below
    example.com (not example.com itself)."""
    for pattern in patterns:
        if pattern.startswith("-"):
            continue  # a default host taken off, never a match
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return pattern
        elif host == pattern:
            return pattern
    return None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def host_name(text: str) -> str | None:
    """`text` as a lower-case host name without a trailing dot, or an IP address's canonical form; None
    when it is neither."""
    text = text.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    address = _ip(text)
    if address is not None:
        return str(address)
    text = text.removesuffix(".")
    if not text or len(text) > MAX_HOST:
        return None
    labels = text.split(".")
    if not all(LABEL_RE.fullmatch(label) for label in labels):
        return None
    return text


def normalize_pattern(entry: Any) -> str:
    """One egress_allow entry, checked: a host name, an IP address or `*.` and a name of at least two labels.
    EgressError says what to write instead."""
    if not isinstance(entry, str):
        raise EgressError(f"egress_allow: {entry!r} is not a host name: write names as strings, e.g. pypi.org")
    raw = entry.strip()
    shown = raw or repr(entry)
    if raw.startswith("-"):
        name = host_name(raw[1:])
        if name not in DEFAULT_ALLOW:
            raise EgressError(f"egress_allow: {shown!r}: a leading '-' takes a host of the default list off it, and "
                              f"{raw[1:]!r} is not on it: write one of {', '.join(DEFAULT_ALLOW)} after the '-', "
                              "or leave the entry out")
        return f"-{name}"
    if "://" in raw or "/" in raw:
        parts = urlsplit(raw if "://" in raw else f"//{raw}")
        hint = f": write {parts.hostname}" if parts.hostname and host_name(parts.hostname) else ""
        raise EgressError(f"egress_allow: {shown!r} is a URL, not a host name{hint} (the host only, no scheme or path)")
    if raw.startswith("*."):
        name = host_name(raw[2:])
        if name is None or _ip(name) is not None:
            raise EgressError(f"egress_allow: {shown!r} is not a wildcard: write *. and a host name, e.g. *.example.com")
        if "." not in name:
            raise EgressError(f"egress_allow: {shown!r} would allow every host under .{name}: name the domain, "
                              f"e.g. *.example.{name}")
        return f"*.{name}"
    if "*" in raw:
        tail = raw.replace("*", "").lstrip(".")
        hint = f"*.{tail}" if tail and host_name(tail) else "*.example.com"
        raise EgressError(f"egress_allow: {shown!r}: a wildcard is only `*.` at the start of a name: write {hint}")
    if _ip(raw) is None and raw.count(":") == 1:
        name, _colon, port = raw.partition(":")
        if port.isdigit() and host_name(name):
            raise EgressError(f"egress_allow: {shown!r} names a port: write {host_name(name)} (any port of an "
                              "allowed host is allowed)")
    name = host_name(raw)
    if name is None:
        raise EgressError(f"egress_allow: {shown!r} is not a host name: letters, digits, '-' and '.', "
                          "e.g. registry.example.com, or *.example.com for every host below it")
    return name


def given_entries(value: Any) -> Any:
    """egress_allow's entries as the user gave them: a list, or one string of names separated by commas or
    spaces (anything else as it is, for the caller to refuse)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [word for word in re.split(r"[\s,]+", value) if word]
    return value


def allow_entries(value: Any) -> tuple[str, ...]:
    """egress_allow as given (a list, or one string of names separated by commas or spaces), checked."""
    value = given_entries(value)
    if not isinstance(value, (list, tuple)):
        raise EgressError(f"egress_allow must be a list of host names, not {type(value).__name__}: "
                          "e.g. egress_allow: [pypi.example.com, '*.corp.example']", "egress_allow")
    if len(value) > MAX_ALLOW:
        raise EgressError(f"egress_allow has {len(value)} entries, at most {MAX_ALLOW}: use `*.` wildcards "
                          "for many hosts of one domain", "egress_allow")
    entries: list[str] = []
    for index, entry in enumerate(value):
        try:
            name = normalize_pattern(entry)
        except EgressError as exc:
            raise EgressError(str(exc), "egress_allow", index) from None
        if name not in entries:
            entries.append(name)
    return tuple(entries)


def parse_mode(value: Any) -> str:
    if value is None or value == "":
        return DEFAULT_MODE
    word = value.strip().lower() if isinstance(value, str) else value
    if word in MODES:
        return word
    close = difflib.get_close_matches(str(word), MODES, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise EgressError(f"egress: {value!r} is not a policy{hint}: write allowlist (the default list plus "
                      "egress_allow), open (any public host, audited) or none (no network)", "egress")


def parse_policy(egress: Any = None, egress_allow: Any = None, environ: Mapping[str, str] | None = None,
                 agents: Iterable[str] = ()) -> EgressPolicy:
    """The box's policy from its create option or agentbox.yaml; EgressError names what to write instead.

    `environ` (the host's, at create) and `agents` (the agents the box will run; all of them when none
    is named) give the agents' API hosts: a list that would leave one of them out is refused."""
    policy = EgressPolicy(parse_mode(egress), allow_entries(egress_allow))
    if environ is not None:
        try:
            check_agent_hosts(policy, environ, agents)
        except EgressError as exc:
            if exc.names:  # the first entry, as given, that takes an agent's host off
                exc.entry = next((index for index, entry in enumerate(given_entries(egress_allow))
                                  if normalize_pattern(entry) in exc.names), None)
            raise
    return policy


def agent_hosts(environ: Mapping[str, str], agents: Iterable[str] = ()) -> dict[str, str]:
    """{host: why} the agents need to reach: their vendor's API host, or the host of the base URL the
    host user set for them (ANTHROPIC_BASE_URL, OPENAI_BASE_URL). A base URL on this machine's
    loopback is left out: a box cannot reach the host's loopback through the gateway anyway."""
    needed: dict[str, str] = {}
    for agent in tuple(agents) or tuple(AGENT_API):
        for vendor_host, variable in AGENT_API.get(agent, ()):
            base = environ.get(variable, "").strip()
            host = vendor_host
            why = f"the {agent} agent's API"
            if base:
                try:
                    given = urlsplit(base).hostname
                except ValueError:
                    given = None
                host = host_name(given or "") or ""
                why = f"the {agent} agent's API ({variable}={base})"
            address = _ip(host)
            if not host or host == "localhost" or (address is not None and address.is_loopback):
                continue
            needed.setdefault(host, why)
    return needed


def check_agent_hosts(policy: EgressPolicy, environ: Mapping[str, str], agents: Iterable[str] = ()) -> None:
    """Refuse an allow list that leaves out an agent's API host (`none` is explicit: nothing at all)."""
    if policy.mode != "allowlist":
        return
    missing = {host: why for host, why in agent_hosts(environ, agents).items() if not policy.decide(host).allowed}
    taken_off = sorted(host for host in missing if f"-{host}" in policy.allow)
    if taken_off:
        raise EgressError(f"egress_allow takes the agent's own API host off the list ({', '.join(taken_off)}): "
                          f"remove {', '.join('-' + host for host in taken_off)} from egress_allow, or use egress: "
                          "none for a box with no network at all", "egress_allow",
                          names=tuple(f"-{host}" for host in taken_off))
    if missing:
        hosts = ", ".join(sorted(missing))
        whys = "; ".join(f"{host}: {why}" for host, why in sorted(missing.items()))
        raise EgressError(f"egress: allowlist would block the agent's own API host ({whys}): add it, "
                          f"egress_allow: [{hosts}], or unset the base URL variable on the host")


def check_open_network(policy: EgressPolicy, where: str) -> None:
    """`egress: open` on a provider's own network (Daytona, boxd: no gateway) is that open network: a `-`
    entry would take one host off it, which an allow list cannot do. EgressError says what to write."""
    taken = [entry for entry in policy.allow if entry.startswith("-")]
    if policy.mode == "open" and taken:
        raise EgressError(f"egress_allow {', '.join(taken)}: with egress: open a box on {where} has the provider's "
                          "open network, whose allow list cannot take one host off it: drop the '-' entries, or "
                          "use egress: allowlist", "egress_allow")


def request_host(text: str) -> str | None:
    """The host a box asks for, normalized as patterns are (None: not a host name or address)."""
    return host_name(text)


def denial_message(box: str, host: str, port: int, decision: Decision) -> str:
    """What a refused connection says: the host, why, and the setting that would change it."""
    if decision.reason == "egress: none":
        change = "set egress: allowlist (with egress_allow) or open in agentbox.yaml or the box's create options"
    elif decision.reason.startswith("resolves to"):
        change = (f"add {host} to egress_allow (agentbox.yaml or the create option) to reach it at a private "
                  "address")
    elif decision.reason.startswith("egress_allow: -"):
        change = f"remove the entry -{host} from egress_allow (agentbox.yaml or the create option), then create the box again"
    else:
        change = (f"add it to egress_allow in agentbox.yaml (egress_allow: [{host}]) or the create option "
                  f"egress_allow, then create the box again; or set egress: open")
    return f"agentbox egress gateway: box {box} may not reach {host}:{port} ({decision.reason}). To allow it, {change}."
