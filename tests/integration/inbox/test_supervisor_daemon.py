"""agentbox-ctl daemon on this host: real processes, a real unix socket, real HTTP on 127.0.0.1.

No box is needed: the daemon runs as the current user with temporary socket, log, state and marker
directories, and a temporary workspace holding the agentbox.yaml under test.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CTL = ROOT / "roles" / "inbox_supervisor" / "files" / "agentbox-ctl"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_for(predicate, timeout: float, message: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s: {message() if callable(message) else message}")


class Supervised:
    """One daemon with its own directories; `ctl(...)` runs the CLI against it."""

    def __init__(self, yaml_text: str, web_port: int | None = None) -> None:
        # Unix socket paths are limited to 108 bytes: keep everything under a short /tmp directory.
        self.root = Path(tempfile.mkdtemp(prefix="abx-"))
        self.workspace = self.root / "ws"
        self.workspace.mkdir()
        self.config = self.workspace / "agentbox.yaml"
        self.socket = self.root / "run" / "ctl.sock"
        self.log_dir = self.root / "log"
        self.state_dir = self.root / "state"
        self.markers = self.root / "markers"
        self.web_port = web_port
        self.write(yaml_text)
        self.proc: subprocess.Popen | None = None
        self.daemon_output = self.root / "daemon.out"
        self.pids_seen: set[int] = set()

    def write(self, yaml_text: str) -> None:
        self.config.write_text(textwrap.dedent(yaml_text))

    def start(self) -> None:
        args = [sys.executable, str(CTL), "daemon", "--config", str(self.config), "--log-dir", str(self.log_dir),
                "--state-dir", str(self.state_dir), "--markers-dir", str(self.markers), "--log-max-bytes", "200000",
                "--web-port", str(self.web_port) if self.web_port else "off"]
        env = dict(os.environ, AGENTBOX_CTL_SOCKET=str(self.socket))
        with open(self.daemon_output, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.workspace)
        wait_for(lambda: self.socket.exists() or self.proc.poll() is not None, 10, "daemon socket")
        assert self.proc.poll() is None, self.daemon_output.read_text()

    def stop(self) -> int:
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = dict(os.environ, AGENTBOX_CTL_SOCKET=str(self.socket))
        return subprocess.run([sys.executable, str(CTL), *args], capture_output=True, text=True, env=env,
                              timeout=timeout, check=False)

    def status(self) -> dict:
        result = self.ctl("status", "--json")
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        for unit in data["tasks"] + data["services"]:
            if unit["pid"]:
                self.pids_seen.add(unit["pid"])
        return data

    def unit(self, name: str) -> dict:
        data = self.status()
        return next(u for u in data["tasks"] + data["services"] if u["name"] == name)

    def wait_state(self, name: str, states: tuple[str, ...], timeout: float = 15) -> dict:
        def reached() -> dict | None:
            unit = self.unit(name)
            return unit if unit["state"] in states else None

        return wait_for(reached, timeout, lambda: f"{name} in {states}; last: {self.unit(name)}")

    def cleanup(self) -> None:
        self.stop()
        for pid in self.pids_seen:  # belt and braces: nothing the test started may survive it
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def supervised():
    made: list[Supervised] = []

    def make(yaml_text: str, web_port: int | None = None, start: bool = True) -> Supervised:
        box = Supervised(yaml_text, web_port)
        made.append(box)
        if start:
            box.start()
        return box

    yield make
    for box in made:
        box.cleanup()


def sample_project(http_port: int, backoff: str = "{initial_ms: 300, max_ms: 1200, factor: 2}") -> str:
    """The issue's sample: a marker-guarded install task and a Python HTTP service that needs it."""
    return f"""\
    tasks:
      install:
        command: |
          echo "install run" >> install-runs.txt
          mkdir -p site && echo "hello from agentbox" > site/index.html
        run_once: true
    services:
      web:
        command: exec {sys.executable} -m http.server {http_port} --bind 127.0.0.1 --directory site
        needs: [install]
        ready_when: {{http: /, port: {http_port}, interval_ms: 100, timeout_ms: 20000}}
        expose: {{port: {http_port}}}
        backoff: {backoff}
    """


