"""`agentbox-ctl init` in a real box (boot: false, the wizard needs no daemon): a small Python project in the
box's /workspace gets the agentbox.yaml init.yml would write for it, as the box user; an edited file is kept
unless --force; a directory it cannot classify gets the minimal file and what to fill in.

The box gets this checkout's agentbox-ctl, its package and module_utils/project, where the image installs them
(/usr/local/bin, /usr/local/lib/agentbox/agentbox_inbox and agentbox_project), so the code under review runs.
"""

from __future__ import annotations

import io
import secrets
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container

from ansible_collections.agentbox.box.plugins.module_utils.tasks._init_task import run_init_task
from tests.conftest import REPO, chown_tree, make_repo
from tests.integration.box.conftest import box_task

pytestmark = pytest.mark.integration
FILES = REPO / "roles" / "inbox_supervisor" / "files"
PROJECT = REPO / "plugins" / "module_utils" / "project"
PYTHON_APP = {
    "requirements.txt": "flask\npytest\n",
    "app.py": "from flask import Flask\napp = Flask(__name__)\n",
}


def checkout_files() -> bytes:
    """A tar of this checkout's wizard, rooted at /usr/local, as the image lays it out."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        members = [(FILES / "agentbox-ctl", "bin/agentbox-ctl", 0o755)]
        members += [(path, f"lib/agentbox/agentbox_inbox/{path.name}", 0o644) for path in (FILES / "agentbox_inbox").glob("*.py")]
        members += [(path, f"lib/agentbox/agentbox_project/{path.name}", 0o644) for path in PROJECT.glob("*.py")]
        for source, name, mode in members:
            data = source.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def box(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[tuple[Path, Container]]:
    repo = make_repo(tmp_path / "shop", PYTHON_APP)
    chown_tree(repo)
    name = f"init-{secrets.token_hex(3)}"
    made = box_task({"name": name, "workspace": str(repo), "image": box_image, "boot": False})
    try:
        assert not made["failed"], made
        container = docker_client.containers.get(f"agentbox-{name}")
        container.exec_run(["rm", "-rf", "/usr/local/lib/agentbox/agentbox_project"], user="root")
        assert container.put_archive("/usr/local", checkout_files())
        yield repo, container
    finally:
        box_task({"name": name, "state": "absent", "delete_branch": True})


def run(container: Container, command: str) -> tuple[int, str]:
    code, output = container.exec_run(["sh", "-c", command], user="vscode", workdir="/workspace")
    return code, output.decode("utf-8", "replace")


def test_agentbox_ctl_init_in_a_box(box: tuple[Path, Container]) -> None:
    repo, container = box
    code, out = run(container, "agentbox-ctl init")
    assert code == 0 and "wrote /workspace/agentbox.yaml: pip (requirements.txt); a Flask app (port 5000)" in out, out
    _code, written = run(container, "cat /workspace/agentbox.yaml")
    host, _warnings = run_init_task({"workspace": str(repo), "force": True}, check_mode=True)
    assert written == host["content"]  # the host's inspection and file, run in the box
    assert not (repo / "agentbox.yaml").exists()  # written in the box's worktree only
    code, owner = run(container, "stat -c %U /workspace/agentbox.yaml && agentbox-ctl validate")
    assert code == 0 and owner.startswith("vscode\n") and "valid (1 tasks, 1 services)" in owner, owner

    # Edited by the agent: kept unless --force; --dry-run --diff shows the change and writes nothing.
    code, out = run(container, "echo '# mine' >> agentbox.yaml && agentbox-ctl init")
    assert code == 1 and "agentbox.yaml exists; nothing written: pass --force to replace it" in out, out
    code, out = run(container, "agentbox-ctl init --force --dry-run --diff && tail -n 1 agentbox.yaml")
    assert code == 0 and "-# mine" in out and out.endswith("# mine\n"), out
    code, out = run(container, "agentbox-ctl init --force && tail -n 1 agentbox.yaml")
    assert code == 0 and "# mine" not in out, out

    # A directory it cannot classify: the minimal file and what to fill in.
    code, out = run(container, "mkdir -p /tmp/notes && echo hi > /tmp/notes/README.md && "
                               "agentbox-ctl init --workspace /tmp/notes && tail -n 2 /tmp/notes/agentbox.yaml")
    assert code == 0 and "fill in: could not tell how to install or run this project" in out, out
    assert out.endswith("tasks: {}\nservices: {}\n"), out
