"""The Daytona emulator driven by the real daytona==0.226.1 SDK, with real containers behind it.

Needs a Docker engine. The sandboxes run a tiny busybox image made by the fixture (or the image named
by AGENTBOX_EMULATOR_TEST_IMAGE); every container and image is removed at the end, even on failure.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from daytona import (  # noqa: E402 - after the sys.path set-up above
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    CreateSnapshotParams,
    Daytona,
    DaytonaAuthenticationError,
    DaytonaBadRequestError,
    DaytonaConflictError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
    ListSandboxesQuery,
    Resources,
    SessionExecuteRequest,
)
from daytona.common.errors import (  # noqa: E402 - after the sys.path set-up above
    DaytonaConnectionTimeoutError,
    DaytonaFileNotFoundError,
    DaytonaInternalServerError,
    DaytonaInvalidFilePathError,
    DaytonaProcessExecutionTimeoutError,
)

from tests.daytona_emulator import (  # noqa: E402 - after the sys.path set-up above
    EMULATOR_LABEL,
    TEST_IMAGE,
    ensure_test_image,
    remove_test_image,
    running_emulator,
)
from tests.daytona_emulator.harness import AdminError  # noqa: E402
from tests.daytona_emulator.testimage import FixtureImageError  # noqa: E402

pytestmark = pytest.mark.integration


# ---- fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def sandbox_image(docker_client):
    """The image behind the emulator's default snapshot; removed at the end if this fixture made it."""
    override = os.environ.get("AGENTBOX_EMULATOR_TEST_IMAGE")
    if override:
        yield override
        return
    try:
        created = ensure_test_image(docker_client)
    except FixtureImageError as exc:
        pytest.fail(f"cannot build the emulator test image: {exc}")
    try:
        yield TEST_IMAGE
    finally:
        # Under pytest-xdist another worker may still run sandboxes from it: then it stays, as a reusable
        # 2 MB fixture image (labelled io.agentbox.test-image).
        if created and not os.environ.get("PYTEST_XDIST_WORKER"):
            remove_test_image(docker_client)


@pytest.fixture(scope="module")
def emulator_instance(sandbox_image, docker_client):
    # These tests pin each call's answer, so they start from the immediate mode (no desired-state or list lag,
    # on by default as on Daytona); a test of a habit turns it on (and the reset below turns it off again).
    with running_emulator(image=sandbox_image, desired_state_seconds=0, list_lag_seconds=0) as running:
        yield running
    label = f"{EMULATOR_LABEL}={running.admin.instance_id}"
    assert docker_client.containers.list(all=True, filters={"label": label}) == []
    assert docker_client.images.list(filters={"label": label}) == []


@pytest.fixture
def emu(emulator_instance):
    """The shared emulator, put back to a clean state (no sandboxes, faults or changed settings) after each test."""
    yield emulator_instance
    emulator_instance.admin.set_config(transition_seconds=0, list_lag_seconds=0, desired_state_seconds=0,
                                       proxy_timeout_seconds=300,
                                       proxy_cut_mode="504", minute_seconds=60)
    emulator_instance.admin.reset()


@pytest.fixture
def client(emu):
    return Daytona(_config(emu.api_url, emu.api_key))


def _config(api_url: str, api_key: str):
    from daytona import DaytonaConfig

    return DaytonaConfig(api_key=api_key, api_url=api_url)


def _name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def _container(emu, docker_client, sandbox_id: str):
    internal = emu.admin.sandbox_internal(sandbox_id)
    assert internal is not None, f"sandbox {sandbox_id} is not in the emulator"
    return docker_client.containers.get(internal["_emulator"]["containerId"])


def _instance_containers(emu, docker_client) -> list:
    return docker_client.containers.list(all=True, filters={"label": f"{EMULATOR_LABEL}={emu.admin.instance_id}"})


def _sdk_requests(emu, method: str, path_suffix: str) -> list[dict]:
    return [r for r in emu.admin.requests() if r["method"] == method and r["path"].endswith(path_suffix)]


