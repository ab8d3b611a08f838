"""Unit tests of the boxd base URL check (_boxd_api.BoxdSettings): each wrong URL says what to write."""

from __future__ import annotations

import pytest

from ansible_collections.agentbox.box.plugins.module_utils._boxd_api import BoxdSettings
from ansible_collections.agentbox.box.plugins.module_utils._errors import ProviderError


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
