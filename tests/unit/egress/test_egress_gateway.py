"""The egress gateway on real sockets: boxes connect on their own unix sockets, speak HTTP CONNECT and
plain-HTTP proxying, and the gateway reaches a stand-in registry on 127.0.0.1 (named pypi.org and
others through AGENTBOX_GATEWAY_RESOLVE, the host user's override). Nothing leaves 127.0.0.1."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import resource
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.egress import _egress_credentials, _egress_gateway
from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import parse_policy
from ansible_collections.agentbox.box.plugins.module_utils.relay import _relay_state
from tests.unit.egress.egress_support import CHUNK, Registry, Running, wait_audit


def connect(path: str, timeout: float = 30.0) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(timeout)
    client.connect(path)
    return client


def read_head(client: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def tunnel(path: str, target: str) -> tuple[socket.socket, bytes]:
    """A CONNECT on the box's socket: the socket and the gateway's answer head."""
    client = connect(path)
    client.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    return client, read_head(client)


def get_through(client: socket.socket, host: str, url: str) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection(host)
    connection.sock = client  # the tunnel is the connection
    connection.request("GET", url)
    return connection.getresponse()


def proxy_request(path: str, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
                  ) -> http.client.HTTPResponse:
    """A plain-HTTP proxy request (absolute URL) on the box's socket."""
    connection = http.client.HTTPConnection("gateway")
    connection.sock = connect(path)
    connection.request(method, url, body=body, headers=headers or {})
    return connection.getresponse()


