"""Shared by every test: the collection on sys.path, the engine and box image (a failure when missing,
never a skip), real git workspaces to build boxes from, and the skip gate (see docs/testing.md)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from ansible.plugins.loader import init_plugin_loader

REPO = Path(__file__).resolve().parents[1]
# gRPC's default epoll1 poller aborts a child forked while a channel is live (the boxd SDK's channel,
# git and Ansible children); the poll poller does not. Set before anything imports grpc.
os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")
# Tests share one HOME, so a relay that one test's create starts would apply its default idle policy
# (at most 5 running) to every other test's boxes and pause them mid-test. Off for the suite; the
# policy's own tests (test_autopause_relay.py) run their relay under a private HOME with it on.
os.environ.setdefault("AGENTBOX_IDLE_INTERVAL", "0")
# Boxes live on the box engine (user namespaces, scripts/ensure-box-engine.sh): every test's docker
# CLI, SDK client and emulator reaches that engine, as the collection does for isolated boxes.
os.environ.setdefault("DOCKER_HOST", os.environ.get("AGENTBOX_ENGINE") or "unix:///run/agentbox-engine/docker.sock")
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))
# Every import of ansible_collections.agentbox.box goes through Ansible's own collection finder,
# installed before any test imports the collection; mixing it with plain imports breaks both.
init_plugin_loader([str(REPO / ".collections")])

# docker-py loses a short command's output now and then: it reads the reply's head through a buffered
# file, then the output from the raw socket, skipping whatever the buffer already took (docker/docker-py
# #2042, #3332; measured here at load 16-20: 5 of 200 `echo` runs came back empty with exit code 0).
# The tests read boxes through the project's own Engine API client, which reads one stream and waits
# for a late exit code; calls it does not serve (tty, stream, socket, detach, stdin) keep the SDK.
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._engine_api import local_engine  # noqa: E402

SDK_EXEC_RUN = docker.models.containers.Container.exec_run


def exec_run_whole(container: Any, cmd: str | list[str], stdout: bool = True, stderr: bool = True,
                   stdin: bool = False, tty: bool = False, privileged: bool = False, user: str = "",
                   detach: bool = False, stream: bool = False, socket: bool = False,
                   environment: dict[str, str] | list[str] | None = None, workdir: str | None = None,
                   demux: bool = False) -> Any:
    """Container.exec_run with its output read whole (see above); same arguments and result."""
    engine = local_engine(300.0) if container.client.api.base_url == "http+docker://localhost" else None
    if engine is None or not (stdout and stderr) or stdin or tty or privileged or detach or stream or socket:
        return SDK_EXEC_RUN(container, cmd, stdout=stdout, stderr=stderr, stdin=stdin, tty=tty,
                            privileged=privileged, user=user, detach=detach, stream=stream, socket=socket,
                            environment=environment, workdir=workdir, demux=demux)
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    code, out, err = engine.exec(container.id, argv, user=user, workdir=workdir, env=environment)
    output: Any = (out or None, err or None) if demux else out + err
    return docker.models.containers.ExecResult(code, output)


docker.models.containers.Container.exec_run = exec_run_whole  # type: ignore[method-assign]

BOX_UID = 1000
BOX_IMAGE = os.environ.get("AGENTBOX_TEST_BOX_IMAGE", "agentbox/box:latest")
# Root running git in a repo owned by uid 1000 needs safe.directory; set it for every git we run.
GIT_ENV = {
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_CONFIG_COUNT": "3",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    "GIT_CONFIG_KEY_1": "user.email",
    "GIT_CONFIG_VALUE_1": "test@agentbox.invalid",
    "GIT_CONFIG_KEY_2": "user.name",
    "GIT_CONFIG_VALUE_2": "agentbox test",
}


# -- the skip gate ------------------------------------------------------------------------------
# A skip is a pass that proved nothing, so every skip fails the run unless it is listed here: a
# pattern its reason must contain, and the condition under which that skip is legitimate right now.
# Name the variable (or "needs root") in the reason of a skip that belongs to one of these.
ALLOWED_SKIPS: tuple[tuple[str, Callable[[], bool], str], ...] = (
    (r"\bDAYTONA_API_KEY\b", lambda: not os.environ.get("DAYTONA_API_KEY"),
     "live Daytona tests, when DAYTONA_API_KEY is not set"),
    (r"\bBOXD_API_KEY\b", lambda: not os.environ.get("BOXD_API_KEY"),
     "live boxd tests, when BOXD_API_KEY is not set"),
    (r"^needs root\b", lambda: os.geteuid() != 0, "root-only tests (reason starting 'needs root'), when not root"),
)  # fmt: skip


def skip_refusal(reason: str) -> str | None:
    """Why this skip may not count (None when the allow-list lets it through)."""
    for pattern, legitimate_now, _what in ALLOWED_SKIPS:
        if re.search(pattern, reason):
            return None if legitimate_now() else f"the allow-list entry {pattern!r} does not apply on this machine"
    return "it is not on the allow-list (ALLOWED_SKIPS in tests/conftest.py)"


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _gate(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn a skip (or an xfail) that is not allowed into a failure that says why."""
    if not report.skipped:
        return
    if hasattr(report, "wasxfail"):
        reason, refusal = f"xfail {report.wasxfail}".strip(), "expected failures are not allowed in this suite"
    else:
        reason = _skip_reason(report)
        refusal = skip_refusal(reason)
        if refusal is None:
            return
    report.outcome = "failed"
    report.longrepr = (
        f"skip gate: this test skipped ({reason}) and the skip does not count as a pass: {refusal}. "
        "Fix what is missing (engine, image, package, set-up script) instead of skipping."
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    _gate(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    report = yield
    _gate(report)
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    allowed = len(terminalreporter.stats.get("skipped", []))
    terminalreporter.section("skip allow-list (tests/conftest.py ALLOWED_SKIPS)")
    for pattern, legitimate_now, what in ALLOWED_SKIPS:
        state = "applies here" if legitimate_now() else "does not apply here"
        terminalreporter.write_line(f"  {pattern}: {what} ({state})")
    terminalreporter.write_line(f"  {allowed} allowed skip(s) in this run; any other skip failed the run")


# -- temp base ------------------------------------------------------------------------------------
BASETEMP_PREFIX = "/tmp/agentbox-pytest-"
made_basetemp = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    # Repos under test belong to uid 1000 and the controller's git acts as their owner, so the
    # temp root must be traversable by that user (pytest's default /tmp/pytest-of-root is 0700).
    # xdist workers get their own directory under the controller's (given to them as basetemp).
    if config.option.basetemp is None and os.geteuid() == 0 and not hasattr(config, "workerinput"):
        remove_dead_runs_basetemp()
        base = Path(f"{BASETEMP_PREFIX}{os.getpid()}")
        base.mkdir(mode=0o755, exist_ok=True)
        base.chmod(0o755)
        config.option.basetemp = str(base)
        config.stash[made_basetemp] = base


def remove_dead_runs_basetemp() -> None:
    """A run that was killed leaves its base directory behind: remove those whose pytest is gone."""
    for leftover in Path(BASETEMP_PREFIX).parent.glob(Path(BASETEMP_PREFIX).name + "*"):
        pid = leftover.name.removeprefix(Path(BASETEMP_PREFIX).name)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(leftover, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    # The base directory this run made goes with it (a base given with --basetemp is the caller's).
    base = config.stash.get(made_basetemp, None)
    if base is not None:
        shutil.rmtree(base, ignore_errors=True)


# -- the engine and the box image ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """The Docker engine (DOCKER_HOST honoured). No engine fails every test that needs it."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"no Docker engine answers ({exc}); start one with scripts/ensure-docker.sh", pytrace=False)
    yield client
    client.close()


@pytest.fixture(scope="session")
def box_image(docker_client: docker.DockerClient) -> str:
    """The box image's reference; not on the engine fails every test that needs it."""
    try:
        docker_client.images.get(BOX_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the box image {BOX_IMAGE} is not on the engine; build it: "
                    "ansible-playbook playbooks/build_image.yml", pytrace=False)  # fmt: skip
    return BOX_IMAGE


def git(repo: Path | str, *args: str, check: bool = True) -> str:
    result = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **GIT_ENV}, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {result.stderr}")
    return result.stdout


def chown_tree(path: Path, uid: int = BOX_UID) -> None:
    """Test repos belong to uid 1000, as a developer's checkout would (the box user shares .git)."""
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", f"{uid}:{uid}", str(path)], check=True)


def run_module(module: str, args: dict, *, check_mode: bool = False, env: dict | None = None) -> dict:
    """Run one of the collection's modules through ansible itself; return its JSON result, with what ansible
    printed on stderr (its [WARNING] lines: the task's warnings are not in the JSON) under `_stderr`."""
    argv = [str(REPO / ".venv/bin/ansible"), "localhost", "-m", f"agentbox.box.{module}", "-a", json.dumps(args)]
    if check_mode:
        argv.append("--check")
    full_env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
        **(env or {}),
    }
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=full_env, check=False)
    # The default callback prints "localhost | CHANGED => {json}" for an ad-hoc task.
    head, _sep, body = result.stdout.partition(" => ")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise AssertionError(f"no JSON result from {module}: rc={result.returncode}\n{result.stdout}\n{result.stderr}") from exc
    payload["failed"] = "FAILED!" in head or "UNREACHABLE!" in head
    payload["_stderr"] = result.stderr
    return payload


