"""The suite's payload cache (tests/integration/support/ansiballz_cache.py, loaded by scripts/test.sh into
the Ansible processes of the pytest step): a module's payload built from the cache is the payload Ansible
builds without it, file for file, the finder runs once, and a module_utils file changed since is found again."""

from __future__ import annotations

import base64
import io
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
from ansible import constants
from ansible.executor import module_common
from ansible.plugins.loader import module_loader
from ansible.template import Templar

from tests.conftest import REPO

CACHE = REPO / "tests" / "integration" / "support" / "ansiballz_cache.py"
MODULE = "agentbox.box.agentbox_box_info"


def payload() -> dict[str, bytes]:
    """The files of the module's AnsiballZ payload, as Ansible builds it for a task (its own per-process
    cache emptied first, so every build goes through the finder)."""
    shutil.rmtree(os.path.join(constants.DEFAULT_LOCAL_TMP, "ansiballz_cache"), ignore_errors=True)
    found = module_loader.find_plugin_with_context(MODULE)
    built = module_common.modify_module(module_name="agentbox_box_info", module_path=found.plugin_resolved_path,
                                        module_args={}, templar=Templar(loader=None),
                                        task_vars={"ansible_python_interpreter": "/usr/bin/python3"})  # fmt: skip
    zipped = re.search(rb"zip_data='([A-Za-z0-9+/=]+)'", built.b_module_data)
    assert zipped, "the payload's zip was not found in the AnsiballZ wrapper"
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(zipped.group(1)))) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_a_payload_from_the_cache_is_the_one_ansible_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finds: list[str] = []
    # Ansible's own finder: under scripts/test.sh this process has the run's cache wrapped around it already.
    original = module_common.recursive_finder
    while hasattr(original, "__wrapped__"):
        original = original.__wrapped__

    def counted(*args: Any) -> Any:
        finds.append(args[1])
        return original(*args)

    monkeypatch.setattr(module_common, "recursive_finder", counted)  # put back after the test
    plain = payload()
    assert any("module_utils/providers/docker" in name for name in plain), sorted(plain)[:20]
    monkeypatch.delenv("AGENTBOX_ANSIBALLZ_CACHE", raising=False)  # under scripts/test.sh: not the run's own cache
    namespace: dict[str, Any] = {"__name__": "agentbox_ansiballz_cache"}
    exec(compile(CACHE.read_text(), str(CACHE), "exec"), namespace)  # as the .pth line of scripts/test.sh does
    namespace["install"](str(tmp_path))  # module_common is imported: wrapped at once
    finds.clear()

    first = payload()  # a miss: found, stored
    assert first == plain and len(finds) == 1
    stored = list(tmp_path.glob("*.pickle"))
    assert len(stored) == 1 and stored[0].stat().st_mode & 0o077 == 0

    second = payload()  # a hit: nothing found again
    assert second == plain and len(finds) == 1

    # A module_utils file that changed since the entry was made (its size or mtime): found again.
    metadata, files = pickle.loads(stored[0].read_bytes())
    changed = next(i for i, (name, _data, source, _stamp) in enumerate(files) if source and "agentbox" in name)
    name, data, source, (size, mtime) = files[changed]
    files[changed] = (name, data, source, (size, mtime - 1))
    stored[0].write_bytes(pickle.dumps((metadata, files)))
    third = payload()
    assert third == plain and len(finds) == 2
