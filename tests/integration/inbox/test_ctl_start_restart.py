"""`agentbox-ctl start` and `restart` answer with the state the service reached, not the
'stopped' it had when the request arrived (issue 18). Real daemon, real processes, real socket."""

from __future__ import annotations

from tests.integration.inbox.test_supervisor_daemon import supervised  # noqa: F401  # pylint: disable=unused-import


def test_start_answers_with_the_state_reached(supervised):  # noqa: F811
    box = supervised("""\
    services:
      extra:
        command: exec sleep 302
        autostart: false
      slow:
        command: echo up; exec sleep 303
        autostart: false
        ready_when: {log_match: up}
    """)
    assert box.unit("extra")["state"] == "stopped"
    started = box.ctl("start", "extra")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("extra: running"), started.stdout
    assert "stopped" not in started.stdout
    slow = box.ctl("start", "slow")
    assert slow.returncode == 0, slow.stderr
    # starting (waiting for its log line) or ready: either is a state the service reached.
    assert slow.stdout.split()[1] in ("starting", "ready"), slow.stdout


def test_restart_answers_with_the_state_reached(supervised):  # noqa: F811
    box = supervised("""\
    services:
      app:
        command: exec sleep 301
    """)
    first = box.wait_state("app", ("running",), timeout=10)
    restarted = box.ctl("restart", "app")
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.startswith("app: running"), restarted.stdout
    assert "restarting" not in restarted.stdout
    assert box.unit("app")["pid"] != first["pid"]
