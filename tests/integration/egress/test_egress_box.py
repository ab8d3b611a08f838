"""Boxes made with an egress policy on the real box engine: their programs (pip, npm) reach the package
registries through the in-box forwarder and the host's gateway (audited), a host the policy refuses is
refused at once saying what to change, root in the box, its own iptables flushed, has no other way out,
a stopped gateway is said at once with how to start it, the box's published 127.0.0.1 ports still
answer, and two boxes on the egress network cannot reach each other. Every test's relay runs under a
private HOME."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import REPO, chown_tree, make_repo, run_module

pytestmark = pytest.mark.integration

RELAY = str(REPO / "scripts/agentbox-relay")
WEB = 8765  # a port the allowing box publishes
NEIGHBOUR = 8766  # a port the open box listens on, for its neighbour to try
PIP = "/tmp/venv/bin/pip install --no-deps --no-cache-dir --retries 0 --timeout 20 six"
NPM = "mkdir -p {0} && cd {0} && npm install --no-audit --no-fund --no-package-lock --cache {0}/.cache is-number"


class Host:
    def __init__(self, home: str) -> None:
        self.home = home

    def module(self, args: dict[str, Any]) -> dict[str, Any]:
        return run_module("agentbox_box", args, env={"HOME": self.home})

    def audit(self, box: str) -> list[dict[str, Any]]:
        path = Path(self.home, ".agentbox/gateway/audit.jsonl")
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [line for line in lines if line["box"] == box]


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    home = tempfile.mkdtemp(prefix="abe-", dir="/tmp")
    os.chmod(home, 0o755)
    yield Host(home)
    subprocess.run([RELAY, "stop"], env={**os.environ, "HOME": home}, capture_output=True, check=False)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def boxes(host: Host, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Three boxes of one workspace: `allowing` (egress allowlist, a published port), `open` (egress open
    with PyPI taken off: egress_allow [-pypi.org]), `closed` (egress none)."""
    root = tmp_path_factory.mktemp("egress")
    for path in (root, *root.parents):
        if str(path) in ("/", "/tmp"):
            break
        path.chmod(path.stat().st_mode | 0o755)
    workspace = make_repo(root / "ws", {"README.md": "hello\n"})
    chown_tree(root)
    made: dict[str, dict[str, Any]] = {}
    try:
        for role, options in (("allowing", {"egress": "allowlist", "ports": [WEB]}),
                              ("open", {"egress": "open", "egress_allow": ["-pypi.org"]}),
                              ("closed", {"egress": "none"})):
            name = f"eg-{secrets.token_hex(3)}"
            created = host.module({"name": name, "workspace": str(workspace), "state": "started", **options})
            assert not created["failed"], created.get("msg")
            made[role] = created["box"]
        yield made
    finally:
        for box in made.values():
            host.module({"name": box["name"], "state": "absent"})


def in_box(box: dict[str, Any], script: str, user: str = "vscode") -> tuple[int, str]:
    container = docker.from_env().containers.get(box["container"])
    result = container.exec_run(["sh", "-c", script], user=user)
    return result.exit_code, result.output.decode("utf-8", "replace")


def venv(box: dict[str, Any]) -> None:
    rc, out = in_box(box, "test -x /tmp/venv/bin/pip || python3 -m venv /tmp/venv")
    assert rc == 0, out


def test_npm_installs_from_the_npm_registry_through_the_gateway(host: Host, boxes: dict[str, dict[str, Any]]) -> None:
    box = boxes["allowing"]
    rc, out = in_box(box, NPM.format("/tmp/npm-a") + " && node -e 'console.log(require(\"is-number\")(5))'")
    assert rc == 0 and out.rstrip().endswith("true"), out
    lines = [line for line in host.audit(box["name"]) if line["host"] == "registry.npmjs.org"]
    assert lines and all((line["decision"], line["reason"], line["port"]) == ("allowed", "default allow list", 443)
                         for line in lines)
    assert sum(line["bytes_in"] for line in lines) > 2000  # the package's metadata and its tarball


def test_an_open_box_is_still_audited_and_a_registry_taken_off_is_refused_naming_the_entry(
    host: Host, boxes: dict[str, dict[str, Any]]
) -> None:
    box = boxes["open"]
    rc, out = in_box(box, NPM.format("/tmp/npm-o"))
    assert rc == 0, out
    npm = [line for line in host.audit(box["name"]) if line["host"] == "registry.npmjs.org"]
    assert npm and all((line["decision"], line["reason"]) == ("allowed", "egress: open") for line in npm)
    venv(box)
    started = time.monotonic()
    rc, out = in_box(box, f"{PIP} --target /tmp/six")
    # pip says only "from versions: none" (the 403 is not shown); curl shows the gateway's answer.
    assert rc != 0 and "from versions: none" in out, out
    rc, out = in_box(box, "curl -sS -o /dev/null https://pypi.org/simple/six/")
    assert rc != 0 and "CONNECT tunnel failed, response 403" in out, out
    assert time.monotonic() - started < 60
    rc, out = in_box(box, "curl -sS http://pypi.org/simple/six/")
    assert "box {} may not reach pypi.org:80 (egress_allow: -pypi.org)".format(box["name"]) in out, out
    assert "remove the entry -pypi.org from egress_allow" in out
    denied = [line for line in host.audit(box["name"]) if line["host"] == "pypi.org"]
    assert denied and all((line["decision"], line["reason"]) == ("denied", "egress_allow: -pypi.org") for line in denied)


