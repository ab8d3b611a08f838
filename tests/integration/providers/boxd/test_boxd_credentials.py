"""boxd API keys through the emulator's key exchange (POST /api/v1/auth/token) and the real SDK.

boxd exchanges a key for a one-hour token, rate-limited per address; the SDK asks callers to reuse one
token. The collection exchanges once per host (_boxd_token) and every process uses that token: here four
forked Ansible workers list boxes at once while the emulator allows a single exchange per window.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.boxd_emulator import running_emulator
from tests.conftest import REPO
from tests.daytona_emulator import TEST_IMAGE, ensure_test_image

pytestmark = pytest.mark.integration

VENV_BIN = REPO / ".venv" / "bin"
WORKERS = 4


@pytest.fixture(scope="module")
def emu(docker_client) -> Iterator:
    ensure_test_image(docker_client)
    with running_emulator(image=TEST_IMAGE) as running:
        yield running


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own ~/.agentbox, so the token it caches is its own."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.delenv("BOXD_TOKEN", raising=False)  # a token would win over the key
    return path


def exchanges(emu, since: int) -> list[int]:
    return [r["status"] for r in emu.control.requests()[since:] if r["method"] == "ExchangeToken"]


def test_parallel_ansible_workers_share_one_exchanged_token(emu, tmp_path: Path) -> None:
    """Four workers at once, one exchange allowed per window: one exchange serves them all, and a second
    run exchanges nothing (the host's token is still good). The key is written nowhere."""
    home = tmp_path / "home"
    home.mkdir()
    playbook = tmp_path / "list.yml"
    playbook.write_text(textwrap.dedent("""\
        - hosts: workers
          gather_facts: false
          tasks:
            - agentbox.box.agentbox_box_info:
                provider: boxd
              register: listed
            - ansible.builtin.assert:
                that: listed.boxes == []
        """))
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[workers]\n" + "".join(f"w{i} ansible_connection=local\n" for i in range(WORKERS)))
    env = {**os.environ, "HOME": str(home), "BOXD_BASE_URL": emu.base_url, "BOXD_API_KEY": emu.api_key,
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}  # fmt: skip
    env.pop("BOXD_TOKEN", None)
    emu.control.configure(exchange_limit=1, exchange_window=20)
    try:
        for run in range(2):
            since = len(emu.control.requests())
            done = _run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "-f", str(WORKERS),
                         "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)], env)
            assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
            assert done.stdout.count("ok=2") == WORKERS
            assert exchanges(emu, since) == ([200] if run == 0 else [])
    finally:
        emu.control.configure(exchange_limit=10, exchange_window=60)
    tokens = home / ".agentbox" / "boxd" / "tokens"
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o700
    [cached] = tokens.glob("*.json")
    assert stat.S_IMODE(cached.stat().st_mode) == 0o600
    assert json.loads(cached.read_text())["token"] and emu.api_key not in cached.read_text()
    assert not [p for p in home.rglob("*") if p.is_file() and emu.api_key in p.read_text(errors="replace")]


def test_a_refused_key_says_so(emu, home) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    provider = BoxdProvider(api_key="bxd_not_this_one", base_url=emu.base_url)
    try:
        with pytest.raises(ProviderError, match=r"refused the API key \(401 .*check BOXD_API_KEY"):
            provider.list_boxes()
    finally:
        provider.close()


def test_a_provider_with_a_key_reaches_boxd_with_its_token(emu, home) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    since = len(emu.control.requests())
    provider = BoxdProvider(api_key=emu.api_key, base_url=emu.base_url)
    try:
        assert provider.list_boxes() == []
        assert provider.find("nothing-here") is None
    finally:
        provider.close()
    assert exchanges(emu, since) == [200]
    assert {"ListVms"} <= {r["method"] for r in emu.control.requests()[since:]}


def _run(argv: list[str], env: dict[str, str]):
    import subprocess

    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=600)
