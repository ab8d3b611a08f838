"""playbooks/init.yml on real projects of four kinds, as published: a Node app with a Vite dev server (the
`create-vite` template from the npm registry), a Python package with a uv lock file (the `iniconfig` sdist from
PyPI), a Go module (Debian's `golang-github-google-uuid-dev`) and a Compose project (docker/awesome-compose's
`flask-redis`, kept in tests/fixtures/init/). Each gets the install task, services and test command its kind
calls for, in a file `agentbox-ctl validate` accepts; a second run without force refuses and keeps the file.

The registries' downloads are made once per machine, into /tmp/agentbox-init-fixtures/ (pinned versions
where the registry keeps them; Debian serves its current package)."""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.integration

VENV_BIN = REPO / ".venv" / "bin"
CACHE = Path("/tmp/agentbox-init-fixtures")
CTL = REPO / "roles" / "inbox_supervisor" / "files" / "agentbox-ctl"


def fetched(name: str, fetch: Callable[[Path], None]) -> Path:
    """CACHE/name, fetched once per machine (under a lock: pytest workers share the cache)."""
    CACHE.mkdir(exist_ok=True)
    target = CACHE / name
    with open(CACHE / ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            fetch(target)
            (target / ".complete").touch()
    return target


def run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"


def unpack(archive: Path, into: Path) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")


def vite_app(into: Path) -> None:
    run(["npm", "pack", "--silent", "create-vite@9.3.0", "--pack-destination", str(into)], into)
    unpack(into / "create-vite-9.3.0.tgz", into)


def iniconfig(into: Path) -> None:
    run([str(VENV_BIN / "pip"), "download", "-q", "--no-deps", "--no-binary", ":all:", "iniconfig==2.3.1",
         "-d", str(into)], into)  # fmt: skip
    unpack(into / "iniconfig-2.3.1.tar.gz", into)


def go_uuid(into: Path) -> None:
    run(["apt-get", "download", "-q", "golang-github-google-uuid-dev"], into)
    run(["dpkg-deb", "-x", glob.glob(str(into / "*.deb"))[0], str(into / "deb")], into)


PROJECTS: dict[str, Callable[[], Path]] = {
    "node": lambda: fetched("create-vite-9.3.0", vite_app) / "package" / "template-vanilla",
    "python": lambda: fetched("iniconfig-2.3.1", iniconfig) / "iniconfig-2.3.1",
    "go": lambda: fetched("golang-uuid", go_uuid) / "deb/usr/share/gocode/src/github.com/google/uuid",
    "compose": lambda: REPO / "tests" / "fixtures" / "init" / "flask-redis",
}


def init(workspace: Path, *extra: str) -> subprocess.CompletedProcess:
    """init.yml by path, run from the workspace as a user would."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "PWD": str(workspace)}
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            str(REPO / "playbooks" / "init.yml"), *extra]  # fmt: skip
    return subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A copy of the project of this kind (the cache and the repository's fixture stay untouched)."""
    source = PROJECTS[request.param]()
    assert source.is_dir(), f"{source} missing from the fetched package"
    return Path(shutil.copytree(source, tmp_path / source.name, ignore=shutil.ignore_patterns(".complete")))


def written(workspace: Path) -> dict:
    """The file init.yml wrote, after the supervisor's own command line accepted it."""
    checked = subprocess.run([sys.executable, str(CTL), "validate", str(workspace / "agentbox.yaml")],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return yaml.safe_load((workspace / "agentbox.yaml").read_text(encoding="utf-8"))


EXPECTED = {
    "node": {"found": "found:    npm (package.json, no lock file); vite dev server (port 5173)",
             "tests": "tests:    -", "tasks": ["install"], "services": ["web"], "web": 5173,
             "install": "npm install --no-fund --no-audit"},
    "python": {"found": "found:    uv (uv.lock)", "tests": "tests:    uv run pytest", "tasks": ["install"],
               "services": [], "web": 0, "install": "uv sync --frozen"},
    "go": {"found": "found:    go module github.com/google/uuid (go.mod)", "tests": "tests:    go test ./...",
           "tasks": ["install"], "services": [], "web": 0, "install": "go mod download"},
    "compose": {"found": "found:    pip (requirements.txt); docker compose (compose.yaml, publishes 6379, 8000)",
                "tests": "tests:    -", "tasks": ["install-python", "install-compose"], "services": ["compose"],
                "web": 8000, "install": "$compose -f compose.yaml build"},
}


@pytest.mark.parametrize("project", list(PROJECTS), indirect=True)
def test_init_writes_a_valid_file_for_each_kind_of_real_project(project: Path, request: pytest.FixtureRequest) -> None:
    kind = request.node.callspec.params["project"]
    expected = EXPECTED[kind]
    ran = init(project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"wrote: {project}/agentbox.yaml" in ran.stdout
    printed = " ".join(ran.stdout.split())  # the YAML result format folds long lines
    assert " ".join(expected["found"].split()) in printed and " ".join(expected["tests"].split()) in printed
    data = written(project)
    assert list(data["tasks"]) == expected["tasks"]
    assert list(data["services"] or {}) == expected["services"]
    install = data["tasks"][expected["tasks"][-1]]
    assert expected["install"] in install["command"] and install["command"].startswith("set -e\n")
    assert "| sha256sum | cmp -s - " in install["run_once"]["check"]  # marker-guarded
    exposed = [unit["expose"]["port"] for unit in (data["services"] or {}).values() if "expose" in unit]
    assert exposed == ([expected["web"]] if expected["web"] else [])

    before = (project / "agentbox.yaml").read_text(encoding="utf-8")
    (project / "agentbox.yaml").write_text(before + "# my own line\n", encoding="utf-8")
    again = init(project)
    assert again.returncode != 0 and "exists; nothing written: pass force=true" in " ".join(again.stdout.split())
    assert (project / "agentbox.yaml").read_text(encoding="utf-8") == before + "# my own line\n"
    forced = init(project, "-e", "force=true", "--diff")
    assert forced.returncode == 0 and "-# my own line" in forced.stdout
    assert (project / "agentbox.yaml").read_text(encoding="utf-8") == before
