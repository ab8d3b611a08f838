"""The daytona provider under injected faults, and its exec semantics, through the emulator and the real SDK.

Faults come from the emulator's fault rules (429/503/504 answers, persistent 500s, dropped answers after
the work was done, a proxy that cuts long calls). Nothing in the SDK is patched.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
import uuid
from collections.abc import Iterator

import docker
import pytest

from tests.daytona_emulator import running_emulator

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"


def _provider(emu, **options):
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

    return DaytonaProvider(api_key=emu.api_key, api_url=emu.api_url, **options)


def _spec(name: str, box_id: str | None = None):
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec

    box_id = box_id or uuid.uuid4().hex[:8]
    project = "f" * 16
    labels = _naming.box_labels(box=name, box_id=box_id, project=project, workspace="/nowhere", branch="",
                                image_fingerprint="", provider="daytona", engine="test")  # fmt: skip
    return BoxSpec(name=name, box_id=box_id, project=project, workspace="/nowhere", image=IMAGE, labels=labels)


class Emu:
    def __init__(self, api_url, api_key, admin):
        self.api_url, self.api_key, self.admin = api_url, api_key, admin


@pytest.fixture(scope="module")
def emu() -> Iterator[Emu]:
    if not docker.from_env().images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    with running_emulator(image=IMAGE) as (api_url, api_key, admin):
        yield Emu(api_url, api_key, admin)


@pytest.fixture(scope="module")
def box(emu: Emu) -> Iterator[str]:
    name = f"flt-{uuid.uuid4().hex[:6]}"
    provider = _provider(emu)
    provider.create(_spec(name))
    try:
        yield name
    finally:
        provider.destroy(name)


@pytest.fixture(autouse=True)
def _no_faults_left(emu: Emu) -> Iterator[None]:
    emu.admin.clear_faults()
    yield
    emu.admin.clear_faults()
    emu.admin.set_config(proxy_timeout_seconds=300, proxy_cut_mode="504")


def _count(emu: Emu, method: str, suffix: str, since: int) -> int:
    return sum(1 for r in emu.admin.requests(since) if r["method"] == method and r["path"].endswith(suffix))


def test_exec_output_exit_codes_stdin_env_workdir_user(emu: Emu, box: str) -> None:
    provider = _provider(emu)
    run = provider.exec(box, ["sh", "-c", "printf 'to out'; printf 'to err' >&2; exit 3"])
    assert (run.rc, run.stdout, run.stderr) == (3, b"to out", b"to err")
    assert provider.exec(box, ["sh", "-c", "exit 255"]).rc == 255
    assert provider.exec(box, ["no-such-command-here"]).rc == 127
    binary = bytes(range(256)) * 8
    assert provider.exec(box, ["cat"], stdin=binary).stdout == binary
    big = os.urandom(3 << 20)
    digest = provider.exec(box, ["sha256sum"], stdin=io.BytesIO(big)).text.split()[0]
    assert digest == hashlib.sha256(big).hexdigest()
    quoted = 'it\'s "quoted" $HOME `x` \\ ✓'
    assert provider.exec(box, ["printf", "%s", quoted]).stdout == quoted.encode()
    assert provider.exec(box, ["sh", "-c", 'printf %s "$A"'], env={"A": "x y=z"}).stdout == b"x y=z"
    assert provider.exec(box, ["pwd"], workdir="/etc").stdout == b"/etc\n"
    assert provider.exec(box, ["id", "-un"], user="root").stdout == b"root\n"
    assert provider.exec(box, ["id", "-un"]).stdout == b"vscode\n"
    # Nothing is left of the finished commands' stdin files.
    leftovers = provider.exec(box, ["sh", "-c", "ls /var/tmp | grep -c agentbox-in- || true"]).text.strip()
    assert leftovers == "0"


def test_long_command_outlives_the_proxy_cut(emu: Emu, box: str) -> None:
    emu.admin.set_config(proxy_timeout_seconds=2)
    from daytona import Daytona, DaytonaConfig, DaytonaTimeoutError

    sandbox = Daytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url)).get(box)
    # One plain call longer than the proxy's limit is cut with a gateway timeout...
    with pytest.raises(DaytonaTimeoutError) as cut:
        sandbox.process.exec("sleep 4")
    assert cut.value.status_code == 504
    # ...while the provider waits in slices shorter than the limit: several calls, none of them cut.
    provider = _provider(emu, exec_slice=1)
    since = len(emu.admin.requests())
    run = provider.exec(box, ["sh", "-c", "sleep 5; echo survived"])
    assert (run.rc, run.stdout) == (0, b"survived\n")
    waits = [r for r in emu.admin.requests(since) if r["method"] == "POST" and r["path"].endswith("/process/execute")]
    assert len(waits) >= 2 and all(r["status"] == 200 for r in waits), waits


@pytest.mark.parametrize("answer", ["410", "400"])
def test_an_ended_exec_session_is_made_again(emu: Emu, box: str, answer: str) -> None:
    """The box's exec session can end (an `exit` in it, a daemon that lost its shell). Its name stays
    taken, so making it again answers 409 and launching in it 410, or, from a daemon that writes the
    command into the dead shell, 400 "failed to write command": exec deletes it first, in a process that
    used it before and in a new one."""
    from daytona import Daytona, DaytonaConfig, SessionExecuteRequest

    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona_exec import EXEC_SESSION

    emu.admin.set_config(ended_session_answer=answer)
    used = _provider(emu)
    assert used.exec(box, ["echo", "before"]).stdout == b"before\n"
    sandbox = Daytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url)).get(box)

    def end_the_session() -> None:
        sandbox.process.execute_session_command(EXEC_SESSION, SessionExecuteRequest(command="exit 0", run_async=True))
        deadline = time.monotonic() + 30
        while _exec_session_alive(emu, sandbox.id):
            assert time.monotonic() < deadline, "the session's shell did not end"
            time.sleep(0.1)
        # Still listed under its name: the case a plain create cannot mend.
        assert EXEC_SESSION in [session.session_id for session in sandbox.process.list_sessions()]

    try:
        for provider in (_provider(emu), used):
            end_the_session()
            run = provider.exec(box, ["echo", "after"])
            assert (run.rc, run.stdout) == (0, b"after\n")
    finally:
        emu.admin.set_config(ended_session_answer="410")


def _exec_session_alive(emu: Emu, sandbox_id: str) -> bool:
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona_exec import EXEC_SESSION

    sessions = emu.admin.state()["sessions"]
    return any(s["sandboxId"] == sandbox_id and s["sessionId"] == EXEC_SESSION and s["alive"] for s in sessions)


def test_rate_limited_start_succeeds_after_retries(emu: Emu, box: str) -> None:
    provider = _provider(emu)
    provider.stop(box)
    since = len(emu.admin.requests())
    emu.admin.add_fault(method="POST", path="/start$", status=429, times=2)
    facts = provider.start(box)
    assert facts.state == "running"
    assert _count(emu, "POST", "/start", since) == 3


def test_gateway_timeouts_on_reads_and_exec_are_retried(emu: Emu, box: str) -> None:
    provider = _provider(emu)
    since = len(emu.admin.requests())
    emu.admin.add_fault(method="GET", path=f"/api/sandbox/{box}$", status=504, times=2)
    assert provider.find(box) is not None
    assert _count(emu, "GET", f"/api/sandbox/{box}", since) >= 3
    emu.admin.add_fault(method="POST", path="/process/execute$", status=504, times=2)
    emu.admin.add_fault(method="POST", path="/process/session/[^/]+/exec$", status=503, times=2)
    run = provider.exec(box, ["sh", "-c", "echo once >> /tmp/agentbox-once; cat /tmp/agentbox-once"])
    assert (run.rc, run.stdout) == (0, b"once\n")


def test_dropped_answer_does_not_run_a_command_twice(emu: Emu, box: str) -> None:
    provider = _provider(emu)
    provider.exec(box, ["rm", "-f", "/tmp/agentbox-twice"]).check("rm")
    # The work is done, then the connection closes: the SDK re-sends the POST by itself.
    since = len(emu.admin.requests())
    emu.admin.add_fault(method="POST", path="/process/session/[^/]+/exec$", action="drop_after", times=1)
    run = provider.exec(box, ["sh", "-c", "echo ran >> /tmp/agentbox-twice; sleep 1"])
    assert run.rc == 0
    launches = [r for r in emu.admin.requests(since) if r["path"].endswith("/exec") and "/session/" in r["path"]]
    assert len(launches) == 2 and launches[0]["status"] is None, launches
    assert provider.exec(box, ["cat", "/tmp/agentbox-twice"]).stdout == b"ran\n"


def test_rate_limited_upload_is_retried(emu: Emu, box: str) -> None:
    provider = _provider(emu)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("up.txt")
        info.size, info.mode, info.uid, info.gid = 3, 0o640, 1000, 1000
        archive.addfile(info, io.BytesIO(b"up\n"))
    emu.admin.add_fault(method="POST", path="/files/bulk-upload$", status=429, times=2)
    provider.put_archive(box, "/tmp", iter([buffer.getvalue()]))
    assert provider.exec(box, ["stat", "-c", "%a %u %s", "/tmp/up.txt"]).stdout == b"640 1000 3\n"


def test_persistent_500_fails_clearly_without_retrying(emu: Emu, box: str) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona_api import DaytonaCallError

    provider = _provider(emu)
    since = len(emu.admin.requests())
    emu.admin.add_fault(method="GET", path=f"/api/sandbox/{box}$", status=500, times=0)
    with pytest.raises(DaytonaCallError) as raised:
        provider.find(box)
    assert raised.value.status == 500
    assert _count(emu, "GET", f"/api/sandbox/{box}", since) == 1  # a 500 is not worth a retry
    text = str(raised.value)
    assert f"find of box {box!r} failed" in text and "500" in text


def test_persistent_503_gives_up_after_the_bounded_retries(emu: Emu, box: str) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona_api import (
        DEFAULT_RETRIES,
        DaytonaCallError,
    )

    provider = _provider(emu)
    since = len(emu.admin.requests())
    emu.admin.add_fault(method="POST", path="/stop$", status=503, times=0)
    with pytest.raises(DaytonaCallError) as raised:
        provider.stop(box)
    attempts = DEFAULT_RETRIES + 1
    assert raised.value.status == 503 and _count(emu, "POST", "/stop", since) == attempts
    assert f"stop of box {box!r} failed" in str(raised.value) and f"503 after {attempts} attempts" in str(raised.value)
    emu.admin.clear_faults()
    assert provider.find(box).state == "running"


def test_ambiguous_create_makes_one_sandbox(emu: Emu) -> None:
    provider = _provider(emu)
    name = f"amb-{uuid.uuid4().hex[:6]}"
    since = len(emu.admin.requests())
    emu.admin.add_fault(method="POST", path="^/api/sandbox$", action="drop_after", times=1)
    try:
        facts = provider.create(_spec(name))
        assert facts.state == "running"
        creates = [r for r in emu.admin.requests(since) if r["method"] == "POST" and r["path"] == "/api/sandbox"]
        assert len(creates) == 1 and creates[0]["status"] is None, creates  # answer dropped, never re-sent
        same = [s for s in emu.admin.state()["sandboxes"] if s["name"] == name]
        assert len(same) == 1
        assert provider.exec(name, ["true"]).rc == 0
    finally:
        provider.destroy(name)
    assert provider.find(name) is None


def test_rate_limited_create_is_asked_again_once_refused(emu: Emu) -> None:
    provider = _provider(emu)
    name = f"rl-{uuid.uuid4().hex[:6]}"
    emu.admin.add_fault(method="POST", path="^/api/sandbox$", status=429, times=1)
    try:
        assert provider.create(_spec(name)).state == "running"
        assert len([s for s in emu.admin.state()["sandboxes"] if s["name"] == name]) == 1
    finally:
        provider.destroy(name)


def test_name_taken_by_another_box_is_refused(emu: Emu, box: str) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    with pytest.raises(ProviderError, match="already exists and is not this box"):
        _provider(emu).create(_spec(box))
    assert _provider(emu).find(box).state == "running"


def test_wrong_key_is_a_clear_error(emu: Emu) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

    wrong = DaytonaProvider(api_key="not-the-key", api_url=emu.api_url)
    with pytest.raises(ProviderError, match="refused the API key"):
        wrong.find("anything")


def test_secrets_are_tmpfs_files_never_env(emu: Emu) -> None:
    provider = _provider(emu)
    name = f"sec-{uuid.uuid4().hex[:6]}"
    spec = _spec(name)
    spec.secrets = {"api_token": "s3cr3t-value", "other": "two"}
    try:
        facts = provider.create(spec)
        listing = provider.exec(name, ["sh", "-c", "stat -f -c %T /run/agentbox/secrets/; stat -c '%a %U %n' "
                                       "/run/agentbox/secrets/*"]).check("stat").text  # fmt: skip
        assert listing.splitlines() == [
            "tmpfs",
            "600 vscode /run/agentbox/secrets/api_token",
            "600 vscode /run/agentbox/secrets/other",
        ]
        assert provider.exec(name, ["cat", "/run/agentbox/secrets/api_token"]).stdout == b"s3cr3t-value"
        sandbox_env = emu.admin.sandbox_internal(facts.container).get("env") or {}
        assert "s3cr3t-value" not in repr(sandbox_env) and "s3cr3t-value" not in repr(facts.labels)
        assert b"s3cr3t-value" not in provider.exec(name, ["env"]).stdout
        # Nothing of it stays on disk (the emulator path passes the value through a /var/tmp file).
        assert provider.exec(name, ["sh", "-c", "grep -rl s3cr3t-value /var/tmp /tmp 2>/dev/null"]).stdout == b""
    finally:
        provider.destroy(name)


def test_exec_in_a_paused_or_stopped_box_says_so(emu: Emu) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = _provider(emu)
    name = f"off-{uuid.uuid4().hex[:6]}"
    provider.create(_spec(name))
    try:
        provider.stop(name)
        with pytest.raises(ProviderError, match="the box is stopped: start it"):
            provider.exec(name, ["true"])
        provider.pause(name)
        # An archived sandbox's toolbox answers 404; the message still says what is going on.
        with pytest.raises(ProviderError, match=r"the box is paused \(archived\): start it"):
            provider.exec(name, ["true"], stdin=b"x")
        assert provider.resume(name).state == "running"
        assert provider.exec(name, ["true"]).rc == 0
    finally:
        provider.destroy(name)


def test_box_from_an_image_with_resources(emu: Emu) -> None:
    """No snapshot of that name: the box is made from the image (Daytona builds it), sized as asked."""
    from tests.daytona_emulator import TEST_IMAGE, ensure_test_image, remove_test_image

    client = docker.from_env()
    built = ensure_test_image(client)
    provider = _provider(emu, auto_stop=45, auto_archive=120)
    name = f"img-{uuid.uuid4().hex[:6]}"
    spec = _spec(name)
    spec.image, spec.resources = TEST_IMAGE, {"memory": "1536m", "cpus": 1.5}
    try:
        facts = provider.create(spec)
        sandbox = next(s for s in emu.admin.state()["sandboxes"] if s["name"] == name)
        assert (sandbox["cpu"], sandbox["memory"]) == (2, 2)  # whole CPUs and GiB, rounded up
        assert (sandbox["autoStopInterval"], sandbox["autoArchiveInterval"]) == (45, 120)
        assert facts.image == TEST_IMAGE and facts.labels["image"] == TEST_IMAGE
        run = provider.exec(name, ["sh", "-c", "echo busy; echo box >&2; exit 2"])  # busybox sh and base64
        assert (run.rc, run.stdout, run.stderr) == (2, b"busy\n", b"box\n")
    finally:
        provider.destroy(name)
        if built:
            remove_test_image(client)


def test_resources_with_a_snapshot_are_refused_before_anything_is_made(emu: Emu) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    spec = _spec(f"res-{uuid.uuid4().hex[:6]}")
    spec.resources = {"memory": "2g"}
    with pytest.raises(ProviderError, match="resources cannot be set for a box started from the Daytona snapshot"):
        _provider(emu).create(spec)
    spec.resources = {"pids_limit": 100}
    with pytest.raises(ProviderError, match="pids_limit cannot be set on Daytona"):
        _provider(emu).create(spec)
    assert not [s for s in emu.admin.state()["sandboxes"] if s["name"] == spec.name]
