"""Start the emulator from Python (tests, the provider's tests) and drive its admin routes.

    from tests.daytona_emulator import running_emulator

    with running_emulator(image="agentbox-test/busybox:latest") as (api_url, api_key, admin):
        daytona = Daytona(DaytonaConfig(api_key=api_key, api_url=api_url))
        admin.add_fault(method="POST", path="^/api/sandbox$", action="status", status=429, times=1)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from .config import EMULATOR_LABEL, EmulatorConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = REPO_ROOT / "scripts" / "daytona-emulator"


class AdminError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"admin call failed with {status}: {body}")
        self.status = status
        self.body = body


class EmulatorAdmin:
    """A small client for /_emulator/*: state, reset, faults, the request log, run-time settings."""

    def __init__(self, base_url: str, api_key: str, instance_id: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.instance_id = instance_id

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api"

    @property
    def toolbox_url(self) -> str:
        return f"{self.base_url}/toolbox"

    def _call(self, method: str, route: str, payload: Any = None, timeout: float = 30) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.base_url}/_emulator{route}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.api_key}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise AdminError(exc.code, exc.read().decode(errors="replace")) from exc
        return json.loads(body) if body else None

    def health(self, timeout: float = 5) -> dict[str, Any]:
        return self._call("GET", "/health", timeout=timeout)

    def state(self) -> dict[str, Any]:
        return self._call("GET", "/state")

    def reset(self) -> dict[str, Any]:
        return self._call("POST", "/reset", timeout=300)

    def config(self) -> dict[str, Any]:
        return self._call("GET", "/config")

    def set_config(self, **settings: Any) -> dict[str, Any]:
        return self._call("POST", "/config", settings)

    def faults(self) -> list[dict[str, Any]]:
        return self._call("GET", "/faults")

    def add_fault(self, **rule: Any) -> dict[str, Any]:
        return self._call("POST", "/faults", rule)[0]

    def release_fault(self, rule_id: int) -> None:
        """The requests a "hold" rule holds go on."""
        self._call("POST", f"/faults/{rule_id}/release")

    def remove_fault(self, rule_id: int) -> None:
        self._call("DELETE", f"/faults/{rule_id}")

    def clear_faults(self) -> None:
        self._call("DELETE", "/faults")

    def requests(self, since: int = 0) -> list[dict[str, Any]]:
        return self._call("GET", f"/requests?since={since}")

    def clear_requests(self) -> None:
        self._call("DELETE", "/requests")

    def tick(self) -> None:
        """Run the auto-stop/archive/delete timers now instead of waiting for the next half second."""
        self._call("POST", "/tick")

    def fail_sandbox(self, sandbox_id: str, reason: str = "no space left on device", recoverable: bool = True) -> dict:
        """Break the sandbox as a runner would report it: state error, recoverable or not."""
        return self._call("POST", f"/sandboxes/{sandbox_id}/fail", {"reason": reason, "recoverable": recoverable})

    def deactivate_unused_snapshot(self, name: str, ago_minutes: float = 60) -> dict:
        """Deactivate a snapshot as Daytona does after 14 days unused (that long ago, in emulated minutes)."""
        quoted = urllib.parse.quote(name, safe="")
        return self._call("POST", f"/snapshots/{quoted}/deactivate-unused", {"ago_minutes": ago_minutes})

    def expire_ssh_access(self, token: str) -> dict:
        """An SSH access token's time is up now, as if its expiresInMinutes had passed."""
        return self._call("POST", f"/ssh-access/{token}/expire")

    def signed_previews(self) -> list[dict[str, Any]]:
        """Every signed preview URL made: token, sandboxId, port, expiresInSeconds (as asked), expiresAt."""
        return self._call("GET", "/signed-previews")

    def expire_signed_preview(self, token: str) -> dict:
        """A signed preview URL's time is up now, as if its expiresInSeconds had passed."""
        return self._call("POST", f"/signed-previews/{token}/expire")

    def sandbox_internal(self, sandbox_id: str) -> dict[str, Any] | None:
        """The sandbox as the admin state shows it, with `_emulator.containerId`, or None once deleted."""
        return next((sb for sb in self.state()["sandboxes"] if sb["id"] == sandbox_id), None)


class RunningEmulator(NamedTuple):
    api_url: str
    api_key: str
    admin: EmulatorAdmin


def _wait_ready(admin: EmulatorAdmin, deadline: float, process: subprocess.Popen | None = None) -> None:
    while True:
        try:
            admin.instance_id = admin.health(timeout=2)["instanceId"]
            return
        except (OSError, AdminError):
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the emulator exited with {process.returncode} before answering") from None
            if time.monotonic() > deadline:
                raise RuntimeError("the emulator did not answer within the start-up timeout") from None
            time.sleep(0.05)


def remove_instance_leftovers(instance_id: str) -> None:
    """Safety net: remove containers and images of one emulator instance, whatever state it died in."""
    import docker
    import docker.errors

    client = docker.from_env(timeout=120)  # never a clean-up that waits on the engine for ever
    try:
        label = f"{EMULATOR_LABEL}={instance_id}"
        # The engine's listing alone: the SDK's list() inspects each container, and one being removed meanwhile
        # hung a full run's teardown on that inspect.
        for container in client.api.containers(all=True, filters={"label": label}):
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(container["Id"], force=True)
        for image in client.images.list(filters={"label": label}):
            for ref in image.tags or [image.id]:
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(ref, force=True)
    finally:
        client.close()


@contextlib.contextmanager
def running_emulator(*, mode: str = "thread", startup_timeout: float = 30, **settings: Any) -> Iterator[RunningEmulator]:
    """Serve an emulator on an ephemeral 127.0.0.1 port; on exit remove every container and image it made.

    `settings` are EmulatorConfig fields (image, transition_seconds, list_lag_seconds, proxy_timeout_seconds,
    faults, ...). mode="thread" serves in this process; mode="subprocess" runs scripts/daytona-emulator.
    """
    settings.setdefault("api_key", "emu-" + secrets.token_hex(16))
    config = EmulatorConfig(**settings)
    config.port = 0
    if mode not in ("thread", "subprocess"):
        raise ValueError(f"mode must be 'thread' or 'subprocess', not {mode!r}")
    serving = _in_thread(config, startup_timeout) if mode == "thread" else _in_subprocess(config, startup_timeout)
    try:
        yield from serving
    finally:
        serving.close()  # runs the server's own clean-up if the caller's block raised


def _in_thread(config: EmulatorConfig, startup_timeout: float) -> Iterator[RunningEmulator]:
    from .core import Emulator
    from .server import EmulatorHTTPServer

    emulator = Emulator(config)
    try:
        server = EmulatorHTTPServer(emulator)
    except BaseException:
        emulator.shutdown()
        raise
    thread = threading.Thread(target=server.serve_forever, name="daytona-emulator", daemon=True)
    thread.start()
    emulator.start_background()
    admin = EmulatorAdmin(emulator.base_url, config.api_key)
    try:
        _wait_ready(admin, time.monotonic() + startup_timeout)
        yield RunningEmulator(emulator.api_url, config.api_key, admin)
    finally:
        server.shutdown()
        server.server_close()
        emulator.shutdown()
        if not config.keep_on_exit:
            remove_instance_leftovers(config.instance_id)


def _in_subprocess(config: EmulatorConfig, startup_timeout: float) -> Iterator[RunningEmulator]:
    argv = [str(LAUNCHER), "--port", "0", "--image", config.image, "--instance-id", config.instance_id,
            "--transition-seconds", str(config.transition_seconds),
            "--desired-state-seconds", str(config.desired_state_seconds), "--list-lag", str(config.list_lag_seconds),
            "--proxy-timeout", str(config.proxy_timeout_seconds), "--proxy-cut-mode", config.proxy_cut_mode,
            "--minute-seconds", str(config.minute_seconds)]
    if config.default_snapshot:
        argv += ["--default-snapshot", config.default_snapshot]
    if config.default_user:
        argv += ["--default-user", config.default_user]
    if not config.box_capabilities:
        argv.append("--no-box-capabilities")
    if not config.toolbox_as_image_user:
        argv.append("--toolbox-as-os-user")
    if not config.events:
        argv.append("--no-events")
    for rule in config.faults:
        argv += ["--fault", json.dumps(rule)]
    env = {**os.environ, "DAYTONA_EMULATOR_API_KEY": config.api_key}  # not on the command line: ps shows argv
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline() or "{}")
        if "api_url" not in ready:
            raise RuntimeError(f"the emulator did not start (exit code {process.wait(10)})")
        admin = EmulatorAdmin(ready["api_url"][: -len("/api")], config.api_key)
        _wait_ready(admin, time.monotonic() + startup_timeout, process)
        yield RunningEmulator(ready["api_url"], config.api_key, admin)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout:
            process.stdout.close()
        remove_instance_leftovers(config.instance_id)
