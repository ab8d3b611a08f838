"""Everything the emulator does to Docker: one container per sandbox, exec, files, commit.

All traffic goes through the Docker API (exec, put_archive, get_archive); nothing talks to a
container's IP address.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from .config import EMULATOR_LABEL, SANDBOX_LABEL, SNAPSHOT_LABEL

# Run as a process of its own (scripts/daytona-emulator, scripts/boxd-emulator) nothing has put the collection
# on sys.path; under pytest conftest has, and Ansible's collection finder serves the import below.
_COLLECTIONS = str(Path(__file__).resolve().parents[2] / ".collections")
if _COLLECTIONS not in sys.path:
    sys.path.append(_COLLECTIONS)

# Exec goes through the project's own Engine API client (see DockerBackend.exec_argv); the engine's late
# exit codes are waited for as the providers wait for them (the boxd emulator uses this backend too).
from ansible_collections.agentbox.box.plugins.module_utils._engine_api import (  # noqa: E402
    EngineAPIError,
    exec_exit_code,
    local_engine,
    pause_patiently,
)

LOG = logging.getLogger("daytona_emulator.docker")

# PID 1 is docker-init; this shell only waits, and exits at once on SIGTERM so stop is fast.
KEEP_ALIVE = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]

# Like the daemon: the first available of zsh, bash, sh runs the command, stderr joins stdout.
PICK_SHELL = (
    'for s in zsh bash sh; do if command -v "$s" >/dev/null 2>&1; then exec "$s" -c "$1" 2>&1; fi; done; '
    'echo "no shell found in the sandbox" >&2; exit 127'
)

# Kills every process that carries the marker variable (an exec that timed out, a deleted session).
KILL_MARKED = (
    'for p in /proc/[0-9]*; do '
    'if tr "\\0" "\\n" < "$p/environ" 2>/dev/null | grep -qx "$1"; then kill -KILL "${p#/proc/}" 2>/dev/null; fi; '
    'done; true'
)

EXEC_MARKER = "DAYTONA_EMULATOR_EXEC_ID"
SESSION_MARKER = "DAYTONA_EMULATOR_SESSION_ID"

_BOX_CAPS: dict[str, Any] = {
    # SYS_PTRACE: the emulator finds an exec's processes by their environment, which a user-namespaced
    # engine (the box engine) keeps from root in the container without it.
    "cap_add": ["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
}


class BackendError(RuntimeError):
    """A Docker operation failed; the message is meant for the sandbox's errorReason."""


class PathNotFound(BackendError):
    pass


class PathIsDirectory(BackendError):
    pass


@dataclass
class ImageInfo:
    image_id: str
    user: str
    workdir: str
    size_gib: float
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None

    def restore_changes(self) -> list[str]:
        """Dockerfile lines that give a committed sandbox back the image's own USER/ENTRYPOINT/CMD."""
        return [f"USER {self.user or 'root'}", f"ENTRYPOINT {json.dumps(self.entrypoint or [])}",
                f"CMD {json.dumps(self.cmd or [])}"]


@dataclass
class ExecResult:
    exit_code: int
    output: bytes
    timed_out: bool = False


def docker_name(text: str) -> str:
    """A Docker repository component from any snapshot name."""
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return cleaned[:100] or "snapshot"


