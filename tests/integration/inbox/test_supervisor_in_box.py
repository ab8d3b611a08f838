"""The supervisor in a real box: created and restarted through agentbox.box.agentbox_box.

The box runs a derived image: agentbox/box:latest plus this checkout's agentbox-ctl and agentbox-boot,
so the test exercises the code under review rather than whatever the image baked last.
"""
from __future__ import annotations

import io
import json
import subprocess
import tarfile
import tempfile
import urllib.request
import uuid
from pathlib import Path

import docker
import pytest

ROOT = Path(__file__).resolve().parents[3]
FILES = ROOT / "roles" / "inbox_supervisor" / "files"
PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"

pytestmark = pytest.mark.integration

SAMPLE = """\
tasks:
  install:
    command: |
      echo run >> /var/lib/agentbox/install-runs
      mkdir -p site && echo "hello from the box" > site/index.html
    run_once: true
services:
  web:
    command: exec python3 -m http.server 8000 --bind 127.0.0.1 --directory site
    needs: [install]
    ready_when: {http: /, port: 8000, interval_ms: 200}
    expose: {port: 8000}
"""


@pytest.fixture(scope="module")
def derived_image(docker_client: docker.DockerClient, box_image: str):
    """The box image plus this checkout's agentbox-ctl and agentbox-boot."""
    client = docker_client
    tag = f"agentbox-test/supervisor-box:{uuid.uuid4().hex[:12]}"
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        dockerfile = f"FROM {box_image}\nCOPY agentbox-ctl agentbox-boot /usr/local/bin/\n".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        for name in ("agentbox-ctl", "agentbox-boot"):
            data = (FILES / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True)
    try:
        yield tag
    finally:
        client.images.remove(tag, force=True)