def test_a_stopped_gateway_is_said_at_once_with_how_to_start_it_and_nothing_goes_direct(
    host: Host, boxes: dict[str, dict[str, Any]]
) -> None:
    box = boxes["allowing"]
    env = {**os.environ, "HOME": host.home}
    subprocess.run([RELAY, "stop"], env=env, capture_output=True, check=True)
    try:
        started = time.monotonic()
        _rc, out = in_box(box, "curl -sS -D - http://pypi.org/simple/six/; "
                          "curl -sS -o /dev/null https://pypi.org/simple/six/; echo rc=$?")
        assert time.monotonic() - started < 30, out
        assert "503 agentbox egress gateway not reachable: start it on the host" in out, out
        assert "ansible-playbook playbooks/relay.yml (or scripts/agentbox-relay start)" in out
        assert "rc=0" not in out  # https through the tunnel fails too: no fallback to a direct connection
    finally:
        subprocess.run([RELAY, "start"], env=env, capture_output=True, check=True)
    deadline = time.monotonic() + 30
    while True:  # the started relay binds the box's gateway socket again from its registration
        _rc, out = in_box(box, "curl -sS -o /dev/null -w '%{http_code}' https://pypi.org/simple/six/")
        if out == "200" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert out == "200", out


def test_pip_installs_from_pypi_through_the_gateway_and_again_after_a_restart(
    host: Host, boxes: dict[str, dict[str, Any]]
) -> None:
    box = boxes["allowing"]
    venv(box)
    rc, out = in_box(box, f"env | grep -i _proxy= | sort; {PIP} --target /tmp/six-a")
    assert rc == 0, out
    assert "HTTPS_PROXY=http://127.0.0.1:3128" in out and "Successfully installed six" in out
    allowed = {(line["host"], line["decision"], line["reason"]) for line in host.audit(box["name"])}
    assert ("pypi.org", "allowed", "default allow list") in allowed
    assert ("files.pythonhosted.org", "allowed", "default allow list") in allowed
    line = next(line for line in host.audit(box["name"]) if line["host"] == "files.pythonhosted.org")
    assert line["port"] == 443 and line["bytes_in"] > 10_000 and line["box_id"] == box["id"]
    # sudo (which drops the variables), apt as root and SSH logins (a fresh environment) read the box's own settings.
    rc, out = in_box(box, "sudo sh -c 'echo $https_proxy'; apt-config dump Acquire::https::Proxy; "
                          "env -i bash -lc 'echo $HTTP_PROXY' </dev/null")
    assert out.split("\n")[0] == "http://127.0.0.1:3128", out
    assert 'Acquire::https::Proxy "http://127.0.0.1:3128";' in out and out.rstrip().endswith("http://127.0.0.1:3128")
    # A stop ends the forwarder with every process: a start brings it back.
    for state in ("stopped", "started"):
        moved = host.module({"name": box["name"], "state": state})
        assert not moved["failed"], moved.get("msg")
    rc, out = in_box(box, f"{PIP} --target /tmp/six-b")
    assert rc == 0 and "Successfully installed six" in out, out


def test_a_box_whose_policy_refuses_pypi_is_told_at_once_which_setting_to_change(
    host: Host, boxes: dict[str, dict[str, Any]]
) -> None:
    box = boxes["closed"]
    venv(box)
    started = time.monotonic()
    rc, out = in_box(box, f"{PIP} --target /tmp/six")
    assert rc != 0 and "from versions: none" in out, out
    assert time.monotonic() - started < 60  # no retries against a wall: pip gives up on the answer
    rc, out = in_box(box, "curl -sS http://pypi.org/simple/six/")
    assert "box {} may not reach pypi.org:80 (egress: none)".format(box["name"]) in out, out
    assert "set egress: allowlist" in out
    denied = [line for line in host.audit(box["name"]) if line["host"] == "pypi.org"]
    assert denied and all(line["decision"] == "denied" and line["reason"] == "egress: none" for line in denied)
    assert {line["port"] for line in denied} == {80, 443} and all(line["bytes_in"] == 0 for line in denied)


