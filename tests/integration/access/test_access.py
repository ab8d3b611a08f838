"""`ssh agentbox-<box>` with the real OpenSSH client, attach URIs, and ~/.ssh/config's Include line.

Every test runs with a temporary HOME (its own ~/.ssh key and ~/.agentbox), so the real ones are
never touched; OpenSSH reads the aliases through `-F <HOME>/.agentbox/ssh_config`.

The tests are about the way into a box, not Ansible's path to a module: the modules run by their own main
(tests/conftest.py run_module_direct, no ansible start; agentbox_box's action plugin calls the same task
function); the playbooks (attach, create_box, shell, forward, checkpoint, switch_box) still run through
ansible-playbook.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.access import _forwards
from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.conftest import REPO, make_repo, run_module_direct

pytestmark = pytest.mark.integration


def new_home() -> Path:
    """A temporary HOME with an ed25519 key; short, so ssh control sockets fit in sun_path."""
    path = Path(tempfile.mkdtemp(prefix="abh-", dir="/tmp"))
    (path / ".ssh").mkdir(mode=0o700)
    keygen(path / ".ssh" / "id_ed25519")
    return path


def enter_home(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("AGENTBOX_SSH_KEY", raising=False)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = new_home()
    enter_home(monkeypatch, path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def boxes() -> Iterator[list[str]]:
    names: list[str] = []  # the test's boxes, destroyed after it
    yield names
    destroy_quietly(names)


def move_to(name: str, state: str, provider: DockerProvider | None = None) -> dict[str, Any]:
    """Set-up, not under test: the box to `state` in-process (_box.set_state, as agentbox_box); its facts."""
    provider = provider or DockerProvider()
    return _box.set_state(provider, provider.find(name), state).to_dict()


def destroy_quietly(names: list[str]) -> None:
    """Clean-up, not under test: in-process, no Ansible start per box (tests that assert a destroy use the module)."""
    provider = DockerProvider()
    for name in names:
        facts = provider.find(name)
        if facts is not None:
            _box.destroy_box(provider, facts, fetch=False)


@dataclasses.dataclass
class SharedBox:
    name: str
    web_url: str  # as the box's last create or start reported it


@pytest.fixture(scope="module")
def shared_home() -> Iterator[Path]:
    path = new_home()  # the HOME of the module's shared boxes (their aliases live in its ~/.agentbox)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def at_shared_home(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    enter_home(monkeypatch, shared_home)
    return shared_home


@contextmanager
def module_box(home: Path, prefix: str, **args: Any) -> Iterator[SharedBox]:
    root = Path(tempfile.mkdtemp(prefix="abw-", dir="/tmp"))
    root.chmod(0o755)
    name = f"{prefix}-{secrets.token_hex(3)}"
    try:
        with pytest.MonkeyPatch.context() as patch:
            enter_home(patch, home)
            made = run_module_direct("agentbox_box", {"name": name, "workspace": str(make_repo(root / "ws")), **args})
        assert not made["failed"], made.get("msg")
        yield SharedBox(name, made["box"]["web_url"])
    finally:
        destroy_quietly([name])
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def served_box(shared_home: Path) -> Iterator[SharedBox]:
    """A running box publishing port 8123, used in turn by tests that each leave it running, with nothing
    listening on 8123 and no named shell (take `at_shared_home` with it)."""
    with module_box(shared_home, "srv", ports=[8123]) as box:
        yield box


@pytest.fixture(scope="module")
def unbooted_box(shared_home: Path) -> Iterator[SharedBox]:
    """A box made with boot=False, used in turn by tests that each leave it running."""
    with module_box(shared_home, "unb", boot=False) as box:
        yield box


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "abx-test", "-f", str(path)], check=True)


def ssh(home: Path, alias: str, command: str, *extra: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    config = home / ".agentbox" / "ssh_config"
    argv = ["ssh", "-F", str(config), "-o", "BatchMode=yes", *extra, alias, command]
    return subprocess.run(argv, capture_output=True, text=True, input=stdin, timeout=60, check=False)


def create(workspace: Path, name: str, boxes: list[str], **args: Any) -> dict:
    """agentbox_box's create by its main. `boot=False` where nothing in the box needs to run: the way in is the
    box's sshd in inetd mode through the engine (the alias's ProxyCommand), whether the box booted or not."""
    boxes.append(name)
    result = run_module_direct("agentbox_box", {"name": name, "workspace": str(workspace), **args})
    assert not result["failed"], result.get("msg")
    return result


def test_ssh_alias_local_box(home: Path, repo_factory, boxes: list[str]) -> None:
    repo = repo_factory("ws")
    name = f"acc-{secrets.token_hex(3)}"
    created = create(repo, name, boxes, boot=False)
    alias = f"agentbox-{name}"
    config = home / ".agentbox" / "ssh_config"
    assert created["access"]["alias"] == alias and created["access"]["warnings"] == []
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert f"Host {alias}\n" in config.read_text()

    branch = ssh(home, alias, "git -C /workspace rev-parse --abbrev-ref HEAD")
    assert branch.returncode == 0, branch.stderr
    assert branch.stdout.strip() == f"agentbox/{name}"
    # A command lands where a login does (issue 16): in /workspace, as vscode, through a login shell.
    where = ssh(home, alias, "pwd; id -un; shopt -q login_shell && echo LOGIN-SHELL")
    assert where.returncode == 0, where.stderr
    assert where.stdout.splitlines() == ["/workspace", "vscode", "LOGIN-SHELL"], where.stdout

    # An interactive login: vscode, a login shell, in /workspace.
    login = ssh(home, alias, "", "-tt", stdin="id -un; pwd; shopt -q login_shell && echo LOGIN-SHELL; exit\n")
    assert login.returncode == 0, login.stderr
    lines = login.stdout.replace("\r", "").splitlines()
    assert "vscode" in lines and "/workspace" in lines and "LOGIN-SHELL" in lines, login.stdout

    # scp in and out, rsync over the same alias.
    payload = home / "in.bin"
    payload.write_bytes(os.urandom(200_000))
    scp = ["scp", "-q", "-F", str(config), "-o", "BatchMode=yes"]
    subprocess.run([*scp, str(payload), f"{alias}:/workspace/in.bin"], check=True, timeout=60)
    back = home / "back.bin"
    subprocess.run([*scp, f"{alias}:/workspace/in.bin", str(back)], check=True, timeout=60)
    assert back.read_bytes() == payload.read_bytes()
    # The legacy scp protocol too (`scp -O`: the remote `scp -t`, through the same login shell).
    subprocess.run([*scp, "-O", str(payload), f"{alias}:legacy.bin"], check=True, timeout=60)
    legacy = ssh(home, alias, "cmp in.bin legacy.bin && echo SAME")
    assert legacy.stdout.strip() == "SAME", legacy.stderr
    synced = home / "synced"
    subprocess.run(["rsync", "-a", "-e", f"ssh -F {config} -o BatchMode=yes", f"{alias}:/workspace/", f"{synced}/"],
                   check=True, timeout=60)  # fmt: skip
    assert (synced / "in.bin").read_bytes() == payload.read_bytes() and (synced / "README.md").exists()

    # A second user's key is refused (the same entry, their own key only), and so is root.
    other = home / "other_key"
    keygen(other)
    own_key = str(home / ".ssh" / "id_ed25519")
    stranger_config = home / "stranger_config"
    stranger_config.write_text(
        config.read_text().replace(f"IdentityFile {own_key}", f"IdentityFile {other}\n  IdentitiesOnly yes")
    )
    stranger = subprocess.run(
        ["ssh", "-F", str(stranger_config), "-o", "BatchMode=yes", alias, "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert stranger.returncode == 255 and "Permission denied" in stranger.stderr, stranger.stderr
    as_root = ssh(home, alias, "true", "-l", "root")
    assert as_root.returncode == 255 and "Permission denied" in as_root.stderr, as_root.stderr

    # The alias follows a stop and a start (the keys lived on the box's tmpfs).
    assert move_to(name, "stopped")["state"] == "stopped"
    moved = run_module_direct("agentbox_box", {"name": name, "state": "started", "boot": False})
    assert not moved["failed"], moved.get("msg")
    again = ssh(home, alias, "git -C /workspace rev-parse --abbrev-ref HEAD")
    assert again.returncode == 0 and again.stdout.strip() == f"agentbox/{name}", again.stderr

    # Destroy removes the entry and its host key.
    gone = run_module_direct("agentbox_box", {"name": name, "state": "absent"})
    assert not gone["failed"], gone.get("msg")
    assert alias not in config.read_text()
    assert alias not in (home / ".agentbox" / "known_hosts").read_text()
    after = ssh(home, alias, "true")
    assert after.returncode == 255


def wait_for_http(url: str, timeout: float = 20) -> str:
    """The body at url, once something answers there (the server in the box is starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.read().decode().strip()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def wait_gone(pid: int) -> None:
    """Polls until a forward's process ended (a state, with a deadline)."""
    deadline = time.monotonic() + 20
    while _forwards.process_start_time(pid):
        assert time.monotonic() < deadline, f"forward process {pid} still runs"
        time.sleep(0.1)


def playbook(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                               **(env or {})}, timeout=300, check=False)  # fmt: skip