def http_get(port: int) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_sample_project_becomes_ready_serves_http_and_skips_install_after_restart(supervised):
    http_port, web_port = free_port(), free_port()
    box = supervised(sample_project(http_port), web_port=web_port)
    ready = box.ctl("wait-ready", "--timeout", "30")
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.strip() == "ready"

    status = box.status()
    install = status["tasks"][0]
    web = status["services"][0]
    assert (install["name"], install["state"]) == ("install", "done")
    assert (web["state"], web["expose"]) == ("ready", http_port)
    assert web["pid"] and pid_alive(web["pid"])
    assert status["web"]["listen"] == web_port and status["web"]["service"] == "web"
    # the web port forwards to the exposed service, which serves what the install task wrote
    assert http_get(web_port) == (200, "hello from agentbox\n")
    assert http_get(http_port) == (200, "hello from agentbox\n")
    assert (box.markers / "install.json").exists()
    assert (box.log_dir / "web.log").read_text().count("GET / HTTP/1.1") >= 2

    # SIGTERM: the daemon stops the service's whole process group and removes its socket
    first_pid = web["pid"]
    assert box.stop() == 0
    assert not pid_alive(first_pid)
    assert not box.socket.exists()

    # a box restart: the daemon starts again, the install task is skipped thanks to its marker
    box.start()
    assert box.ctl("wait-ready", "--timeout", "30").returncode == 0
    assert box.unit("install")["state"] == "skipped"
    assert (box.workspace / "install-runs.txt").read_text().count("install run") == 1
    assert http_get(web_port)[0] == 200

    # run-task honours run_once unless forced
    again = box.ctl("run-task", "install")
    assert again.returncode == 0 and "skipped" in again.stdout
    forced = box.ctl("run-task", "install", "--force")
    assert forced.returncode == 0 and "install: done" in forced.stdout
    assert (box.workspace / "install-runs.txt").read_text().count("install run") == 2


def test_killed_service_restarts_with_growing_backoff(supervised):
    http_port = free_port()
    box = supervised(sample_project(http_port, backoff="{initial_ms: 300, max_ms: 500, factor: 2}"))
    assert box.ctl("wait-ready", "--timeout", "30").returncode == 0
    web_log = box.log_dir / "web.log"
    first = box.unit("web")["pid"]
    os.kill(first, signal.SIGKILL)
    # the supervisor's own lines in the unit's log record every transition, however fast
    wait_for(lambda: "service web: backoff (killed by SIGKILL; restart #1 in 0.3s)" in web_log.read_text(), 10,
             lambda: web_log.read_text()[-2000:])
    second = box.wait_state("web", ("ready",), timeout=30)
    assert second["pid"] != first and second["restarts"] == 1
    os.kill(second["pid"], signal.SIGKILL)
    wait_for(lambda: "restart #2 in 0.5s" in web_log.read_text(), 10, lambda: web_log.read_text()[-2000:])
    third = box.wait_state("web", ("ready",), timeout=30)  # factor 2 gives 0.6s; max_ms caps it at 0.5s
    assert third["restarts"] == 2 and third["pid"] not in (first, second["pid"])
    assert box.ctl("wait-ready", "--timeout", "10").returncode == 0


def test_wait_ready_keeps_waiting_through_backoff_and_times_out(supervised):
    box = supervised("""\
    services:
      flaky:
        command: echo starting; exit 1
        backoff: {initial_ms: 60000, max_ms: 60000}
    """)
    backoff = box.wait_state("flaky", ("backoff",), timeout=10)
    assert backoff["detail"] == "exited with code 1; restart #1 in 60s" and backoff["exit_code"] == 1
    result = box.ctl("wait-ready", "--timeout", "0.5")
    assert result.returncode == 3  # a service in backoff may still come up: not a failure yet
    assert "flaky: backoff (exited with code 1; restart #1 in 60s)" in result.stderr


def test_restart_never_leaves_the_service_crashed_and_says_so(supervised):
    # `clock` fails and restarts every 0.1 s: its restart count is the daemon's own clock. `once`
    # has the same 0.1 s back-off, so had it been scheduled for a restart it would have had one
    # by the time `clock` counted three more restarts.
    box = supervised("""\
    services:
      once:
        command: exec sleep 300
        restart: never
        backoff: {initial_ms: 100, max_ms: 100}
      clock:
        command: exit 1
        restart: always
        backoff: {initial_ms: 100, max_ms: 100}
    """)
    assert box.ctl("wait-ready", "--units", "once", "--timeout", "10").returncode == 0
    pid = box.unit("once")["pid"]
    os.kill(pid, signal.SIGKILL)
    crashed = box.wait_state("once", ("crashed",), timeout=5)
    assert crashed["detail"] == "killed by SIGKILL (restart: never)"
    assert crashed["pid"] is None and crashed["restarts"] == 0 and crashed["runs"] == 1
    counted = box.unit("clock")["restarts"]
    wait_for(lambda: box.unit("clock")["restarts"] >= counted + 3, 30, lambda: box.unit("clock"))
    later = box.unit("once")  # it stays so: no restart, no new run, no process
    assert (later["state"], later["restarts"], later["runs"], later["pid"]) == ("crashed", 0, 1, None)
    assert later["detail"] == "killed by SIGKILL (restart: never)"
    result = box.ctl("wait-ready", "--units", "once", "--timeout", "5")
    assert result.returncode == 1
    assert "once: crashed (killed by SIGKILL (restart: never))" in result.stderr
    human = box.ctl("status").stdout
    assert "crashed" in human and "restart: never" in human


