"""A payload cache for the suite's Ansible processes: the module_utils an agentbox module ships, found
once per test run instead of once per process.

Each `ansible`/`ansible-playbook` start builds the AnsiballZ payload of every module it runs anew: its
cache lives in the process's own temp directory. For this collection's modules that is about 0.55 core-s
per module and process (`compile` of some 130 files to find their imports), a third of what a playbook
start costs the suite. scripts/test.sh loads this file into the venv's Ansible processes (a `.pth` line,
there only during the pytest step, like the process count) with AGENTBOX_ANSIBALLZ_CACHE set to a directory
of the run; it wraps `recursive_finder`, the step that finds and adds the module_utils:

- the key is the module's name and source, and Ansible's version;
- an entry holds the files the finder added (name in the payload, source) and each one's path, size and
  mtime on disk; a hit re-checks every one of them, so an edited module_utils file is a miss;
- extensions (Ansible's debugger, coverage) are never cached.

The payload is the same as without the cache, file for file; only the finding is skipped.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import os
import pickle
import sys
import tempfile
from typing import Any

TARGET = "ansible.executor.module_common"


def install(directory: str) -> None:
    """Wrap `recursive_finder` as soon as Ansible imports module_common (never import it earlier: the CLI
    sets Ansible up in its own order)."""
    if TARGET in sys.modules:
        wrap(sys.modules[TARGET], directory)
        return
    sys.meta_path.insert(0, Hook(directory))


class Hook(importlib.abc.MetaPathFinder):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, directory = spec.loader, self.directory
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            wrap(module, directory)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class Recorder:
    """The payload's zip as the finder sees it: every file it adds is noted, then written."""

    def __init__(self, zipped: Any, origin: Any) -> None:
        self.zipped, self.origin, self.files = zipped, origin, []

    def writestr(self, info: Any, data: Any, *args: Any, **kwargs: Any) -> None:
        tag = self.origin.get_tag(data)
        source = tag.path if tag is not None and tag.path else None
        stamp = stat_of(source) if source else None
        self.files.append((info.filename, as_bytes(data), source, stamp))
        self.zipped.writestr(info, data, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.zipped, name)


def as_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def stat_of(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_size, found.st_mtime_ns


def wrap(module_common: Any, directory: str) -> None:
    original = module_common.recursive_finder
    version = module_common.__version__

    def recursive_finder(name: str, module_fqn: str, module_data: Any, zf: Any, date_time: Any,
                         extension_manager: Any) -> Any:
        if extension_manager.extension_names:
            return original(name, module_fqn, module_data, zf, date_time, extension_manager)
        origin = module_common.Origin.get_tag(module_data)
        where = origin.path if origin is not None and origin.path else "-"  # an installed copy is its own entry
        parts = [version.encode(), module_fqn.encode(), where.encode(), as_bytes(module_data)]
        key = hashlib.sha256(b"\0".join(parts)).hexdigest()
        path = os.path.join(directory, key + ".pickle")
        entry = load(path)
        if entry is not None:
            metadata, files = entry
            for filename, data, _source, _stamp in files:
                zf.writestr(module_common._make_zinfo(filename, date_time, zf=zf), data)  # pylint: disable=protected-access
            return metadata
        recorder = Recorder(zf, module_common.Origin)
        metadata = original(name, module_fqn, module_data, recorder, date_time, extension_manager)
        store(path, (metadata, recorder.files))
        return metadata

    recursive_finder.__wrapped__ = original  # type: ignore[attr-defined]
    module_common.recursive_finder = recursive_finder


def load(path: str) -> tuple[Any, list[tuple[str, bytes, str | None, Any]]] | None:
    try:
        with open(path, "rb") as handle:
            metadata, files = pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
    if any(source and stat_of(source) != stamp for _name, _data, source, stamp in files):
        return None  # a file changed since: found again
    return metadata, files


def store(path: str, entry: Any) -> None:
    """Written whole under a temp name, then renamed: a reader sees a whole entry or none. A process that
    may not write there (a test's other user) goes on without: the cache only saves time."""
    try:
        handle = tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False, suffix=".part")
    except OSError:
        return
    try:
        with handle:
            pickle.dump(entry, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(handle.name, path)
    except OSError:
        os.unlink(handle.name)


if __name__ == "agentbox_ansiballz_cache" and os.environ.get("AGENTBOX_ANSIBALLZ_CACHE"):
    install(os.environ["AGENTBOX_ANSIBALLZ_CACHE"])
