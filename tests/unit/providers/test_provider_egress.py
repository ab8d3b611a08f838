"""An egress policy (docs/egress.md) on Daytona and boxd, which have no gateway: each maps it onto its own network
setting (Provider.egress_network). none: Daytona's network_block_all, boxd's allow list naming only a host that
never resolves; open: the provider's open network; allowlist: boxd's allow list of the policy's hosts, refused on
Daytona (IPv4 CIDRs only). A policy and the `network` option together: refused. No provider is asked anything
here (their API address is a port where nothing listens); what the emulators receive: the box-options tests in
tests/integration/providers/daytona and boxd."""

from __future__ import annotations

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._errors import ProviderError
from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import (
    DEFAULT_ALLOW,
    EgressError,
    parse_policy,
)
from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider
from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd_state import (
    NOTHING_HOST,
    egress_allow_for,
)
from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider
from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona_options import (
    daytona_egress_network,
)

KEY = "agentbox-test-key-never-shown"


def test_an_allowlist_is_the_default_list_less_its_dash_entries_plus_the_users_on_boxd() -> None:
    policy = parse_policy("allowlist", ["pypi.corp.example", "*.corp.example", "-registry.npmjs.org", "1.1.1.1"])
    hosts = egress_allow_for(policy)
    assert hosts == [host for host in DEFAULT_ALLOW if host != "registry.npmjs.org"] + [
        "pypi.corp.example", "*.corp.example", "1.1.1.1"]  # fmt: skip
    assert "api.anthropic.com" in hosts  # the agents' API hosts: check_agent_hosts keeps them on
    assert egress_allow_for(parse_policy("allowlist", ["github.com"])) == list(DEFAULT_ALLOW)  # no repeat


def test_none_lets_nothing_out_and_open_is_the_providers_open_network() -> None:
    assert egress_allow_for(parse_policy("none")) == [NOTHING_HOST]
    assert NOTHING_HOST.endswith(".invalid")  # RFC 6761: never resolves
    assert daytona_egress_network(parse_policy("none")) == {"network_block_all": True}
    # open: boxd's empty list and Daytona's no setting are both their open network (user entries add nothing).
    assert egress_allow_for(parse_policy("open", ["pypi.corp.example"])) == []
    assert daytona_egress_network(parse_policy("open")) == {}


@pytest.mark.parametrize("mapping", [egress_allow_for, daytona_egress_network], ids=["boxd", "daytona"])
def test_open_with_a_host_taken_off_is_refused(mapping) -> None:
    """egress: open with `-host`: the gateway would refuse that one host; an allow list cannot."""
    with pytest.raises(EgressError, match=r"^egress_allow -registry\.npmjs\.org: with egress: open a box on "
                       r"(boxd|Daytona) has the provider's open network, whose allow list cannot take one host off "
                       r"it: drop the '-' entries, or use egress: allowlist$"):  # fmt: skip
        mapping(parse_policy("open", ["-registry.npmjs.org"]))


def test_boxd_refuses_an_address_its_allow_list_cannot_take() -> None:
    """boxd takes public IPv4 addresses only: a private or IPv6 entry (the gateway's `named` hosts) is refused."""
    with pytest.raises(ValueError, match=r"^egress_allow 10\.1\.2\.3, 2001:db8::1: boxd's allow list takes host "
                       r"names and public IPv4 addresses only"):  # fmt: skip
        egress_allow_for(parse_policy("allowlist", ["10.1.2.3", "2001:db8::1", "8.8.8.8"]))


def test_daytona_refuses_an_allowlist_saying_to_give_cidrs_with_network() -> None:
    with pytest.raises(ValueError, match=r"Daytona's network allow list takes IPv4 CIDRs only: create the box with "
                       r"network: \[10\.0\.0\.0/8, \.\.\.\] or network: block_all instead of egress, or with egress: "
                       r"none or open$"):  # fmt: skip
        daytona_egress_network(parse_policy("allowlist"))


def test_each_provider_takes_a_policy_unless_the_network_option_was_given_too() -> None:
    """The provider holds the policy (True: the create's one rule lets it through) in place of its environment
    default; with the `network` create option as well it refuses, saying to drop one."""
    daytona = DaytonaProvider(api_key=KEY, api_url="http://127.0.0.1:9/api")
    boxd = BoxdProvider(api_key=KEY, base_url="http://127.0.0.1:9")
    assert daytona.egress_network(parse_policy("none")) is True and boxd.egress_network(parse_policy("none")) is True
    with pytest.raises(ProviderError, match="Daytona's network allow list takes IPv4 CIDRs only"):
        daytona.egress_network(parse_policy("allowlist"))
    given = [DaytonaProvider(api_key=KEY, api_url="http://127.0.0.1:9/api", network="block_all"),
             BoxdProvider(api_key=KEY, base_url="http://127.0.0.1:9", egress_allow=["github.com"])]
    for provider in given:
        with pytest.raises(ProviderError, match=r"^egress and network were both given: .* drop one$"):
            provider.egress_network(parse_policy("none"))
