# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The workspace inspection behind `init.yml`: package managers and their lock files (npm, pnpm, yarn;
pip, Poetry, uv; Cargo; Go; Docker Compose), the dev server and its port, the test command.

Reads the workspace's root and its first-level directories only, each file capped, nothing executed;
the result is a `_project_plan.Plan`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from typing import Any

from ._project_plan import INSTALL_TIMEOUT_MS, Plan, Unit, marker_guard, unit_name

MAX_READ = 1 << 20  # bytes of one file read; lock files are only looked for
SKIP_DIRS = {"node_modules", "vendor", "venv", "target", "dist", "build", "docs", "doc", "site-packages", "__pycache__"}
# Ports of databases, caches and brokers: a compose file's web port is another one.
DATA_PORTS = {5432, 3306, 6379, 27017, 9200, 5672, 11211, 1433, 9092, 2181, 5984, 8086}
COMPOSE_FILES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
# Dev servers' default ports, by the program a package.json script starts.
NODE_DEFAULT_PORTS = {
    "vite": 5173, "next": 3000, "nuxt": 3000, "nuxi": 3000, "astro": 4321, "react-scripts": 3000, "ng": 4200,
    "gatsby": 8000, "webpack-dev-server": 8080, "vue-cli-service": 8080, "parcel": 1234, "remix": 3000,
    "http-server": 8080, "serve": 3000, "svelte-kit": 5173, "eleventy": 8080, "docusaurus": 3000,
}
# Programs that take --host, so the server listens where the box's checks and forwards look (127.0.0.1).
NODE_HOST_FLAG = {"vite", "astro"}
_PORT_IN_TEXT = re.compile(r"(?:--port[= ]|\s-p\s+|PORT=|listen\(\s*|PORT \|\| |PORT\s*\?\?\s*)(\d{2,5})\b")
# A tool the default box image lacks, installed by the install task when missing.
_TOOLS = {
    "pnpm": "command -v pnpm >/dev/null || sudo npm install --global --no-fund --no-audit pnpm",
    "yarn": "command -v yarn >/dev/null || sudo npm install --global --no-fund --no-audit yarn",
    "uv": 'command -v uv >/dev/null || { python3 -m venv "$HOME/.local/agentbox-uv" && '
          '"$HOME/.local/agentbox-uv/bin/pip" install -q uv && mkdir -p "$HOME/.local/bin" && '
          'ln -sf "$HOME/.local/agentbox-uv/bin/uv" "$HOME/.local/bin/uv"; }',
    "poetry": 'command -v poetry >/dev/null || { python3 -m venv "$HOME/.local/agentbox-poetry" && '
              '"$HOME/.local/agentbox-poetry/bin/pip" install -q poetry && mkdir -p "$HOME/.local/bin" && '
              'ln -sf "$HOME/.local/agentbox-poetry/bin/poetry" "$HOME/.local/bin/poetry"; }',
    "go": "command -v go >/dev/null || { sudo apt-get update -qq && sudo apt-get install -y -qq golang-go; }",
    "cargo": "command -v cargo >/dev/null || { sudo apt-get update -qq && sudo apt-get install -y -qq cargo; }",
    "compose": "docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || "
               "{ sudo apt-get update -qq && sudo apt-get install -y -qq docker-compose; }",
}
_COMPOSE = 'if docker compose version >/dev/null 2>&1; then compose="docker compose"; else compose=docker-compose; fi'
_PATH_LOCAL_BIN = 'export PATH="$HOME/.local/bin:$PATH"'


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_READ)
    except (OSError, UnicodeError):
        return ""


def _has(folder: str, *names: str) -> str:
    """The first of `names` that is a file in `folder`, or ""."""
    return next((name for name in names if os.path.isfile(os.path.join(folder, name))), "")


def _folders(root: str) -> list[str]:
    """The workspace's root ("") and its first-level directories, sorted, hidden and build ones left out."""
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError:
        return [""]
    subdirs = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)
               and not entry.name.startswith(".") and entry.name not in SKIP_DIRS]
    return ["", *subdirs]


