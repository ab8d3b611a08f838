"""The daytona provider's pure parts: command lines, the in-box exec scripts (run here with a real sh),
retry classification on the SDK's own error classes, names, sizes and the idle decision."""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from daytona import (
    DaytonaConnectionError,
    DaytonaInternalServerError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
)

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers import _snapshot_store as snapshots  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona import _daytona as dt  # noqa: E402


def sh(line: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", line], capture_output=True, check=False, **kwargs)


def test_command_line_runs_argv_exactly_in_a_real_shell(tmp_path: Path) -> None:
    odd = ["printf", "%s|", "it's", '"q"', "$HOME", "`x`", "a b", "✓", ""]
    line = dt.command_line(odd, user="me", sandbox_user="me")
    assert sh(line).stdout == 'it\'s|"q"|$HOME|`x`|a b|✓||'.encode()
    line = dt.command_line(["sh", "-c", 'pwd; printf %s "$V"'], user="me", sandbox_user="me", workdir=str(tmp_path),
                           env={"V": "x=y z"})  # fmt: skip
    assert sh(line).stdout == f"{tmp_path}\nx=y z".encode()
    assert sh(dt.command_line(["sh", "-c", "exit 7"], user=None, sandbox_user="me")).returncode == 7


def test_command_line_switches_user_with_sudo_and_bounds_time() -> None:
    assert dt.command_line(["id"], user="vscode", sandbox_user="vscode") == "sh -c 'exec id'"
    root = dt.command_line(["id"], user="root", sandbox_user="vscode")
    assert root.startswith("sudo -n -E -H -- sh -c")
    other = dt.command_line(["id"], user="alice", sandbox_user="vscode", timeout=2.2)
    assert other.startswith("sudo -n -E -H -u alice -- timeout -s KILL 3 sh -c")
    with pytest.raises(ProviderError):
        dt.command_line([], user=None, sandbox_user="x")


def _launch(directory: Path, line: str, stdin: str = "") -> None:
    done = subprocess.run(["sh", "-c", dt.LAUNCH_SCRIPT, "launch", str(directory), line, stdin], check=False)
    assert done.returncode == 0


def _wait(directory: Path, slice_seconds: int = 5) -> tuple[str, int | None, bytes, bytes]:
    done = subprocess.run(["sh", "-c", dt.WAIT_SCRIPT, "wait", str(directory), str(slice_seconds)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return dt.parse_wait_output(done.stdout)


def test_launch_and_wait_scripts_give_exact_output_once(tmp_path: Path) -> None:
    directory = tmp_path / "exec" / "n1"
    stdin = tmp_path / "in"
    stdin.write_bytes(b"\x00\xffdata")
    counter = tmp_path / "count"
    line = dt.command_line(["sh", "-c", f"echo x >> {counter}; cat; printf 'E' >&2; exit 4"], user=None,
                           sandbox_user="me")  # fmt: skip
    _launch(directory, line, str(stdin))
    _launch(directory, line, str(stdin))  # a re-sent launcher starts nothing
    assert _wait(directory) == ("DONE", 4, b"\x00\xffdata", b"E")
    assert counter.read_text() == "x\n"
    assert not stdin.exists()  # the stdin file is removed once the command has it
    # A lost answer: the waiter is asked again and still has the result.
    assert _wait(directory) == ("DONE", 4, b"\x00\xffdata", b"E")


def test_wait_reports_pending_lost_and_not_started(tmp_path: Path) -> None:
    # The command ends only when the test says so: PENDING is checked while it cannot have finished,
    # then the waiter must report DONE once it has (the long slice is a bound, not a pace).
    go = tmp_path / "go"
    slow = tmp_path / "e" / "slow"
    _launch(slow, f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done; echo finished")
    assert _wait(slow, 1)[0] == "PENDING"
    go.touch()
    assert _wait(slow, 60) == ("DONE", 0, b"finished\n", b"")
    lost = tmp_path / "e" / "lost"
    lost.mkdir(parents=True)
    (lost / "pid").write_text("999999\n")  # no such process, and no exit status
    assert _wait(lost)[0] == "LOST"
    assert _wait(tmp_path / "e" / "never", 1)[0] == "NOTSTARTED"


def test_parse_wait_output_edge_cases() -> None:
    out = base64.b64encode(b"o" * 100).decode()
    text = f"AGENTBOX-EXEC DONE 0\n{out[:40]}\n{out[40:]}\n--\n\n"
    assert dt.parse_wait_output(text) == ("DONE", 0, b"o" * 100, b"")
    assert dt.parse_wait_output("AGENTBOX-EXEC DONE 1\n--\n") == ("DONE", 1, b"", b"")
    assert dt.parse_wait_output("AGENTBOX-EXEC PENDING\n")[0] == "PENDING"
    with pytest.raises(ValueError):
        dt.parse_wait_output("sh: base64: not found\n")


def test_retry_classification_on_sdk_errors() -> None:
    limited = DaytonaRateLimitError("slow down", status_code=429, headers={"Retry-After": "3"})
    assert dt.is_retryable(limited) and dt.backoff_delay(0, limited) == 3.0
    assert dt.backoff_delay(0, DaytonaRateLimitError("x", status_code=429, headers={"Retry-After": "999"})) == dt.MAX_RETRY_AFTER
    assert dt.is_retryable(DaytonaTimeoutError("gateway", status_code=504))
    assert not dt.is_retryable(DaytonaTimeoutError("our own wait ran out"))  # no status: not a gateway timeout
    assert not dt.is_retryable(DaytonaInternalServerError("boom", status_code=500))
    assert not dt.is_retryable(DaytonaNotFoundError("gone", status_code=404))
    assert dt.is_retryable(DaytonaConnectionError("reset"))
    assert dt.is_retryable(httpx.ConnectError("refused"))
    response = httpx.Response(503, request=httpx.Request("GET", "http://x"))
    assert dt.is_retryable(httpx.HTTPStatusError("503", request=response.request, response=response))
    assert [dt.backoff_delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_errors_name_the_box_and_operation() -> None:
    provider = dt.DaytonaProvider(api_key="k", api_url="http://127.0.0.1:9/api")
    error = provider._fail(DaytonaRateLimitError("too many", status_code=429), "b1", "start", attempts=4)
    assert str(error).startswith("start of box 'b1' failed: Daytona answered 429 after 4 attempts")
    assert isinstance(provider._fail(DaytonaNotFoundError("no", status_code=404), "b1", "find"), dt.BoxNotFound)
    unreachable = provider._fail(DaytonaConnectionError("refused"), "b1", "find")
    assert isinstance(unreachable, dt.EngineUnreachable) and "did not answer" in str(unreachable)


def test_calls_are_retried_only_when_idempotent() -> None:
    provider = dt.DaytonaProvider(api_key="k", api_url="http://127.0.0.1:9/api", retries=2)
    calls = []

    def flaky():
        calls.append(1)
        raise DaytonaRateLimitError("x", status_code=429, headers={"Retry-After": "0"})

    with pytest.raises(ProviderError, match="after 3 attempts"):
        provider._call(flaky, box="b", operation="op")
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(ProviderError):
        provider._call(flaky, box="b", operation="op", idempotent=False)
    assert len(calls) == 1


def test_sizes_names_and_states() -> None:
    assert dt.gib("4g") == 4 and dt.gib("512m") == 1 and dt.gib(3 * (1 << 30)) == 3 and dt.gib("2GiB") == 2
    with pytest.raises(ProviderError, match="not a size"):
        dt.gib("lots")
    name = snapshots.snapshot_name("0123456789abcdef", "my-box-3")
    assert snapshots.parse_snapshot_name(name) == ("0123456789abcdef", "my-box-3")
    assert snapshots.snapshot_name("0123456789abcdef", "x") != snapshots.snapshot_name("0123456789abcdef", "x")
    assert snapshots.parse_snapshot_name("agentbox/box:latest") is None
    assert dt.is_registry_reference("ghcr.io/org/box:1") and dt.is_registry_reference("localhost:5000/box")
    assert not dt.is_registry_reference("agentbox/box:latest") and not dt.is_registry_reference("ubuntu")
    assert [dt.box_state(s) for s in ("started", "archived", "stopped", "error", "destroyed")] == [
        "running", "paused", "stopped", "stopped", "missing"]  # fmt: skip


def test_idle_decision() -> None:
    now = 1_000_000
    assert dt.idle_decision({"now": str(now)}, 5)[0:2] == (
        "keep",
        "no idle signal (no agent heartbeat file, no tmux window)",
    )
    assert dt.idle_decision({"now": str(now), "heartbeat": str(now - 3600)}, 5)[0] == "pause"
    assert dt.idle_decision({"now": str(now), "heartbeat": str(now - 3600), "tmux": str(now - 10)}, 5)[0] == "keep"
    busy = dt.idle_decision({"now": str(now), "heartbeat": str(now - 3600), "recent": "/workspace/a"}, 5)
    assert busy[0] == "keep" and "/workspace/a" in busy[1]
    assert dt.idle_decision({}, 5)[0] == "keep"


def test_idle_probe_script_reads_the_heartbeat(tmp_path: Path) -> None:
    (tmp_path / ".agentbox").mkdir()
    beat = tmp_path / ".agentbox" / "last-activity"
    beat.touch()
    os.utime(beat, (1_600_000_000, 1_600_000_000))
    done = subprocess.run(["sh", "-c", dt.IDLE_PROBE_SCRIPT, "probe", "60"], capture_output=True, text=True,
                          env={**os.environ, "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True)  # fmt: skip
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert values["heartbeat"] == "1600000000" and abs(int(values["now"]) - time.time()) < 5


def test_missing_key_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    monkeypatch.delenv("DAYTONA_JWT_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)  # the SDK also reads ./.env
    provider = dt.DaytonaProvider(api_url="http://127.0.0.1:9/api")
    with pytest.raises(ProviderError, match="no Daytona API key"):
        provider.find("x")


def test_bad_interval_settings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOX_DAYTONA_AUTO_STOP", "soon")
    with pytest.raises(ProviderError, match="AGENTBOX_DAYTONA_AUTO_STOP"):
        dt.DaytonaProvider(api_key="k")
    monkeypatch.setenv("AGENTBOX_DAYTONA_AUTO_STOP", "45")
    monkeypatch.setenv("AGENTBOX_IDLE_TIMEOUT", "10")
    provider = dt.DaytonaProvider(api_key="k")
    assert (provider._auto_stop, provider._idle_timeout) == (45, 10)


def test_forked_child_forgets_the_parents_clients() -> None:
    dt._CLIENTS[("http://x", "k", "")] = object()
    try:
        pid = os.fork()
        if pid == 0:  # the child: Ansible's per-task worker
            os._exit(0 if not dt._CLIENTS else 1)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert dt._CLIENTS  # the parent keeps its own
    finally:
        dt._CLIENTS.clear()


def test_refused_connection_is_unreachable_after_bounded_retries() -> None:
    provider = dt.DaytonaProvider(api_key="k", api_url="http://127.0.0.1:9/api")  # nothing listens on port 9
    with pytest.raises(dt.EngineUnreachable, match="did not answer after 4 attempts"):
        provider.find("x")