def _wait_for_state(client, sandbox_id: str, state: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (seen := client.get(sandbox_id).state) != state:
        assert time.monotonic() < deadline, f"the sandbox never showed {state!r} (last: {seen!r})"
        time.sleep(0.05)


def _transitions_done(sandbox_id: str, timeout: float = 30) -> None:
    """Join the emulator's transition threads of this sandbox (it serves in this process)."""
    for thread in threading.enumerate():
        if thread.name == f"transition-{sandbox_id[:8]}":
            thread.join(timeout)
            assert not thread.is_alive(), f"a transition of {sandbox_id} did not end in {timeout} s"


# ---- lifecycle --------------------------------------------------------------------------------------------
def test_lifecycle_exec_files_stop_start_archive_delete(emu, client, docker_client):
    name = _name("life")
    labels = {"io.agentbox.box": name, "owner": "tests"}
    sandbox = client.create(CreateSandboxFromSnapshotParams(
        name=name, labels=labels, env_vars={"GREETING": "hello there"}, auto_stop_interval=0,
        auto_archive_interval=60))
    assert sandbox.state == "started"
    assert sandbox.labels == {**labels, "code-toolbox-language": "python"}
    assert sandbox.auto_stop_interval == 0 and sandbox.auto_archive_interval == 60
    container = _container(emu, docker_client, sandbox.id)
    assert container.status == "running"
    assert container.labels[EMULATOR_LABEL] == emu.admin.instance_id
    assert {"SYS_ADMIN", "NET_ADMIN"} <= set(container.attrs["HostConfig"]["CapAdd"])
    assert not container.attrs["HostConfig"]["Privileged"]

    by_name = client.get(name)
    by_id = client.get(sandbox.id)
    assert by_name.id == by_id.id == sandbox.id
    assert by_name.env == {"GREETING": "hello there"}

    ok = sandbox.process.exec("echo hi")
    assert (ok.exit_code, ok.result) == (0, "hi\n")
    failing = sandbox.process.exec('echo "$GREETING"; echo oops >&2; exit 3')
    assert (failing.exit_code, failing.result) == (3, "hello there\noops\n")
    in_dir = sandbox.process.exec('pwd; echo "$EXTRA"', cwd="/tmp", env={"EXTRA": "x y"})
    assert (in_dir.exit_code, in_dir.result) == (0, "/tmp\nx y\n")
    assert sandbox.process.exec("id -un").result.strip() == sandbox.user
    assert sandbox.process.exec("pwd", cwd="/no/such/dir").exit_code == -1  # never started, like the daemon

    payload = bytes(range(256)) * 1024 + os.urandom(4096)
    sandbox.fs.upload_file(payload, "/tmp/deep/dir/blob.bin")
    assert sandbox.fs.download_file("/tmp/deep/dir/blob.bin") == payload
    listing = {entry.name: entry for entry in sandbox.fs.list_files("/tmp/deep/dir")}
    assert listing["blob.bin"].size == len(payload) and not listing["blob.bin"].is_dir

    old_token = sandbox.get_preview_link(3000).token
    sandbox.stop()
    assert sandbox.state == "stopped"
    container.reload()
    assert container.status == "exited"
    with pytest.raises(DaytonaBadRequestError) as not_started:
        sandbox.stop()
    assert not_started.value.status_code == 400

    sandbox.archive()
    assert sandbox.state == "archived"
    with pytest.raises(DaytonaNotFoundError):  # the real proxy answers a misleading 404 for archived boxes
        sandbox.process.exec("true")

    sandbox.start()
    assert sandbox.state == "started"
    assert sandbox.get_preview_link(3000).token != old_token
    assert sandbox.fs.download_file("/tmp/deep/dir/blob.bin") == payload  # the filesystem survived

    client.delete(sandbox, wait=True)
    with pytest.raises(DaytonaNotFoundError):
        client.get(sandbox.id)
    assert _instance_containers(emu, docker_client) == []


def test_archive_only_from_stopped_and_start_is_idempotent(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("arch")))
    with pytest.raises(DaytonaBadRequestError, match="Sandbox is not stopped"):
        sandbox.archive()
    token = sandbox.get_preview_link(8080).token
    sandbox.start()  # no-op on a started sandbox, and no new token
    assert sandbox.state == "started"
    assert sandbox.get_preview_link(8080).token == token


