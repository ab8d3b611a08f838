"""`ssh agentbox-<box>` for a Daytona box, with the real OpenSSH client, through the emulator's SSH gateway
(a token as the user name, commands run in the sandbox as the daemon's user, as Daytona's gateway does), and
a port of the box through a signed preview URL (agentbox_forward). Issues 16 and 19.

HOME is a private temp dir (its own key, ~/.agentbox); OpenSSH reads the alias with `-F`.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.daytona_emulator import running_emulator
from tests.integration.support.ssh_world import SshWorld, box_world

pytestmark = pytest.mark.integration


class World(SshWorld):
    provider_name, credentials_prefix = "daytona", "DAYTONA_"

    def __init__(self, api_url: str, api_key: str, admin, root: Path) -> None:
        super().__init__(root, "dssh", "daytona over ssh\n")
        self.api_url, self.api_key, self.admin = api_url, api_key, admin

    def provider_env(self) -> dict[str, str]:
        return {"DAYTONA_API_URL": self.api_url, "DAYTONA_API_KEY": self.api_key}

    def module(self, module: str, **args) -> dict:
        saved = os.environ.pop("DAYTONA_TARGET", None)
        try:
            return super().module(module, **args)
        finally:
            if saved is not None:
                os.environ["DAYTONA_TARGET"] = saved

    def gateway_token(self) -> str:
        text = (self.home / ".agentbox" / "daytona-ssh" / f"{self.box}.conf").read_text()
        return re.search(r"^  User (\S+)$", text, re.M).group(1)


@pytest.fixture(scope="module")
def world(box_image: str) -> Iterator[World]:
    with (
        running_emulator(image=box_image) as (api_url, api_key, admin),
        box_world(lambda root: World(api_url, api_key, admin, root)) as made,
    ):
        yield made


def test_ssh_alias_lands_as_vscode_on_the_boxs_branch(world: World) -> None:
    access = world.created["access"]
    assert access["alias"] == f"agentbox-{world.box}" and access["warnings"] == [], access
    assert access["expires_at"].endswith("Z")
    assert stat.S_IMODE(world.config.stat().st_mode) == 0o600
    branch = world.ssh("git -C /workspace rev-parse --abbrev-ref HEAD")
    assert branch.returncode == 0, branch.stderr
    assert branch.stdout.strip() == f"agentbox/{world.box}"
    assert world.ssh("id -un").stdout == "vscode\n"
    # The same in-box sshd as a local box's: a command lands in /workspace (issue 16).
    assert world.ssh("pwd").stdout == "/workspace\n"
    # The token is a credential: only in the private gateway file, never in the shared config or a command line.
    token = world.gateway_token()
    assert token not in world.config.read_text()
    gateway = world.home / ".agentbox" / "daytona-ssh" / f"{world.box}.conf"
    assert stat.S_IMODE(gateway.stat().st_mode) == 0o600


def test_scp_in_and_out(world: World) -> None:
    payload = os.urandom(300_000)
    source = world.root / "in.bin"
    source.write_bytes(payload)
    done = world.scp(str(source), f"agentbox-{world.box}:/tmp/in.bin")
    assert done.returncode == 0, done.stderr
    assert world.ssh("stat -c %U /tmp/in.bin").stdout == "vscode\n"
    back = world.root / "out.bin"
    done = world.scp(f"agentbox-{world.box}:/tmp/in.bin", str(back))
    assert done.returncode == 0, done.stderr
    assert back.read_bytes() == payload


def test_an_expired_token_is_refreshed(world: World) -> None:
    old = world.gateway_token()
    world.admin.expire_ssh_access(old)  # its time is up on the service's side
    # Where ssh runs without the API key, the alias cannot renew it, and says what is missing.
    refused = world.ssh("true")
    assert refused.returncode == 255
    assert "DAYTONA_API_KEY" in refused.stderr, refused.stderr
    # With the key there, the alias's wake launcher renews the token and the same ssh goes through.
    renewed = world.ssh("git -C /workspace rev-parse --abbrev-ref HEAD", DAYTONA_API_KEY=world.api_key)
    assert (renewed.returncode, renewed.stdout.strip()) == (0, f"agentbox/{world.box}"), renewed.stderr
    assert "SSH access had run out; renewed" in renewed.stderr
    assert world.gateway_token() != old
    # And through the module (attach.yml), as the message says.
    old = world.gateway_token()
    world.admin.expire_ssh_access(old)
    renewed = world.module("agentbox_access", name=world.box, ide="ssh")
    assert not renewed["failed"], renewed
    assert renewed["uri"] == f"vscode-remote://ssh-remote+agentbox-{world.box}/workspace"
    assert renewed["expires_at"] and world.gateway_token() != old
    again = world.ssh("git -C /workspace rev-parse --abbrev-ref HEAD")
    assert (again.returncode, again.stdout.strip()) == (0, f"agentbox/{world.box}"), again.stderr


def test_a_token_past_its_recorded_expiry_says_how_to_renew(tmp_path: Path, monkeypatch) -> None:
    """The ProxyCommand checks the expiry Daytona gave before trying (the real gateway just closes)."""
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona import _daytona_ssh

    monkeypatch.setenv("HOME", str(tmp_path))
    past = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    proxy, until = _daytona_ssh.write_gateway("old", {"command": "ssh -p 2222 Tok3n0123456789@127.0.0.1",
                                                      "token": "Tok3n0123456789", "expires_at": past})  # fmt: skip
    assert until == past
    done = subprocess.run(proxy, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 255
    assert "the Daytona SSH access of box old expired" in done.stderr and "playbooks/attach.yml" in done.stderr
    with pytest.raises(Exception, match="not `ssh"):
        _daytona_ssh.write_gateway("bad", {"command": "ssh -o ProxyCommand=x tok@h", "token": "tok",
                                           "expires_at": past})  # fmt: skip


def playbook(world: World, *args: str) -> subprocess.CompletedProcess:
    """An ansible-playbook run as the user runs it: the world's HOME and the provider's URL and key."""
    env = {k: v for k, v in os.environ.items() if k != "DAYTONA_TARGET"}
    return subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), *args, "-e", "provider=daytona"],
        cwd=REPO,
        env={**env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **world.env()},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_named_shells_on_a_daytona_box(world: World) -> None:
    """shell.yml reaches the box through the box connection, as on any provider: shell-<name> is vscode's login
    shell in /workspace, listed, attachable over the alias, and ended."""
    made = playbook(world, "playbooks/shell.yml", "-e", f"box={world.box}", "-e", "name=build")
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-2000:]
    flat = " ".join(made.stdout.split())  # the YAML callback folds long lines
    assert f"agentbox-{world.box} tmux attach -t shell-build" in flat, made.stdout
    probe = world.ssh("tmux display-message -p -t shell-build '#{pane_current_path}'; readlink -f /workspace; "
                      "ps -o user= -p $(tmux display-message -p -t shell-build '#{pane_pid}')")  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    pane_path, workspace_target, owner = probe.stdout.split()
    assert pane_path in ("/workspace", workspace_target) and owner == "vscode", probe.stdout
    listed = playbook(world, "playbooks/shell.yml", "-e", f"box={world.box}", "-e", "state=list")
    assert listed.returncode == 0 and f"shells in {world.box}: shell-build" in listed.stdout, listed.stdout
    ended = playbook(world, "playbooks/shell.yml", "-e", f"box={world.box}", "-e", "name=build", "-e", "state=absent")
    assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr[-2000:]
    # Every run lists the shells after its own step (state=list is that step alone, run above): none left.
    assert f"shells in {world.box}: none" in ended.stdout, ended.stdout


def test_the_alias_follows_a_stop_and_a_start(world: World) -> None:
    """box_state.yml stopped, then started: the same alias lands as vscode in /workspace (the keys lived on the
    box's tmpfs; ssh runs without DAYTONA_API_KEY, so only the start itself can have set the box up again), and
    the start gave the alias a new SSH access token (docs/access.md: each start mints one)."""
    before = world.gateway_token()
    for state in ("stopped", "started"):
        moved = playbook(world, "playbooks/box_state.yml", "-e", f"box={world.box}", "-e", f"state={state}")
        assert moved.returncode == 0, moved.stdout[-3000:] + moved.stderr[-2000:]
    landed = world.ssh("id -un; pwd; git -C /workspace rev-parse --abbrev-ref HEAD")
    assert landed.returncode == 0, landed.stderr
    assert landed.stdout.split() == ["vscode", "/workspace", f"agentbox/{world.box}"], landed.stdout
    assert world.ssh("true").returncode == 0
    assert world.gateway_token() != before


def test_the_preview_urls_ttl_reaches_daytona_and_an_expired_url_is_refused(world: World) -> None:
    """forward.yml's `ttl` is the expiresInSeconds of Daytona's signed preview URL (the emulator keeps what it was
    asked for; agentbox_forward returns it as expires_in, printed as `valid:`), the URL reaches the box's port
    until then, and once its time is up the preview proxy refuses it (401)."""
    started = world.ssh("mkdir -p /tmp/ttl && echo within-ttl > /tmp/ttl/index.html && "
                        "(nohup python3 -m http.server 8124 --directory /tmp/ttl >/dev/null 2>&1 &)")  # fmt: skip
    assert started.returncode == 0, started.stderr
    since = max((entry["seq"] for entry in world.admin.requests()), default=0)
    done = playbook(world, "playbooks/forward.yml", "-e", f"box={world.box}", "-e", "port=8124", "-e", "ttl=777")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "valid:   777 s" in done.stdout, done.stdout
    url = re.search(r"url: +(\S+)", done.stdout).group(1).strip("'\"")
    asked = [entry["query"] for entry in world.admin.requests(since) if entry["path"].endswith("/ports/8124/signed-preview-url")]
    assert asked == ["expiresInSeconds=777"], asked
    token = url.rstrip("/").rsplit("/", 1)[-1]
    made = [record for record in world.admin.signed_previews() if record["token"] == token]
    assert [(record["port"], record["expiresInSeconds"]) for record in made] == [(8124, 777)], made

    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                assert response.read() == b"within-ttl\n"
            break
        except urllib.error.HTTPError as exc:
            assert exc.code == 502 and time.monotonic() < deadline, f"the server in the box never answered: {exc}"
            time.sleep(0.5)  # the server is still starting: polled with a deadline
    world.admin.expire_signed_preview(token)  # its 777 s are up
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=30)
    assert refused.value.code == 401


def test_destroy_removes_the_alias_and_the_token(world: World, box_image: str) -> None:
    """A box of its own: destroying it removes its entry and its gateway files, and the alias stops working."""
    name = f"dsx-{uuid.uuid4().hex[:6]}"
    made = world.module("agentbox_box", name=name, workspace=str(world.workspace), boot=False)
    assert not made["failed"], made
    assert f"Host agentbox-{name}\n" in world.config.read_text()
    gone = world.module("agentbox_box", name=name, state="absent")
    assert not gone["failed"] and gone["changed"], gone
    assert f"agentbox-{name}" not in world.config.read_text()
    assert not list((world.home / ".agentbox" / "daytona-ssh").glob(f"{name}.*"))
    assert f"Host agentbox-{world.box}\n" in world.config.read_text()  # the other box's entry stays
