"""agentbox-ctl as an entry script over the package agentbox_inbox, and the package in the image's build context."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image  # noqa: E402

FILES = REPO / "roles" / "inbox_supervisor" / "files"
CTL = FILES / "agentbox-ctl"
VALID = REPO / "tests" / "fixtures" / "supervisor" / "valid" / "full.yaml"


def _shadow(where: Path) -> None:
    """Modules agentbox-ctl imports (its package, PyYAML) that fail loudly if they are ever imported."""
    package = where / "agentbox_inbox"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('shadowed agentbox_inbox imported')\n")
    (package / "cli.py").write_text("raise SystemExit('shadowed agentbox_inbox.cli imported')\n")
    (where / "yaml.py").write_text("raise SystemExit('shadowed yaml imported')\n")


def test_modules_of_the_package_stay_small() -> None:
    modules = sorted((FILES / "agentbox_inbox").glob("*.py"))
    assert {path.name for path in modules} >= {"__init__.py", "cli.py", "config.py", "supervisor.py"}
    sizes = {path.name: len(path.read_text().splitlines()) for path in modules}
    assert max(sizes.values()) <= 650, sizes
    assert len(CTL.read_text().splitlines()) <= 80


def test_neither_cwd_nor_pythonpath_can_shadow_the_package(tmp_path: Path) -> None:
    _shadow(tmp_path / "cwd")
    _shadow(tmp_path / "path")
    before = set(FILES.rglob("__pycache__"))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "path")}
    done = subprocess.run([sys.executable, str(CTL), "validate", str(VALID)], cwd=tmp_path / "cwd", env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "shadowed" not in done.stdout + done.stderr
    # Compiled per run, as the one-file program was: nothing written beside the package.
    assert set(FILES.rglob("__pycache__")) == before


def test_libraries_go_to_lib_with_mode_0644_and_count_in_the_fingerprint() -> None:
    libraries = {"agentbox_inbox/__init__.py": "", "agentbox_inbox/cli.py": "print('cli')\n"}
    parts = _image.context_from_parts("FROM x\n", {"agentbox-ctl": "#!/bin/sh\n"}, [], libraries)
    assert [(f.path, f.executable) for f in parts] == [
        ("Dockerfile", False), ("bin/agentbox-ctl", True),
        ("lib/agentbox_inbox/__init__.py", False), ("lib/agentbox_inbox/cli.py", False)]  # fmt: skip
    with tarfile.open(fileobj=_image.context_tar(parts)) as archive:
        modes = {member.name: member.mode for member in archive.getmembers()}
    assert modes["lib"] == modes["lib/agentbox_inbox"] == 0o755 and modes["lib/agentbox_inbox/cli.py"] == 0o644
    changed = _image.context_from_parts("FROM x\n", {"agentbox-ctl": "#!/bin/sh\n"}, [],
                                        {**libraries, "agentbox_inbox/cli.py": "print('cli v2')\n"})
    assert _image.compute_fingerprint(changed) != _image.compute_fingerprint(parts)


@pytest.mark.parametrize("path", ["", "/abs/x.py", "../x.py", "a/../x.py", "a//x.py", "a/./x.py", "a\\x.py"])
def test_odd_library_paths_are_refused(path: str) -> None:
    with pytest.raises(_image.ImageError, match="relative path of plain names"):
        _image.context_from_parts("FROM x\n", {}, [], {path: "data"})