def test_mutation_during_a_transition_is_409(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("busy")))
    emu.admin.set_config(transition_seconds=3)
    stopper = threading.Thread(target=sandbox.stop)
    stopper.start()
    try:
        _wait_for_state(client, sandbox.id, "stopping")
        # Still stopping (the emulator settles the state only when the transition ends): refused.
        with pytest.raises(DaytonaConflictError, match="state change in progress") as conflict:
            client.get(sandbox.id).start()
        assert conflict.value.status_code == 409
    finally:
        stopper.join(30)
    _transitions_done(sandbox.id)
    assert client.get(sandbox.id).state == "stopped"


def test_start_may_interrupt_archiving(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("unarch")))
    sandbox.stop()
    emu.admin.set_config(transition_seconds=1.5)
    sandbox.archive()  # does not wait: the SDK refreshes once and sees 'archiving'
    assert sandbox.state == "archiving"
    with pytest.raises(DaytonaConflictError):  # other mutations wait for the transition
        client.delete(client.get(sandbox.id))
    sandbox.start()
    assert sandbox.state == "started"
    _transitions_done(sandbox.id)  # the interrupted archive has ended and did not settle the state
    assert client.get(sandbox.id).state == "started"


def test_state_changes_are_pushed_over_socketio(emu, client):
    import socketio  # the SDK's own event client library (a dependency of the pinned daytona)
    base = emu.api_url[: -len("/api")]
    events: list[tuple[str, str]] = []
    listener = socketio.Client(reconnection=False)
    listener.on("sandbox.state.updated", lambda data: events.append((data["oldState"], data["newState"])))
    listener.connect(base, socketio_path="/api/socket.io/", transports=["websocket"], auth={"token": emu.api_key},
                     wait_timeout=5)
    try:
        sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("evt")))
        sandbox.stop()
        deadline = time.monotonic() + 5
        while ("stopping", "stopped") not in events and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ("creating", "started") in events
        assert events.index(("started", "stopping")) < events.index(("stopping", "stopped"))
    finally:
        listener.disconnect()
    intruder = socketio.Client(reconnection=False)
    with pytest.raises(socketio.exceptions.ConnectionError):
        intruder.connect(base, socketio_path="/api/socket.io/", transports=["websocket"],
                         auth={"token": "wrong"}, wait_timeout=5)


def test_create_from_image_with_resources_and_missing_things(emu, client, sandbox_image):
    sandbox = client.create(CreateSandboxFromImageParams(
        name=_name("img"), image=sandbox_image, resources=Resources(cpu=2, memory=2, disk=4)))
    assert (sandbox.cpu, sandbox.memory, sandbox.disk) == (2, 2, 4)
    assert sandbox.build_info.dockerfile_content == f"FROM {sandbox_image}\n"
    with pytest.raises(DaytonaBadRequestError, match="Snapshot no-such-snapshot not found"):
        client.create(CreateSandboxFromSnapshotParams(name=_name("x"), snapshot="no-such-snapshot"))
    with pytest.raises(DaytonaError, match="cannot pull"):
        client.create(CreateSandboxFromImageParams(name=_name("x"), image="agentbox-test/absent:none"), timeout=20)
    with pytest.raises(DaytonaConflictError, match="already exists"):
        client.create(CreateSandboxFromSnapshotParams(name=sandbox.name))


