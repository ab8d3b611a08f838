"""The docs check (issue 18, "Done when"): every shell command in README.md and docs/ is either run
here, for real, or listed in NOT_RUN with the reason it cannot run on this machine. A new command
in the docs fails this test until it is run or classified.

Commands are run as the docs say, from a temp git workspace holding a `playbooks` link to this
checkout (so `ansible-playbook playbooks/...` resolves as from the repository root; the link is in
.git/info/exclude), with a short temp HOME and box/checkpoint names made unique. Optional `[...]`
parts are kept unless they hold a placeholder (PATH, NAME...). Destroys run last. A command the docs
print twice runs once; the `ansible-doc` lines run as one `ansible-doc -t TYPE NAME...` per plugin type
(each plugin's page must be in its output). Clean-up runs the modules by their own main, not ansible.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, chown_tree, make_repo, run_module_direct

pytestmark = pytest.mark.integration

VENV_BIN = REPO / ".venv" / "bin"

# Commands that cannot run here, and why. Each entry is a regex matched against the command.
NOT_RUN: dict[str, str] = {
    r"^scripts/up\.sh": "sets the machine up (pip into .venv, apt, Docker, ~/.ansible): scripts/test.sh runs the same "
    "set-up scripts, and a test must not reinstall the venv other runs share",
    r"^ssh agentbox-": "plain ssh reads ~/.ssh/config from the passwd home, not this check's temp HOME; "
    "test_access.py runs the printed -F line, and plain `ssh agentbox-<box>` as a user whose passwd home is a temp HOME",
    r"^scripts/test\.sh": "the whole suite, which runs this very test: it is the coordinator's command (.ci/run)",
    r"^export DAYTONA_API_KEY=\.\.\.": "a placeholder for the user's own Daytona key",
    r"^ansible -i fleet\.agentbox\.yml daytona ": "needs a Daytona account; test_daytona_provider.py runs the inventory "
    "and connection against the local emulator",
    r"provider=docker_ssh|engine=builder1|-i engines\.yml": "needs an SSH-reachable Docker engine called builder1; "
    "test_docker_ssh.py runs these playbooks against engines it starts on 127.0.0.1",
    r"playbooks/reap_idle\.yml": "pauses idle Daytona boxes: needs Daytona (test_daytona_provider_reap.py runs it on the emulator)",
    r"provider=boxd|scripts/boxd-emulator|^export BOXD_": "needs the boxd emulator started in the same shell "
    "(its token and port); test_boxd_emulator.py starts scripts/boxd-emulator, the boxd provider tests use it",
    r"provider=daytona": "needs Daytona (test_daytona_provider.py and test_daytona_files.py run it on the emulator)",
    r"playbooks/agent(_login)?\.yml|-e agent=": "starts a coding agent's CLI, which needs its vendor's API (unreachable "
    "here); the agents' tests run it against a local stand-in (ANTHROPIC_BASE_URL)",
    r"playbooks/build_image\.yml": "builds the shared box image (minutes, and moves :latest under other runs); "
    "test_box_image.py runs the role into a test repository, test_build_progress.py a build",
    r"^(debootstrap|tar --numeric-owner|rm -rf /var/tmp/rootfs)": "the manual base-image recipe for a machine with no "
    "registry (a Debian mirror, minutes); the role's own debootstrap path is tested in test_box_image.py",
    r"^(K=|curl )": "needs the emulator started in the same shell (the block's $K and $E); test_daytona_emulator.py "
    "drives the same /_emulator/faults API",
    r"playbooks/best_of\.yml .*(claude|TASK\.md)": "starts coding agents' CLIs, which need their vendors' APIs "
    "(unreachable here); test_best_of.py runs best_of.yml with Claude Code against local stand-ins",
    r"pytest ": "test commands: the suite runs them",
    r"playbooks/doctor\.yml": "fails by design in the check's fresh HOME (no relay, no key yet); test_doctor.py runs it "
    "there, failing with each fix and then passing",
    r"molecule_init -e role_path=PATH|^cd PATH && molecule ": "Molecule on a role of the user's (PATH): "
    "test_molecule_scenario.py runs molecule_init.yml on a sample role, then molecule converge, verify and destroy; "
    "the inbox_supervisor gate runs molecule test with the same create.yml and destroy.yml",
    r"-e vnc=true|playbooks/screen\.yml|box_image_screen=true": "the box's screen needs the screen image, a build of its "
    "own (Chromium and the desktop): test_screen.py builds it through the role, creates a box with vnc and runs screen.yml",
    r"-e workspace=PATH|-e box=NAME|<[a-z_]+>": "a usage line with placeholders (the same playbook runs from another line)",
}
PLACEHOLDER = re.compile(r"\b(PATH|NAME|ID|STATE|PORT|N|WORKSPACE|URL)\b|\.\.\.")


def doc_commands() -> list[tuple[str, str]]:
    """(file, command) for each line of the docs' shell blocks, and each inline `ansible-doc ...`."""
    found: list[tuple[str, str]] = []
    for path in ["README.md", *sorted(glob.glob("docs/**/*.md", root_dir=REPO, recursive=True))]:
        text = (REPO / path).read_text(encoding="utf-8")
        for block in re.finditer(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
            for line in block.group(1).replace("\\\n", " ").splitlines():
                command = re.sub(r"\s+#.*$", "", line).strip()
                if command and not command.startswith("#"):
                    found.append((path, command))
        for inline in re.finditer(r"`(ansible-doc [^`]+)`", text):
            found.append((path, inline.group(1)))
    return found


def not_run_reason(command: str) -> str | None:
    return next((reason for pattern, reason in NOT_RUN.items() if re.search(pattern, command)), None)


class Runner:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.token = secrets.token_hex(3)
        self.home = Path(tempfile.mkdtemp(prefix="abh-", dir="/tmp"))  # short: the relay's socket lives under HOME
        self.workspace = make_repo(root / "ws", {"README.md": "docs\n", ".gitignore": ".env*\n"})
        (self.workspace / ".env").write_text("KEY=docs-check\n")
        (self.workspace / "playbooks").symlink_to(REPO / "playbooks")
        (self.workspace / ".git/info/exclude").write_text("playbooks\n")
        chown_tree(self.workspace)
        (self.workspace / "dev.agentbox.yml").write_text(
            f"plugin: agentbox.box.boxes\nlocal: true\ninclude: ['nc-doc-*-{self.token}']\n"
        )
        (self.workspace / "app.agentbox.yml").write_text((self.workspace / "dev.agentbox.yml").read_text())
        (self.workspace / ".git/info/exclude").write_text("playbooks\ndev.agentbox.yml\napp.agentbox.yml\n")
        self.boxes: set[str] = set()
        self.ran: list[str] = []

    def env(self) -> dict[str, str]:
        return {**os.environ, "HOME": str(self.home), "PWD": str(self.workspace), "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
                "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}  # fmt: skip

    def concrete(self, command: str) -> str:
        """Unique names for the docs' example names; optional parts kept unless they hold a placeholder."""
        command = re.sub(r"\[([^\[\]]*)\]", lambda m: "" if PLACEHOLDER.search(m.group(1)) else m.group(1), command)
        for example in ("fix-login", "api"):
            command = re.sub(rf"\bbox={example}\b", f"box=nc-doc-{example}-{self.token}", command)
        command = re.sub(r"\bcheckpoint=warm\b", f"checkpoint=warm-{self.token}", command)
        self.boxes.update(re.findall(r"box=(nc-doc-[a-z-]+-[0-9a-f]{6})", command))
        return " ".join(command.split())

    def run(self, command: str, timeout: float = 900) -> subprocess.CompletedProcess:
        argv = shlex.split(command)
        if argv[0].startswith(("ansible", "scripts/")):
            argv[0] = str(VENV_BIN / argv[0]) if argv[0].startswith("ansible") else str(REPO / argv[0])
        done = subprocess.run(argv, cwd=self.workspace, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        self.ran.append(command)
        return done

    def daytona_emulator(self, command: str) -> None:
        """`scripts/daytona-emulator --port P` in the foreground, on a free port: up, answering, stopped."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [str(REPO / "scripts/daytona-emulator"), *shlex.split(command)[1:]]
        argv[argv.index("--port") + 1] = str(port)
        with subprocess.Popen(argv, cwd=REPO, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
            deadline = time.monotonic() + 60
            up = False
            while time.monotonic() < deadline and proc.poll() is None and not up:
                with socket.socket() as client:
                    up = client.connect_ex(("127.0.0.1", port)) == 0
                if not up:
                    time.sleep(0.2)  # a port has no event to wait on: poll it, up to the deadline
            proc.terminate()
            proc.wait(30)
        assert up, f"{command}: nothing answered on 127.0.0.1:{port}"
        self.ran.append(command)

    def ansible_doc(self, commands: list[str]) -> None:
        """The `ansible-doc [-t TYPE] NAME` lines, one run per type: each NAME's page is in the output."""
        by_type: dict[str, list[str]] = {}
        for command in commands:
            argv = shlex.split(command)[1:]
            kind = argv[argv.index("-t") + 1] if "-t" in argv else "module"
            names = by_type.setdefault(kind, [])
            names += [name for name in argv if "." in name and name not in names]
        for kind, names in by_type.items():
            done = self.run(f"ansible-doc -t {kind} {' '.join(names)}")
            # A page starts "> MODULE name (path)" ("> ROLE: ..."), the name bold: *name* without colour.
            pages = [re.sub(r"\x1b\[\d+m|\*", "", page) for page in re.findall(r"^> [A-Z]+:? (\S+)", done.stdout, re.M)]
            assert sorted(pages) == sorted(names), f"ansible-doc -t {kind}: pages {pages}, asked {names}"
        self.ran.extend(commands)

    def cleanup(self) -> None:
        engine = docker.from_env()
        env = {"HOME": str(self.home)}
        for box in sorted(self.boxes):  # what the commands left (the docs' destroy_box line removes one)
            if engine.containers.list(all=True, filters={"label": f"io.agentbox.box={box}"}):
                run_module_direct("agentbox_box", {"name": box, "state": "absent", "delete_branch": True}, env=env)
        run_module_direct("agentbox_relay", {"state": "stopped"}, env=env)
        project = hashlib.sha1(str(self.workspace).encode()).hexdigest()[:16]
        for image in engine.images.list(filters={"label": f"io.agentbox.project={project}"}):
            for tag in image.tags:
                engine.images.remove(tag, force=True)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    made = Runner(tmp_path)
    yield made
    made.cleanup()


def test_every_doc_command_is_run_or_says_why_not(runner: Runner) -> None:
    commands = doc_commands()
    assert len(commands) > 20
    later: list[str] = []
    docs: list[str] = []
    unclassified: list[str] = []
    seen: set[str] = set()
    for path, raw in commands:
        if not_run_reason(raw):
            continue
        command = runner.concrete(raw)
        if command in seen:  # printed in two places: one run proves both
            continue
        seen.add(command)
        first = command.split()[0]
        if first == "ansible-doc":
            docs.append(command)
        elif first == "scripts/daytona-emulator":
            runner.daytona_emulator(command)
        elif "playbooks/destroy_box.yml" in command or "state=stopped" in command:  # the box is used later
            later.append(command)
        elif first in ("ansible-playbook", "ansible-inventory", "ansible"):
            runner.run(command)
        else:
            unclassified.append(f"{path}: {raw}")
    runner.ansible_doc(docs)
    for command in later:
        runner.run(command)
    assert not unclassified, "run these in this test or add them to NOT_RUN with the reason:\n" + "\n".join(unclassified)
    assert any("create_box.yml" in c for c in runner.ran) and any("ansible-doc" in c for c in runner.ran)