def test_attach_uri_resume_and_include(home: Path, repo_factory, boxes: list[str], tmp_path: Path) -> None:
    repo = repo_factory("ws")
    name = f"att-{secrets.token_hex(3)}"
    create(repo, name, boxes, boot=False)
    paused = move_to(name, "paused")
    assert paused["state"] == "paused", paused

    # A hand-written ~/.ssh/config: only the Include line is added, once, at the top.
    user_config = home / ".ssh" / "config"
    original = "# mine\nHost work\n  HostName 192.0.2.1\n  User me\n\nHost *\n  ServerAliveInterval 30\n"
    user_config.write_text(original)
    user_config.chmod(0o644)

    # `code` is not installed: the playbook prints the URI (the box is resumed first).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    no_code_path = f"{bin_dir}:{os.environ['PATH']}"
    done = playbook("playbooks/attach.yml", "-e", f"box={name}", "-e", "ssh_include=true", env={"PATH": no_code_path})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "code is not installed here" in done.stdout
    uri = next(line for line in done.stdout.splitlines() if "uri:" in line).split("uri:", 1)[1].strip().strip("'")
    prefix, _sep, rest = uri.partition("+")
    assert prefix == "vscode-remote://attached-container" and rest.endswith("/workspace")
    target = json.loads(bytes.fromhex(rest.removesuffix("/workspace")))
    assert target["containerName"] == f"/agentbox-{name}"
    inspected = subprocess.run(["docker", "inspect", "--format", "{{.Name}} {{.State.Status}}",
                                target["containerName"].lstrip("/")], capture_output=True, text=True, check=True)  # fmt: skip
    inspected = inspected.stdout.split()
    assert inspected == [f"/agentbox-{name}", "running"]

    assert summary_line(done.stdout, "ssh") == f"ssh agentbox-{name}"  # the Include line is there now
    text = user_config.read_text()
    include = f"Include {home}/.agentbox/ssh_config\n"
    assert text == include + original
    assert stat.S_IMODE(user_config.stat().st_mode) == 0o644
    again = playbook("playbooks/attach.yml", "-e", f"box={name}", "-e", "ide=print", "-e", "ssh_include=true")
    assert again.returncode == 0, again.stdout + again.stderr
    assert user_config.read_text() == include + original

    # With an editor CLI on the PATH it is run with --folder-uri; ide=ssh gives the Remote-SSH URI.
    fake_code = bin_dir / "code"
    fake_code.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {bin_dir}/args\n")
    fake_code.chmod(0o755)
    opened = playbook("playbooks/attach.yml", "-e", f"box={name}", "-e", "ide=ssh", env={"PATH": no_code_path})
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert (bin_dir / "args").read_text().splitlines() == [
        "--folder-uri",
        f"vscode-remote://ssh-remote+agentbox-{name}/workspace",
    ]


