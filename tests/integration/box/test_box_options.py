"""agentbox_box options on the local engine: resources, extra ports and boot: false. (state: present, which
creates a missing box and then leaves its run state alone, is proven in-process on the fake provider:
tests/unit/box/test_box_module.py.)"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import chown_tree, make_repo, run_module

pytestmark = pytest.mark.integration


@pytest.fixture
def box(docker_client: docker.DockerClient, box_image: str, tmp_path: Path) -> Iterator[dict]:
    repo = make_repo(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(repo)
    name = f"opt-{secrets.token_hex(3)}"
    yield {"name": name, "workspace": str(repo), "image": box_image, "client": docker_client}
    run_module("agentbox_box", {"name": name, "state": "absent", "delete_branch": True})


def in_box(client: docker.DockerClient, name: str, command: str) -> int:
    return client.containers.get(f"agentbox-{name}").exec_run(["sh", "-c", command], user="root").exit_code


def test_resources_ports_and_no_boot(box: dict) -> None:
    client, name = box["client"], box["name"]
    made = run_module("agentbox_box", {
        "name": name, "workspace": box["workspace"], "image": box["image"], "boot": False, "ports": [8080, 9000],
        "resources": {"memory": "512m", "cpus": 1.5, "pids_limit": 300},
    })  # fmt: skip
    assert made.get("failed") is not True and made["changed"] is True, made
    assert made["box"]["state"] == "running"
    host_config = client.containers.get(f"agentbox-{name}").attrs["HostConfig"]
    assert host_config["Memory"] == 512 * 1024 * 1024
    assert host_config["NanoCpus"] == 1_500_000_000
    assert host_config["PidsLimit"] == 300
    # Port 80 always, the extra ones too, each on an ephemeral port of 127.0.0.1 only.
    bindings = host_config["PortBindings"]
    assert set(bindings) == {"80/tcp", "8080/tcp", "9000/tcp"}
    assert all(binding["HostIp"] == "127.0.0.1" for entries in bindings.values() for binding in entries)
    published = client.containers.get(f"agentbox-{name}").attrs["NetworkSettings"]["Ports"]
    assert set(made["box"]["ports"]) == {"80", "8080", "9000"}
    for port in ("80", "8080", "9000"):
        assert str(made["box"]["ports"][port]) == published[f"{port}/tcp"][0]["HostPort"]
    # boot: false: the in-box start sequence did not run (no supervisor socket, no dockerd).
    assert in_box(client, name, "test -S /run/agentbox/ctl.sock") != 0
    assert in_box(client, name, "pgrep -x dockerd") != 0
    assert in_box(client, name, "test -f /workspace/a.txt") == 0  # seeded all the same
