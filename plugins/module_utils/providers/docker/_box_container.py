# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The container a Docker box is, as the Engine API's create body: one place, for every engine.

The body is the one the Docker SDK's `containers.create` sent for the same arguments (a unit test
compares them), so moving the create off the SDK changed nothing the engine sees: capabilities and
security options (never --privileged), devices, tmpfs, ports on 127.0.0.1, binds, limits, and the
proxy variables of the user's Docker client configuration.

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ...core._naming import label
from ...core._sizes import memory_bytes


def proxy_environment(environ: dict[str, str] | None = None) -> list[str]:
    """HTTP_PROXY and friends from the Docker client's config.json `proxies.default`, as the
    docker CLI and SDK put them in a new container (before the container's own environment)."""
    env = os.environ if environ is None else environ
    config_dir = env.get("DOCKER_CONFIG")
    home = os.path.expanduser("~")
    paths = [
        os.path.join(config_dir, "config.json") if config_dir else "",
        os.path.join(home, ".docker", "config.json"),
        os.path.join(home, ".dockercfg"),
    ]
    path = next((p for p in paths if p and os.path.exists(p)), None)
    if path is None:
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return []
    proxies = (config.get("proxies") or {}).get("default") or {} if isinstance(config, dict) else {}
    pairs = []
    for key, name in (("httpProxy", "http_proxy"), ("httpsProxy", "https_proxy"), ("ftpProxy", "ftp_proxy"), ("noProxy", "no_proxy")):
        if proxies.get(key):
            pairs += [f"{name}={proxies[key]}", f"{name.upper()}={proxies[key]}"]
    return pairs


def container_config(
    *,
    image: str,
    name: str,
    command: list[str],
    labels: dict[str, str],
    env: dict[str, str],
    binds: list[tuple[str, str, str]],
    ports: list[int],
    cap_add: list[str],
    devices: list[tuple[str, str, str]],
    security_opt: list[str],
    tmpfs: dict[str, str],
    extra_hosts: dict[str, str],
    memory: str | int | None = None,
    nano_cpus: int | None = None,
    pids_limit: int | None = None,
    proxies: list[str] | None = None,
    network: str = "default",
) -> dict[str, Any]:
    """The create body of a detached container with a private cgroup namespace. `binds` are
    (source, path in the container, mode), `devices` (host path, container path, permissions),
    `ports` published on 127.0.0.1 at a port the engine picks."""
    exposed = {f"{port}/tcp": {} for port in sorted(set(ports))}
    host_config: dict[str, Any] = {
        "Binds": [f"{source}:{path}:{mode}" for source, path, mode in binds],
        "CapAdd": list(cap_add),
        "CgroupnsMode": "private",
        "Devices": [
            {"PathOnHost": host, "PathInContainer": inside, "CgroupPermissions": perms} for host, inside, perms in devices
        ],
        "ExtraHosts": [f"{host}:{address}" for host, address in extra_hosts.items()],
        "NetworkMode": network,
        "PortBindings": {key: [{"HostIp": "127.0.0.1", "HostPort": ""}] for key in exposed},
        "SecurityOpt": list(security_opt),
        "Tmpfs": dict(tmpfs),
    }
    if memory:
        host_config["Memory"] = memory_bytes(memory)
    if nano_cpus:
        host_config["NanoCpus"] = nano_cpus
    if pids_limit:
        host_config["PidsLimit"] = pids_limit
    return {
        "Image": image,
        "Cmd": list(command),
        "Hostname": name,
        "Labels": dict(labels),
        "Env": [*(proxies or []), *(f"{key}={value}" for key, value in env.items())],
        "ExposedPorts": exposed,
        "Volumes": {path: {} for _source, path, _mode in binds},
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "Tty": False,
        "OpenStdin": False,
        "StdinOnce": False,
        "NetworkDisabled": False,
        "HostConfig": host_config,
    }


def probe_in_image(engine: Any, image: str, argv: list[str], user: str, timeout: float,
                   bounded: bool) -> tuple[int, bytes, bytes]:  # fmt: skip
    """argv run as `user` in a throwaway container of `image` (no network, never a box: no io.agentbox.box
    label), removed after; (exit code, stdout, stderr). `engine`: an EngineAPI or SDKEngine; `bounded`: its
    exec takes a timeout (EngineAPI's does, the SDK's does not)."""
    import secrets

    config = {
        "Image": image,
        "Entrypoint": ["sleep"],
        "Cmd": [str(int(timeout) + 30)],  # ends by itself should the removal below never happen
        "Labels": {label("kind"): "probe"},
        "NetworkDisabled": True,
        # Gone by itself once it stops (a killed module leaves nothing), and small: it runs the image's login
        # profile, which a box may have written (a checkpoint's image).
        "HostConfig": {"NetworkMode": "none", "AutoRemove": True, "PidsLimit": 256, "Memory": 512 << 20},
    }
    container = engine.create_container(config, f"agentbox-probe-{secrets.token_hex(5)}")
    try:
        engine.start_container(container)
        bound = {"timeout": timeout} if bounded else {}
        return engine.exec(container, argv, user=user, max_output=1 << 16, **bound)
    finally:
        engine.remove_container(container, force=True)
