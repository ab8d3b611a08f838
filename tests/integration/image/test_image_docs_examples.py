"""The box image has what its own examples use (issue 18): docs/agentbox-yaml.md's install task
runs `python3 -m venv .venv` and then `.venv/bin/pip`, so the image must carry python3-venv."""

from __future__ import annotations

import secrets
import subprocess

import pytest

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"


def test_python_venv_from_the_docs_example_works_in_the_image():
    name = f"agentbox-test-venv-{secrets.token_hex(4)}"
    script = "cd /tmp && python3 -m venv .venv && .venv/bin/python -m pip --version && .venv/bin/python -c 'import sys; print(sys.prefix)'"
    run = subprocess.run(
        ["docker", "run", "--rm", "--name", name, "--network", "none", "-u", "vscode", "--entrypoint", "sh", IMAGE, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "pip " in run.stdout and run.stdout.strip().endswith("/tmp/.venv")
