"""The in-box forwarder, run as the box runs it (`python3 -c <source>`), here on the host's loopback:
real clients (curl, Python's urllib) with the box's proxy variables go through it and the gateway to
the stand-in registry on 127.0.0.1; with no gateway they get an answer saying how to start it."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.egress import _egress_forwarder
from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import parse_policy
from tests.unit.egress.egress_support import Forwarder, Registry, Running, wait_audit


@pytest.fixture
def forwarder(running: Running) -> Iterator[Forwarder]:
    made = Forwarder(running.box("fix-login", parse_policy()))
    yield made
    made.stop()


def test_the_boxs_proxy_variables_name_the_forwarder_in_both_cases() -> None:
    environ = _egress_forwarder.box_environment(3128, "db")
    for name in ("http_proxy", "https_proxy"):
        assert environ[name] == environ[name.upper()] == "http://127.0.0.1:3128"
    assert environ["no_proxy"] == environ["NO_PROXY"] == "localhost,127.0.0.1,::1,db"


def test_curl_and_urllib_reach_an_allowed_host_through_the_forwarder_and_the_gateway(
    running: Running, forwarder: Forwarder
) -> None:
    plain = forwarder.curl(f"http://registry.npmjs.org:{running.port}/echo")
    assert plain.returncode == 0 and '"path": "/echo"' in plain.stdout
    tunnelled = forwarder.curl("--proxytunnel", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
                               f"http://pypi.org:{running.port}/bytes/1048576")
    assert tunnelled.returncode == 0 and tunnelled.stdout == "200 1048576", tunnelled.stderr
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(
        {"http": forwarder.environ["http_proxy"]}))  # what urllib reads from http_proxy
    with opener.open(f"http://files.pythonhosted.org:{running.port}/echo", timeout=30) as answer:
        assert answer.status == 200
    lines = sorted((line["host"], line["decision"]) for line in wait_audit(3))
    assert lines == [("files.pythonhosted.org", "allowed"), ("pypi.org", "allowed"), ("registry.npmjs.org", "allowed")]


def test_a_host_not_allowed_is_refused_through_the_forwarder_with_the_setting_to_change(
    forwarder: Forwarder,
) -> None:
    plain = forwarder.curl("-w", "%{http_code}", "http://example.com/")
    assert plain.stdout.endswith("403")
    assert "may not reach example.com:80" in plain.stdout and "egress_allow: [example.com]" in plain.stdout
    tunnelled = forwarder.curl("https://example.com/")
    assert tunnelled.returncode != 0 and "403" in tunnelled.stderr
    assert Registry.seen == []


def test_with_no_gateway_a_connection_fails_at_once_saying_how_to_start_it(tmp_path: Path) -> None:
    made = Forwarder(str(tmp_path / "gateway.sock"))  # nothing listens there
    try:
        plain = made.curl("-w", "%{http_code}", "http://pypi.org/simple/")
        assert plain.stdout.endswith("503")
        assert "does not answer" in plain.stdout and _egress_forwarder.START_HINT in plain.stdout
        tunnelled = made.curl("https://pypi.org/simple/")
        assert tunnelled.returncode != 0 and "503" in tunnelled.stderr
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.build_opener(urllib.request.ProxyHandler({"http": made.environ["http_proxy"]})).open(
                "http://pypi.org/simple/", timeout=30)
        assert caught.value.code == 503
    finally:
        made.stop()
