"""Shared by every test: the collection on sys.path, and real git workspaces to build boxes from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ansible.plugins.loader import init_plugin_loader

REPO = Path(__file__).resolve().parents[1]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))
# Every import of ansible_collections.agentbox.box goes through Ansible's own collection finder,
# installed before any test imports the collection; mixing it with plain imports breaks both.
init_plugin_loader([str(REPO / ".collections")])

BOX_UID = 1000
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


def pytest_configure(config: pytest.Config) -> None:
    # Repos under test belong to uid 1000 and the controller's git acts as their owner, so the
    # temp root must be traversable by that user (pytest's default /tmp/pytest-of-root is 0700).
    if config.option.basetemp is None and os.geteuid() == 0:
        base = Path(f"/tmp/agentbox-pytest-{os.getpid()}")
        base.mkdir(mode=0o755, exist_ok=True)
        base.chmod(0o755)
        config.option.basetemp = str(base)


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
    """Run one of the collection's modules through ansible itself; return its JSON result."""
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
    return payload


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
