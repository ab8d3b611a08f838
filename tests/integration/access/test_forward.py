"""forward.yml on a port the box did not publish at create: a server on the box's own loopback reached from this
machine's 127.0.0.1 through the forward (several connections at once), the forward recorded, listed, asked again,
removed by state=absent, by a stop and by a destroy; bad input refused. The test talks only to 127.0.0.1.

forward.yml and list_boxes.yml are run as a user types them (agentbox_forward through Ansible); the boxes, the
repeated ask, the refusals of the module and the destroy are the tasks in-process (`box_task`,
`run_module_inprocess`: the same task Ansible runs, without an `ansible` start each). forward.yml's check of
its extra vars is proven in-process in tests/unit/playbooks/test_playbook_arguments.py."""

from __future__ import annotations

import concurrent.futures
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.access import _forwards
from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider
from tests.conftest import make_repo
from tests.integration.access.test_access import destroy_quietly, enter_home, new_home, playbook, wait_gone
from tests.integration.box.conftest import box_task
from tests.unit.support.inprocess import run_module_inprocess

pytestmark = pytest.mark.integration

PORT = 8765  # not published at create: the box publishes 80 only


@pytest.fixture(scope="module")
def forward_home() -> Iterator[Path]:
    path = new_home()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def at_home(forward_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    enter_home(monkeypatch, forward_home)  # forwards.json lives in this HOME's ~/.agentbox
    return forward_home


def make_box(home: Path, prefix: str) -> str:
    """Set-up: a box publishing only its web port, made without the in-box boot (nothing here needs it)."""
    root = Path(tempfile.mkdtemp(prefix="abw-", dir="/tmp"))
    root.chmod(0o755)
    name = f"{prefix}-{secrets.token_hex(3)}"
    with pytest.MonkeyPatch.context() as patch:
        enter_home(patch, home)
        made = box_task({"name": name, "workspace": str(make_repo(root / "ws")), "boot": False})
    assert not made["failed"], made.get("msg")
    assert sorted(made["box"]["ports"]) == ["80"], made["box"]["ports"]
    return name


@pytest.fixture(scope="module")
def forward_box(forward_home: Path) -> Iterator[str]:
    name = make_box(forward_home, "fwd")
    yield name
    with pytest.MonkeyPatch.context() as patch:
        enter_home(patch, forward_home)
        destroy_quietly([name])


def serve_in_box(name: str, files: dict[str, str]) -> None:
    """A web server on the box's own loopback only (127.0.0.1:PORT in the box), serving `files`."""
    script = "mkdir -p /tmp/www && cd /tmp/www && " + " && ".join(f"echo {body} > {file}" for file, body in files.items())
    subprocess.run(["docker", "exec", "-u", "vscode", f"agentbox-{name}", "sh", "-c", script], check=True)
    subprocess.run(["docker", "exec", "-d", "-u", "vscode", f"agentbox-{name}", "python3", "-m", "http.server",
                    str(PORT), "--bind", "127.0.0.1", "--directory", "/tmp/www"], check=True)  # fmt: skip


def forward(name: str, *extra: str) -> str:
    done = playbook("playbooks/forward.yml", "-e", f"box={name}", "-e", f"port={PORT}", *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join(done.stdout.split())  # the YAML callback folds long lines


def fetch(url: str, timeout: float = 30) -> str:
    """The body at url, once the server in the box answers (it may be starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.read().decode().strip()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def listed(name: str) -> str:
    done = playbook("playbooks/list_boxes.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    return next((line for line in done.stdout.splitlines() if name in line), "")


def test_a_port_not_published_at_create_is_forwarded_from_the_boxs_loopback(at_home: Path, forward_box: str) -> None:
    name = forward_box
    files = {f"f{index}": secrets.token_hex(8) for index in range(8)}
    serve_in_box(name, files)
    try:
        said = forward(name)
        url = re.search(r"url: +(http://127\.0\.0\.1:(\d+)/)", said)
        pid = int(re.search(r"forward: pid (\d+)", said).group(1))
        assert url, said
        assert fetch(url.group(1) + "f0") == files["f0"]
        # Several connections at once, each its own relay into the box.
        with concurrent.futures.ThreadPoolExecutor(len(files)) as pool:
            got = dict(zip(files, pool.map(lambda file: fetch(url.group(1) + file), files), strict=True))
        assert got == files

        # Asked again: the live forward, unchanged; list_boxes.yml shows it.
        again = run_module_inprocess("agentbox_forward", {"name": name, "port": PORT})
        assert not again["failed"] and again["changed"] is False, again
        assert (again["url"], again["pid"]) == (url.group(1), pid)
        assert f"127.0.0.1:{url.group(2)}=>{PORT}(pid={pid})" in listed(name)

        # state=absent ends it: the process, the port on this machine and the line in the list.
        assert f"removed the forward of port {PORT} (pid {pid})" in forward(name, "-e", "state=absent")
        wait_gone(pid)
        with pytest.raises(OSError):
            urllib.request.urlopen(url.group(1) + "f0", timeout=10)
        assert "=>" not in listed(name)
        assert f"no forward of port {PORT} of {name}" in forward(name, "-e", "state=absent")
    finally:
        subprocess.run(["docker", "exec", f"agentbox-{name}", "pkill", "-f", f"http.server {PORT}"], check=False)


def test_a_forward_of_bad_input_says_what_to_do(at_home: Path, forward_box: str) -> None:
    """The module on a real box (tests/unit/access/test_access_modules.py has the rest; forward.yml's own check of
    -e state and -e port: tests/unit/playbooks/test_playbook_arguments.py)."""
    out_of_range = run_module_inprocess("agentbox_forward", {"name": forward_box, "port": 70000})
    assert out_of_range["failed"] and "port must be 1-65535" in out_of_range["msg"]
    assert _forwards.forwards_of("docker", "local", forward_box) == []  # nothing half-made


def test_forwards_end_when_the_box_stops_and_when_it_is_destroyed(at_home: Path) -> None:
    name = make_box(at_home, "fws")
    try:
        said = forward(name)  # nothing listens yet: the forward is made, and says so
        assert f"listens: nothing listens on port {PORT} in the box (the URL answers once something does)" in said
        first = int(re.search(r"forward: pid (\d+)", said).group(1))

        stopped = playbook("playbooks/box_state.yml", "-e", f"box={name}", "-e", "state=stopped")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        wait_gone(first)
        assert _forwards.forwards_of("docker", "local", name) == []
        refused = run_module_inprocess("agentbox_forward", {"name": name, "port": PORT})
        assert refused["failed"] and "is stopped" in refused["msg"]

        provider = DockerProvider()  # set-up, not under test: the box running again
        _box.set_state(provider, provider.find(name), "started", boot=False)
        second = int(re.search(r"forward: pid (\d+)", forward(name)).group(1))
        gone = box_task({"name": name, "state": "absent"})
        assert not gone["failed"], gone.get("msg")
        wait_gone(second)
        assert _forwards.forwards_of("docker", "local", name) == []
    finally:
        destroy_quietly([name])