# ---- snapshots --------------------------------------------------------------------------------------------
def test_snapshot_create_restore_and_name_free_again_after_delete(emu, client, docker_client):
    source = client.create(CreateSandboxFromSnapshotParams(name=_name("src")))
    source.process.exec("echo carried-over > /tmp/marker")
    snapshot_name = _name("ckpt")
    source.create_snapshot(snapshot_name)
    snapshot = client.snapshot.get(snapshot_name)
    assert snapshot.state == "active" and snapshot.source_sandbox_id == source.id
    image = docker_client.images.get(snapshot.image_name)
    assert image.labels[EMULATOR_LABEL] == emu.admin.instance_id

    restored = client.create(CreateSandboxFromSnapshotParams(name=_name("dst"), snapshot=snapshot_name))
    assert restored.snapshot == snapshot_name
    assert restored.process.exec("cat /tmp/marker").result == "carried-over\n"
    assert restored.user == source.user

    with pytest.raises(DaytonaConflictError, match="already exists"):
        source.create_snapshot(snapshot_name)
    client.snapshot.delete(snapshot)
    with pytest.raises(DaytonaNotFoundError):
        client.snapshot.get(snapshot_name)
    # Unique among the snapshots that exist: the name is free again (and the restored sandbox keeps its image).
    source.create_snapshot(snapshot_name)
    again = client.snapshot.get(snapshot_name)
    assert again.id != snapshot.id and again.image_name != snapshot.image_name
    assert restored.process.exec("cat /tmp/marker").result == "carried-over\n"
    client.snapshot.delete(again)

    client.delete(restored)
    client.delete(source)
    assert not docker_client.images.list(name=snapshot.image_name.split(":")[0])  # released with its last user


def test_a_list_limit_over_200_is_refused(emu, client):
    """Daytona's @PageLimit: a page holds 1 to 200; more is a 400, not a page of 200 (the SDK checks the
    sandbox list's limit itself, so that one is asked over plain HTTP)."""
    for path in ("/sandbox", "/snapshots"):
        request = urllib.request.Request(f"{emu.api_url}{path}?limit=201",
                                         headers={"Authorization": f"Bearer {emu.api_key}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400 and b"limit must not be greater than 200" in refused.value.read()
    assert client.snapshot.list(page=1, limit=200).items


def test_snapshot_from_image_and_listing(emu, client, sandbox_image):
    made = client.snapshot.create(CreateSnapshotParams(name=_name("base"), image=sandbox_image))
    assert made.state == "active"
    names = {item.name for item in client.snapshot.list().items}
    assert made.name in names and sandbox_image in names
    with pytest.raises(DaytonaError, match="cannot pull"):
        client.snapshot.create(CreateSnapshotParams(name=_name("absent"), image="agentbox-test/absent:none"))


# ---- list -------------------------------------------------------------------------------------------------
def test_list_filters_by_labels_and_follows_cursors(emu, client):
    tag = secrets.token_hex(4)
    made = [client.create(CreateSandboxFromSnapshotParams(name=_name(f"l{i}"), labels={"batch": tag}))
            for i in range(3)]
    client.create(CreateSandboxFromSnapshotParams(name=_name("other"), labels={"batch": "other"}))
    seen = list(client.list(ListSandboxesQuery(labels={"batch": tag}, limit=1)))
    assert sorted(s.id for s in seen) == sorted(s.id for s in made)
    assert len(_sdk_requests(emu, "GET", "/api/sandbox")) >= 3  # one page per sandbox


def test_list_is_eventually_consistent_when_configured(emu, client):
    emu.admin.set_config(list_lag_seconds=2.5)
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("lag"), labels={"lag": "yes"}))
    query = ListSandboxesQuery(labels={"lag": "yes"})
    assert client.get(sandbox.name).id == sandbox.id  # get(name) sees it at once
    assert list(client.list(query)) == []
    deadline = time.monotonic() + 30
    while not (listed := list(client.list(query))):  # the index catches up once the lag has passed
        assert time.monotonic() < deadline, "the sandbox never showed up in list()"
        time.sleep(0.1)
    assert [s.id for s in listed] == [sandbox.id]
    client.delete(sandbox)
    lingering = list(client.list(query))
    assert [(s.id, s.state) for s in lingering] == [(sandbox.id, "destroyed")]


# ---- auth and faults --------------------------------------------------------------------------------------
def test_wrong_api_key_is_401(emu):
    intruder = Daytona(_config(emu.api_url, "not-the-key"))
    with pytest.raises(DaytonaAuthenticationError) as denied:
        intruder.get("anything")
    assert denied.value.status_code == 401


