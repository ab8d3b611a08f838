"""SSH destinations and ~/.ssh/config handling for docker_ssh engines (no network needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

import paramiko  # noqa: E402

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.ssh import _ssh  # noqa: E402


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("builder1", (None, "builder1", None)),
        ("root@127.0.0.1:2201", ("root", "127.0.0.1", 2201)),
        ("ssh://deploy@build.example.com:2222", ("deploy", "build.example.com", 2222)),
        ("ops@host", ("ops", "host", None)),
        ("[::1]:2200", (None, "::1", 2200)),
        ("me@[2001:db8::5]", ("me", "2001:db8::5", None)),
    ],
)
def test_split_destination(engine, expected):
    assert _ssh.split_destination(engine) == expected


@pytest.mark.parametrize(
    ("engine", "advice"),
    [
        ("", "use an ~/.ssh/config alias or user@host[:port]"),
        ("a b", "use an ~/.ssh/config alias or user@host[:port]"),
        ("root@host:notaport", "use an ~/.ssh/config alias or user@host[:port]"),
        ("user@", "use an ~/.ssh/config alias or user@host[:port]"),
        ("ssh://", "use an ~/.ssh/config alias or user@host[:port]"),
        ("host:70000", "port 70000 is out of range 1-65535"),
    ],
)
def test_bad_destination_says_what_to_write(engine, advice):
    with pytest.raises(ProviderError) as failure:
        _ssh.split_destination(engine)
    assert f"engine {engine!r}" in str(failure.value) and advice in str(failure.value)


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_alias_from_config(tmp_path):
    config = write(
        tmp_path / "config",
        "Host builder1\n  HostName 192.0.2.10\n  Port 2201\n  User deploy\n  IdentityFile ~/keys/builder\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {tmp_path}/kh1 {tmp_path}/kh2\n\n"
        "Host *\n  User fallback\n",
    )
    dest = _ssh.resolve_destination("builder1", config_file=config)
    assert (dest.host, dest.port, dest.user) == ("192.0.2.10", 2201, "deploy")
    assert dest.identities_only and dest.identity_files[0].endswith("/keys/builder")
    assert dest.known_hosts_files[:2] == (f"{tmp_path}/kh1", f"{tmp_path}/kh2")
    assert dest.known_hosts_name == "[192.0.2.10]:2201" and dest.strict


def test_explicit_values_win_over_config(tmp_path):
    config = write(tmp_path / "config", "Host box.example\n  Port 2201\n  User deploy\n  IdentityFile /k/config_key\n")
    dest = _ssh.resolve_destination("root@box.example:22", private_key_file="/k/explicit", config_file=config)
    assert (dest.user, dest.port) == ("root", 22)
    assert dest.identity_files == ("/k/explicit", "/k/config_key")
    assert dest.known_hosts_name == "box.example"  # port 22: recorded without brackets


def test_env_names_the_config(tmp_path, monkeypatch):
    config = write(tmp_path / "config", "Host e1\n  HostName 127.0.0.1\n  Port 3022\n  User root\n")
    monkeypatch.setenv(_ssh.SSH_CONFIG_ENV, config)
    assert _ssh.resolve_destination("e1").address == "root@127.0.0.1:3022"


def test_host_key_checks_relaxed_only_when_asked(tmp_path):
    config = write(tmp_path / "config", "Host lab\n  StrictHostKeyChecking no\n  HostKeyAlias lab-alias\n")
    assert _ssh.resolve_destination("other", config_file=config).strict is True
    assert _ssh.resolve_destination("other", config_file=config, strict_host_key_checking=False).strict is False
    lab = _ssh.resolve_destination("lab", config_file=config)
    assert lab.strict is False and lab.known_hosts_name == "lab-alias"


def test_missing_config_is_fine_and_bad_config_is_reported(tmp_path):
    assert _ssh.resolve_destination("u@h", config_file=str(tmp_path / "absent")).host == "h"
    bad = write(tmp_path / "bad", "Host x\n  Match\n")
    with pytest.raises(ProviderError) as failure:
        _ssh.resolve_destination("x", config_file=bad)
    assert "cannot read the SSH config" in str(failure.value)


def test_fingerprint_matches_ssh_keygen(tmp_path):
    key_path = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_path)], check=True)
    expected = subprocess.run(["ssh-keygen", "-lf", str(key_path)], check=True, capture_output=True, text=True)
    key = paramiko.PKey.from_path(str(key_path))
    assert _ssh.fingerprint(key) == expected.stdout.split()[1]
