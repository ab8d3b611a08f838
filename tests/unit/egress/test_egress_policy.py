"""A box's egress policy: the words and patterns accepted, what is refused with what to write instead,
the default list, and the decision for one host (docs/egress.md)."""

from __future__ import annotations

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import (
    DEFAULT_ALLOW,
    Decision,
    EgressError,
    EgressPolicy,
    agent_hosts,
    denial_message,
    parse_policy,
    request_host,
)


def test_the_default_policy_is_the_allow_list_of_registries_sources_and_agent_apis() -> None:
    policy = parse_policy()
    assert policy == EgressPolicy("allowlist", ())
    for host in ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "deb.debian.org",
                 "security.debian.org", "github.com", "codeload.github.com", "objects.githubusercontent.com",
                 "api.anthropic.com", "api.openai.com"):
        assert policy.decide(host) == Decision(True, "default allow list"), host
    assert policy.decide("example.com") == Decision(False, "not in the allow list")
    assert policy.decide("evil.github.com.attacker.example") == Decision(False, "not in the allow list")
    assert len(set(DEFAULT_ALLOW)) == len(DEFAULT_ALLOW)
    assert all(request_host(host) == host for host in DEFAULT_ALLOW)


def test_open_allows_any_host_and_none_allows_nothing() -> None:
    assert parse_policy("open").decide("example.com") == Decision(True, "egress: open")
    none = parse_policy(" None ", ["example.com"])
    assert none.decide("pypi.org") == Decision(False, "egress: none")
    assert none.decide("example.com") == Decision(False, "egress: none")


def test_egress_allow_adds_names_and_wildcards_to_the_default_list() -> None:
    policy = parse_policy("allowlist", ["Registry.Corp.Example.", "*.pkg.example.org", "10.0.0.7", "[::1]"])
    assert policy.allow == ("registry.corp.example", "*.pkg.example.org", "10.0.0.7", "::1")
    assert policy.decide("registry.corp.example") == Decision(True, "egress_allow: registry.corp.example", named=True)
    assert policy.decide("a.b.pkg.example.org") == Decision(True, "egress_allow: *.pkg.example.org", named=True)
    assert not policy.decide("pkg.example.org").allowed  # a wildcard is the names below, not the domain
    assert not policy.decide("xpkg.example.org").allowed
    assert policy.decide("10.0.0.7").allowed and policy.decide("::1").allowed
    assert policy.decide("pypi.org").allowed  # added to, not replaced
    assert parse_policy(None, "a.example, *.b.example  c.example").allow == ("a.example", "*.b.example", "c.example")
    assert EgressPolicy.from_record(policy.record()) == policy
    for broken in ({}, "open", {"egress": None}, {"egress": "open", "egress_allow": "bad_host"}):
        with pytest.raises(EgressError):
            EgressPolicy.from_record(broken)


def test_a_leading_minus_takes_a_host_off_the_default_list_and_a_refusal_says_which_entry() -> None:
    policy = parse_policy("allowlist", ["-Registry.NPMjs.org", "pkg.corp.example"], environ={})
    assert policy.allow == ("-registry.npmjs.org", "pkg.corp.example")
    assert policy.decide("registry.npmjs.org") == Decision(False, "egress_allow: -registry.npmjs.org")
    assert policy.decide("pypi.org").allowed and policy.decide("pkg.corp.example").allowed
    assert EgressPolicy.from_record(policy.record()) == policy
    message = denial_message("fix-login", "registry.npmjs.org", 443, policy.decide("registry.npmjs.org"))
    assert "remove the entry -registry.npmjs.org from egress_allow" in message
    assert not parse_policy("open", ["-pypi.org"]).decide("pypi.org").allowed
    with pytest.raises(EgressError, match=r"'-example.com'.* is not on it: write one of pypi.org"):
        parse_policy("allowlist", ["-example.com"])
    with pytest.raises(EgressError, match=r"takes the agent's own API host off the list \(api.anthropic.com\): "
                                          r"remove -api.anthropic.com from egress_allow"):
        parse_policy("allowlist", ["-api.anthropic.com"], environ={}, agents=("claude",))


