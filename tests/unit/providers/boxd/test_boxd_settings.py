"""Unit tests of the boxd base URL check (_boxd_api.BoxdSettings): each wrong URL says what to write."""

from __future__ import annotations

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._errors import ProviderError
from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd_api import BoxdSettings


@pytest.mark.parametrize(("url", "says"), [
    ("boxd.example.com", "has no scheme: write https://boxd.example.com (or http://boxd.example.com"),
    ("127.0.0.1:8080", "has no scheme: write https://127.0.0.1:8080"),
    ("https://", "names no host"),
    ("http://:80", "names no host"),
    ("grpc://boxd.sh", "must start with https:// (or http:// for a local emulator), not grpc://"),
    ("http://127.0.0.1:9/api", "host and port only (boxd's API has no path): use http://127.0.0.1:9"),
])
def test_a_wrong_base_url_says_what_to_write(url: str, says: str) -> None:
    with pytest.raises(ProviderError) as caught:
        BoxdSettings(token="t", base_url=url).check()
    assert says in str(caught.value)
    assert "BOXD_BASE_URL" in str(caught.value) and "nothing was created" in str(caught.value)


@pytest.mark.parametrize(("url", "taken"), [
    ("HTTPS://boxd.sh", "https://boxd.sh"),
    (" https://boxd.sh/ ", "https://boxd.sh"),
    ("Http://127.0.0.1:8080", "http://127.0.0.1:8080"),
])
def test_a_base_url_differing_only_in_case_or_spacing_is_taken(url: str, taken: str) -> None:
    settings = BoxdSettings(token="t", base_url=url)
    settings.check()
    assert settings.base_url == taken


def test_the_base_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOXD_BASE_URL", "boxd.internal:443")
    with pytest.raises(ProviderError, match=r"write https://boxd\.internal:443"):
        BoxdSettings(token="t").check()


def test_without_an_address_the_sdks_own_front_door_is_dialled(monkeypatch: pytest.MonkeyPatch) -> None:
    """boxd's gRPC API is at boxd.sh:9443 (the SDK's default); boxd.sh:443 is the web console, not the API.
    The key exchange goes to the console host, as the SDK derives it."""
    from boxd._urls import resolve_endpoint

    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd_api import client_for, forget_client

    for name in ("BOXD_BASE_URL", "BOXD_API_URL"):
        monkeypatch.delenv(name, raising=False)
    settings = BoxdSettings(token="t")
    settings.check()
    assert settings.base_url == "https://boxd.sh:9443"
    assert settings.exchange_url == "https://app.boxd.sh/api/v1/auth/token"
    client = client_for(settings)  # no I/O: the channel opens at the first call
    try:
        assert client.base_url == "https://boxd.sh:9443"
        assert resolve_endpoint(client.base_url) == ("boxd.sh:9443", True)  # host:port dialled, over TLS
    finally:
        forget_client(settings)


def test_an_unreachable_key_exchange_is_reported_as_unreachable(home, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key is exchanged over HTTPS before any gRPC call; an address that does not answer is a network
    problem to report as such, not a refused key."""
    import socket

    from ansible_collections.agentbox.box.plugins.module_utils.core._errors import EngineUnreachable
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    monkeypatch.delenv("BOXD_TOKEN", raising=False)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = BoxdProvider(api_key="bxd_unit", base_url=f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(EngineUnreachable) as caught:
            provider.list_boxes()
    finally:
        provider.close()
    message = str(caught.value)
    assert f"http://127.0.0.1:{port}/api/v1/auth/token did not answer" in message, message
    assert "the credential" not in message and "the API key" not in message and "bxd_unit" not in message