def test_ssh_alias_and_web_url_of_a_box_restored_from_a_checkpoint(home: Path, repo_factory, boxes: list[str]) -> None:
    """checkpoint.yml, then create_box.yml with that checkpoint, as a user would: the restored box gets its own
    alias (its branch over ssh) and the web URL the restore prints is the port the engine published for it."""
    repo = repo_factory("ws")
    tag = secrets.token_hex(3)
    source, restored, checkpoint = f"cks-{tag}", f"ckr-{tag}", f"ck-{tag}"
    create(repo, source, boxes, boot=False)  # the restore boots its box, as create_box.yml does
    try:
        saved = playbook("playbooks/checkpoint.yml", "-e", f"box={source}", "-e", f"checkpoint={checkpoint}")
        assert saved.returncode == 0, saved.stdout[-3000:] + saved.stderr[-2000:]
        boxes.append(restored)
        made = playbook(
            "playbooks/create_box.yml", "-e", f"workspace={repo}", "-e", f"box={restored}",
            "-e", f"checkpoint={checkpoint}",
        )  # fmt: skip
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-2000:]
        assert f"checkpoint {checkpoint}" in made.stdout, made.stdout

        alias = f"agentbox-{restored}"
        assert f"Host {alias}\n" in (home / ".agentbox" / "ssh_config").read_text()
        branch = ssh(home, alias, "git -C /workspace rev-parse --abbrev-ref HEAD")
        assert branch.returncode == 0, branch.stderr
        assert branch.stdout.strip() == f"agentbox/{restored}"

        published = subprocess.run(
            ["docker", "port", alias, "80/tcp"], capture_output=True, text=True, check=True
        ).stdout.split()
        port = next(line.rsplit(":", 1)[1] for line in published if line.startswith("127.0.0.1:"))
        assert re.search(r"web: +(http://[^\s']+)", made.stdout).group(1) == f"http://127.0.0.1:{port}/", made.stdout
        assert run_module_direct("agentbox_box_info", {"name": restored})["box"]["web_url"] == f"http://127.0.0.1:{port}/"
    finally:
        destroy_quietly([restored, source])  # the checkpoint's image goes once no box runs from it
        removed = run_module_direct("agentbox_checkpoint", {"workspace": str(repo), "name": checkpoint, "state": "absent"})
        assert not removed["failed"], removed.get("msg")


