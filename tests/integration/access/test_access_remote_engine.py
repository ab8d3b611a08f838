"""`ssh agentbox-<box>` to a box on a remote engine over SSH, with the real OpenSSH client: its alias through the
engine, forward.yml, the Remote-SSH URI and shell.yml through the box connection (the run's shared engine
fleet, tests/integration/conftest.py). A file of its own beside test_access.py (whose helpers it uses), so the
two spread over the suite's workers.
"""

from __future__ import annotations

import re
import secrets
import subprocess
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.conftest import run_module_direct
from tests.integration.access.test_access import (  # pylint: disable=unused-import
    home,  # noqa: F401
    move_to,
    playbook,
    ssh,
    wait_for_http,
    wait_gone,
)
from tests.integration.support.engines import FLEET_IMAGE, EngineFleet

pytestmark = pytest.mark.integration


def test_ssh_alias_and_named_shells_of_a_box_on_a_remote_engine(
    home: Path, repo_factory, engine_fleet: EngineFleet  # noqa: F811
) -> None:
    """A box on an engine over SSH (the worker's shared engine, tests/integration/conftest.py): its alias
    reaches it through the engine (ssh, scp, after a stop and start), forward.yml brings its port here,
    ide=vscode gives the Remote-SSH URI; shell.yml's tasks go through the box connection, the session is
    vscode's in /workspace and reachable over the alias, listed and ended; destroy removes the alias."""
    engine = engine_fleet.engines[0]
    repo = repo_factory("ws")
    name = f"rem-{secrets.token_hex(3)}"
    common = {"name": name, "provider": "docker_ssh", "engine": engine.alias, "isolation": "none"}
    where = ("-e", f"box={name}", "-e", "provider=docker_ssh", "-e", f"engine={engine.alias}")
    try:
        # boot=False: the alias, forward.yml and tmux need nothing started in the box (no dockerd in the engine's box).
        created = run_module_direct("agentbox_box", {**common, "workspace": str(repo), "ports": [8123], "image": FLEET_IMAGE,
                                                     "boot": False})  # fmt: skip
        assert not created["failed"], created.get("msg")
        alias = created["access"]["alias"]
        assert created["access"]["warnings"] == []
        config = home / ".agentbox" / "ssh_config"
        assert f"engine={engine.alias}" in config.read_text()

        branch = ssh(home, alias, "git -C /workspace rev-parse --abbrev-ref HEAD")
        assert branch.returncode == 0, branch.stderr
        assert branch.stdout.strip() == f"agentbox/{name}"
        whoami = ssh(home, alias, "hostname; id -un")
        assert whoami.stdout.split() == [f"agentbox-{name}", "vscode"], whoami.stdout + whoami.stderr

        payload = home / "in.txt"
        payload.write_text("through the engine\n")
        scp = ["scp", "-q", "-F", str(config), "-o", "BatchMode=yes"]
        subprocess.run([*scp, str(payload), f"{alias}:/workspace/in.txt"], check=True, timeout=60)
        subprocess.run([*scp, f"{alias}:/workspace/in.txt", str(home / "out.txt")], check=True, timeout=60)
        assert (home / "out.txt").read_text() == "through the engine\n"

        remote = DockerProvider(engine=engine.alias, ssh_options={}, isolation="none")
        assert move_to(name, "stopped", remote)["state"] == "stopped"
        moved = run_module_direct("agentbox_box", {**common, "state": "started", "boot": False})
        assert not moved["failed"], moved.get("msg")
        again = ssh(home, alias, "git -C /workspace rev-parse --abbrev-ref HEAD")
        assert again.returncode == 0 and again.stdout.strip() == f"agentbox/{name}", again.stderr

        # forward.yml: the box's ports on this machine's 127.0.0.1, through the engine: 8123 published at create
        # (an SSH forward to it), 9999 not (a relay into the box's loopback per connection, over the same SSH).
        token = secrets.token_hex(8)
        served = ssh(home, alias, f"mkdir -p /tmp/www && echo {token} > /tmp/www/token && cd /tmp/www && "
                     "(nohup python3 -m http.server 8123 >/dev/null 2>&1 &) && "
                     "(nohup python3 -m http.server 9999 --bind 127.0.0.1 >/dev/null 2>&1 &) && echo serving")  # fmt: skip
        assert served.stdout.strip() == "serving", served.stderr
        pids = []
        for port in (8123, 9999):
            forwarded = playbook(
                "playbooks/forward.yml", "-e", f"box={name}", "-e", f"port={port}", "-e", "provider=docker_ssh",
                "-e", f"engine={engine.alias}",
            )  # fmt: skip
            assert forwarded.returncode == 0, forwarded.stdout + forwarded.stderr
            url = re.search(r"url: +(http://127\.0\.0\.1:\d+/)", forwarded.stdout).group(1)
            pids.append(int(re.search(r"forward: pid (\d+)", forwarded.stdout).group(1)))
            assert wait_for_http(url + "token") == token

        # ide=ssh and any box off the local engine: the Remote-SSH URI.
        way_in = run_module_direct("agentbox_access", {**common, "ide": "vscode"})
        assert way_in["uri"] == f"vscode-remote://ssh-remote+{alias}/workspace"

        # Named shells on the remote box.
        made = playbook("playbooks/shell.yml", *where, "-e", "name=build")
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-2000:]
        assert f"agentbox-{name} tmux attach -t shell-build" in " ".join(made.stdout.split()), made.stdout
        probe = ssh(home, alias, "tmux display-message -p -t shell-build '#{pane_current_path}'; "
                    "readlink -f /workspace; ps -o user= -p $(tmux display-message -p -t shell-build '#{pane_pid}')")  # fmt: skip
        assert probe.returncode == 0, probe.stderr
        pane_path, workspace_target, owner = probe.stdout.split()
        assert pane_path in ("/workspace", workspace_target) and owner == "vscode", probe.stdout
        # Listed and ended: every shell.yml run ends with the box's list of shells, read by tmux after its change
        # (state=list alone, the same task and report, is test_named_shells').
        assert f"shells in {name}: shell-build" in " ".join(made.stdout.split()), made.stdout
        ended = playbook("playbooks/shell.yml", *where, "-e", "name=build", "-e", "state=absent")
        assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr[-2000:]
        assert f"shells in {name}: none" in ended.stdout, ended.stdout
    finally:
        gone = run_module_direct("agentbox_box", {**common, "state": "absent"})
        assert not gone["failed"], gone.get("msg")
    assert f"agentbox-{name}" not in (home / ".agentbox" / "ssh_config").read_text()
    assert engine.agentbox_objects(name) == []
    for pid in pids:  # the forwards ended with the box
        wait_gone(pid)