def test_reload_applies_only_the_difference(supervised):
    box = supervised("""\
    tasks:
      prepare:
        command: echo prepared >> prepare-runs.txt
    services:
      keep:
        command: exec sleep 301
      change:
        command: exec sleep 302
      drop:
        command: exec sleep 303
    """)
    assert box.ctl("wait-ready", "--timeout", "10").returncode == 0
    before = {u["name"]: u["pid"] for u in box.status()["services"]}
    box.write("""\
    tasks:
      prepare:
        command: echo prepared >> prepare-runs.txt
    services:
      keep:
        command: exec sleep 301
      change:
        command: exec sleep 312
      add:
        command: exec sleep 304
        needs: [keep]
    """)
    result = box.ctl("reload")
    assert result.returncode == 0, result.stderr
    assert "added: add" in result.stdout and "removed: drop" in result.stdout
    assert "changed: change" in result.stdout and "unchanged: prepare, keep" in result.stdout
    assert box.ctl("wait-ready", "--timeout", "10").returncode == 0
    after = {u["name"]: u["pid"] for u in box.status()["services"]}
    assert after["keep"] == before["keep"]
    assert after["change"] != before["change"] and not pid_alive(before["change"])
    assert "drop" not in after and not pid_alive(before["drop"])
    assert after["add"] and pid_alive(after["add"])
    assert (box.workspace / "prepare-runs.txt").read_text().count("prepared") == 1

    # an invalid file is refused as a whole: nothing changes
    box.write("services:\n  keep:\n    command: exec sleep 301\n    needs: [ghost]\n")
    refused = box.ctl("reload")
    assert refused.returncode == 1
    assert "agentbox.yaml:4: error: services.keep.needs[0]: unknown unit 'ghost'" in refused.stderr
    assert {u["name"]: u["pid"] for u in box.status()["services"]} == after


INVALID_FILES = {
    "cycle": ("""\
        tasks:
          a:
            command: touch started-a
            needs: [b]
          b:
            command: touch started-b
            needs: [a]
        services:
          web:
            command: touch started-web; exec sleep 300
        """, "agentbox.yaml:7: error: tasks.b.needs: dependency cycle: a -> b -> a"),
    "unknown-need": ("""\
        tasks:
          install: touch started-install
        services:
          web:
            command: touch started-web; exec sleep 300
            needs: [instal]
        """, "agentbox.yaml:6: error: services.web.needs[0]: unknown unit 'instal'; did you mean 'install'?"),
    "bad-type": ("""\
        tasks:
          install: touch started-install
        services:
          web:
            command: touch started-web; exec sleep 300
            ready_when: {port: eighty}
        """, "agentbox.yaml:6: error: services.web.ready_when.port: expected an integer, got str 'eighty'"),
    "yaml-syntax": ("""\
        tasks:
          install: touch started-install
        services:
          web:
            command: touch started-web; exec sleep 300
            needs: [install
            restart: always
        """, "agentbox.yaml:7: error: services.web.needs: YAML syntax error"),
}


@pytest.mark.parametrize("case", sorted(INVALID_FILES))
def test_invalid_file_names_key_and_line_and_nothing_starts(supervised, case):
    text, expected = INVALID_FILES[case]
    box = supervised(text)
    result = box.ctl("wait-ready", "--timeout", "10")
    assert result.returncode == 1
    assert expected in result.stderr, result.stderr
    status = box.status()
    assert status["config"]["valid"] is False
    assert status["tasks"] == [] and status["services"] == []
    assert any(issue["line"] for issue in status["config"]["issues"])
    validate = box.ctl("validate", str(box.config))
    assert validate.returncode == 1 and expected in validate.stderr
    assert box.ctl("reload").returncode == 1  # still invalid: refused, nothing changes
    assert box.status()["services"] == [] and not box.log_dir.exists()  # no unit was ever made

    # fixing the file and reloading starts everything. Its units touch other files than the invalid
    # file's: once the fixed ones have run to ready, the daemon has had every chance to run the
    # invalid ones too, and only the fixed ones' file may be there.
    box.write("tasks:\n  install: touch fixed-install\nservices:\n  web:\n    command: exec sleep 300\n")
    assert box.ctl("reload").returncode == 0
    assert box.ctl("wait-ready", "--timeout", "10").returncode == 0
    assert sorted(p.name for p in box.workspace.iterdir()) == ["agentbox.yaml", "fixed-install"]