def test_attach_missing_box_removes_stale_alias(home: Path, repo_factory, boxes: list[str]) -> None:
    repo = repo_factory("ws")
    name = f"gone-{secrets.token_hex(3)}"
    create(repo, name, boxes, boot=False)
    # Removed behind the collection's back: the entry stays until something notices.
    subprocess.run(["docker", "rm", "-f", "-v", f"agentbox-{name}"], check=True, capture_output=True)
    config = home / ".agentbox" / "ssh_config"
    assert f"agentbox-{name}" in config.read_text()
    done = playbook("playbooks/attach.yml", "-e", f"box={name}")
    assert done.returncode != 0
    assert f"no box called '{name}'" in done.stdout and "stale alias" in done.stdout, done.stdout
    assert f"agentbox-{name}" not in config.read_text()
    # Destroy still removes what the removed container left (its volumes).
    gone = run_module_direct("agentbox_box", {"name": name, "state": "absent"})
    assert not gone["failed"], gone.get("msg")
    assert volume_names(f"io.agentbox.box={name}") == []


def test_an_unusable_named_key_is_said_and_no_key_is_made(
    home: Path, repo_factory, boxes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in (home / ".ssh").iterdir():
        key.unlink()
    # A key whose .pub is not text counts as none (it used to fail the task after the box was made).
    keygen(home / ".ssh" / "id_ecdsa")
    (home / ".ssh" / "id_ecdsa.pub").write_bytes(b"\xff\xfe not a public key\n")
    monkeypatch.setenv("AGENTBOX_SSH_KEY", str(home / ".ssh" / "id_ecdsa"))
    repo = repo_factory("ws")
    name = f"nokey-{secrets.token_hex(3)}"
    created = create(repo, name, boxes)
    # The key the user named is not replaced by one of the collection's: the warning says what to fix.
    assert any("AGENTBOX_SSH_KEY=" in warning and "id_ecdsa.pub" in warning for warning in created["access"]["warnings"])
    assert created["access"]["key_made"] is None and not (home / ".agentbox" / "ssh").exists()
    # The box itself is fine, and the alias exists; no key can log in yet.
    assert created["box"]["state"] == "running"
    assert f"Host agentbox-{name}" in (home / ".agentbox" / "ssh_config").read_text()


@pytest.fixture
def bare_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary HOME with no ~/.ssh at all: a user who never made an SSH key."""
    path = Path(tempfile.mkdtemp(prefix="abn-", dir="/tmp"))
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("AGENTBOX_SSH_KEY", raising=False)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_its_owner(home: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """Run argv as a user whose passwd home is `home`: OpenSSH reads ~/.ssh/config from the passwd entry, not
    from $HOME, so the command runs in a mount namespace of its own where /etc/passwd says so (the host's
    passwd stays as it is)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace with another /etc/passwd for OpenSSH's home")
    passwd = home.parent / f"{home.name}.passwd"
    lines = Path("/etc/passwd").read_text().splitlines()
    uid = str(os.getuid())
    passwd.write_text("".join(
        ":".join([*fields[:5], str(home), *fields[6:]]) + "\n" if fields[2] == uid else line + "\n"
        for line, fields in ((line, line.split(":")) for line in lines)
    ))  # fmt: skip
    try:
        return subprocess.run(
            ["unshare", "--mount", "--", "sh", "-c", 'mount --bind "$0" /etc/passwd && exec "$@"', str(passwd), *argv],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        passwd.unlink()


def summary_line(out: str, label: str) -> str:
    """A line of create_box.yml's or attach.yml's summary (the YAML callback quotes and folds long ones)."""
    flat = " ".join(out.split())
    match = re.search(rf"- '?{label}: +(.*?)'?(?= - |$)", flat)
    assert match, out
    return match.group(1)


def test_first_create_without_a_key_makes_one_and_ssh_has_one_form(
    bare_home: Path, repo_factory, boxes: list[str]
) -> None:
    """A user with no ~/.ssh: the first create makes a key for the boxes and the printed line, with -F, logs in
    with the real OpenSSH client; after one yes (-e ssh_include=true) every create prints the short form, keeps
    the one Include line, and plain `ssh agentbox-<box>` logs in. Before: a warning to run ssh-keygen, no login,
    and the -F form printed by every create whatever the Include line."""
    home = bare_home
    repo = repo_factory("ws")
    tag = secrets.token_hex(3)
    first, second, third = f"kf-{tag}", f"ks-{tag}", f"kt-{tag}"

    boxes.append(first)
    made = playbook("playbooks/create_box.yml", "-e", f"workspace={repo}", "-e", f"box={first}")
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-2000:]
    key = home / ".agentbox" / "ssh" / "id_ed25519"
    assert summary_line(made.stdout, "ssh") == f"ssh -F ~/.agentbox/ssh_config agentbox-{first}", made.stdout
    assert summary_line(made.stdout, "key").startswith(f"made {key} for ssh into boxes"), made.stdout
    assert "-e ssh_include=true once" in summary_line(made.stdout, "tip"), made.stdout
    assert "no SSH key" not in made.stdout + made.stderr, made.stderr
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and "agentbox.box" in key.with_suffix(".pub").read_text()
    entry = (home / ".agentbox" / "ssh_config").read_text()
    assert f"  IdentityFile {key}\n  IdentitiesOnly yes\n" in entry
    assert not (home / ".ssh").exists()  # nothing made or changed there without the user's yes

    # The printed line as the user types it (the shell expands ~ from $HOME), with the real OpenSSH client.
    line = summary_line(made.stdout, "ssh")
    login = subprocess.run(["sh", "-c", line.replace("ssh ", "ssh -o BatchMode=yes ", 1) + " 'id -un; pwd'"],
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert login.returncode == 0 and login.stdout.split() == ["vscode", "/workspace"], login.stderr

    # attach.yml prints the same form, and the tip is not said again (nor the key: it was made already).
    attached = playbook("playbooks/attach.yml", "-e", f"box={first}", "-e", "ide=print")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert summary_line(attached.stdout, "ssh") == f"ssh -F ~/.agentbox/ssh_config agentbox-{first}"
    assert "tip:" not in attached.stdout and "key:" not in attached.stdout, attached.stdout
    # switch_box.yml too (it printed the bare alias whatever ~/.ssh/config held).
    switched = playbook("playbooks/switch_box.yml", "-e", f"box={first}")
    assert switched.returncode == 0, switched.stdout + switched.stderr
    assert summary_line(switched.stdout, "ssh") == f"ssh -F ~/.agentbox/ssh_config agentbox-{first}", switched.stdout

    # One yes: this create and every later one print the short form, and ~/.ssh/config has one Include line.
    for name, answer in ((second, ("-e", "ssh_include=true")), (third, ())):
        boxes.append(name)
        made = playbook("playbooks/create_box.yml", "-e", f"workspace={repo}", "-e", f"box={name}", *answer)
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-2000:]
        assert summary_line(made.stdout, "ssh") == f"ssh agentbox-{name}", made.stdout
        assert "tip:" not in made.stdout and "key:" not in made.stdout, made.stdout
        assert (home / ".ssh" / "config").read_text() == f"Include {home}/.agentbox/ssh_config\n"
    assert json.loads((home / ".agentbox" / "access.json").read_text())["ssh_include"] is True
    assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700
    assert summary_line(playbook("playbooks/attach.yml", "-e", f"box={first}", "-e", "ide=print").stdout, "ssh") \
        == f"ssh agentbox-{first}"

    # Plain ssh, as the user whose home this is: ~/.ssh/config includes the aliases, the key is the boxes' own.
    for name in (first, third):
        plain = as_its_owner(home, ["ssh", "-o", "BatchMode=yes", f"agentbox-{name}", "git rev-parse --abbrev-ref HEAD"])
        assert plain.returncode == 0 and plain.stdout.strip() == f"agentbox/{name}", plain.stderr


@pytest.fixture
def no_sshd_image() -> Iterator[str]:
    """The box image without its OpenSSH server (removed after the test's boxes: ask for it before `boxes`)."""
    image = f"agentbox-test/no-sshd:{secrets.token_hex(3)}"
    maker = f"abx-nosshd-{secrets.token_hex(3)}"
    subprocess.run(["docker", "run", "--name", maker, "agentbox/box:latest", "rm", "-f", "/usr/sbin/sshd"],
                   check=True, capture_output=True)  # fmt: skip
    try:
        subprocess.run(["docker", "commit", "--change", 'CMD ["sleep", "infinity"]', maker, image],
                       check=True, capture_output=True)  # fmt: skip
    finally:
        subprocess.run(["docker", "rm", "-f", maker], capture_output=True, check=False)
    yield image
    subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)