class DockerBackend:
    def __init__(self, instance_id: str, box_capabilities: bool = True, name_prefix: str = "daytona-emu-") -> None:
        self.instance_id = instance_id
        # The boxd emulator shares this backend; its containers are named after it.
        self.name_prefix = name_prefix
        self.box_capabilities = box_capabilities
        # Short calls get a timeout; exec, commit and session streams may legitimately run for long.
        self.client = docker.from_env(timeout=120)
        self.long_client = docker.from_env(timeout=None)
        # docker-py's exec_start loses a short command's output now and then under load (docker-py #2042,
        # #3332; tests/conftest.py routes exec_run around it too); this client reads the one stream whole.
        # None where only the SDK reaches the engine (TLS): exec then keeps the SDK.
        self.engine = local_engine(120.0)
        self._fuse_ok = True
        self._lock = threading.Lock()

    def close(self) -> None:
        self.client.close()
        self.long_client.close()

    # ---- images -------------------------------------------------------------------------------------------
    def image_info(self, image: str) -> ImageInfo | None:
        try:
            attrs = self.client.api.inspect_image(image)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            if exc.status_code == 404:
                return None
            raise
        config = attrs.get("Config") or {}
        return ImageInfo(
            image_id=attrs["Id"],
            user=config.get("User") or "",
            workdir=config.get("WorkingDir") or "",
            size_gib=round((attrs.get("Size") or 0) / 2**30, 3),
            entrypoint=config.get("Entrypoint"),
            cmd=config.get("Cmd"),
        )

    def build_image(self, dockerfile: str, tag: str) -> str:
        """Build a Dockerfile with no context (only works offline if every base image is local)."""
        try:
            image, _build_log = self.long_client.images.build(
                fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True, pull=False,
                labels={EMULATOR_LABEL: self.instance_id},
            )
        except (docker.errors.BuildError, docker.errors.APIError) as exc:
            raise BackendError(f"build failed: {exc}") from exc
        return image.id

    def commit(self, container_id: str, repository: str, tag: str, snapshot_id: str,
               changes: list[str]) -> ImageInfo:
        try:
            self.long_client.api.commit(
                container_id, repository=repository, tag=tag, changes=changes,
                conf={"Labels": {EMULATOR_LABEL: self.instance_id, SNAPSHOT_LABEL: snapshot_id}},
            )
        except docker.errors.APIError as exc:
            raise BackendError(f"commit failed: {exc}") from exc
        info = self.image_info(f"{repository}:{tag}")
        if info is None:
            raise BackendError(f"commit produced no image {repository}:{tag}")
        return info

    def remove_image(self, ref: str) -> bool:
        """Remove an image the emulator made; False while a container still uses it."""
        try:
            self.client.images.remove(ref, noprune=False)
        except docker.errors.ImageNotFound:
            return True
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                return False
            raise
        return True

    # ---- containers ---------------------------------------------------------------------------------------
    def create_container(self, sandbox_id: str, hostname: str, image: str, env: dict[str, str],
                         entrypoint: list[str] | None, cpu: int, memory_gib: int, enforce_resources: bool,
                         network_block_all: bool = False) -> str:
        kwargs: dict[str, Any] = {
            "image": image,
            "name": f"{self.name_prefix}{sandbox_id}",
            "hostname": hostname,
            "environment": env,
            "labels": {EMULATOR_LABEL: self.instance_id, SANDBOX_LABEL: sandbox_id},
            "init": True,
            "detach": True,
        }
        if entrypoint:
            kwargs["entrypoint"] = entrypoint
            kwargs["command"] = []
        else:
            kwargs["entrypoint"] = KEEP_ALIVE[:1]
            kwargs["command"] = KEEP_ALIVE[1:]
            kwargs["user"] = "0"
        if network_block_all:
            kwargs["network_mode"] = "none"  # loopback only: docker exec and the preview fetch still work
        if enforce_resources:
            kwargs["nano_cpus"] = int(cpu * 1e9)
            kwargs["mem_limit"] = f"{memory_gib}g"
        if self.box_capabilities:
            kwargs.update(_BOX_CAPS)
            if self._fuse_ok:
                kwargs["devices"] = ["/dev/fuse:/dev/fuse:rwm"]
        try:
            container = self.client.containers.create(**kwargs)
        except docker.errors.APIError as exc:
            if "devices" in kwargs and "/dev/fuse" in str(exc):
                LOG.warning("the engine has no /dev/fuse; sandboxes run without it")
                self._fuse_ok = False
                kwargs.pop("devices")
                container = self.client.containers.create(**kwargs)
            else:
                raise BackendError(f"container create failed: {exc.explanation or exc}") from exc
        return container.id

    def start(self, container_id: str) -> None:
        try:
            self.client.api.start(container_id)
        except docker.errors.APIError as exc:
            raise BackendError(f"container start failed: {exc.explanation or exc}") from exc

    def stop(self, container_id: str, force: bool = False) -> None:
        try:
            if force:
                self.client.api.kill(container_id)
                self.client.api.wait(container_id, timeout=30)
            else:
                self.client.api.stop(container_id, timeout=10)
        except docker.errors.NotFound as exc:
            raise BackendError("the sandbox's container is gone") from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and force:  # already stopped
                return
            raise BackendError(f"container stop failed: {exc.explanation or exc}") from exc

    def pause(self, container_id: str) -> None:
        """docker pause, tried again while runc cannot freeze a busy container (as the provider does)."""

        def pause_once(container: str) -> None:
            try:
                self.client.api.pause(container)
            except docker.errors.APIError as exc:
                raise EngineAPIError(exc.status_code or 500, str(exc.explanation or exc)) from exc

        try:
            pause_patiently(pause_once, container_id)
        except EngineAPIError as exc:
            raise BackendError(f"container pause failed: {exc.message}") from exc

    def unpause(self, container_id: str) -> None:
        try:
            self.client.api.unpause(container_id)
        except docker.errors.APIError as exc:
            raise BackendError(f"container unpause failed: {exc.explanation or exc}") from exc

    def remove(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass

    def is_running(self, container_id: str) -> bool:
        try:
            return bool(self.client.api.inspect_container(container_id)["State"]["Running"])
        except docker.errors.NotFound:
            return False

    def containers(self, all_instances: bool = False) -> list[dict[str, Any]]:
        label = EMULATOR_LABEL if all_instances else f"{EMULATOR_LABEL}={self.instance_id}"
        return self.client.api.containers(all=True, filters={"label": label})

    def images(self) -> list[dict[str, Any]]:
        return self.client.api.images(filters={"label": f"{EMULATOR_LABEL}={self.instance_id}"})

    def cleanup(self) -> dict[str, int]:
        """Remove every container and image this instance made."""
        removed = {"containers": 0, "images": 0}
        for container in self.containers():
            self.remove(container["Id"])
            removed["containers"] += 1
        for image in self.images():
            for ref in image.get("RepoTags") or [image["Id"]]:
                try:
                    self.client.images.remove(ref, force=True)
                    removed["images"] += 1
                except docker.errors.ImageNotFound:
                    pass
                except docker.errors.APIError as exc:
                    LOG.warning("could not remove image %s: %s", ref, exc)
        return removed

    # ---- exec ---------------------------------------------------------------------------------------------
    def exec_argv(self, container_id: str, argv: list[str], user: str = "", workdir: str | None = None,
                  env: dict[str, str] | None = None) -> ExecResult:
        """argv in the container: its exit code and stdout then stderr in one buffer; -1 and the engine's
        message when the engine refuses the exec."""
        if self.engine is not None:
            try:
                exit_code, out, err = self.engine.exec(container_id, argv, user=user, workdir=workdir or None,
                                                       env=env or None)
            except EngineAPIError as exc:
                return ExecResult(-1, exc.message.encode())
            return ExecResult(exit_code, out + err)
        api = self.long_client.api
        try:
            exec_id = api.exec_create(container_id, argv, user=user, workdir=workdir or None,
                                      environment=env or None)["Id"]
            output = api.exec_start(exec_id, demux=False) or b""
            # The engine may record the exit a moment after the output ends (seen under load).
            exit_code = exec_exit_code(lambda: api.exec_inspect(exec_id))
        except docker.errors.APIError as exc:
            return ExecResult(-1, str(exc.explanation or exc).encode())
        return ExecResult(exit_code, output)

    def run_command(self, container_id: str, command: str, user: str, workdir: str | None,
                    env: dict[str, str] | None, timeout: float | None, exec_token: str) -> ExecResult:
        """A toolbox exec: the command under a shell, stdout+stderr in one buffer, killed on timeout."""
        full_env = dict(env or {})
        full_env[EXEC_MARKER] = exec_token
        argv = ["/bin/sh", "-c", PICK_SHELL, "daytona-exec", command]
        if not timeout:
            return self.exec_argv(container_id, argv, user, workdir, full_env)
        box: dict[str, ExecResult] = {}
        worker = threading.Thread(
            target=lambda: box.setdefault("r", self.exec_argv(container_id, argv, user, workdir, full_env)),
            daemon=True,
        )
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            self.kill_marked(container_id, f"{EXEC_MARKER}={exec_token}")
            worker.join(10)
            return ExecResult(-1, box["r"].output if "r" in box else b"", timed_out=True)
        return box["r"]

    def kill_marked(self, container_id: str, marker: str) -> None:
        self.exec_argv(container_id, ["/bin/sh", "-c", KILL_MARKED, "daytona-kill", marker], user="0")

    def shell(self, container_id: str, user: str, workdir: str | None, env: dict[str, str]) -> tuple[str, Any]:
        """A long-lived shell reading commands on stdin (a toolbox session); returns (exec id, socket)."""
        api = self.long_client.api
        exec_id = api.exec_create(container_id, ["/bin/sh"], stdin=True, stdout=True, stderr=True, user=user,
                                  workdir=workdir or None, environment=env)["Id"]
        sock = api.exec_start(exec_id, socket=True)
        return exec_id, sock._sock  # docker-py exposes the raw socket only this way

    def exec_exit_code(self, exec_id: str) -> int | None:
        try:
            info = self.client.api.exec_inspect(exec_id)
        except docker.errors.APIError:
            return None
        return None if info.get("Running") else info.get("ExitCode")

    # ---- files --------------------------------------------------------------------------------------------
    def read_file(self, container_id: str, path: str) -> bytes:
        stream, stat = self._get_archive(container_id, path)
        if stat.get("linkTarget"):
            resolved = self.exec_argv(container_id, ["readlink", "-f", path], user="0")
            target = resolved.output.decode().strip()
            if resolved.exit_code != 0 or not target:
                raise PathNotFound(f"file not found: {path}")
            stream, stat = self._get_archive(container_id, target)
        if stat.get("mode", 0) & (1 << 31):
            raise PathIsDirectory(f"path is a directory: {path}")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r") as archive:
            for member in archive:
                if member.isfile():
                    extracted = archive.extractfile(member)
                    return extracted.read() if extracted else b""
        raise PathNotFound(f"file not found: {path}")

    def read_dir_files(self, container_id: str, path: str) -> dict[str, bytes]:
        """Every regular file directly under a directory, by name ({} if the directory does not exist)."""
        try:
            stream, _stat = self._get_archive(container_id, path)
        except PathNotFound:
            return {}
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r") as archive:
            for member in archive:
                if member.isfile():
                    extracted = archive.extractfile(member)
                    files[member.name.rsplit("/", 1)[-1]] = extracted.read() if extracted else b""
        return files

    def _get_archive(self, container_id: str, path: str) -> tuple[Any, dict[str, Any]]:
        try:
            return self.client.api.get_archive(container_id, path)
        except docker.errors.NotFound as exc:
            raise PathNotFound(f"file not found: {path}") from exc
        except docker.errors.APIError as exc:
            raise BackendError(f"reading {path} failed: {exc.explanation or exc}") from exc

    def write_file(self, container_id: str, path: str, data: bytes, uid: int, gid: int, user: str) -> None:
        parent, _slash, name = path.rstrip("/").rpartition("/")
        parent = parent or "/"
        made = self.exec_argv(container_id, ["mkdir", "-p", parent], user=user)
        if made.exit_code != 0:
            made = self.exec_argv(container_id, ["mkdir", "-p", parent], user="0")
            if made.exit_code != 0:
                raise BackendError(f"cannot create {parent}: {made.output.decode(errors='replace').strip()}")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.uid, info.gid = uid, gid
            info.mtime = int(time.time())
            archive.addfile(info, io.BytesIO(data))
        try:
            ok = self.client.api.put_archive(container_id, parent, buffer.getvalue())
        except docker.errors.APIError as exc:
            raise BackendError(f"writing {path} failed: {exc.explanation or exc}") from exc
        if not ok:
            raise BackendError(f"writing {path} failed")

    def container_workdir(self, container_id: str) -> str:
        try:
            config = self.client.api.inspect_container(container_id).get("Config") or {}
        except docker.errors.APIError:
            return ""
        return config.get("WorkingDir") or ""