def test_injected_429_and_504_are_answered_and_then_clear(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("flt")))
    emu.admin.add_fault(method="GET", path=f"^/api/sandbox/{sandbox.id}$", action="status", status=429,
                        headers={"X-RateLimit-Remaining": "0"}, times=1)
    with pytest.raises(DaytonaRateLimitError) as limited:
        client.get(sandbox.id)
    assert limited.value.status_code == 429 and limited.value.headers.get("X-RateLimit-Remaining") == "0"
    assert client.get(sandbox.id).id == sandbox.id  # the rule fired once

    # With Retry-After, urllib3 under the SDK quietly retries an idempotent call itself (after the wait).
    emu.admin.clear_requests()
    emu.admin.add_fault(method="GET", path=f"^/api/sandbox/{sandbox.id}$", action="status", status=429,
                        headers={"Retry-After": "1"}, times=1)
    began = time.monotonic()
    assert client.get(sandbox.id).id == sandbox.id
    assert time.monotonic() - began >= 1
    assert [r["status"] for r in _sdk_requests(emu, "GET", f"/api/sandbox/{sandbox.id}")] == [429, 200]
    # ... but not a POST: the 429 reaches the caller.
    emu.admin.add_fault(method="POST", path=f"/api/sandbox/{sandbox.id}/stop$", action="status", status=429,
                        headers={"Retry-After": "1"}, times=1)
    with pytest.raises(DaytonaRateLimitError):
        sandbox.stop()
    assert client.get(sandbox.id).state == "started"

    emu.admin.add_fault(method="POST", path="/process/execute$", action="status", status=504, times=1)
    with pytest.raises(DaytonaTimeoutError) as gateway:
        sandbox.process.exec("touch /tmp/ran")
    assert gateway.value.status_code == 504
    assert sandbox.process.exec("test -e /tmp/ran").exit_code == 1  # a status fault does no work
    assert [rule["fired"] for rule in emu.admin.faults()] == [1, 1, 1, 1]


def test_persistent_500_fails_every_time(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("p500")))
    rule = emu.admin.add_fault(path=f"/api/sandbox/{sandbox.id}/start$", status=500, times=0)
    for _attempt in range(3):
        with pytest.raises(DaytonaInternalServerError):
            sandbox.start()
    assert next(r for r in emu.admin.faults() if r["id"] == rule["id"])["fired"] == 3


def test_slow_responses_hit_the_client_timeout(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("slow")))
    emu.admin.add_fault(method="GET", path=f"^/api/sandbox/{sandbox.id}$", action="delay", delay=1.5, times=1)
    began = time.monotonic()
    assert client.get(sandbox.id).id == sandbox.id
    assert time.monotonic() - began >= 1.5
    emu.admin.add_fault(method="POST", path=f"/api/sandbox/{sandbox.id}/autostop/", action="delay", delay=3,
                        times=1)
    with pytest.raises(DaytonaConnectionTimeoutError):
        sandbox.set_autostop_interval(5, request_timeout=1)


def test_connection_dropped_mid_call(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("drop")))
    emu.admin.add_fault(method="POST", path=f"/api/sandbox/{sandbox.id}/stop$", action="truncate", times=1)
    with pytest.raises(DaytonaConnectionError):
        sandbox.stop()
    # The work was done before the answer broke: the sandbox did stop.
    assert client.get(sandbox.id).state == "stopped"


def test_dropped_connections_and_what_the_sdk_retries_by_itself(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("rd")))
    # A drop before any work on a control-plane POST reaches the caller, and nothing happened.
    emu.admin.add_fault(method="POST", path=f"/api/sandbox/{sandbox.id}/stop$", action="drop", times=1)
    with pytest.raises(DaytonaConnectionError):
        sandbox.stop()
    assert client.get(sandbox.id).state == "started"
    # The same drop on a GET is retried by urllib3 under the SDK: the caller never sees it.
    emu.admin.add_fault(method="GET", path=f"^/api/sandbox/{sandbox.id}$", action="drop", times=1)
    assert client.get(sandbox.id).id == sandbox.id
    # Toolbox calls retry RemoteDisconnected even for POST: an answer lost after the work runs it twice.
    emu.admin.add_fault(method="POST", path="/process/execute$", action="drop_after", times=1)
    assert sandbox.process.exec("echo ran >> /tmp/runs").exit_code == 0
    assert sandbox.process.exec("cat /tmp/runs").result == "ran\nran\n"