def test_access_rides_in_the_boot_exec_and_its_failure_is_a_warning(
    home: Path, repo_factory, no_sshd_image: str, boxes: list[str]
) -> None:
    """A create runs the SSH access's box side in the boot's exec, or the seed's when it does not boot
    (one exec less): when it fails there (an image without sshd), the box is still made and running,
    and the warning says what failed."""
    name = f"nosshd-{secrets.token_hex(3)}"
    boxes.append(name)
    created = run_module_direct("agentbox_box", {"name": name, "workspace": str(repo_factory("ws")), "image": no_sshd_image})
    assert not created["failed"], created.get("msg")
    assert created["box"]["state"] == "running" and created["boot"]["ok"] is True
    assert any(
        "preparing SSH access in the box failed: no OpenSSH server in the box (/usr/sbin/sshd)" in warning
        for warning in created["access"]["warnings"]
    ), created["access"]
    # With no boot, it rides in the worktree seed's exec instead: the same words (its own exec would
    # say "exited 4"), and the box is made.
    unbooted_name = f"nosshd-{secrets.token_hex(3)}"
    boxes.append(unbooted_name)
    unbooted = run_module_direct("agentbox_box", {"name": unbooted_name, "workspace": str(repo_factory("ws2")),
                                                  "image": no_sshd_image, "boot": False})  # fmt: skip
    assert not unbooted["failed"], unbooted.get("msg")
    assert unbooted["box"]["state"] == "running" and unbooted["seed"]["mode"] == "worktree"
    assert any(
        "preparing SSH access in the box failed: no OpenSSH server in the box (/usr/sbin/sshd)" in warning
        for warning in unbooted["access"]["warnings"]
    ), unbooted["access"]
    # The same failure through attach, which runs the access alone (its own exec).
    attached = run_module_direct("agentbox_access", {"name": name, "ide": "print"})
    assert not attached["failed"], attached.get("msg")
    assert any(
        "preparing SSH access in the box" in warning and "no OpenSSH server in the box" in warning
        for warning in attached["warnings_access"]
    ), attached["warnings_access"]