def test_ready_when_timeouts_mark_unhealthy_or_kill(supervised):
    silent_port = free_port()
    box = supervised(f"""\
    services:
      slow:
        command: exec sleep 300
        ready_when: {{port: {silent_port}, interval_ms: 100, timeout_ms: 600}}
      doomed:
        command: exec sleep 300
        restart: never
        ready_when: {{log_match: never printed, timeout_ms: 600, on_timeout: kill}}
    """)
    slow = box.wait_state("slow", ("unhealthy",), timeout=10)
    assert slow["detail"].startswith("not ready after 0.6s") and slow["pid"]
    doomed = box.wait_state("doomed", ("crashed",), timeout=10)
    assert "not ready after 0.6s" in doomed["detail"] and "killed (on_timeout: kill)" in doomed["detail"]
    result = box.ctl("wait-ready", "--timeout", "5", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["result"] == "failed" and len(report["problems"]) == 2

    # the unhealthy one keeps being checked: once its port answers it becomes ready
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", silent_port))
        listener.listen()
        box.wait_state("slow", ("ready",), timeout=5)
    assert box.ctl("wait-ready", "--units", "slow", "--timeout", "5").returncode == 0


def test_wait_ready_times_out_with_exit_3(supervised):
    box = supervised(f"""\
    services:
      never:
        command: exec sleep 300
        ready_when: {{port: {free_port()}, timeout_ms: 60000}}
    """)
    result = box.ctl("wait-ready", "--timeout", "1")
    assert result.returncode == 3
    assert "not ready after 1s; still waiting for:" in result.stderr and "never: starting" in result.stderr


def test_autostart_false_needs_pull_in_stop_and_start(supervised):
    box = supervised("""\
    services:
      db:
        command: echo db up; exec sleep 300
        autostart: false
        ready_when: {log_match: db up}
      app:
        command: exec sleep 301
        needs: [db]
      extra:
        command: exec sleep 302
        autostart: false
    """)
    assert box.ctl("wait-ready", "--timeout", "10").returncode == 0
    assert box.unit("db")["state"] == "ready"  # started because app needs it
    extra = box.unit("extra")
    assert extra["state"] == "stopped" and "autostart: false" in extra["detail"]
    started = box.ctl("start", "extra")
    assert started.returncode == 0
    box.wait_state("extra", ("running",), timeout=5)
    app_pid = box.unit("app")["pid"]
    stopped = box.ctl("stop", "app")
    assert stopped.returncode == 0 and "app: stopped (stopped by request)" in stopped.stdout
    assert not pid_alive(app_pid)
    assert box.ctl("wait-ready", "--timeout", "5").returncode == 0  # a stopped service is not waited for
    app_log = (box.log_dir / "app.log").read_text()
    assert "app: stopped (stopped by request)" in app_log
    assert "backoff" not in app_log and "crashed" not in app_log  # a requested stop is not a failure
    assert box.ctl("restart", "app").returncode == 0
    assert box.wait_state("app", ("running",), timeout=5)["pid"] != app_pid
    unknown = box.ctl("restart", "nope")
    assert unknown.returncode == 1 and "no unit named 'nope'" in unknown.stderr
    wrong_kind = box.ctl("run-task", "app")
    assert wrong_kind.returncode == 1 and "app is a service" in wrong_kind.stderr


def test_failed_task_blocks_dependents_and_rerun_unblocks(supervised):
    box = supervised("""\
    tasks:
      install:
        command: test -f go
    services:
      web:
        command: exec sleep 300
        needs: [install]
    """)
    result = box.ctl("wait-ready", "--timeout", "10")
    assert result.returncode == 1
    assert "install: failed (exited with code 1)" in result.stderr
    assert "web: needs task install, which failed" in result.stderr
    assert box.unit("web")["state"] == "waiting"
    (box.workspace / "go").touch()
    assert box.ctl("run-task", "install").returncode == 0
    assert box.ctl("wait-ready", "--timeout", "10").returncode == 0


def test_sigterm_kills_whole_process_groups(supervised):
    box = supervised("""\
    services:
      forks:
        command: sleep 310 & echo "child $!" ; exec sleep 311
        ready_when: {log_match: child}
    """)
    assert box.ctl("wait-ready", "--timeout", "10").returncode == 0
    leader = box.unit("forks")["pid"]
    child = int(next(line.split()[1] for line in (box.log_dir / "forks.log").read_text().splitlines()
                     if line.startswith("child ")))
    assert pid_alive(leader) and pid_alive(child)
    box.pids_seen.add(child)
    assert box.stop() == 0
    assert not pid_alive(leader) and not pid_alive(child)


def test_shutdown_command_stops_units_then_the_daemon(supervised):
    box = supervised("services:\n  svc:\n    command: exec sleep 300\n")
    assert box.ctl("wait-ready", "--timeout", "10").returncode == 0
    pid = box.unit("svc")["pid"]
    result = box.ctl("shutdown", "--timeout", "20")
    assert result.returncode == 0, result.stderr
    assert "stopped" in result.stdout
    assert box.proc.wait(10) == 0
    assert not pid_alive(pid) and not box.socket.exists()


def test_logs_tail_follow_and_rotation(supervised):
    box = supervised("""\
    services:
      chatty:
        command: |
          i=0; while [ $i -lt 6000 ]; do echo "line $i padding padding padding"; i=$((i+1)); done
          echo done-writing; exec sleep 300
        ready_when: {log_match: done-writing}
    """)
    assert box.ctl("wait-ready", "--timeout", "20").returncode == 0
    current = box.log_dir / "chatty.log"
    rotated = box.log_dir / "chatty.log.1"
    assert rotated.exists()
    assert current.stat().st_size <= 200000 + 65536 and rotated.stat().st_size <= 200000 + 65536
    tail = box.ctl("logs", "chatty", "--tail", "3")
    assert tail.returncode == 0
    lines = tail.stdout.splitlines()
    assert len(lines) == 3 and lines[2].startswith("[agentbox-ctl ") and "service chatty: ready" in lines[2]
    assert lines[:2] == ["line 5999 padding padding padding", "done-writing"]

    env = dict(os.environ, AGENTBOX_CTL_SOCKET=str(box.socket))
    follower = subprocess.Popen([sys.executable, str(CTL), "logs", "chatty", "--tail", "1", "--follow"],
                                stdout=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(20, follower.kill)  # a readline that never returns must not hang the suite
    watchdog.start()
    try:
        # The daemon sends the tail, then registers the follower: once the tail is here, it follows.
        assert follower.stdout.readline() == lines[2] + "\n"
        assert box.ctl("restart", "chatty").returncode == 0
        seen = [follower.stdout.readline() for _round in range(8)]  # events of the restart, then fresh output
        assert any("killed by SIGTERM" in line for line in seen), seen
        assert "line 0 padding padding padding\n" in seen, seen
    finally:
        watchdog.cancel()
        follower.kill()
        follower.wait()


def test_socket_is_private_and_a_second_daemon_refuses(supervised):
    box = supervised("services: {}\n")
    mode = stat.S_IMODE(box.socket.stat().st_mode)
    assert mode == 0o660
    second = subprocess.run([sys.executable, str(CTL), "daemon", "--config", str(box.config), "--log-dir",
                             str(box.log_dir), "--state-dir", str(box.state_dir), "--web-port", "off"],
                            env=dict(os.environ, AGENTBOX_CTL_SOCKET=str(box.socket)), capture_output=True,
                            text=True, timeout=15, check=False)
    assert second.returncode == 1 and "already answers" in second.stderr
    assert box.ctl("status").returncode == 0  # the first one is untouched


def test_cli_without_daemon_says_what_to_do(tmp_path):
    env = dict(os.environ, AGENTBOX_CTL_SOCKET=str(tmp_path / "none.sock"))
    result = subprocess.run([sys.executable, str(CTL), "status"], capture_output=True, text=True, env=env,
                            timeout=15, check=False)
    assert result.returncode == 4
    assert "no supervisor socket" in result.stderr and "agentbox-boot" in result.stderr


def test_web_port_answers_503_without_expose_and_502_before_the_service_listens(supervised):
    web_port = free_port()
    box = supervised("services:\n  plain:\n    command: exec sleep 300\n", web_port=web_port)
    code, body = http_get(web_port)
    assert code == 503 and "expose" in body
    target = free_port()
    box.write(f"services:\n  plain:\n    command: exec sleep 300\n    expose: {{port: {target}}}\n")
    assert box.ctl("reload").returncode == 0
    code, body = http_get(web_port)
    assert code == 502 and "plain" in body and str(target) in body
