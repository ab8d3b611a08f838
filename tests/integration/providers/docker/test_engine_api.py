"""The standard-library Engine API client (_engine_api) that carries every task's calls, on the
real local engine: exec streams and exit codes, big stdin and output at once, archives, the
errors a task can meet, a kept-alive connection the engine dropped, forks, and the promise it
exists for: listing and running tasks import no docker SDK.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import socket
import subprocess
import sys
import tarfile
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import (  # noqa: E402
    BoxNotFound,
    EngineUnreachable,
    ProviderError,
)
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._ckpt_env import without_container_config  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._engine_api import (  # noqa: E402
    EngineAPIError,
    local_engine,
)

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
# A project label of this run only: a container left by a killed run must not show up in these listings.
PROJECT = f"engineapi-test-{uuid.uuid4().hex[:8]}"


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def box_name(box_image: str):
    """A plain labelled container (the client needs no seeded workspace)."""
    name = f"engineapi-{uuid.uuid4().hex[:8]}"
    docker(
        "run", "-d", "--name", f"agentbox-{name}", "--label", "io.agentbox.kind=box", "--label", f"io.agentbox.box={name}",
        "--label", f"io.agentbox.project={PROJECT}", "--entrypoint", "sleep", IMAGE, "infinity",
    )  # fmt: skip
    yield name
    docker("rm", "-f", "-v", f"agentbox-{name}", check=False)


@pytest.fixture()
def provider() -> DockerProvider:
    made = DockerProvider()
    assert made._direct is not None, "the local engine should be reached without the SDK"
    return made


def test_exec_streams_exit_codes_env_and_workdir(provider, box_name):
    result = provider.exec(box_name, ["sh", "-c", "printf 'out é'; printf 'err\\n' >&2; exit 7"])
    assert (result.rc, result.stdout, result.stderr) == (7, "out é".encode(), b"err\n")
    result = provider.exec(box_name, ["sh", "-c", 'echo "$GREETING" "$(pwd)" "$(id -un)"'],
                           env={"GREETING": "hi there"}, workdir="/tmp", user="root")  # fmt: skip
    assert result.stdout == b"hi there /tmp root\n"
    assert provider.exec(box_name, ["id", "-u"]).stdout == b"1000\n"  # vscode by default
    missing = provider.exec(box_name, ["/no/such/binary"])
    assert missing.rc == 127 or missing.rc == 126, missing


def test_big_stdin_and_big_output_at_once_do_not_stall(provider, box_name):
    """8 MiB in through cat while 4 MiB go to stderr: both sides stream, nothing deadlocks."""
    payload = os.urandom(8 << 20)
    script = "head -c 4194304 /dev/zero >&2; cat"
    result = provider.exec(box_name, ["sh", "-c", script], stdin=payload)
    assert result.rc == 0
    assert hashlib.sha256(result.stdout).digest() == hashlib.sha256(payload).digest()
    assert len(result.stderr) == 4 << 20
    # A command that stops reading early: its exit code is the answer, not a broken pipe.
    early = provider.exec(box_name, ["sh", "-c", "head -c 10 >/dev/null; exit 3"], stdin=io.BytesIO(payload))
    assert early.rc == 3


def test_archives_round_trip_and_missing_paths(provider, box_name):
    content = os.urandom(3 << 20)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("blob ü.bin")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    provider.put_archive(box_name, "/tmp", buffer)
    out = b"".join(provider.get_archive(box_name, "/tmp/blob ü.bin"))
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        member = tar.getmembers()[0]
        assert member.name == "blob ü.bin"
        assert tar.extractfile(member).read() == content
    with pytest.raises(ProviderError, match="does not exist in the box"):
        provider.get_archive(box_name, "/tmp/not-here")
    with pytest.raises(ProviderError, match="no-such-dir"):
        provider.put_archive(box_name, "/tmp/no-such-dir", [b"\0" * 1024])


def test_listing_and_find(provider, box_name):
    listed = [facts.name for facts in provider.list_boxes(project=PROJECT)]
    assert listed == [box_name]
    facts = provider.find(box_name)
    assert facts is not None and facts.state == "running" and facts.container == f"agentbox-{box_name}"
    assert provider.find(f"{box_name}-gone") is None


def test_missing_paused_and_stopped_boxes(provider, box_name):
    with pytest.raises(BoxNotFound, match="no box called"):
        provider.exec(f"{box_name}-gone", ["true"])
    docker("pause", f"agentbox-{box_name}")
    try:
        with pytest.raises(ProviderError, match="paused: resume it"):
            provider.exec(box_name, ["true"])
    finally:
        docker("unpause", f"agentbox-{box_name}")
    docker("stop", "-t", "0", f"agentbox-{box_name}")
    try:
        with pytest.raises(ProviderError, match="stopped: start it"):
            provider.exec(box_name, ["true"])
    finally:
        docker("start", f"agentbox-{box_name}")
    assert provider.exec(box_name, ["true"]).rc == 0


def test_unreachable_engine_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTBOX_ENGINE", f"unix://{tmp_path}/nothing.sock")
    with pytest.raises(EngineUnreachable, match=r"box engine at \S*nothing\.sock does not answer") as caught:
        DockerProvider().list_boxes()
    assert "scripts/ensure-box-engine.sh" in str(caught.value)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-user-engine.sock")  # the user's engine: isolation none
    with pytest.raises(EngineUnreachable, match=r"no-user-engine\.sock does not answer.*ensure-docker\.sh"):
        DockerProvider(isolation="none").list_boxes()
    # A socket that accepts and hangs up at once: also unreachable, never a traceback.
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "hangup.sock"))
    listener.listen(1)
    monkeypatch.setenv("AGENTBOX_ENGINE", f"unix://{tmp_path}/hangup.sock")

    def hang_up() -> None:
        conn, _addr = listener.accept()
        conn.close()

    hanger = threading.Thread(target=hang_up, daemon=True)
    hanger.start()
    try:
        with pytest.raises(EngineUnreachable, match=r"hangup\.sock"):
            DockerProvider().list_boxes()
    finally:
        hanger.join(timeout=5)
        listener.close()


@contextlib.contextmanager
def engine_over_tcp() -> Iterator[int]:
    """The local engine's socket behind a 127.0.0.1 TCP port (a plain forwarder, half-close kept),
    so DOCKER_HOST=tcp:// reaches the real engine."""
    engine_path = (os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock").removeprefix("unix://")
    listener = socket.create_server(("127.0.0.1", 0))

    def pump(source: socket.socket, target: socket.socket, done: list[int]) -> None:
        try:
            while data := source.recv(1 << 16):
                target.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)
            done.append(1)
            if len(done) == 2:
                source.close()
                target.close()

    def serve() -> None:
        while True:
            try:
                client, _peer = listener.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX)
            engine.connect(engine_path)
            done: list[int] = []
            for source, target in ((client, engine), (engine, client)):
                threading.Thread(target=pump, args=(source, target, done), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_tcp_engine_is_reached_directly_too(monkeypatch, box_name):
    payload = os.urandom(1 << 20)
    with engine_over_tcp() as port:
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{port}")
        provider = DockerProvider(isolation="none")  # DOCKER_HOST names the user's own engine
        assert provider._direct is not None and provider._direct.where == f"tcp://127.0.0.1:{port}"
        assert [facts.name for facts in provider.list_boxes(project=PROJECT)] == [box_name]
        result = provider.exec(box_name, ["sh", "-c", "cat; exit 5"], stdin=payload)
        assert result.rc == 5 and result.stdout == payload
        assert b"".join(provider.get_archive(box_name, "/etc/hostname"))


def test_which_engines_the_direct_client_takes():
    assert local_engine(5, {}) is not None
    assert local_engine(5, {"DOCKER_HOST": "unix:///run/other.sock"}).where == "unix:///run/other.sock"
    assert local_engine(5, {"DOCKER_HOST": "tcp://127.0.0.1:2375"}) is not None
    # TLS and ssh:// stay with the SDK, which knows how to set them up.
    assert local_engine(5, {"DOCKER_HOST": "tcp://127.0.0.1:2376", "DOCKER_TLS_VERIFY": "1"}) is None
    assert local_engine(5, {"DOCKER_HOST": "ssh://user@builder"}) is None


def test_dropped_keepalive_connection_is_reopened(provider, box_name):
    assert provider.exec(box_name, ["true"]).rc == 0
    shared = provider._direct._shared
    assert shared is not None and shared.sock is not None
    shared.sock.shutdown(socket.SHUT_RDWR)  # as if the engine had closed it while idle
    assert provider.exec(box_name, ["sh", "-c", "exit 4"]).rc == 4
    assert provider._direct._shared is not shared


def test_forked_child_opens_its_own_connection(provider, box_name):
    assert provider.exec(box_name, ["true"]).rc == 0
    pid = os.fork()
    if pid == 0:  # child: the inherited connection must not be used
        code = 1
        try:
            code = 0 if provider.exec(box_name, ["sh", "-c", "echo child"]).stdout == b"child\n" else 2
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert provider.exec(box_name, ["sh", "-c", "echo parent"]).stdout == b"parent\n"


def test_task_calls_import_no_docker_sdk(box_name):
    """The reason this client exists: a forked Ansible worker pays no SDK import."""
    probe = textwrap.dedent(f"""
        import sys, io, tarfile
        sys.path.insert(0, {str(REPO / ".collections")!r})
        from ansible_collections.agentbox.box.plugins.plugin_utils._providers import provider_for
        provider = provider_for("docker", "local")
        assert [f.name for f in provider.list_boxes(project={PROJECT!r})] == [{box_name!r}]
        assert provider.exec({box_name!r}, ["true"]).rc == 0
        provider.put_archive({box_name!r}, "/tmp", [bytes(10240)])
        b"".join(provider.get_archive({box_name!r}, "/etc/hostname"))
        heavy = sorted(m for m in ("docker", "requests", "urllib3", "paramiko") if m in sys.modules)
        print(",".join(heavy) or "none")
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "none"


@pytest.mark.parametrize("client", ["standard library", "docker SDK"])
def test_state_changes_through_either_client(box_name, client):
    """pause, resume, stop, start through _engine_api on the local engine, and through the SDK behind
    the same methods (_engine_sdk, what docker_ssh and TLS engines use): the same facts either way."""
    provider = DockerProvider()
    if client == "docker SDK":
        provider._direct = None  # as on an engine the standard library does not reach
    try:
        assert provider.pause(box_name).state == "paused"
        assert provider.pause(box_name).state == "paused"
        stopped = provider.stop(box_name)  # a paused box is resumed first, then stopped
        assert (stopped.state, stopped.name, stopped.container) == ("stopped", box_name, f"agentbox-{box_name}")
        with pytest.raises(ProviderError, match="only a running box can be paused"):
            provider.pause(box_name)
        assert provider.start(box_name).state == "running"
        assert provider.start(box_name).state == "running"
        assert provider.pause(box_name).state == "paused"
        assert provider.resume(box_name).state == "running"
        for change in (provider.start, provider.stop, provider.pause, provider.resume):
            with pytest.raises(BoxNotFound, match="no box called"):
                change(f"{box_name}-gone")
    finally:
        docker("unpause", f"agentbox-{box_name}", check=False)
        docker("start", f"agentbox-{box_name}", check=False)


def test_state_changes_import_no_docker_sdk(box_name):
    """A switch (pause one box, resume another) on the local engine pays no SDK import either."""
    probe = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / ".collections")!r})
        from ansible_collections.agentbox.box.plugins.plugin_utils._providers import provider_for
        provider = provider_for("docker", "local")
        assert provider.pause({box_name!r}).state == "paused"
        assert provider.resume({box_name!r}).state == "running"
        heavy = sorted(m for m in ("docker", "requests", "urllib3", "paramiko") if m in sys.modules)
        print(",".join(heavy) or "none")
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "none"


@pytest.mark.parametrize("client", ["standard library", "docker SDK"])
def test_checkpoint_image_calls_through_either_client(box_name, client):
    """The image calls of a checkpoint (commit, tag, list, load, export, import, remove) through
    _engine_api and through the SDK behind the same methods; the export is a stream of chunks."""
    provider = DockerProvider()
    if client == "docker SDK":
        provider._direct = None
    engine = provider.checkpoint_store().engine
    repository = f"agentbox-test/engineapi-{uuid.uuid4().hex[:8]}"
    mark = {"io.agentbox.test": repository}
    try:
        image_id = engine.commit_container(f"agentbox-{box_name}", repository, "one", {"Labels": mark, "Env": ["A=1"]})
        committed = engine.inspect_image(f"{repository}:one")
        assert committed["Id"] == image_id and committed["Config"]["Labels"]["io.agentbox.test"] == repository
        engine.tag_image(image_id, repository, "two")
        listed = engine.images({"label": [f"io.agentbox.test={repository}"]})
        assert sorted(tag for image in listed for tag in image["RepoTags"]) == [f"{repository}:one", f"{repository}:two"]
        cleaned = without_container_config(engine, image_id, f"{repository}:clean", ["B=2"])
        assert engine.inspect_image(f"{repository}:clean")["Config"]["Env"] == ["B=2"] and cleaned != image_id
        # The box's whole filesystem (1 GB) comes in 1 MiB chunks: the first arrives long before the rest.
        chunks = engine.export_container(f"agentbox-{box_name}")
        first = next(chunks)
        assert 0 < len(first) <= 1 << 20 and first[257:262] == b"ustar"
        chunks.close()
        sent: list[int] = []

        def filesystem() -> Iterator[bytes]:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                info = tarfile.TarInfo("hello")
                info.size = 2
                tar.addfile(info, io.BytesIO(b"hi"))
            for piece in (buffer.getvalue()[:512], buffer.getvalue()[512:]):
                sent.append(len(piece))
                yield piece

        engine.import_image(filesystem(), repository, "flat", ['LABEL "io.agentbox.test"="' + repository + '"', "CMD [\"true\"]"])
        flat = engine.inspect_image(f"{repository}:flat")
        assert flat["Config"]["Cmd"] == ["true"] and len(sent) == 2
        engine.remove_image(f"{repository}:two")
        with pytest.raises(EngineAPIError) as gone:
            engine.remove_image(f"{repository}:two")
        assert gone.value.status == 404
    finally:
        for tag in ("one", "two", "clean", "flat"):
            docker("rmi", "-f", f"{repository}:{tag}", check=False)
