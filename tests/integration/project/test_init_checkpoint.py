"""`init.yml -e checkpoint=true` on the real engine: the file is written, a box installs the project (its
marker-guarded task), the checkpoint `init` is taken and made the project's default, and the set-up box is
destroyed; the next box of the workspace starts from that checkpoint with the install skipped (its marker
matched) and the dev server the file names answering on the box's web port."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, chown_tree, make_repo, run_module

pytestmark = pytest.mark.integration

PACKAGE = {"name": "hello", "version": "1.0.0", "private": True, "scripts": {"dev": "node server.js"}}
# npm's own lock file of a package without dependencies: `npm ci` needs no registry.
LOCK = {"name": "hello", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
        "packages": {"": {"name": "hello", "version": "1.0.0"}}}
SERVER = ("require('http').createServer((q, s) => s.end('hello from the box\\n'))"
          ".listen(process.env.PORT || 3000, '127.0.0.1')\n")


@pytest.fixture
def workspace(docker_client: docker.DockerClient, box_image: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="agentbox-init-"))
    root.chmod(0o755)
    workspace = make_repo(root / "ws", {"package.json": json.dumps(PACKAGE), "package-lock.json": json.dumps(LOCK),
                                        "server.js": SERVER, ".gitignore": "node_modules/\n"})
    chown_tree(workspace)
    project = hashlib.sha1(str(workspace).encode()).hexdigest()[:16]
    try:
        yield workspace
    finally:
        for box in run_module("agentbox_box_info", {"workspace": str(workspace)}).get("boxes", []):
            run_module("agentbox_box", {"name": box["name"], "state": "absent", "delete_branch": True})
        for image in docker_client.images.list(filters={"label": f"io.agentbox.project={project}"}):
            for tag in image.tags:
                docker_client.images.remove(tag, force=True)
        for folder in ("checkpoints", "projects"):
            shutil.rmtree(Path.home() / ".agentbox" / folder / project, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def test_init_with_checkpoint_installs_once_and_new_boxes_start_with_it_done(workspace: Path) -> None:
    setup = f"init-{secrets.token_hex(3)}"
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "PWD": str(workspace)}
    ran = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-e",
                          f"ansible_python_interpreter={sys.executable}", str(REPO / "playbooks/init.yml"),
                          "-e", "checkpoint=true", "-e", f"box={setup}"],
                         cwd=workspace, env=env, capture_output=True, text=True, timeout=900, check=False)
    printed = " ".join(ran.stdout.split())
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert "found: npm (package-lock.json); package.json scripts.dev (port 3000)" in printed
    assert "checkpoint: init, now the project default" in printed, ran.stdout[-3000:]
    assert f"box: {setup} destroyed" in printed, ran.stdout[-3000:]
    assert (workspace / "agentbox.yaml").is_file()

    info = run_module("agentbox_checkpoint_info", {"workspace": str(workspace)})
    assert info["default"] == "init" and [entry["name"] for entry in info["checkpoints"]] == ["init"]
    assert run_module("agentbox_box_info", {"workspace": str(workspace)})["boxes"] == []  # the set-up box went

    box = f"after-{secrets.token_hex(3)}"
    made = run_module("agentbox_box", {"name": box, "workspace": str(workspace), "checkpoint": "default"})
    assert not made["failed"], made
    assert made["box"]["checkpoint"] == "init"
    status = subprocess.run(["docker", "exec", "-u", "vscode", made["box"]["container"], "sh", "-c",
                             "agentbox-ctl wait-ready --timeout 60 >/dev/null; agentbox-ctl status --json"],
                            capture_output=True, text=True, timeout=120, check=True)
    units = {unit["name"]: unit for unit in json.loads(status.stdout)["tasks"] + json.loads(status.stdout)["services"]}
    assert units["install"]["state"] == "skipped", units  # the checkpoint's marker matched: no install ran again
    assert units["web"]["state"] == "ready", units
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, never through a proxy
    with direct.open(made["box"]["web_url"], timeout=30) as answer:  # the box's web port 80 -> 3000
        assert answer.read() == b"hello from the box\n"
