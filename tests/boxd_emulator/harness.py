"""Start the emulator from Python (its tests, the provider's tests) and drive its control calls."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from tests.daytona_emulator.harness import remove_instance_leftovers

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = REPO_ROOT / "scripts" / "boxd-emulator"
CONTROL_SERVICE = "boxd.emulator.Control"


class Control:
    """The emulator's own calls: state, faults, the request log, the idle timer, delays."""

    def __init__(self, base_url: str, token: str) -> None:
        self.channel = grpc.insecure_channel(base_url.removeprefix("http://"))
        self.metadata = [("authorization", f"Bearer {token}")]

    def _call(self, name: str, payload: Any = None, timeout: float = 30) -> Any:
        call = self.channel.unary_unary(f"/{CONTROL_SERVICE}/{name}")
        answer = call(json.dumps(payload or {}).encode(), metadata=self.metadata, timeout=timeout)
        return json.loads(answer or b"null")

    def health(self) -> dict[str, Any]:
        return self._call("Health", timeout=2)

    def state(self) -> dict[str, Any]:
        return self._call("State")

    def add_fault(self, **rule: Any) -> dict[str, Any]:
        return self._call("AddFault", rule)

    def clear_faults(self) -> None:
        self._call("ClearFaults")

    def requests(self) -> list[dict[str, Any]]:
        return self._call("Requests")

    def tick(self) -> None:
        self._call("Tick")

    def configure(self, **settings: Any) -> dict[str, Any]:
        return self._call("Configure", settings)

    def fail_snapshot(self, name: str, reason: str = "injected") -> str:
        """The capture in progress of snapshot `name` fails, as a worker would report it."""
        return self._call("FailSnapshot", {"name": name, "reason": reason})

    def archive_snapshot(self, name: str) -> str:
        """Snapshot `name` goes to object storage (storage archived), as boxd archives unused snapshots."""
        return self._call("ArchiveSnapshot", {"name": name})

    def machine(self, machine_id: str) -> dict[str, Any] | None:
        return next((m for m in self.state()["machines"] if m["id"] == machine_id), None)

    def close(self) -> None:
        self.channel.close()


class RunningEmulator(NamedTuple):
    base_url: str
    token: str
    control: Control
    instance_id: str
    api_key: str = ""  # a key the emulator's exchange takes (POST /api/v1/auth/token)


def _wait_ready(control: Control, deadline: float, process: subprocess.Popen | None = None) -> str:
    while True:
        try:
            return control.health()["instance_id"]
        except grpc.RpcError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the emulator exited with {process.returncode} before answering") from None
            if time.monotonic() > deadline:
                raise RuntimeError("the emulator did not answer within the start-up timeout") from None
            time.sleep(0.05)


@contextlib.contextmanager
def running_emulator(*, image: str, mode: str = "subprocess", start_seconds: float = 0.3,
                     startup_timeout: float = 60, faults: list[dict[str, Any]] | None = None,
                     box_capabilities: bool = True) -> Iterator[RunningEmulator]:
    """An emulator on an ephemeral 127.0.0.1 port; on exit every container and image it made is removed.

    mode="subprocess" runs scripts/boxd-emulator (a test that forks, e.g. ansible-playbook, keeps
    gRPC's server threads out of its own process); mode="thread" serves in this process.
    """
    token = "emu-" + secrets.token_hex(16)
    api_key = "bxd_emu_" + secrets.token_hex(16)
    instance_id = "bx" + secrets.token_hex(5)
    if mode == "thread":
        from .server import Emulator

        emulator = Emulator(token=token, image=image, instance_id=instance_id, start_seconds=start_seconds,
                            box_capabilities=box_capabilities, faults=faults, api_key=api_key)
        emulator.start()
        control = Control(emulator.base_url, token)
        try:
            _wait_ready(control, time.monotonic() + startup_timeout)
            yield RunningEmulator(emulator.base_url, token, control, instance_id, api_key)
        finally:
            control.close()
            emulator.stop()
            remove_instance_leftovers(instance_id)
        return
    argv = [str(LAUNCHER), "--port", "0", "--image", image, "--instance-id", instance_id,
            "--start-seconds", str(start_seconds)]
    if not box_capabilities:
        argv.append("--no-box-capabilities")
    for rule in faults or []:
        argv += ["--fault", json.dumps(rule)]
    env = {**os.environ, "BOXD_TOKEN": token, "BOXD_API_KEY": api_key}  # not on the command line: ps shows argv
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    control = None
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline() or "{}")
        if "base_url" not in ready:
            raise RuntimeError(f"the emulator did not start (exit code {process.wait(10)})")
        control = Control(ready["base_url"], token)
        _wait_ready(control, time.monotonic() + startup_timeout, process)
        yield RunningEmulator(ready["base_url"], token, control, instance_id, api_key)
    finally:
        if control is not None:
            control.close()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout:
            process.stdout.close()
        remove_instance_leftovers(instance_id)