def test_named_shells(at_shared_home: Path, served_box: SharedBox) -> None:
    home, name = at_shared_home, served_box.name
    made = playbook("playbooks/shell.yml", "-e", f"box={name}", "-e", "name=build")
    assert made.returncode == 0, made.stdout + made.stderr
    flat = " ".join(made.stdout.split())  # the YAML callback folds long lines
    assert f"agentbox-{name} tmux attach -t shell-build" in flat, made.stdout
    again = playbook("playbooks/shell.yml", "-e", f"box={name}", "-e", "name=build")
    assert again.returncode == 0 and "changed=0" in again.stdout.split("PLAY RECAP")[-1].split("agentbox_shell")[-1]

    # The session is vscode's login shell in /workspace, and reachable over the alias.
    probe = ssh(
        home,
        f"agentbox-{name}",
        "tmux display-message -p -t shell-build '#{pane_current_path}'; readlink -f /workspace",
    )
    assert probe.returncode == 0, probe.stderr
    pane_path, workspace_target = probe.stdout.split()
    assert pane_path in ("/workspace", workspace_target), probe.stdout
    owner = ssh(home, f"agentbox-{name}", "ps -o user= -p $(tmux display-message -p -t shell-build '#{pane_pid}')")
    assert owner.stdout.strip() == "vscode", owner.stdout + owner.stderr

    listed = playbook("playbooks/shell.yml", "-e", f"box={name}", "-e", "state=list")
    assert listed.returncode == 0 and f"shells in {name}: shell-build" in listed.stdout, listed.stdout
    ended = playbook("playbooks/shell.yml", "-e", f"box={name}", "-e", "name=build", "-e", "state=absent")
    assert ended.returncode == 0, ended.stdout + ended.stderr
    # The list after the end: the run's own report, tmux's list read after the kill (the task state=list runs).
    assert f"shells in {name}: none" in ended.stdout, ended.stdout
    # A bad name is refused by the play's first task: tests/unit/playbooks/test_playbook_arguments.py.


