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

from ansible_collections.agentbox.box.plugins.module_utils.access import _access
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxFacts
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from ansible_collections.agentbox.box.plugins.module_utils.relay._relay_state import code_root, module_argv


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
    # The user's own key is used as it is: no key is made for the boxes.
    assert _access.box_identities().keys == _access.identity_files() and _access.box_identities().made is None
    assert not Path(_access.box_key_path()).exists()
    (ssh_dir / "id_ed25519.pub").write_text("not a key\n")
    assert _access.identity_files() == []


def test_a_user_without_a_key_gets_one_made_for_the_boxes(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ~/.ssh at all: box_identities makes ~/.agentbox/ssh/id_ed25519 (0600, no passphrase, a comment saying
    what it is for), once; the entry names it alone (IdentitiesOnly); ~/.ssh is never made or touched."""
    monkeypatch.delenv("AGENTBOX_SSH_KEY", raising=False)
    first = _access.box_identities()
    path = home / ".agentbox" / "ssh" / "id_ed25519"
    assert first.made == str(path) and first.problem == "" and [p for p, _line in first.keys] == [str(path)]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert first.public_lines() == [path.with_suffix(".pub").read_text().strip()]
    assert first.public_lines()[0].startswith("ssh-ed25519 ") and "agentbox.box: ssh into boxes only" in first.keys[0][1]
    # No passphrase: ssh-keygen reads the public half out of it with an empty one.
    derived = subprocess.run(["ssh-keygen", "-y", "-P", "", "-f", str(path)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == first.public_lines()[0].split()[:2]
    assert not (home / ".ssh").exists()
    # Made once: later calls find it (identity_files too), nothing is made again.
    again = _access.box_identities()
    assert again.keys == first.keys and again.made is None and _access.identity_files() == first.keys
    entry = _access.entry_text(facts("b1"), _access.local_proxy_command("b1"), [str(path)])
    assert f"  IdentityFile {path}\n  IdentitiesOnly yes\n" in entry
    assert "IdentitiesOnly" not in _access.entry_text(facts("b1"), _access.local_proxy_command("b1"), [])
    # A key the user makes later wins; the boxes' own one stays where it is.
    (home / ".ssh").mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    assert [p for p, _line in _access.box_identities().keys] == [str(home / ".ssh" / "id_ed25519")]
    assert path.exists()


def test_a_named_key_that_is_not_usable_is_said_and_no_key_is_made(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOX_SSH_KEY", str(home / "missing_key"))
    found = _access.box_identities()
    assert found.keys == [] and "AGENTBOX_SSH_KEY=" in found.problem and "missing_key.pub" in found.problem
    assert not (home / ".agentbox" / "ssh").exists()


def test_no_ssh_keygen_is_a_reason_not_a_failure(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTBOX_SSH_KEY", raising=False)
    monkeypatch.setenv("PATH", str(home / "empty-bin"))
    found = _access.box_identities()
    assert found.keys == [] and "ssh-keygen" in found.problem and "could not be made" in found.problem
    assert not Path(_access.box_key_path()).exists()


def _make_key(home: str, out: multiprocessing.Queue) -> None:
    os.environ["HOME"] = home
    key, made = _access.make_box_key()
    out.put((key[1], made))


def test_parallel_creates_make_one_key(home: Path) -> None:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    workers = [context.Process(target=_make_key, args=(str(home), out)) for _worker in range(6)]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=60) for _worker in workers]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert {line for line, _made in results} == {(home / ".agentbox" / "ssh" / "id_ed25519.pub").read_text().strip()}
    assert [made for _line, made in results].count(True) == 1
    assert sorted(os.listdir(home / ".agentbox" / "ssh")) == ["id_ed25519", "id_ed25519.lock", "id_ed25519.pub"]


def test_the_include_answer_is_remembered_and_kept(home: Path) -> None:
    """Without a yes ~/.ssh/config is never touched; a yes puts the line in once and every later alias write
    keeps it (put back when it went); a no takes only our line out."""
    assert not _access.keep_include() and not (home / ".ssh").exists()
    assert _access.include_answer() is None
    original = "Host work\n  HostName 192.0.2.1\n"
    (home / ".ssh").mkdir()
    (home / ".ssh" / "config").write_text(original)
    assert not _access.keep_include() and (home / ".ssh" / "config").read_text() == original
    assert _access.answer_include(True)
    line = _access.include_line()
    assert (home / ".ssh" / "config").read_text() == f"{line}\n{original}"
    assert json.loads((home / ".agentbox" / "access.json").read_text())["ssh_include"] is True
    assert not _access.answer_include(True)  # the same answer again: nothing to change
    assert _access.keep_include() and (home / ".ssh" / "config").read_text() == f"{line}\n{original}"
    (home / ".ssh" / "config").write_text(original)  # taken out by hand: the next alias write puts it back
    assert _access.keep_include() and (home / ".ssh" / "config").read_text() == f"{line}\n{original}"
    assert (home / ".ssh" / "config").read_text().count("Include") == 1
    assert _access.answer_include(False)
    assert (home / ".ssh" / "config").read_text() == original
    assert not _access.keep_include() and (home / ".ssh" / "config").read_text() == original
    assert _access.include_answer() is False


def test_one_ssh_form_and_the_hint_said_once(home: Path) -> None:
    assert _access.ssh_command("b1") == "ssh -F ~/.agentbox/ssh_config agentbox-b1"
    hint = _access.include_hint("b1")
    assert "-e ssh_include=true" in hint and _access.include_line() in hint
    assert _access.include_hint("b2") == ""  # said once
    _access.answer_include(True)
    assert _access.ssh_command("b1") == "ssh agentbox-b1" and _access.ssh_program() == "ssh"
    _access.answer_include(False)
    assert _access.ssh_command("b1") == "ssh -F ~/.agentbox/ssh_config agentbox-b1"


def test_the_hint_is_not_said_to_a_user_who_answered(home: Path) -> None:
    assert _access.include_hint("b1", record=False) != ""  # check mode: not recorded as said
    _access.answer_include(False)
    assert _access.include_hint("b1") == ""


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
    relay = Path(__file__).resolve().parents[3] / "scripts" / "agentbox-relay"
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
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd import _boxd_pipe

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