def test_ambiguous_create_makes_one_sandbox(emu, client):
    name = _name("amb")
    emu.admin.add_fault(method="POST", path="^/api/sandbox$", action="drop_after", times=1)
    with pytest.raises(DaytonaConnectionError):
        client.create(CreateSandboxFromSnapshotParams(name=name, labels={"amb": name}))
    found = client.get(name)  # look it up by name instead of creating again
    assert found.state == "started"
    assert [s.id for s in client.list(ListSandboxesQuery(labels={"amb": name}))] == [found.id]
    creates = _sdk_requests(emu, "POST", "/api/sandbox")
    assert [(r["status"], r["outcome"]) for r in creates] == [(None, "fault:drop_after")]


def test_bad_fault_rule_is_refused(emu):
    with pytest.raises(AdminError) as refused:
        emu.admin.add_fault(path="(", status=500)
    assert refused.value.status == 400 and "regex" in refused.value.body


# ---- toolbox ----------------------------------------------------------------------------------------------
def test_session_command_outlives_the_proxy_cut(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("sess")))
    process = sandbox.process
    process.create_session("long")
    setup = process.execute_session_command("long", SessionExecuteRequest(command="cd /tmp && export STEP=two"))
    assert setup.exit_code == 0

    emu.admin.set_config(proxy_timeout_seconds=2)
    with pytest.raises(DaytonaTimeoutError) as cut:
        sandbox.process.exec("sleep 8; echo late")
    assert cut.value.status_code == 504
    assert _sdk_requests(emu, "POST", "/process/execute")[-1]["status"] == 504  # the proxy cut it, not the client

    began = time.monotonic()
    started = process.execute_session_command(
        "long", SessionExecuteRequest(command='sleep 3; echo "$STEP in $(pwd)"; echo warn >&2; false', run_async=True))
    assert started.exit_code is None
    polls = 0
    while (command := process.get_session_command("long", started.cmd_id)).exit_code is None:
        assert time.monotonic() - began < 60, "the session command never finished"
        polls += 1
        time.sleep(0.25)
    assert polls > 0  # it was still running after the answer: longer than the cut, and it finished
    assert command.exit_code == 1
    logs = process.get_session_command_logs("long", started.cmd_id)
    assert (logs.stdout, logs.stderr) == ("two in /tmp\n", "warn\n")

    process.execute_session_command("long", SessionExecuteRequest(command="sleep 300 &", run_async=True))
    process.delete_session("long")  # deleting a session kills what it started
    assert "sleep 300" not in sandbox.process.exec("ps -o args").result


def test_exec_timeout_is_408_and_kills_the_command(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("tmo")))
    with pytest.raises(DaytonaProcessExecutionTimeoutError) as timed_out:
        sandbox.process.exec("sleep 120", timeout=1)
    assert timed_out.value.status_code == 408
    assert "sleep 120" not in sandbox.process.exec("ps -o args").result


def test_file_operations_and_errors(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("fs")))
    fs = sandbox.fs
    with pytest.raises(DaytonaFileNotFoundError):
        fs.download_file("/tmp/none.txt")
    fs.create_folder("/tmp/made/inner", "0750")
    with pytest.raises(DaytonaInvalidFilePathError):
        fs.download_file("/tmp/made")
    info = fs.get_file_info("/tmp/made/inner")
    assert info.is_dir and info.permissions == "0750" and info.owner == sandbox.user
    fs.upload_file(b"relative\n", "notes.txt")  # relative to the work dir
    assert fs.download_file(f"{sandbox.get_work_dir()}/notes.txt") == b"relative\n"
    fs.move_files(f"{sandbox.get_work_dir()}/notes.txt", "/tmp/made/notes.txt")
    assert [e.name for e in fs.list_files("/tmp/made")] == ["inner", "notes.txt"]
    with pytest.raises(DaytonaBadRequestError):
        fs.delete_file("/tmp/made")
    fs.delete_file("/tmp/made", recursive=True)
    with pytest.raises(DaytonaFileNotFoundError):
        fs.get_file_info("/tmp/made")
    assert sandbox.get_user_home_dir() == sandbox.process.exec('printf %s "$HOME"').result


