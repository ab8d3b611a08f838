"""The real relay daemon runs the egress gateway: a box registered with a policy gets its gateway socket
from the relay process, the forwarder reaches the stand-in registry through it, a stopped relay
means an answer saying how to start it (never another way out), and a restarted relay serves again.
The relay's idle pass is switched off (AGENTBOX_IDLE_INTERVAL=0) and the registration is fresh, so the
daemon asks no engine anything."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.egress import _egress_forwarder, _egress_gateway
from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import parse_policy
from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_state
from tests.unit.egress.egress_support import Forwarder, wait_audit

BOX_ID = "0e9e55ab"


@pytest.fixture
def relay(short_home: Path, registry_port: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("AGENTBOX_IDLE_INTERVAL", "0")
    monkeypatch.setenv("AGENTBOX_GATEWAY_RESOLVE", "pypi.org=127.0.0.1")
    _relay_state.register_box("fix-login", BOX_ID, "docker", "local", channel="socket",
                              egress=parse_policy().record())
    _relay_state.start()
    try:
        yield Path(_relay_state.box_socket_dir(BOX_ID)) / _egress_gateway.SOCKET_NAME
    finally:
        _relay_state.stop()


def wait_for_socket(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.is_socket() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_relay_serves_the_gateway_and_a_stopped_relay_is_named_not_bypassed(
    relay: Path, registry_port: int
) -> None:
    wait_for_socket(relay)
    forwarder = Forwarder(str(relay))
    try:
        allowed = forwarder.curl("--proxytunnel", "-o", "/dev/null", "-w", "%{http_code}",
                                 f"http://pypi.org:{registry_port}/bytes/65536")
        assert allowed.stdout == "200", allowed.stderr
        denied = forwarder.curl("-w", "%{http_code}", "http://example.com/")
        assert denied.stdout.endswith("403") and "egress_allow: [example.com]" in denied.stdout
        assert sorted((line["host"], line["decision"]) for line in wait_audit(2)) == [
            ("example.com", "denied"), ("pypi.org", "allowed")]
        _relay_state.stop()
        down = forwarder.curl("-w", "%{http_code}", f"http://pypi.org:{registry_port}/bytes/10")
        assert down.stdout.endswith("503") and _egress_forwarder.START_HINT in down.stdout
        _relay_state.start()
        wait_for_socket(relay)
        again = forwarder.curl("--proxytunnel", "-o", "/dev/null", "-w", "%{http_code}",
                               f"http://pypi.org:{registry_port}/bytes/10")
        assert again.stdout == "200", again.stderr
        assert oct(os.lstat(relay).st_mode & 0o777) == "0o666"
    finally:
        forwarder.stop()