def module(**args) -> dict:
    """Run agentbox.box.agentbox_box once through ansible-playbook and return its registered result."""
    with tempfile.TemporaryDirectory(prefix="abx-play-") as tmp:
        out = Path(tmp) / "result.json"
        playbook = Path(tmp) / "play.yml"
        playbook.write_text(
            "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
            f"    - agentbox.box.agentbox_box: {json.dumps(args)}\n"
            "      register: result\n      ignore_errors: true\n"
            f"    - ansible.builtin.copy: {{content: '{{{{ result | to_json }}}}', dest: {json.dumps(str(out))}}}\n")
        run = subprocess.run([str(PLAYBOOK), "-i", "localhost,", "-c", "local", "-e",
                              f"ansible_python_interpreter={ROOT / '.venv' / 'bin' / 'python'}", str(playbook)], cwd=ROOT,
                             capture_output=True, text=True, timeout=600, check=False)
        if not out.exists():
            raise AssertionError(f"ansible-playbook failed: {run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        outcome = json.loads(out.read_text())
    assert not outcome.get("failed"), outcome.get("msg")
    return outcome


def in_box(container, command: str, user: str = "vscode", timeout: float = 180) -> tuple[int, str]:
    """docker exec, bounded: the CLI call is killed if it hangs."""
    run = subprocess.run(["docker", "exec", "-u", user, container, "bash", "-c", command], capture_output=True,
                         text=True, timeout=timeout, check=False)
    return run.returncode, run.stdout + run.stderr


def http_get(url: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return response.status, response.read().decode()


@pytest.fixture
def workspace():
    with tempfile.TemporaryDirectory(prefix="abx-sup-") as path:
        repo = Path(path) / "sample"
        repo.mkdir()
        (repo / "agentbox.yaml").write_text(SAMPLE)
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
        subprocess.run([*git, "add", "agentbox.yaml"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "sample"], check=True)
        yield repo


def test_sample_project_in_a_real_box(docker_client, derived_image, workspace):
    name = f"sup-{uuid.uuid4().hex[:8]}"
    container = f"agentbox-{name}"
    try:
        created = module(name=name, workspace=str(workspace), image=derived_image, state="started")
        box = created["box"]
        code, out = in_box(container, "agentbox-ctl wait-ready --timeout 90")
        assert code == 0, out + in_box(container, "agentbox-ctl status; tail -50 /var/log/agentbox/*.log")[1]
        # the published 127.0.0.1 port of container port 80 reaches the exposed service
        web_url = box.get("web_url") or f"http://127.0.0.1:{box['ports']['80']}/"
        assert web_url.startswith("http://127.0.0.1:"), box
        print(f"web url {web_url}; boot: {created.get('boot')}")
        assert http_get(web_url) == (200, "hello from the box\n")
        code, out = in_box(container, "agentbox-ctl status --json")
        status = json.loads(out)
        assert status["tasks"][0]["state"] == "done" and status["services"][0]["state"] == "ready"
        assert status["web"]["listen"] == 80

        # stop and start: the boot sequence runs again, the marker keeps install from running twice
        module(name=name, state="stopped")
        restarted = module(name=name, state="started")["box"]
        # an ephemeral host port is chosen again on every container start: read it back
        web_url = restarted.get("web_url") or f"http://127.0.0.1:{restarted['ports']['80']}/"
        code, out = in_box(container, "agentbox-ctl wait-ready --timeout 90")
        assert code == 0, out
        code, out = in_box(container, "agentbox-ctl status --json")
        assert json.loads(out)["tasks"][0]["state"] == "skipped"
        assert in_box(container, "cat /var/lib/agentbox/install-runs")[1] == "run\n"
        assert http_get(web_url)[0] == 200

        # in-box Docker: import a tiny image made from the box's own /bin files, run it, report the driver
        code, out = in_box(container, r"""
            set -e
            root=$(mktemp -d)
            for bin in /bin/dash /bin/echo; do
              install -D "$bin" "$root$bin"
              for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do install -D "$(readlink -f "$lib")" "$root$lib"; done
            done
            tar -C "$root" -c . | docker import - agentbox-tiny:1 >/dev/null
            docker run --rm agentbox-tiny:1 /bin/echo hello from inner docker
            echo "driver=$(docker info --format '{{.Driver}}')"
        """)
        assert code == 0, out
        assert "hello from inner docker" in out
        driver = out.strip().splitlines()[-1].split("=", 1)[1]
        assert driver in ("overlay2", "fuse-overlayfs", "vfs")
        print(f"in-box Docker storage driver: {driver}")

        # the boot summary of a second, idempotent run reports the same driver and starts nothing new
        code, out = in_box(container, "agentbox-boot 2>/dev/null", user="root")
        summary = json.loads(out.strip().splitlines()[-1])
        assert code == 0 and summary["started"] == []
        assert summary["dockerd"]["storage_driver"] == driver

        removed = module(name=name, state="absent", delete_branch=True)
        assert removed["changed"] is True
        assert docker_client.containers.list(all=True, filters={"name": f"^/{container}$"}) == []
    finally:
        # A failure above leaves the box behind: remove it (the module first, then whatever it left).
        if docker_client.containers.list(all=True, filters={"name": f"^/{container}$"}):
            try:
                module(name=name, state="absent", delete_branch=True)
            finally:
                for leftover in docker_client.containers.list(all=True, filters={"name": f"^/{container}$"}):
                    leftover.remove(force=True, v=True)


def test_boot_fails_clearly_when_dockerd_cannot_start_and_still_starts_the_supervisor(docker_client, derived_image):
    """Without the box's capabilities dockerd cannot run: agentbox-boot must say so and exit non-zero."""
    client = docker_client
    container = client.containers.create(derived_image, entrypoint=["agentbox-boot", "--dockerd-timeout", "20"],
                                         user="root", name=f"abx-boot-{uuid.uuid4().hex[:8]}")
    try:
        container.start()
        exit_code = container.wait(timeout=180)["StatusCode"]
        stdout = container.logs(stdout=True, stderr=False).decode()
        stderr = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True, v=True)
    assert exit_code == 1, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["ok"] is False
    assert summary["dockerd"]["state"] == "failed"
    assert "dockerd" in summary["dockerd"]["error"] and "/var/log/agentbox/dockerd.log" in summary["dockerd"]["error"]
    assert summary["supervisor"]["state"] == "started"  # the app side does not depend on Docker
    assert "agentbox-boot: dockerd:" in stderr and "last lines of its log" in stderr