class _Scan:
    """The findings of one workspace, folder by folder, into a Plan."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.plan = Plan()
        self.exposed = False

    def _where(self, folder: str) -> str:
        return f" in {folder}/" if folder else ""

    def add_task(self, folder: str, kind: str, tool: str, install: str, inputs: list[str], marker: str,
                 why: list[str], several: bool) -> str:
        name = unit_name("install", folder, kind if several else "")
        steps = [_TOOLS[tool]] if tool in _TOOLS else []
        if tool in ("uv", "poetry"):
            steps.insert(0, _PATH_LOCAL_BIN)
        command, check = marker_guard("\n".join([*steps, install]), inputs, marker)
        changes = f"{inputs[0]} changes" if len(inputs) == 1 else f"{', '.join(inputs[:-1])} or {inputs[-1]} change"
        why = [*why, f"Once per box, and again when {changes} ({marker} keeps the checksum);",
               "a checkpoint taken after it starts new boxes with it done."]
        self.plan.tasks.append(Unit(name=name, command=command, why=why, cwd=folder, check=check,
                                    timeout_ms=INSTALL_TIMEOUT_MS))
        return name

    def add_service(self, folder: str, base: str, command: str, port: int, why: list[str], needs: list[str],
                    stop_timeout_ms: int = 0) -> None:
        expose = bool(port) and not self.exposed
        self.exposed = self.exposed or expose
        if port:
            why = [*why, f"Ready when port {port} answers" + ("; the box's web port 80 forwards to it." if expose
                                                              else " (another service has the web port).")]
        else:
            self.plan.notes.append(f"services.{unit_name(base, folder)}: the port it listens on was not found; "
                                   "add ready_when.port and expose.port")
        self.plan.services.append(Unit(name=unit_name(base, folder), command=command, why=why, cwd=folder,
                                       port=port, expose=expose, needs=needs, stop_timeout_ms=stop_timeout_ms))

    def add_test(self, folder: str, command: str) -> None:
        self.plan.tests.append(f"cd {shlex.quote(folder)} && {command}" if folder else command)

    # ----------------------------------------------------------------------------------------- per folder

    def folder(self, folder: str) -> None:
        path = os.path.join(self.root, folder)
        compose = _has(path, *COMPOSE_FILES)
        kinds = [kind for kind, probe in (
            ("node", lambda: _has(path, "package.json")),
            ("python", lambda: _has(path, "pyproject.toml", "setup.py", "setup.cfg", "Pipfile", "requirements.txt")),
            ("rust", lambda: _has(path, "Cargo.toml")),
            ("go", lambda: _has(path, "go.mod")),
        ) if probe()]
        several = len(kinds) + bool(compose) > 1
        serve = not compose  # a compose file runs the project's servers itself
        tests_before = len(self.plan.tests)
        for kind in kinds:
            getattr(self, kind)(folder, path, several, serve)
        if compose:
            self.compose(folder, path, compose, several)
        # A Makefile's `test` target is the project's own way of running its tests: it replaces the guesses.
        if (kinds or compose) and re.search(r"(?m)^test:", _read(os.path.join(path, "Makefile"))):
            del self.plan.tests[tests_before:]
            self.add_test(folder, "make test")

    def node(self, folder: str, path: str, several: bool, serve: bool) -> None:
        package = _json(os.path.join(path, "package.json"))
        scripts = package.get("scripts") if isinstance(package.get("scripts"), dict) else {}
        declared = str(package.get("packageManager", ""))
        lock = _has(path, "pnpm-lock.yaml", "yarn.lock", "package-lock.json", "npm-shrinkwrap.json", "bun.lockb",
                    "bun.lock")
        manager = ("pnpm" if lock == "pnpm-lock.yaml" or declared.startswith("pnpm")
                   else "yarn" if lock == "yarn.lock" or declared.startswith("yarn") else "npm")
        if lock.startswith("bun"):
            self.plan.notes.append(f"{folder or '.'}/{lock}: bun is not in the box image; the install uses npm")
        berry = manager == "yarn" and _has(path, ".yarnrc.yml")
        install = {
            "npm": "npm ci --no-fund --no-audit" if lock in ("package-lock.json", "npm-shrinkwrap.json")
            else "npm install --no-fund --no-audit",
            "pnpm": "pnpm install --frozen-lockfile" if lock == "pnpm-lock.yaml" else "pnpm install",
            "yarn": ("yarn install --immutable" if berry else "yarn install --frozen-lockfile") if lock == "yarn.lock"
            else "yarn install",
        }[manager]
        inputs = ["package.json"] + ([lock] if lock and not lock.startswith("bun") else [])
        self.plan.found.append(f"{manager} ({lock or 'package.json, no lock file'}){self._where(folder)}")
        task = self.add_task(folder, "node", manager, install, inputs, "node_modules/.agentbox-installed",
                             [f"{manager}: {install.split(' --no-fund', maxsplit=1)[0]} ({lock or 'no lock file'})."], several)
        test = str(scripts.get("test", ""))
        if test and "no test specified" not in test:
            self.add_test(folder, f"{manager} test")
        script = next((name for name in ("dev", "start", "serve") if isinstance(scripts.get(name), str)), "")
        if not serve or not script:
            return
        text = scripts[script]
        program = next((word for word in re.findall(r"[\w@/.-]+", text) if word in NODE_DEFAULT_PORTS), "")
        found = _PORT_IN_TEXT.search(" " + text)
        port = int(found.group(1)) if found else NODE_DEFAULT_PORTS.get(program, 0)
        if not port and not program:  # `node server.js`: the port the file names
            main = re.search(r"\b(?:node|nodemon|tsx|ts-node)\s+([\w./-]+\.[cm]?[jt]s)\b", text)
            source = _read(os.path.join(path, main.group(1))) if main else ""
            found = _PORT_IN_TEXT.search(source)
            port = int(found.group(1)) if found else 0
        extra = f"--host 127.0.0.1{'' if found else f' --port {port}'}" if program in NODE_HOST_FLAG and port else ""
        run = f"exec {manager} run {script}" + ((" -- " if manager == "npm" else " ") + extra if extra else "")
        what = f"{program} dev server" if program else f"package.json scripts.{script}"
        self.plan.found.append(f"{what}{f' (port {port})' if port else ''}{self._where(folder)}")
        self.add_service(folder, "web", run, port, [f"The dev server: package.json scripts.{script} ({text})."],
                         [task])

    def python(self, folder: str, path: str, several: bool, serve: bool) -> None:
        pyproject = _toml(os.path.join(path, "pyproject.toml"))
        tool = pyproject.get("tool", {}) if isinstance(pyproject.get("tool"), dict) else {}
        lock = _has(path, "uv.lock", "poetry.lock", "Pipfile.lock")
        requirements = sorted(name for name in _listdir(path) if re.fullmatch(r"requirements([-_.][\w.-]+)?\.txt", name)
                              and "doc" not in name)
        if lock == "uv.lock" or (not lock and "uv" in tool):
            manager, install, runner = "uv", "uv sync --frozen" if lock else "uv sync", "uv run "
            inputs, marker = ["pyproject.toml"] + ([lock] if lock else []), ".venv/.agentbox-installed"
        elif lock == "poetry.lock" or "poetry" in tool:
            manager, install, runner = "poetry", "POETRY_VIRTUALENVS_IN_PROJECT=true poetry install", "poetry run "
            inputs, marker = ["pyproject.toml"] + ([lock] if lock else []), ".venv/.agentbox-installed"
        elif _has(path, "Pipfile"):
            manager, runner, marker = "pipenv", ".venv/bin/", ".venv/.agentbox-installed"
            install = "python3 -m venv .venv\n.venv/bin/pip install -q pipenv\n" \
                      "PIPENV_VENV_IN_PROJECT=1 .venv/bin/pipenv install --dev" + (" --deploy" if lock else "")
            inputs = ["Pipfile"] + ([lock] if lock else [])
        elif requirements:
            manager, runner, marker, inputs = "pip", ".venv/bin/", ".venv/.agentbox-installed", requirements
            install = "python3 -m venv .venv\n" + "\n".join(f".venv/bin/pip install -q -r {name}" for name in requirements)
        else:
            manager, runner, marker = "pip", ".venv/bin/", ".venv/.agentbox-installed"
            inputs = [name for name in ("pyproject.toml", "setup.py", "setup.cfg") if _has(path, name)]
            extras = _optional(pyproject)
            target = f"'.[{','.join(extras)}]'" if extras else "."
            install = f"python3 -m venv .venv\n.venv/bin/pip install -q -e {target}"
        self.plan.found.append(f"{manager} ({lock or ', '.join(inputs)}){self._where(folder)}")
        first = install.splitlines()[-1].replace(".venv/bin/", "")
        task = self.add_task(folder, "python", manager, install, inputs, marker,
                             [f"Python, {manager}: {first} (into {folder + '/' if folder else ''}.venv)."], several)
        if _uses_pytest(path, pyproject, requirements):
            self.add_test(folder, f"{runner}python -m pytest" if runner != "uv run " else "uv run pytest")
        elif os.path.isdir(os.path.join(path, "tests")):
            self.add_test(folder, f"{runner}python -m unittest discover -s tests")
        if serve:
            self._python_server(folder, path, runner, task)

    def _python_server(self, folder: str, path: str, runner: str, task: str) -> None:
        python = f"{runner}python" if runner != "uv run " else "uv run python"
        if _has(path, "manage.py") and "django" in _read(os.path.join(path, "manage.py")).lower():
            command, port, what = f"exec {python} manage.py runserver 127.0.0.1:8000", 8000, "Django runserver"
        else:
            command = what = ""
            port = 0
            for name in ("main.py", "app.py", "server.py", "wsgi.py", "asgi.py"):
                source = _read(os.path.join(path, name))
                fastapi = re.search(r"(?m)^(\w+)\s*=\s*(?:FastAPI|Starlette|Litestar)\(", source)
                flask = re.search(r"(?m)^(\w+)\s*=\s*Flask\(", source)
                if fastapi:
                    command = f"exec {python} -m uvicorn {name[:-3]}:{fastapi.group(1)} --host 127.0.0.1 --port 8000"
                    port, what = 8000, "an ASGI app (uvicorn)"
                elif flask:
                    command = f"exec {python} -m flask --app {name[:-3]}:{flask.group(1)} run --host 127.0.0.1 --port 5000"
                    port, what = 5000, "a Flask app"
                if command:
                    break
        if command:
            if runner in ("uv run ", "poetry run "):  # where the install task put the tool
                command = f"{_PATH_LOCAL_BIN}\n{command}"
            self.plan.found.append(f"{what} (port {port}){self._where(folder)}")
            self.add_service(folder, "web", command, port, [f"The dev server: {what}."], [task])

    def rust(self, folder: str, path: str, several: bool, serve: bool) -> None:
        lock = _has(path, "Cargo.lock")
        inputs = ["Cargo.toml"] + ([lock] if lock else [])
        self.plan.found.append(f"cargo ({lock or 'Cargo.toml, no lock file'}){self._where(folder)}")
        self.add_task(folder, "rust", "cargo", "cargo build" + (" --locked" if lock else ""), inputs,
                      "target/.agentbox-installed",
                      ["Rust, cargo: cargo build (dependencies fetched and compiled into target/)."], several)
        self.add_test(folder, "cargo test")

    def go(self, folder: str, path: str, several: bool, serve: bool) -> None:
        module = re.search(r"(?m)^module\s+(\S+)", _read(os.path.join(path, "go.mod")))
        inputs = ["go.mod"] + (["go.sum"] if _has(path, "go.sum") else [])
        self.plan.found.append(f"go module {module.group(1) if module else '?'} ({', '.join(inputs)}){self._where(folder)}")
        name = unit_name("install", folder, "go" if several else "")
        task = self.add_task(folder, "go", "go", "go mod download", inputs, f"$HOME/.cache/agentbox-installed/{name}",
                             ["Go: go mod download (into the module cache)."], several)
        self.add_test(folder, "go test ./...")
        if not serve:
            return
        sources = [_read(os.path.join(path, name)) for name in _listdir(path) if name.endswith(".go")
                   and not name.endswith("_test.go")]
        main = [source for source in sources if re.search(r"(?m)^package main\b", source)]
        pattern = re.compile(r"Listen(?:AndServe)?\w*\(\s*\"[\w.]*:(\d{2,5})\"")
        listen = next((found for found in map(pattern.search, main) if found), None)
        if listen:
            port = int(listen.group(1))
            self.plan.found.append(f"a Go server (port {port}){self._where(folder)}")
            self.add_service(folder, "web", "exec go run .", port, ["The server: go run . (package main)."], [task])

    def compose(self, folder: str, path: str, compose: str, several: bool) -> None:
        text = _read(os.path.join(path, compose))
        ports = _compose_ports(text)
        published = f", publishes {', '.join(map(str, sorted(ports)))}" if ports else ""
        self.plan.found.append(f"docker compose ({compose}{published}){self._where(folder)}")
        name = unit_name("install", folder, "compose" if several else "")
        task = self.add_task(folder, "compose", "compose",
                             f"{_COMPOSE}\n$compose -f {compose} pull --ignore-pull-failures --quiet\n"
                             f"$compose -f {compose} build", [compose], f"$HOME/.cache/agentbox-installed/{name}",
                             [f"Docker Compose: the images of {compose} pulled and built in the box's own Docker."],
                             several)
        self.add_service(folder, "compose", f"{_COMPOSE}\nexec $compose -f {compose} up --remove-orphans",
                         ports[0] if ports else 0, [f"The project's containers: {compose} up (stopped with the box)."],
                         [task], stop_timeout_ms=30000)


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _json(path: str) -> dict[str, Any]:
    try:
        data = json.loads(_read(path) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _toml(path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(_read(path))
    except tomllib.TOMLDecodeError:
        return {}


def _optional(pyproject: dict[str, Any]) -> list[str]:
    """The extras a developer installs (test, dev, ...), when pyproject.toml declares them."""
    project = pyproject.get("project") if isinstance(pyproject.get("project"), dict) else {}
    extras = project.get("optional-dependencies") if isinstance(project.get("optional-dependencies"), dict) else {}
    return [name for name in extras if name in ("test", "tests", "testing", "dev")]


def _uses_pytest(path: str, pyproject: dict[str, Any], requirements: list[str]) -> bool:
    if _has(path, "pytest.ini", "conftest.py") or "pytest" in pyproject.get("tool", {}):
        return True
    texts = [_read(os.path.join(path, name)) for name in (*requirements, "setup.cfg", "tox.ini", "Pipfile")]
    return "pytest" in json.dumps(pyproject) or any("pytest" in text for text in texts)


def _compose_ports(text: str) -> list[int]:
    """The host ports a compose file publishes, in order ("8000:5000", "127.0.0.1:8000:5000", published: 8000)."""
    ports = [int(found.group(1) or found.group(2)) for found in re.finditer(
        r"(?m)^\s*-\s*[\"']?(?:[\d.]+:)?(\d{2,5}):\d{1,5}(?:/\w+)?[\"']?\s*$|^\s*published:\s*[\"']?(\d{2,5})", text)]
    # The web port first: databases, caches and brokers publish theirs too.
    return sorted(ports, key=lambda port: port in DATA_PORTS)


def scan_workspace(root: str) -> Plan:
    """What a box of the workspace at `root` should install and run."""
    scan = _Scan(root)
    for folder in _folders(root):
        scan.folder(folder)
    return scan.plan
