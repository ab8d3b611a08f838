"""_box_container: the create body the provider sends is the one the Docker SDK sent for the same
box (the create moved off the SDK; the engine must see no difference)."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._sizes import BadValue, memory_bytes
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._box_container import (
    container_config,
    proxy_environment,
)


def sdk_body(monkeypatch: pytest.MonkeyPatch, **kwargs) -> tuple[str, dict]:
    """What DockerClient.containers.create posted for kwargs: (name, config)."""
    client = docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41")
    seen: dict = {}

    def capture(config: dict, name: str | None = None, platform: str | None = None) -> dict:
        seen.update(config=config, name=name)
        raise LookupError("captured")

    monkeypatch.setattr(client.api, "create_container_from_config", capture)
    with pytest.raises(LookupError):
        client.containers.create(**kwargs)
    return seen["name"], seen["config"]


def drop_nulls(value):
    if isinstance(value, dict):
        return {key: drop_nulls(item) for key, item in value.items() if item is not None}
    return value


@pytest.mark.parametrize(
    "resources",
    [{}, {"memory": "2g", "cpus": "1.5", "pids_limit": 512}, {"memory": "512mb"}, {"memory": "1073741824"}],
)
def test_the_body_is_the_sdks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, resources: dict) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"proxies": {"default": {"httpsProxy": "http://p:3128", "noProxy": "x"}}}))
    labels = {"io.agentbox.box": "b", "io.agentbox.id": "123"}
    env = {"AGENTBOX": "1", "KEY": "v=1"}
    binds = [("agentbox-b-docker", "/var/lib/docker", "rw"), ("/h/.git", "/h/.git", "rw"), ("/etc/x", "/x", "ro")]
    nano = int(float(resources["cpus"]) * 1e9) if resources.get("cpus") else None
    name, expected = sdk_body(
        monkeypatch,
        image="agentbox/box:latest",
        command=["sleep", "infinity"],
        name="agentbox-b",
        hostname="agentbox-b",
        labels=labels,
        environment=env,
        volumes={source: {"bind": path, "mode": mode} for source, path, mode in binds},
        ports={f"{port}/tcp": ("127.0.0.1", None) for port in (80, 8080)},
        cap_add=["SYS_ADMIN", "NET_ADMIN"],
        devices=["/dev/fuse:/dev/fuse:rwm"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        cgroupns="private",
        tmpfs={"/run/agentbox": "mode=0755,uid=1000,gid=1000"},
        extra_hosts={"host.docker.internal": "host-gateway"},
        mem_limit=resources.get("memory"),
        nano_cpus=nano,
        pids_limit=resources.get("pids_limit"),
        detach=True,
    )
    ours = container_config(
        image="agentbox/box:latest",
        name="agentbox-b",
        command=["sleep", "infinity"],
        labels=labels,
        env=env,
        binds=binds,
        ports=[8080, 80, 80],
        cap_add=["SYS_ADMIN", "NET_ADMIN"],
        devices=[("/dev/fuse", "/dev/fuse", "rwm")],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        tmpfs={"/run/agentbox": "mode=0755,uid=1000,gid=1000"},
        extra_hosts={"host.docker.internal": "host-gateway"},
        memory=resources.get("memory"),
        nano_cpus=nano,
        pids_limit=resources.get("pids_limit"),
        proxies=proxy_environment(),
    )
    assert name == "agentbox-b"
    assert "Privileged" not in ours["HostConfig"]
    assert drop_nulls(ours) == drop_nulls(expected)


def test_memory_units_and_bad_values() -> None:
    assert memory_bytes("2g") == 2 * 1024**3
    assert memory_bytes("1.5G") == int(1.5 * 1024**3)
    assert memory_bytes("256MB") == 256 * 1024**2
    assert memory_bytes("100") == 100
    for bad in ("2x", "lots", "g"):
        with pytest.raises(BadValue):
            memory_bytes(bad)


def test_no_docker_config_no_proxies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert proxy_environment() == []
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker" / "config.json").write_text("{not json")
    assert proxy_environment() == []
