"""boxd exposed ports end to end: the emulator's public forwards on 127.0.0.1, the real SDK, the provider and
forward.yml. A box exposes its web port (80) and the ports given at create; its web URL and forward.yml's URL
reach servers in the box; a port it did not expose is a clear error.
"""

from __future__ import annotations

import http.client
import os
import re
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.boxd_emulator import running_emulator
from tests.conftest import REPO

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
VENV_BIN = REPO / ".venv" / "bin"
# Binds and listens before the exec returns (the parent exits after the bind), then serves from a child with
# no hold on the exec's output: nothing to wait for afterwards.
SERVE = (
    "import functools, http.server, os, sys\n"
    "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])\n"
    "server = http.server.ThreadingHTTPServer(('0.0.0.0', int(sys.argv[1])), handler)\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "os.setsid()\n"
    "null = os.open(os.devnull, os.O_RDWR)\n"
    "for fd in (0, 1, 2):\n"
    "    os.dup2(null, fd)\n"
    "server.serve_forever()\n"
)


@pytest.fixture(scope="module")
def emu(box_image: str) -> Iterator:
    with running_emulator(image=box_image) as running:
        yield running


def _provider(emu):
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    return BoxdProvider(token=emu.token, base_url=emu.base_url)


def _box_spec(name: str, ports: list[int]):
    from ansible_collections.agentbox.box.plugins.module_utils.core._naming import box_labels
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec

    box_id = secrets.token_hex(8)
    labels = box_labels(box=name, box_id=box_id, project="0" * 16, workspace="/tmp", branch="",
                        image_fingerprint="", provider="boxd", engine="", checkpoint=None)  # fmt: skip
    return BoxSpec(name=name, box_id=box_id, project="0" * 16, workspace="/tmp", image=IMAGE, labels=labels,
                   ports=ports)


def _serve(provider, name: str, port: int, body: str) -> None:
    site = f"/tmp/site-{port}"
    provider.exec(name, ["sh", "-c", 'mkdir -p "$1" && printf %s "$2" > "$1/index.html"', "site", site, body],
                  user="root").check("writing the page", name)
    provider.exec(name, ["python3", "-c", SERVE, str(port), site], user="root").check(f"serving :{port}", name)


def _get(url: str) -> bytes:
    # A connection the emulator's forward closes unanswered (its reason goes to the emulator's stderr) is
    # tried twice more, as a browser would; one that never reaches the server still fails.
    for _attempt in range(2):
        try:
            with urllib.request.urlopen(url + "index.html", timeout=30) as answer:
                return answer.read()
        except (http.client.RemoteDisconnected, ConnectionResetError):
            pass
    with urllib.request.urlopen(url + "index.html", timeout=30) as answer:
        return answer.read()


def _forward(emu, home: Path, box: str, port: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "BOXD_BASE_URL": emu.base_url, "BOXD_TOKEN": emu.token,
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}  # fmt: skip
    for key in ("BOXD_API_KEY", "BOXD_ORG"):
        env.pop(key, None)
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            "playbooks/forward.yml", "-e", "provider=boxd", "-e", f"box={box}", "-e", f"port={port}"]  # fmt: skip
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def test_web_url_and_forwarded_port_reach_servers_in_the_box(emu, tmp_path: Path) -> None:
    provider = _provider(emu)
    name = f"bpt-{secrets.token_hex(3)}"
    facts = provider.create(_box_spec(name, [8000]))
    try:
        assert sorted(facts.ports) == ["80", "8000"], facts.ports
        assert facts.web_url == f"http://127.0.0.1:{facts.ports['80']}/"
        assert provider.find(name).web_url == facts.web_url  # read back by a fresh lookup as well
        _serve(provider, name, 80, "web port 80")
        _serve(provider, name, 8000, "app port 8000")
        assert _get(facts.web_url) == b"web port 80"

        done = _forward(emu, tmp_path, name, 8000)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        url = re.search(r"url:\s+(http://\S+/)", done.stdout)
        assert url, done.stdout[-3000:]
        assert url.group(1).startswith("http://127.0.0.1:") and url.group(1) != facts.web_url
        assert _get(url.group(1)) == b"app port 8000"

        # A suspended box wakes for a connection, as inbound traffic wakes a boxd machine.
        assert provider.pause(name).state == "paused"
        assert _get(facts.web_url) == b"web port 80"

        refused = _forward(emu, tmp_path, name, 9000)
        assert refused.returncode != 0
        assert "does not expose port 9000" in refused.stdout and "it exposes 80, 8000" in refused.stdout, (
            refused.stdout[-3000:])
    finally:
        provider.destroy(name)
    assert provider.find(name) is None


def test_more_ports_than_boxd_allows_make_nothing(emu) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = _provider(emu)
    before = len(emu.control.state()["machines"])
    with pytest.raises(ProviderError, match="at most 3 ports"):
        provider.create(_box_spec(f"bpt-{secrets.token_hex(3)}", [3000, 8000, 9000]))
    assert len(emu.control.state()["machines"]) == before