@pytest.mark.parametrize(("egress", "says"), [
    ("opne", "did you mean open?"),
    ("allow", "did you mean allowlist?"),
    ("deny-all", "write allowlist (the default list plus egress_allow), open (any public host, audited) or none"),
    (3, "is not a policy"),
])  # fmt: skip
def test_an_unknown_policy_word_is_refused_with_the_words_there_are(egress: object, says: str) -> None:
    with pytest.raises(EgressError, match="is not a policy") as caught:
        parse_policy(egress)
    assert says in str(caught.value)


@pytest.mark.parametrize(("entry", "says"), [
    ("https://github.com/org/repo", "is a URL, not a host name: write github.com"),
    ("pypi.org/simple", "is a URL, not a host name: write pypi.org"),
    ("registry.example.com:8443", "names a port: write registry.example.com"),
    ("*github.com", "a wildcard is only `*.` at the start of a name: write *.github.com"),
    ("api.*.example.com", "a wildcard is only `*.` at the start of a name"),
    ("*.com", "would allow every host under .com: name the domain"),
    ("*", "a wildcard is only `*.` at the start of a name: write *.example.com"),
    ("*.10.0.0.1", "is not a wildcard"),
    ("exa mple.com", "is not a host name"),
    ("-bad.example", "a leading '-' takes a host of the default list off it"),
    ("under_score.example", "is not a host name"),
    ("", "is not a host name"),
    (5, "is not a host name: write names as strings"),
])  # fmt: skip
def test_a_malformed_allow_entry_is_refused_with_what_to_write(entry: object, says: str) -> None:
    with pytest.raises(EgressError) as caught:
        parse_policy("allowlist", [entry])
    assert says in str(caught.value)
    assert str(caught.value).startswith("egress_allow: ")


def test_an_allow_list_that_is_not_a_list_or_too_long_is_refused() -> None:
    with pytest.raises(EgressError, match="must be a list of host names, not dict"):
        parse_policy("allowlist", {"github.com": True})
    with pytest.raises(EgressError, match=r"at most 256: use `\*\.` wildcards"):
        parse_policy("allowlist", [f"h{i}.example.com" for i in range(257)])


def test_a_list_that_blocks_the_agents_own_api_host_is_refused_with_what_to_add() -> None:
    environ = {"ANTHROPIC_BASE_URL": "https://llm.corp.example/anthropic"}
    with pytest.raises(EgressError) as caught:
        parse_policy("allowlist", [], environ=environ)
    message = str(caught.value)
    assert "would block the agent's own API host" in message
    assert "egress_allow: [llm.corp.example]" in message
    assert "ANTHROPIC_BASE_URL=https://llm.corp.example/anthropic" in message
    assert parse_policy("allowlist", ["llm.corp.example"], environ=environ).allow == ("llm.corp.example",)
    assert parse_policy("allowlist", ["*.corp.example"], environ=environ).mode == "allowlist"
    assert parse_policy("open", [], environ=environ).mode == "open"
    # Only the agents the box runs count; vendor hosts are on the default list.
    assert parse_policy("allowlist", [], environ=environ, agents=("codex",)).mode == "allowlist"
    assert parse_policy("allowlist", [], environ={}).mode == "allowlist"


def test_the_agents_api_hosts_follow_the_hosts_base_urls() -> None:
    assert agent_hosts({}) == {"api.anthropic.com": "the claude agent's API", "api.openai.com": "the codex agent's API"}
    moved = agent_hosts({"OPENAI_BASE_URL": "http://gw.example:8080/v1", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    assert moved == {"gw.example": "the codex agent's API (OPENAI_BASE_URL=http://gw.example:8080/v1)"}


def test_a_refusal_names_the_host_and_the_setting_to_change() -> None:
    policy = parse_policy()
    message = denial_message("fix-login", "example.com", 443, policy.decide("example.com"))
    assert "box fix-login may not reach example.com:443 (not in the allow list)" in message
    assert "egress_allow: [example.com]" in message
    none = denial_message("b", "pypi.org", 443, parse_policy("none").decide("pypi.org"))
    assert "(egress: none)" in none and "set egress: allowlist" in none


def test_request_hosts_are_normalized_or_refused() -> None:
    assert request_host("GitHub.COM.") == "github.com"
    assert request_host("[2001:db8::1]") == "2001:db8::1"
    assert request_host("a b") is None
    assert request_host("x" * 300) is None