def test_root_in_the_box_gets_nowhere_directly_even_after_flushing_its_own_iptables(
    boxes: dict[str, dict[str, Any]]
) -> None:
    box = boxes["allowing"]
    address = socket.gethostbyname("pypi.org")  # a registry: the only hosts tests reach
    direct = f"curl -sS --noproxy '*' --connect-timeout 5 -o /dev/null -w '%{{http_code}}' https://pypi.org/simple/ " \
             f"--resolve pypi.org:443:{address}; echo rc=$?"
    rc, out = in_box(box, direct, user="root")
    assert "rc=0" not in out and "rc=" in out, out
    rc, out = in_box(box, "iptables -F && iptables -t nat -F && iptables -P OUTPUT ACCEPT && "
                          "awk '$2 == \"00000000\" {print \"default route\"}' /proc/net/route && " + direct, user="root")
    assert rc == 0 and "default route" in out, out  # its own rules are gone, its route is there
    assert "rc=0" not in out and "rc=" in out, out
    attrs = docker.from_env().api.inspect_container(box["container"])
    assert list(attrs["NetworkSettings"]["Networks"]) == ["agentbox-egress"]


def test_boxes_on_the_egress_network_cannot_reach_each_other(boxes: dict[str, dict[str, Any]]) -> None:
    """Root in one box, its own iptables flushed, gets nothing to another box's listening port, nor even
    an ARP answer from it (the host isolates every port of the bridge: no frame passes between boxes).
    Addresses are read and used only inside the boxes (never traffic from the host to a box)."""
    target, source = boxes["open"], boxes["allowing"]
    rc, out = in_box(target, f"cd /tmp && (setsid python3 -m http.server {NEIGHBOUR} >/dev/null 2>&1 & echo $! "
                             "> /tmp/neighbour.pid); "
                             "python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'")
    assert rc == 0, out
    address = out.split()[-1]  # its address on the egress network (the engine's /etc/hosts line; not its own docker0)
    try:
        # The listener answers on that address from inside its own box: what the neighbour tries is there.
        probe = f"curl -sS --noproxy '*' --connect-timeout 5 -o /dev/null -w '%{{http_code}}' http://{address}:{NEIGHBOUR}/"
        deadline = time.monotonic() + 30
        while (out := in_box(target, probe)[1]) != "200" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert out == "200", out
        rc, out = in_box(source, f"iptables -F && iptables -P OUTPUT ACCEPT && {probe} 2>&1; echo rc=$?; "
                                 f"grep -F '{address} ' /proc/net/arp || echo no-entry", user="root")
        assert "rc=0" not in out and "rc=" in out, out  # curl failed: no connection
        entry = next(line.split() for line in out.splitlines() if line.startswith((f"{address} ", "no-entry")))
        # An unanswered ARP request leaves flags 0x0 and a zero address; an answer, 0x2 and the box's MAC.
        assert entry == ["no-entry"] or (entry[2], entry[3]) == ("0x0", "00:00:00:00:00:00"), out
    finally:
        in_box(target, "kill $(cat /tmp/neighbour.pid)")


def test_a_published_port_of_a_box_with_a_policy_still_answers_on_the_hosts_loopback(
    boxes: dict[str, dict[str, Any]]
) -> None:
    box = boxes["allowing"]
    rc, out = in_box(box, f"cd /tmp && (setsid python3 -m http.server {WEB} >/dev/null 2>&1 &) ; sleep 1; echo up")
    assert rc == 0, out
    # Read now: a start (another test's) publishes on a new port.
    attrs = docker.from_env().api.inspect_container(box["container"])
    port = attrs["NetworkSettings"]["Ports"][f"{WEB}/tcp"][0]["HostPort"]
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
                assert answer.status == 200
                break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_bad_policy_is_refused_at_create_with_what_to_write_and_nothing_made(host: Host, tmp_path: Path) -> None:
    workspace = make_repo(tmp_path / "ws")
    name = f"eg-{secrets.token_hex(3)}"
    for options, said in (({"egress": "opne"}, "'opne' is not a policy (did you mean open?)"),
                          ({"egress_allow": ["https://github.com/org/repo"]}, "is a URL, not a host name: write github.com"),
                          ({"egress_allow": ["-example.com"]}, "is not on it: write one of pypi.org"),
                          ({"egress_allow": ["-api.anthropic.com"]}, "remove -api.anthropic.com from egress_allow")):
        refused = host.module({"name": name, "workspace": str(workspace), **options})
        assert refused["failed"] and said in refused["msg"], refused.get("msg")
    assert docker.from_env().containers.list(all=True, filters={"name": f"agentbox-{name}"}) == []
    assert not Path(host.home, ".agentbox/relay/boxes").exists() or not any(
        json.loads(p.read_text())["name"] == name for p in Path(host.home, ".agentbox/relay/boxes").glob("*.json"))