def test_stopped_sandbox_refuses_toolbox_calls(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("off")))
    sandbox.stop()
    with pytest.raises(DaytonaBadRequestError, match="Is the Sandbox started"):
        sandbox.process.exec("true")


def test_preview_urls_follow_the_rotating_token(emu, client):
    sandbox = client.create(CreateSandboxFromSnapshotParams(name=_name("web")))
    # busybox httpd in the test image; python's http.server in images without it (like the box image).
    serve = ("mkdir -p /tmp/www && echo page-one > /tmp/www/index.html && if command -v httpd >/dev/null; "
             "then httpd -p 8080 -h /tmp/www; else cd /tmp/www && nohup python3 -m http.server 8080 "
             ">/dev/null 2>&1 & fi")
    assert sandbox.process.exec(serve).exit_code == 0
    link = sandbox.get_preview_link(8080)
    assert _fetch(link.url + "/index.html", {"x-daytona-preview-token": link.token}) == (200, b"page-one\n")
    assert _fetch(link.url + "/index.html", {"x-daytona-preview-token": "stale"})[0] == 401
    signed = sandbox.create_signed_preview_url(8080, expires_in_seconds=120)
    assert _fetch(signed.url + "/index.html", {}) == (200, b"page-one\n")

    sandbox.stop()
    sandbox.start()
    assert sandbox.process.exec(serve).exit_code == 0
    fresh = sandbox.get_preview_link(8080)
    assert fresh.token != link.token
    assert _fetch(fresh.url + "/index.html", {"x-daytona-preview-token": link.token})[0] == 401
    assert _fetch(fresh.url + "/index.html", {"x-daytona-preview-token": fresh.token}) == (200, b"page-one\n")
    sandbox.expire_signed_preview_url(8080, signed.token)
    assert _fetch(signed.url + "/index.html", {})[0] == 401


def _fetch(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """GET through the emulator's preview proxy; a 502 (server in the box not up yet) is retried briefly."""
    deadline = time.monotonic() + 10
    while True:
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            if exc.code != 502 or time.monotonic() > deadline:
                return exc.code, exc.read()
        time.sleep(0.2)


# ---- timers -----------------------------------------------------------------------------------------------
def test_auto_stop_then_auto_archive(emu, client, docker_client):
    emu.admin.set_config(minute_seconds=0.5)
    sandbox = client.create(CreateSandboxFromSnapshotParams(
        name=_name("idle"), auto_stop_interval=1, auto_archive_interval=2))
    container = _container(emu, docker_client, sandbox.id)
    deadline = time.monotonic() + 30
    states = []
    while "archived" not in states:
        assert time.monotonic() < deadline, f"states seen: {states}"
        state = client.get(sandbox.id).state
        if not states or states[-1] != state:
            states.append(state)
        time.sleep(0.1)
    assert states[0] == "started" and "stopped" in states
    container.reload()
    assert container.status == "exited"


# ---- the launcher -----------------------------------------------------------------------------------------
def test_launcher_serves_the_sdk_and_cleans_up(sandbox_image, docker_client):
    with running_emulator(mode="subprocess", image=sandbox_image) as (api_url, api_key, admin):
        assert api_url.startswith("http://127.0.0.1:") and api_url.endswith("/api")
        remote = Daytona(_config(api_url, api_key))
        sandbox = remote.create(CreateSandboxFromSnapshotParams(name=_name("cli")))
        assert sandbox.process.exec("echo via-launcher").result == "via-launcher\n"
        label = f"{EMULATOR_LABEL}={admin.instance_id}"
        assert len(docker_client.containers.list(filters={"label": label})) == 1
    assert docker_client.containers.list(all=True, filters={"label": label}) == []
