"""The set-up wizard's inspection of a workspace (`_project_scan`) and the agentbox.yaml it renders
(`_project_plan`): each kind of project gives the install task, services and test command a box needs, and
every file rendered passes the supervisor's own validator."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.agentbox.box.plugins.module_utils.core._preflight import project_text_issues
from ansible_collections.agentbox.box.plugins.module_utils.project._project_plan import (
    Plan,
    fill_in,
    marker_guard,
    render,
    unit_name,
)
from ansible_collections.agentbox.box.plugins.module_utils.project._project_scan import scan_workspace


def project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def rendered(root: Path) -> tuple[Plan, dict]:
    """The plan for `root`, and its rendered file as data, after the supervisor's validator accepted it
    without a warning."""
    plan = scan_workspace(str(root))
    text = render(plan)
    verdict = project_text_issues(text, str(root / "agentbox.yaml"))
    assert verdict == (True, []), text
    return plan, yaml.safe_load(text)


def package_json(scripts: dict[str, str], **extra: str) -> str:
    return json.dumps({"name": "app", "version": "1.0.0", "scripts": scripts, **extra})


def test_npm_lock_file_gives_npm_ci_and_the_vite_dev_server_on_its_port(tmp_path: Path) -> None:
    root = project(tmp_path, {"package.json": package_json({"dev": "vite", "test": "vitest run"}),
                              "package-lock.json": "{}"})
    plan, data = rendered(root)
    install = data["tasks"]["install"]
    assert "npm ci" in install["command"]
    assert install["run_once"]["check"] == (
        "cat package.json package-lock.json | sha256sum | cmp -s - node_modules/.agentbox-installed")
    web = data["services"]["web"]
    assert web["command"] == "exec npm run dev -- --host 127.0.0.1 --port 5173"
    assert web["needs"] == ["install"]
    assert web["ready_when"]["port"] == 5173 and web["expose"] == {"port": 5173}
    assert plan.tests == ["npm test"] and plan.web_port == 5173
    assert plan.found == ["npm (package-lock.json)", "vite dev server (port 5173)"]


def test_pnpm_and_yarn_are_installed_when_the_box_lacks_them(tmp_path: Path) -> None:
    pnpm = project(tmp_path / "p", {"package.json": package_json({"dev": "next dev -p 4000"}), "pnpm-lock.yaml": ""})
    _plan, data = rendered(pnpm)
    assert "command -v pnpm >/dev/null || sudo npm install --global" in data["tasks"]["install"]["command"]
    assert "pnpm install --frozen-lockfile" in data["tasks"]["install"]["command"]
    assert data["services"]["web"]["command"] == "exec pnpm run dev"
    assert data["services"]["web"]["ready_when"]["port"] == 4000  # the script's own -p wins over next's 3000
    berry = project(tmp_path / "y", {"package.json": package_json({"start": "react-scripts start"}), "yarn.lock": "",
                                     ".yarnrc.yml": ""})
    _plan, data = rendered(berry)
    assert "yarn install --immutable" in data["tasks"]["install"]["command"]
    assert data["services"]["web"]["ready_when"]["port"] == 3000


def test_node_server_port_is_read_from_the_file_its_script_runs(tmp_path: Path) -> None:
    root = project(tmp_path, {"package.json": package_json({"start": "node server.js",
                                                            "test": 'echo "Error: no test specified" && exit 1'}),
                              "server.js": "require('http').createServer(h).listen(process.env.PORT || 8123)\n"})
    plan, data = rendered(root)
    assert "npm install" in data["tasks"]["install"]["command"]  # no lock file
    assert data["services"]["web"]["ready_when"]["port"] == 8123
    assert plan.tests == []  # npm's placeholder test script is not a test command


def test_marker_guard_writes_the_checksum_only_after_the_install_succeeded(tmp_path: Path) -> None:
    command, check = marker_guard("false", ["lock"], "out/.marker")
    (tmp_path / "lock").write_text("v1")
    assert subprocess.run(["bash", "-c", command], cwd=tmp_path, check=False).returncode != 0
    assert not (tmp_path / "out/.marker").exists()
    command, check = marker_guard("true", ["lock"], "out/.marker")
    assert subprocess.run(["bash", "-c", check], cwd=tmp_path, check=False).returncode != 0  # not installed yet
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
    assert subprocess.run(["bash", "-c", check], cwd=tmp_path, check=False).returncode == 0  # skipped now
    (tmp_path / "lock").write_text("v2")
    assert subprocess.run(["bash", "-c", check], cwd=tmp_path, check=False).returncode != 0  # lock changed: again


def test_python_managers_uv_poetry_pip_and_plain_pyproject(tmp_path: Path) -> None:
    uv = project(tmp_path / "uv", {"pyproject.toml": "[project]\nname='a'\n[dependency-groups]\ndev=['pytest']\n",
                                   "uv.lock": ""})
    plan, data = rendered(uv)
    assert "uv sync --frozen" in data["tasks"]["install"]["command"] and plan.tests == ["uv run pytest"]
    poetry = project(tmp_path / "poetry", {"pyproject.toml": "[tool.poetry]\nname='a'\n", "poetry.lock": "",
                                           "tests/test_a.py": ""})
    plan, data = rendered(poetry)
    assert "POETRY_VIRTUALENVS_IN_PROJECT=true poetry install" in data["tasks"]["install"]["command"]
    assert plan.tests == ["poetry run python -m unittest discover -s tests"]
    pip = project(tmp_path / "pip", {"requirements.txt": "flask\n", "requirements-dev.txt": "pytest\n",
                                     "app.py": "from flask import Flask\napp = Flask(__name__)\n"})
    plan, data = rendered(pip)
    command = data["tasks"]["install"]["command"]
    assert ".venv/bin/pip install -q -r requirements-dev.txt" in command and "-r requirements.txt" in command
    assert data["services"]["web"]["command"] == (
        "exec .venv/bin/python -m flask --app app:app run --host 127.0.0.1 --port 5000")
    assert plan.tests == [".venv/bin/python -m pytest"]
    plain = project(tmp_path / "plain", {"pyproject.toml": "[project]\nname='a'\n[project.optional-dependencies]\n"
                                                           "test=['pytest']\ndocs=['sphinx']\n"})
    _plan, data = rendered(plain)
    assert ".venv/bin/pip install -q -e '.[test]'" in data["tasks"]["install"]["command"]


def test_django_and_fastapi_dev_servers(tmp_path: Path) -> None:
    django = project(tmp_path / "d", {"requirements.txt": "django\n",
                                      "manage.py": "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'x')\n"})
    _plan, data = rendered(django)
    assert data["services"]["web"]["command"] == "exec .venv/bin/python manage.py runserver 127.0.0.1:8000"
    api = project(tmp_path / "f", {"pyproject.toml": "[project]\nname='a'\n", "uv.lock": "",
                                   "main.py": "from fastapi import FastAPI\napi = FastAPI()\n"})
    _plan, data = rendered(api)
    assert data["services"]["web"]["command"] == ('export PATH="$HOME/.local/bin:$PATH"\n'
                                                  "exec uv run python -m uvicorn main:api --host 127.0.0.1 --port 8000\n")


def test_cargo_and_go_with_a_server(tmp_path: Path) -> None:
    cargo = project(tmp_path / "c", {"Cargo.toml": "[package]\nname='a'\n", "Cargo.lock": ""})
    plan, data = rendered(cargo)
    assert "cargo build --locked" in data["tasks"]["install"]["command"] and plan.tests == ["cargo test"]
    go = project(tmp_path / "g", {"go.mod": "module example.com/srv\n\ngo 1.19\n", "go.sum": "",
                                  "main.go": 'package main\n\nfunc main() { http.ListenAndServe(":9090", nil) }\n'})
    plan, data = rendered(go)
    assert "command -v go >/dev/null || {" in data["tasks"]["install"]["command"]
    assert data["services"]["web"]["command"] == "exec go run ." and plan.web_port == 9090
    assert plan.found[0] == "go module example.com/srv (go.mod, go.sum)"


def test_compose_file_runs_the_servers_and_exposes_its_web_port_not_the_database(tmp_path: Path) -> None:
    root = project(tmp_path, {
        "docker-compose.yml": "services:\n  db:\n    image: postgres\n    ports:\n      - \"5432:5432\"\n"
                              "  app:\n    build: .\n    ports:\n      - 127.0.0.1:8080:80\n",
        "requirements.txt": "flask\n", "app.py": "app = Flask(__name__)\n", "Makefile": "test:\n\tpytest\n"})
    plan, data = rendered(root)
    assert set(data["tasks"]) == {"install-python", "install-compose"}
    assert list(data["services"]) == ["compose"]  # no Flask server beside the one compose runs
    compose = data["services"]["compose"]
    assert compose["ready_when"]["port"] == 8080 and compose["expose"] == {"port": 8080}
    assert "exec $compose -f docker-compose.yml up --remove-orphans" in compose["command"]
    assert plan.tests == ["make test"]  # the project's own target wins over the guess


def test_first_level_folders_get_their_own_units_and_one_web_port(tmp_path: Path) -> None:
    root = project(tmp_path, {"frontend/package.json": package_json({"dev": "vite"}),
                              "frontend/package-lock.json": "{}",
                              "api/go.mod": "module example.com/api\n",
                              "api/main.go": 'package main\nfunc main() { http.ListenAndServe("127.0.0.1:8081", h) }\n',
                              "node_modules/x/package.json": "{}", ".hidden/go.mod": "module x\n"})
    plan, data = rendered(root)
    assert set(data["tasks"]) == {"install-api", "install-frontend"}
    assert data["tasks"]["install-frontend"]["cwd"] == "frontend"
    assert data["services"]["web-api"]["expose"] == {"port": 8081}  # the first folder's server has the web port
    assert "expose" not in data["services"]["web-frontend"]
    assert plan.tests == ["cd api && go test ./..."]


def test_unclassifiable_workspace_gets_a_minimal_file_and_says_what_to_fill_in(tmp_path: Path) -> None:
    root = project(tmp_path, {"README.md": "hello\n", "notes/todo.txt": "x\n"})
    plan, data = rendered(root)
    assert not plan.classified and data == {"tasks": {}, "services": {}}
    assert "fill in tasks.install" in fill_in(plan) and "services.web" in fill_in(plan)
    assert "# Nothing in this workspace said how to install or run it" in render(plan)


def test_a_server_whose_port_is_unknown_is_written_without_one_and_flagged(tmp_path: Path) -> None:
    root = project(tmp_path, {"package.json": package_json({"start": "node ./bin/www"})})
    plan, data = rendered(root)
    assert "ready_when" not in data["services"]["web"]
    assert fill_in(plan) == ("check by hand: services.web: the port it listens on was not found; "
                             "add ready_when.port and expose.port")


@pytest.mark.parametrize(("parts", "name"), [(("install", "my app!", ""), "install-my-app"),
                                             (("web", "-x-"), "web-x"), (("", "..."), "unit")])
def test_unit_names_are_ones_the_supervisor_accepts(parts: tuple[str, ...], name: str) -> None:
    assert unit_name(*parts) == name


def test_odd_commands_and_paths_are_quoted_so_the_file_stays_valid(tmp_path: Path) -> None:
    root = project(tmp_path, {"my app: #1/package.json": package_json({"dev": "vite --port 3001 # yes"})})
    _plan, data = rendered(root)
    assert data["services"]["web-my-app-1"]["cwd"] == "my app: #1"
    assert data["services"]["web-my-app-1"]["ready_when"]["port"] == 3001