# A test about what a module does (not how a playbook reaches it) runs the module's own `main` in a
# fresh Python with its arguments in a file, as Ansible does on the target (AnsiballZ), without the
# 1-2 s of an ansible start; at least one test of each module still goes through Ansible.
def run_module_direct(module: str, args: dict[str, Any], *, check_mode: bool = False,
                      env: dict[str, str] | None = None) -> dict[str, Any]:
    """The module's JSON result, with `failed` always there (True or False), as tests.conftest.run_module
    returns it; its warnings are in `warnings` (Ansible would print them on stderr)."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode, "_ansible_diff": True}}
    fd, args_file = tempfile.mkstemp(prefix="agentbox-module-args-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle)
    pythonpath = os.pathsep.join(p for p in (str(REPO / ".collections"), os.environ.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", f"ansible_collections.agentbox.box.plugins.modules.{module}", args_file],
            env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=REPO,
            check=False,
        )
    finally:
        os.unlink(args_file)
    try:
        result = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"{module} did not answer JSON (rc={done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}") from None  # fmt: skip
    result["failed"] = bool(result.get("failed"))
    return result


def make_repo(path: Path, files: dict[str, str | bytes] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, content in (files or {"README.md": "hello\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's tmp_path, made traversable by uid 1000 (pytest creates it 0700)."""
    for path in (tmp_path, *tmp_path.parents):
        if path == Path("/tmp") or not str(path).startswith("/tmp/"):
            break
        path.chmod(path.stat().st_mode | 0o755)
    return tmp_path


@pytest.fixture
def repo_factory(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Make git repos under a temp dir, owned by uid 1000."""
    made: list[Path] = []

    def factory(name: str = "ws", files: dict[str, str | bytes] | None = None) -> Path:
        repo = make_repo(tmp_path / name, files)
        made.append(repo)
        return repo

    yield factory