def test_forward_local_and_web_url_after_start(at_shared_home: Path, served_box: SharedBox) -> None:
    name = served_box.name
    forwarded = run_module_direct("agentbox_forward", {"name": name})
    assert forwarded["url"] == served_box.web_url and forwarded["changed"] is False
    try:
        assert move_to(name, "stopped")["state"] == "stopped"
        not_running = run_module_direct("agentbox_forward", {"name": name})
        assert not_running["failed"] and "is stopped" in not_running["msg"]
        # After a start the published port is new: box_state.yml prints the URL as it is now.
        started = playbook("playbooks/box_state.yml", "-e", f"box={name}", "-e", "state=started")
        assert started.returncode == 0, started.stdout + started.stderr
    except BaseException:
        run_module_direct("agentbox_box", {"name": name, "state": "started"})  # the shared box as the next test expects
        raise
    now = run_module_direct("agentbox_forward", {"name": name})["url"]
    served_box.web_url = now
    assert f"web: {now}" in started.stdout


def test_forward_says_when_nothing_listens_in_the_box(at_shared_home: Path, served_box: SharedBox) -> None:
    """forward.yml asks the box before it prints a URL: the web port's forwarder with no service behind it
    (it would answer 503), a published port with no server; once a server listens, no note and the URL works."""
    name = served_box.name

    def forward(port: int) -> str:
        done = playbook("playbooks/forward.yml", "-e", f"box={name}", "-e", f"port={port}")
        assert done.returncode == 0, done.stdout + done.stderr
        return " ".join(done.stdout.split())

    web = forward(80)
    assert "listens: nothing listens on port 80 in the box: No service in /workspace/agentbox.yaml sets expose" in web, web
    assert "nothing listens on port 8123 in the box (the URL answers once something does)" in forward(8123)
    token = secrets.token_hex(8)
    subprocess.run(["docker", "exec", "-u", "vscode", f"agentbox-{name}", "sh", "-c",
                    f"mkdir -p /tmp/www && echo {token} > /tmp/www/token && cd /tmp/www && "
                    "(nohup python3 -m http.server 8123 >/dev/null 2>&1 &)"], check=True)  # fmt: skip
    try:
        url = wait_until_served(lambda: forward(8123), "listens:")
        assert wait_for_http(url + "token") == token
    finally:  # the shared box as the next test expects: nothing listening on 8123
        subprocess.run(["docker", "exec", f"agentbox-{name}", "pkill", "-f", "http.server 8123"], check=False)


def wait_until_served(forward: Callable[[], str], note: str) -> str:
    """forward.yml again until the server that was just started listens (a state polled with a deadline)."""
    deadline = time.monotonic() + 60
    while True:
        said = forward()
        if note not in said:
            return re.search(r"url: +(http://127\.0\.0\.1:\d+/)", said).group(1)
        assert time.monotonic() < deadline, said


def test_ssh_wake_of_a_stopped_box_says_its_new_web_url(at_shared_home: Path, unbooted_box: SharedBox) -> None:
    """`ssh agentbox-<box>` starts a stopped box (the ProxyCommand's wake); the start publishes a new web port,
    and the wake says the new URL on stderr (ssh shows it), the one the box's facts report."""
    home, name = at_shared_home, unbooted_box.name
    alias = f"agentbox-{name}"
    config = home / ".agentbox" / "ssh_config"
    argv = ["ssh", "-F", str(config), "-o", "BatchMode=yes", alias, "id -un"]

    # A paused box keeps its ports: resumed, no URL said.
    assert move_to(name, "paused")["state"] == "paused"
    resumed = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0 and resumed.stdout == "vscode\n", resumed.stderr
    assert "was paused" in resumed.stderr and " web " not in resumed.stderr, resumed.stderr

    stopped = move_to(name, "stopped")
    assert stopped["state"] == "stopped" and not stopped["web_url"], stopped
    woke = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)  # a guard, not a timing
    assert woke.returncode == 0 and woke.stdout == "vscode\n", woke.stderr
    assert "was stopped" in woke.stderr, woke.stderr
    said = re.findall(r"agentbox: box '[^']+': web (\S+)", woke.stderr)
    facts = run_module_direct("agentbox_box_info", {"name": name})["box"]
    assert facts["state"] == "running" and facts["web_url"], facts
    assert said == [facts["web_url"]], woke.stderr
    assert run_module_direct("agentbox_forward", {"name": name})["url"] == facts["web_url"]
    # The entry is still current: the next login takes the direct path (no wake, nothing said).
    assert f"Host {alias}\n" in config.read_text()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0 and "agentbox:" not in again.stderr, again.stderr


