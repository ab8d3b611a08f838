"""plugins/plugin_utils/_bytecode.py: the controller loads the collection's utils from Python's .pyc cache.

Each case runs in a fresh interpreter with Ansible's collection finder installed the way
ansible-playbook installs it, against a copy of the collection in a temporary directory, so the
cache starts empty and nothing of this test run's own imports leaks in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# Imports the in-process action plugin for agentbox_box as a worker would, then reports how its utils loaded.
PROBE = """
import json, sys
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.argv[1]])
import ansible_collections.agentbox.box.plugins.action.agentbox_box
names = {"_box": "box", "_box_task": "tasks", "_module": "providers", "_seed": "git"}
mods = {n: sys.modules[f"ansible_collections.agentbox.box.plugins.module_utils.{d}.{n}"] for n, d in names.items()}
mods["tasks"] = sys.modules["ansible_collections.agentbox.box.plugins.module_utils.tasks"]
report = {n: {"loader": type(m.__loader__).__name__, "file": m.__file__} for n, m in mods.items()}
try:
    import ansible_collections.agentbox.box.plugins.module_utils._no_such_util
    report["missing"] = "imported"
except ImportError as exc:
    report["missing"] = type(exc).__name__
print(json.dumps(report))
"""


def collection_copy(root: Path) -> Path:
    """A copy of the collection's plugins and metadata under root/ansible_collections/agentbox/box."""
    box = root / "ansible_collections" / "agentbox" / "box"
    box.mkdir(parents=True)
    for name in ("galaxy.yml", "meta", "plugins"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, box / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, box / name)
    return box


def probe(root: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    run = subprocess.run([sys.executable, "-c", PROBE, str(root)], capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


FOLDERS = {"_box": "box", "_box_task": "tasks", "_module": "providers", "_seed": "git"}


def test_utils_load_from_a_bytecode_cache_kept_in_the_collection(tmp_path: Path) -> None:
    box = collection_copy(tmp_path)
    cache = box / "plugins" / "module_utils" / "box" / "__pycache__"
    assert not cache.exists()

    first = probe(tmp_path)
    for name, folder in FOLDERS.items():
        assert first[name]["loader"] == "SourceFileLoader", first
        assert first[name]["file"] == str(box / "plugins" / "module_utils" / folder / f"{name}.py")
    # A folder of utils (its __init__.py) comes from the cache too.
    assert first["tasks"] == {
        "loader": "SourceFileLoader",
        "file": str(box / "plugins" / "module_utils" / "tasks" / "__init__.py"),
    }
    cached = cache / f"_box.cpython-{sys.version_info.major}{sys.version_info.minor}.pyc"
    assert cached.is_file()
    written = cached.stat().st_mtime_ns

    # The next worker reads the cache: the file is not written again while the source is unchanged.
    second = probe(tmp_path)
    assert second["_box"]["loader"] == "SourceFileLoader"
    assert cached.stat().st_mtime_ns == written

    # A name that is not a file of the collection is Ansible's to answer (here: not found).
    assert first["missing"] == "ModuleNotFoundError"


def test_an_edited_util_is_compiled_again(tmp_path: Path) -> None:
    box = collection_copy(tmp_path)
    probe(tmp_path)
    source = box / "plugins" / "module_utils" / "providers" / "_module.py"
    source.write_text(source.read_text() + "\nEDITED_MARK = 1\n")
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    check = PROBE.replace("print(json.dumps(report))", "print(json.dumps({'mark': mods['_module'].EDITED_MARK}))")
    run = subprocess.run([sys.executable, "-c", check, str(tmp_path)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"mark": 1}
