"""~/.agentbox/ssh_config, known_hosts and ~/.ssh/config as files: blocks, the Include line, locking.

No engine needed: these are the host-side files (a temporary HOME each test).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils import _access
from ansible_collections.agentbox.box.plugins.module_utils._docker import DockerProvider
from ansible_collections.agentbox.box.plugins.module_utils._provider import BoxFacts
from ansible_collections.agentbox.box.plugins.module_utils._relay_state import code_root, module_argv


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    return tmp_path


def facts(name: str, engine: str = "local", provider: str = "docker") -> BoxFacts:
    return BoxFacts(
        name=name, id="abcd1234", provider=provider, engine=engine, state="running", container=f"agentbox-{name}",
        image="agentbox/box:latest", project="0" * 16, workspace="/w", branch=f"agentbox/{name}", created="",
    )  # fmt: skip


def write(name: str, engine: str = "local") -> None:
    _access.write_entry(name, _access.entry_text(facts(name, engine), _access.local_proxy_command(name), []))


def test_entries_added_replaced_removed_and_other_text_kept(home: Path) -> None:
    write("one")
    write("two")
    config = home / ".agentbox" / "ssh_config"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE((home / ".agentbox").stat().st_mode) == 0o700
    # Something the user added outside the blocks survives every rewrite.
    config.write_text(config.read_text() + "# my note\n")
    write("one")  # rewritten in place of the old block, not duplicated
    text = config.read_text()
    assert text.count("Host agentbox-one\n") == 1 and text.count("Host agentbox-two\n") == 1
    assert "# my note\n" in text
    assert _access.entry_engine("two") == "local"
    assert _access.box_removed("two", "local")
    text = config.read_text()
    assert "agentbox-two" not in text and "Host agentbox-one\n" in text and "# my note\n" in text
    assert _access.entry_engine("two") is None


def test_removal_leaves_an_entry_of_the_same_name_on_another_engine(home: Path) -> None:
    write("same", engine="root@127.0.0.1:2201")
    assert not _access.box_removed("same", "local")
    assert _access.entry_engine("same") == "root@127.0.0.1:2201"


def test_known_hosts_lines_per_box(home: Path) -> None:
    key = "ssh-ed25519 " + "A" * 68
    _access.write_known_host("a", key)
    _access.write_known_host("b", key)
    _access.write_known_host("a", key.replace("A", "B"))
    lines = (home / ".agentbox" / "known_hosts").read_text().splitlines()
    assert lines == [f"agentbox-b {key}", f"agentbox-a {key.replace('A', 'B')}"]
    _access.write_known_host("a", None)
    assert (home / ".agentbox" / "known_hosts").read_text().splitlines() == [f"agentbox-b {key}"]


def test_include_line_added_once_at_the_top_and_nothing_else_changed(home: Path) -> None:
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir()
    real = home / "dotfiles" / "ssh_config"
    real.parent.mkdir()
    original = "Host *\n  ServerAliveInterval 30\n\n# trailing comment without newline"
    real.write_text(original)
    real.chmod(0o640)
    (ssh_dir / "config").symlink_to(real)
    assert not _access.include_present()
    assert _access.ensure_include()
    line = _access.include_line()
    assert real.read_text() == f"{line}\n{original}"  # written through the symlink, which stays
    assert (ssh_dir / "config").is_symlink() and stat.S_IMODE(real.stat().st_mode) == 0o640
    assert _access.include_present()
    assert not _access.ensure_include()
    assert real.read_text() == f"{line}\n{original}"


def test_include_line_for_a_missing_config(home: Path) -> None:
    assert _access.ensure_include()
    config = home / ".ssh" / "config"
    assert config.read_text() == f"{_access.include_line()}\n"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700


def test_include_line_uses_the_absolute_path_when_home_is_not_the_passwd_home(home: Path) -> None:
    # OpenSSH expands ~ from the passwd entry, so under another HOME only the absolute path works.
    assert _access.include_line() == f"Include {home}/.agentbox/ssh_config"


def _write_many(home: str, names: list[str]) -> None:
    os.environ["HOME"] = home
    for name in names:
        write(name)


def test_concurrent_writers_lose_nothing(home: Path) -> None:
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_write_many, args=(str(home), [f"w{worker}-{index}" for index in range(10)]))
        for worker in range(6)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    text = (home / ".agentbox" / "ssh_config").read_text()
    for worker in range(6):
        for index in range(10):
            assert text.count(f"Host agentbox-w{worker}-{index}\n") == 1


def test_proxy_commands(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _access.local_proxy_command("b1").endswith("exec -i -u root agentbox-b1 /usr/sbin/sshd -i")
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    assert " -H tcp://127.0.0.1:2375 exec " in _access.local_proxy_command("b1")
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/%1/docker.sock")
    assert "unix:///run/user/%%1/docker.sock" in _access.local_proxy_command("b1")  # ssh expands % tokens


def test_attach_uris(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTBOX_ENGINE", raising=False)
    local, here = facts("fix-login"), DockerProvider()
    uri = _access.attach_uri(here, local, "vscode")
    payload = uri.removeprefix("vscode-remote://attached-container+").removesuffix("/workspace")
    # An isolated box is a container of the box engine: the editor is told that engine's address.
    assert json.loads(bytes.fromhex(payload)) == {"containerName": "/agentbox-fix-login",
                                                  "settings": {"host": "unix:///run/agentbox-engine/docker.sock"}}
    assert _access.attach_uri(here, local, "ssh") == "vscode-remote://ssh-remote+agentbox-fix-login/workspace"
    remote = facts("fix-login", engine="builder1", provider="docker_ssh")
    there = DockerProvider(engine="builder1")
    assert _access.attach_uri(there, remote, "cursor") == "vscode-remote://ssh-remote+agentbox-fix-login/workspace"
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    here = DockerProvider(isolation="none")
    payload = _access.attach_uri(here, local, "cursor").split("+", 1)[1].removesuffix("/workspace")
    assert json.loads(bytes.fromhex(payload))["settings"] == {"host": "tcp://127.0.0.1:2375"}


def test_public_keys_found_and_no_key(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTBOX_SSH_KEY", raising=False)
    assert _access.identity_files() == []
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "id_ed25519").write_text("private\n")
    (ssh_dir / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE me@host\n")
    (ssh_dir / "id_rsa.pub").write_text("ssh-rsa AAAAB3 orphan public key without its private key\n")
    assert _access.identity_files() == [(str(ssh_dir / "id_ed25519"), "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE me@host")]
    (ssh_dir / "id_ed25519.pub").write_text("not a key\n")
    assert _access.identity_files() == []


def test_waking_proxy_command_runs_the_wake_only_when_the_direct_command_fails(home: Path) -> None:
    """As ssh runs a ProxyCommand: its %-tokens expanded (%% -> %), then `exec` in a shell."""

    def as_ssh_runs(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", "exec " + command.replace("%%", "%")], capture_output=True, text=True,
                              check=False)  # fmt: skip

    fine = as_ssh_runs(_access.waking_proxy_command(["printf", "%s|%s", "it's", "100%"], facts("b1"), {}))
    assert fine.returncode == 0 and fine.stdout == "it's|100%" and fine.stderr == ""
    failing = _access.waking_proxy_command(["false"], facts("b1"), {"private_key_file": "/k"})
    assert "agentbox-wake docker local b1" in failing
    # No launcher written yet (no box made from this HOME): the wake is tried, and says what is missing.
    tried = as_ssh_runs(failing)
    assert tried.returncode == 127 and "agentbox-wake" in tried.stderr
    # The engine's refusal of a paused or stopped box is the wake's to say: only its line reaches ssh.
    for refusal in ("Error response from daemon: Container 3f2a is paused, unpause the container before exec",
                    "Error response from daemon: container 3f2a is not running"):  # fmt: skip
        paused = as_ssh_runs(_access.waking_proxy_command(["sh", "-c", f"echo '{refusal}' >&2; exit 1"], facts("b1"), {}))
        assert paused.returncode == 127 and refusal not in paused.stderr and "agentbox-wake" in paused.stderr
    # Anything else the direct path says is passed on, before the wake.
    other = as_ssh_runs(_access.waking_proxy_command(["sh", "-c", "echo 'ssh: connect refused' >&2; exit 255"],
                                                     facts("b1"), {}))  # fmt: skip
    assert other.stderr.startswith("ssh: connect refused\n") and "agentbox-wake" in other.stderr


def test_wake_gets_the_engine_this_process_was_pointed_at(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ssh runs the proxy with the login environment: a DOCKER_HOST given to the task reaches the wake."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("AGENTBOX_ENGINE", raising=False)
    assert DockerProvider().reopen_environment() == {}
    # An isolated box's engine is the box engine (AGENTBOX_ENGINE); an unisolated one's, DOCKER_HOST.
    monkeypatch.setenv("AGENTBOX_ENGINE", "unix:///run/user/1000/agentbox-engine/docker.sock")
    assert DockerProvider().reopen_environment() == {"AGENTBOX_ENGINE": "unix:///run/user/1000/agentbox-engine/docker.sock"}
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    environment = DockerProvider(isolation="none").reopen_environment()
    assert environment == {"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}
    assert DockerProvider(engine="builder1").reopen_environment() == {}  # its engine is in reopen_options
    proxy = _access.waking_proxy_command(["false"], facts("b1"), {}, environment)
    assert "; exec env DOCKER_HOST=unix:///run/user/1000/docker.sock " in proxy
    assert "env DOCKER_HOST" not in _access.waking_proxy_command(["false"], facts("b1"), {}, {})


def plant(directory: Path) -> Path:
    """Modules named like ones the launchers import (a stdlib one and the collection's top package), each
    writing a marker when imported: what a hostile checkout could hold in the directory ssh runs from."""
    marker = directory / "PLANTED-RAN"
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    directory.mkdir()
    (directory / "json.py").write_text(code)
    (directory / "ansible_collections").mkdir()
    (directory / "ansible_collections" / "__init__.py").write_text(code)
    return marker


def test_host_launchers_never_import_from_their_current_directory(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _access.write_wake_launcher()
    launcher = _access.wake_launcher_path()
    marker = plant(home / "hostile")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    woke = subprocess.run([launcher], cwd=home / "hostile", env=env, capture_output=True, text=True, check=False)
    # It got as far as its own usage line: the collection imported, from its own root, not the planted one.
    assert woke.returncode == 2 and "usage: agentbox-wake" in woke.stderr, woke.stderr
    relay = Path(__file__).resolve().parents[2] / "scripts" / "agentbox-relay"
    status = subprocess.run([str(relay), "status"], cwd=home / "hostile", env=env, capture_output=True, text=True,
                            check=False)  # fmt: skip
    assert status.returncode == 3 and '"running": false' in status.stdout, status.stderr
    # What an interpreter older than 3.11 (no -P) gets: the same usage line, nothing planted imported.
    monkeypatch.setattr(sys, "version_info", (3, 10, 0))
    older = module_argv(_access.WAKE_MODULE)
    assert "-P" not in older
    env["PYTHONPATH"] = str(code_root())
    woke = subprocess.run(older, cwd=home / "hostile", env=env, capture_output=True, text=True, check=False)
    assert woke.returncode == 2 and "usage: agentbox-wake" in woke.stderr, woke.stderr
    assert not marker.exists(), marker.read_text()


def test_both_host_launchers_are_written_once_0700_and_never_import_from_their_current_directory(home: Path) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils import _boxd_pipe

    marker = plant(home / "hostile")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    for write_launcher, path, usage in (
        (_access.write_wake_launcher, _access.wake_launcher_path(), "usage: agentbox-wake"),
        (_boxd_pipe.write_launcher, _boxd_pipe.launcher_path(), "usage: agentbox-boxd-pipe"),
    ):
        assert write_launcher()
        assert not write_launcher()  # the same text: left alone
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        text = Path(path).read_text()
        assert text.startswith("#!/bin/sh\n") and f"{sys.executable} -P -m " in text, text
        ran = subprocess.run([path], cwd=home / "hostile", env=env, capture_output=True, text=True, check=False)
        assert ran.returncode == 2 and usage in ran.stderr, ran.stderr
        Path(path).write_text("#!/bin/sh\nexit 0\n")  # changed by someone else: written again
        assert write_launcher()
    assert not marker.exists(), marker.read_text()