def volume_names(box_or_kind: str) -> list[str]:
    out = subprocess.run(["docker", "volume", "ls", "--filter", f"label={box_or_kind}", "--format", "{{.Name}}"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sorted(out.split())


def test_editor_servers_and_extensions_are_each_box_s_own(
    home: Path, repo_factory, boxes: list[str], unbooted_box: SharedBox
) -> None:
    """Each box's VS Code and Cursor servers, extensions included, live in volumes of that box alone: an
    extension one box plants never reaches another box's editor server (the other box: the module's
    unbooted_box, only read here)."""
    repo = repo_factory("ws")
    first, second = f"ed-{secrets.token_hex(3)}", unbooted_box.name
    create(repo, first, boxes, boot=False)
    alias = f"agentbox-{first}"
    for name in (first, second):
        mounts = json.loads(
            subprocess.run(["docker", "inspect", "--format", "{{json .Mounts}}", f"agentbox-{name}"],
                           capture_output=True, text=True, check=True).stdout
        )
        by_path = {mount["Destination"]: mount.get("Name") for mount in mounts}
        assert by_path["/home/vscode/.vscode-server"] == f"agentbox-{name}-vscode-server"
        assert by_path["/home/vscode/.cursor-server"] == f"agentbox-{name}-cursor-server"
        assert not [path for path in by_path if path.endswith("/extensions")], by_path
    # Dev Containers attaches as vscode in /workspace (so the server lands in the per-box volume).
    metadata = subprocess.run(["docker", "inspect", "--format", '{{index .Config.Labels "devcontainer.metadata"}}',
                               alias], capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(metadata) == [{"remoteUser": "vscode", "workspaceFolder": "/workspace"}]

    # The box user writes a server file and an extension for each editor; they survive a stop and start.
    planted = "mkdir -p ~/.vscode-server/extensions ~/.cursor-server/extensions && echo server > ~/.vscode-server/marker" \
        f" && echo ext > ~/.vscode-server/extensions/planted-{first} && echo ext > ~/.cursor-server/extensions/planted-{first}"
    wrote = ssh(home, alias, planted)
    assert wrote.returncode == 0, wrote.stderr
    assert move_to(first, "stopped")["state"] == "stopped"
    assert not run_module_direct("agentbox_box", {"name": first, "state": "started", "boot": False})["failed"]
    kept = ssh(home, alias, f"cat ~/.vscode-server/marker ~/.vscode-server/extensions/planted-{first}")
    assert kept.stdout.split() == ["server", "ext"], kept.stdout + kept.stderr
    seen = subprocess.run(["docker", "exec", f"agentbox-{second}", "sh", "-c",
                           f"ls /home/vscode/.vscode-server/extensions/planted-{first} "
                           f"/home/vscode/.cursor-server/extensions/planted-{first} 2>&1; true"],
                          capture_output=True, text=True, check=True).stdout
    assert seen.count("No such file") == 2, seen

    # Destroy removes every editor volume of the box.
    assert not run_module_direct("agentbox_box", {"name": first, "state": "absent"})["failed"]
    assert volume_names(f"io.agentbox.box={first}") == []


def test_attach_starts_a_stopped_box_and_runs_only_the_editor_asked_for(
    at_shared_home: Path, unbooted_box: SharedBox, tmp_path: Path
) -> None:
    """A stopped box is started first; `ide=print` runs no editor even with `code` and `cursor` installed;
    `ide=cursor` runs `cursor --folder-uri <Dev Containers URI of the box>`."""
    name = unbooted_box.name
    assert move_to(name, "stopped")["state"] == "stopped"

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for editor in ("code", "cursor"):  # fake editor CLIs: each call is its name and arguments, a line each
        fake = bin_dir / editor
        fake.write_text(f"#!/bin/sh\nprintf '%s\\n' {editor} \"$@\" >> {calls}\n")
        fake.chmod(0o755)
    path = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}

    printed = playbook("playbooks/attach.yml", "-e", f"box={name}", "-e", "ide=print", env=path)
    assert printed.returncode == 0, printed.stdout + printed.stderr
    assert "printed only" in printed.stdout, printed.stdout
    assert not calls.exists(), calls.read_text()
    facts = run_module_direct("agentbox_box_info", {"name": name})["box"]
    assert facts["state"] == "running", facts
    assert f"web:     {facts['web_url']}" in printed.stdout, printed.stdout  # the URL after the start

    opened = playbook("playbooks/attach.yml", "-e", f"box={name}", "-e", "ide=cursor", env=path)
    assert opened.returncode == 0, opened.stdout + opened.stderr
    editor, flag, uri = calls.read_text().splitlines()
    assert (editor, flag) == ("cursor", "--folder-uri")
    prefix, _sep, rest = uri.partition("+")
    assert prefix == "vscode-remote://attached-container" and rest.endswith("/workspace"), uri
    assert json.loads(bytes.fromhex(rest.removesuffix("/workspace")))["containerName"] == f"/agentbox-{name}"