def test_an_allowed_host_is_reached_through_a_connect_tunnel_and_audited(running: Running) -> None:
    box = running.box("fix-login", parse_policy())
    client, head = tunnel(box, f"pypi.org:{running.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    answer = get_through(client, "pypi.org", "/bytes/300000")
    assert answer.status == 200 and len(answer.read()) == 300000
    client.close()
    [line] = wait_audit(1)
    assert line["box"] == "fix-login" and line["host"] == "pypi.org" and line["port"] == running.port
    assert line["decision"] == "allowed" and line["reason"] == "default allow list"
    assert line["bytes_in"] > 300000 and 0 < line["bytes_out"] < 1000
    assert set(line) >= {"time", "box", "host", "port", "decision", "reason", "bytes_in", "bytes_out"}
    assert stat.S_IMODE(os.stat(_egress_gateway.audit_path()).st_mode) == 0o600


def test_a_plain_http_request_is_sent_on_in_origin_form_without_the_proxys_headers(running: Running) -> None:
    box = running.box("b", parse_policy())
    answer = proxy_request(box, "GET", f"http://registry.npmjs.org:{running.port}/left-pad?v=1",
                           headers={"Proxy-Authorization": "Basic c2VjcmV0", "Proxy-Connection": "keep-alive",
                                    "Connection": "X-Drop", "X-Drop": "1", "X-Keep": "2", "Host": "evil.example"})
    assert answer.status == 200
    seen = json.loads(answer.read())
    assert seen["path"] == "/left-pad?v=1"
    names = {name.lower() for name in seen["headers"]}
    assert "proxy-authorization" not in names and "proxy-connection" not in names and "x-drop" not in names
    assert seen["headers"]["X-Keep"] == "2" and seen["headers"]["Connection"] == "close"
    assert seen["headers"]["Host"] == f"registry.npmjs.org:{running.port}"  # the checked host, not the box's
    # An upload is streamed on as it comes (8 MiB in pieces).
    pieces = (b"y" * CHUNK for _piece in range(128))
    posted = proxy_request(box, "POST", f"http://files.pythonhosted.org:{running.port}/upload", body=pieces,
                           headers={"Content-Length": str(128 * CHUNK)})
    assert posted.status == 200 and posted.read() == str(128 * CHUNK).encode()
    lines = wait_audit(2)
    assert [line["host"] for line in lines] == ["registry.npmjs.org", "files.pythonhosted.org"]
    assert lines[1]["bytes_out"] > 128 * CHUNK


def test_a_host_not_allowed_is_refused_at_once_naming_the_host_and_the_setting(running: Running) -> None:
    box = running.box("fix-login", parse_policy())
    client, head = tunnel(box, "example.com:443")
    status_line = head.split(b"\r\n", 1)[0].decode()
    assert status_line == "HTTP/1.1 403 agentbox egress: example.com:443 not allowed (see egress_allow)"
    body = client.recv(4096).decode() if not head.split(b"\r\n\r\n", 1)[1] else head.split(b"\r\n\r\n", 1)[1].decode()
    assert "box fix-login may not reach example.com:443 (not in the allow list)" in body
    assert "egress_allow: [example.com]" in body
    client.close()
    plain = proxy_request(box, "GET", "http://example.org/")
    assert plain.status == 403 and b"may not reach example.org:80" in plain.read()
    none = running.box("sealed", parse_policy("none"))
    _client, head = tunnel(none, f"pypi.org:{running.port}")
    assert head.startswith(b"HTTP/1.1 403 ")
    assert Registry.seen == []  # nothing reached the upstream
    lines = wait_audit(3)
    assert [(line["box"], line["host"], line["decision"], line["reason"]) for line in lines] == [
        ("fix-login", "example.com", "denied", "not in the allow list"),
        ("fix-login", "example.org", "denied", "not in the allow list"),
        ("sealed", "pypi.org", "denied", "egress: none"),
    ]
    assert all(line["bytes_in"] == line["bytes_out"] == 0 for line in lines)


def test_a_private_address_is_refused_unless_the_user_named_the_host(running: Running) -> None:
    wide_open = running.box("open", parse_policy("open"))
    targets = (f"127.0.0.1:{running.port}", f"localhost:{running.port}", "[::1]:22", "169.254.169.254:80",
               "10.1.2.3:443", "[::ffff:127.0.0.1]:80", "[64:ff9b::7f00:1]:80", "[2002:7f00:1::]:80")
    for target in targets:
        _client, head = tunnel(wide_open, target)
        assert head.startswith(b"HTTP/1.1 403 "), target
    reasons = [line["reason"] for line in wait_audit(len(targets))]
    assert all(reason.startswith("resolves to a non-public address") for reason in reasons), reasons
    named = running.box("named", parse_policy("allowlist", ["127.0.0.1"]))
    client, head = tunnel(named, f"127.0.0.1:{running.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert get_through(client, "127.0.0.1", "/echo").status == 200
    assert wait_audit(len(targets) + 1)[-1]["reason"] == "egress_allow: 127.0.0.1"


def test_the_gateway_reaches_a_registry_as_any_host_process_does(running: Running) -> None:
    """The default list's registry, resolved on the host: this machine's network answers every name at a
    transparent proxy in a documentation range (203.0.113.0/24), which Python calls private; the gateway
    must connect there as curl on the host does (the allowed path in a box failed: pip found no versions)."""
    box = running.box("pip", parse_policy())
    client, head = tunnel(box, "registry.yarnpkg.com:443")  # not pointed at the stand-in
    assert head.startswith(b"HTTP/1.1 200 "), head
    client.close()
    assert wait_audit(1)[-1]["reason"] == "default allow list"
    assert _egress_gateway.is_public("203.0.113.80") and _egress_gateway.is_public("2001:db8::1")
    for private in ("10.0.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254", "::ffff:10.0.0.1", "fd00::1"):
        assert not _egress_gateway.is_public(private), private


def test_an_allowed_host_that_does_not_answer_gets_a_502_at_once(running: Running) -> None:
    idle = socket.socket()
    idle.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    box = running.box("b", parse_policy())
    _client, head = tunnel(box, f"pypi.org:{idle.getsockname()[1]}")
    idle.close()
    assert head.startswith(b"HTTP/1.1 502 ")
    [line] = wait_audit(1)
    assert line["decision"] == "allowed" and "not connected" in line["reason"]


def test_each_box_is_the_socket_it_came_in_on(running: Running) -> None:
    loose = running.box("loose", parse_policy("allowlist", ["127.0.0.1"]))
    strict = running.box("strict", parse_policy())
    ok, head = tunnel(loose, f"127.0.0.1:{running.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    ok.close()
    # A request head cannot claim another box: there is no field for it, only the socket.
    client = connect(strict)
    client.sendall(f"CONNECT 127.0.0.1:{running.port} HTTP/1.1\r\nX-Agentbox-Box: loose\r\n\r\n".encode())
    assert read_head(client).startswith(b"HTTP/1.1 403 ")
    assert sorted((line["box"], line["decision"]) for line in wait_audit(2)) == [("loose", "allowed"),
                                                                                 ("strict", "denied")]


def test_a_box_over_its_connection_cap_waits_and_other_boxes_do_not(running: Running) -> None:
    flooding = running.box("flood", parse_policy(), box_connections=2)
    calm = running.box("calm", parse_policy(), box_connections=2)
    held = [tunnel(flooding, f"pypi.org:{running.port}") for _slot in range(2)]
    assert all(head.startswith(b"HTTP/1.1 200 ") for _client, head in held)
    waiting = connect(flooding, timeout=0.5)  # queued in the box's own listen queue
    waiting.sendall(f"CONNECT pypi.org:{running.port} HTTP/1.1\r\n\r\n".encode())
    with pytest.raises(TimeoutError):
        waiting.recv(1)  # not taken while both of the box's slots are held
    # Many more connections from the flooding box: its queue fills, its own connects wait.
    queued = []
    for _extra in range(50):
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.setblocking(False)
        try:
            extra.connect(flooding)
        except BlockingIOError:
            pass  # its queue is full
        queued.append(extra)
    # Meanwhile the other box is served.
    client, head = tunnel(calm, f"pypi.org:{running.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert get_through(client, "pypi.org", "/echo").status == 200
    for extra in queued:
        extra.close()
    for held_client, _head in held:
        held_client.close()
    waiting.settimeout(30)
    assert read_head(waiting).startswith(b"HTTP/1.1 200 ")  # a slot freed: its turn came


def test_a_large_download_is_streamed_not_held_in_memory(running: Running) -> None:
    box = running.box("b", parse_policy())
    size = 200 * 1024 * 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    client, head = tunnel(box, f"pypi.org:{running.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    answer = get_through(client, "pypi.org", f"/bytes/{size}")
    got = 0
    while chunk := answer.read(1 << 20):
        got += len(chunk)
    client.close()
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert got == size
    assert grew_mib < 64, f"peak RSS grew {grew_mib:.0f} MiB for {size >> 20} MiB carried"
    assert wait_audit(1)[0]["bytes_in"] > size


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"hello\r\n\r\n", b"400"),
    (b"GET /relative HTTP/1.1\r\nHost: pypi.org\r\n\r\n", b"400"),
    (b"CONNECT pypi.org HTTP/1.1\r\n\r\n", b"400"),
    (b"CONNECT pypi.org:99999 HTTP/1.1\r\n\r\n", b"400"),
    (b"GET https://pypi.org/ HTTP/1.1\r\n\r\n", b"400"),
    (b"CONNECT bad_host!:443 HTTP/1.1\r\n\r\n", b"400"),
    (b"GET http://pypi.org/ HTTP/1.1\r\n" + b"X-Big: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
])  # fmt: skip
def test_a_malformed_request_is_answered_and_the_gateway_keeps_serving(running: Running, request_bytes: bytes,
                                                                       status: bytes) -> None:
    box = running.box("b", parse_policy())
    client = connect(box)
    client.sendall(request_bytes)
    assert read_head(client).split(b" ")[1] == status
    [line] = wait_audit(1)
    assert line["decision"] == "denied" and line["reason"] == "malformed request"
    _ok, head = tunnel(box, f"pypi.org:{running.port}")
    assert head.startswith(b"HTTP/1.1 200 ")


def test_the_relays_registrations_give_each_local_box_a_gateway_socket(running: Running) -> None:
    policy = parse_policy("allowlist", ["127.0.0.1"])
    _relay_state.register_box("local", "0badc0de", "docker", "local", channel="socket", egress=policy.record())
    _relay_state.register_box("remote", "0ddba11", "docker_ssh", "ssh://h", channel="tunnel", egress=policy.record())
    _relay_state.register_box("before", "0ldb0c5", "docker", "local", channel="socket")  # made without a policy
    running.run(running.gateway.sync(_relay_state.registered_boxes()))
    socket_path = Path(_relay_state.box_socket_dir("0badc0de")) / _egress_gateway.SOCKET_NAME
    assert stat.S_IMODE(os.lstat(socket_path).st_mode) == 0o666
    assert sorted(running.gateway.boxes) == ["0badc0de"]  # a remote box reaches it another way
    assert os.listdir(_relay_state.box_socket_dir("0ldb0c5")) == []
    client, head = tunnel(str(socket_path), f"127.0.0.1:{running.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    client.close()
    assert wait_audit(1)[0]["reason"] == "egress_allow: 127.0.0.1"
    # The host records a new policy: the next connection is decided by it.
    _relay_state.register_box("local", "0badc0de", "docker", "local", channel="socket",
                              egress=parse_policy("none").record())
    running.run(running.gateway.sync(_relay_state.registered_boxes()))
    _client, head = tunnel(str(socket_path), f"127.0.0.1:{running.port}")
    assert head.startswith(b"HTTP/1.1 403 ")
    # A record the gateway does not understand allows nothing.
    broken = {**_relay_state.registered_boxes()["0badc0de"], "egress": {"egress": "everything"}}
    running.run(running.gateway.sync({"0badc0de": broken}))
    _client, head = tunnel(str(socket_path), "pypi.org:443")
    assert head.startswith(b"HTTP/1.1 403 ")
    assert wait_audit(3)[-1]["reason"] == "egress: none"
    _relay_state.forget_box("0badc0de")
    running.run(running.gateway.sync(_relay_state.registered_boxes()))
    assert running.gateway.boxes == {}


def api_request(path: str, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
    """What the agent in a box sends to its base URL at the gateway (origin form, through the forwarder)."""
    connection = http.client.HTTPConnection("127.0.0.1", 3128)
    connection.sock = connect(path)
    connection.request("GET", url, headers=headers)
    return connection.getresponse()


def test_the_api_endpoint_adds_the_hosts_key_in_place_of_the_boxs_placeholder(running: Running) -> None:
    """Credential injection (docs/egress.md): the box sends the placeholder, the upstream sees the host's key,
    which only the host's file holds; a box the host wrote nothing for is told how to start its agent."""
    box = running.box("agent", parse_policy())
    key = "sk-ant-host-only-0123456789"
    env, files, kind = _egress_credentials.keep_on_host(
        "id-agent", "claude", {"ANTHROPIC_API_KEY": key, "ANTHROPIC_MODEL": "m"}, {".claude/.credentials.json": "{}"})
    assert kind == "ANTHROPIC_API_KEY" and files == {} and key not in json.dumps(env)
    assert env == {"ANTHROPIC_MODEL": "m", "ANTHROPIC_BASE_URL": "http://127.0.0.1:3128/anthropic",
                   "ANTHROPIC_API_KEY": _egress_credentials.PLACEHOLDER}
    assert stat.S_IMODE(os.stat(_egress_credentials.credentials_file("id-agent")).st_mode) == 0o600
    running.gateway.environ["AGENTBOX_GATEWAY_UPSTREAM_ANTHROPIC"] = f"http://127.0.0.1:{running.port}"
    answer = api_request(box, "/anthropic/echo?beta=true", {"x-api-key": env["ANTHROPIC_API_KEY"],
                                                            "anthropic-beta": "a,b"})
    assert answer.status == 200
    seen = json.loads(answer.read())
    assert seen["path"] == "/echo?beta=true"
    assert seen["headers"]["x-api-key"] == key and seen["headers"]["Host"] == f"127.0.0.1:{running.port}"
    assert seen["headers"]["anthropic-beta"] == "a,b"
    line = wait_audit(1)[-1]
    assert line["host"] == "127.0.0.1" and line["decision"] == "allowed" and key not in json.dumps(line)
    assert line["reason"].endswith("ANTHROPIC_API_KEY added")
    nothing = running.box("bare", parse_policy())
    refused = api_request(nothing, "/anthropic/v1/messages", {})
    assert refused.status == 403 and b"start the agent from the host" in refused.read()
    assert api_request(box, "/elsewhere", {}).status == 400
    # A client that sends its base URL to the proxy (NO_PROXY not read) reaches the same endpoint.
    through = api_request(box, "http://127.0.0.1:3128/anthropic/echo", {"x-api-key": "placeholder"})
    assert json.loads(through.read())["headers"]["x-api-key"] == key


def test_the_api_endpoint_keeps_to_the_boxs_policy_and_a_sign_in_token_goes_as_a_bearer(running: Running) -> None:
    sealed = running.box("sealed", parse_policy("none"))
    signed_in = json.dumps({"claudeAiOauth": {"accessToken": "sk-ant-oat-host", "refreshToken": "r"}})
    _env, _files, kind = _egress_credentials.keep_on_host("id-sealed", "claude", {},
                                                          {".claude/.credentials.json": signed_in})
    assert kind == "~/.claude/.credentials.json"
    assert _egress_credentials.read_credential("id-sealed", "anthropic")["headers"] == {
        "authorization": "Bearer sk-ant-oat-host"}
    refused = api_request(sealed, "/anthropic/v1/messages", {})
    assert refused.status == 403 and b"may not reach api.anthropic.com:443 (egress: none)" in refused.read()
    # A later run without any credential keeps what an earlier one wrote; the box's end takes the file away.
    _egress_credentials.keep_on_host("id-sealed", "claude", {}, {})
    assert _egress_credentials.read_credential("id-sealed", "anthropic")["kind"] == "~/.claude/.credentials.json"
    _egress_credentials.forget("id-sealed")
    assert _egress_credentials.read_credential("id-sealed", "anthropic") is None


def test_codex_with_an_api_key_gets_it_added_as_a_bearer_on_the_openai_endpoint(running: Running) -> None:
    box = running.box("codex", parse_policy())
    env, files, kind = _egress_credentials.keep_on_host(
        "id-codex", "codex", {"OPENAI_API_KEY": "sk-host-openai"}, {".codex/auth.json": '{"OPENAI_API_KEY": "x"}'})
    assert kind == "OPENAI_API_KEY" and files == {}
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:3128/openai" and "sk-host-openai" not in json.dumps(env)
    running.gateway.environ["AGENTBOX_GATEWAY_UPSTREAM_OPENAI"] = f"http://127.0.0.1:{running.port}/v1"
    answer = api_request(box, "/openai/responses", {"authorization": f"Bearer {env['OPENAI_API_KEY']}"})
    seen = json.loads(answer.read())
    assert seen["path"] == "/v1/responses" and seen["headers"]["authorization"] == "Bearer sk-host-openai"
    # Codex signed in to ChatGPT (no key) and OpenCode keep what they had: the gateway carries no such credential.
    signed_in = {".codex/auth.json": '{"tokens": {}}'}
    assert _egress_credentials.keep_on_host("id-other", "codex", {}, signed_in) == ({}, signed_in, "")
    assert _egress_credentials.keep_on_host("id-other", "opencode", {"OPENAI_API_KEY": "k"}, {}) == (
        {"OPENAI_API_KEY": "k"}, {}, "")
