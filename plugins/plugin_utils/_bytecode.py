# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Python's own bytecode cache for this collection's utils when they load in the controller.

Note that this plugin util is PRIVATE to the collection: it can change at any time.

Ansible's collection loader compiles a module_util from its source on every import, and every task
runs in a freshly forked worker: an action plugin that does its work in the controller's process
compiled the ~4,900 lines it imports on each task (0.084 s of the agentbox_box action's 0.106 s
import; 0.03-0.04 s with the cache). The finder installed here loads this collection's own module_utils and
plugin_utils with Python's standard source loader instead, which keeps a `.pyc` beside each file
(in `__pycache__`, written only when the directory is writable) and reads it back when the source
has not changed. Only files of this collection that are plain files on disk; any other name, and any
module Ansible has already loaded, stays with Ansible's loader. The cache lives in the collection's
own directory on the host, which no box can write.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

_PLUGINS = Path(__file__).parent.parent
_PACKAGE = "ansible_collections.agentbox.box.plugins."
_UTIL_DIRS = ("module_utils", "plugin_utils")


class _CollectionUtilFinder:
    """A meta-path finder for `ansible_collections.agentbox.box.plugins.{module,plugin}_utils[.folder...]._x`
    and the folders' own `__init__.py`."""

    agentbox_bytecode_cache = True

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if not fullname.startswith(_PACKAGE):
            return None
        parts = fullname[len(_PACKAGE) :].split(".")
        if len(parts) < 2 or parts[0] not in _UTIL_DIRS or not all(part.isidentifier() for part in parts):
            return None
        base = _PLUGINS.joinpath(*parts)
        source = base.with_name(f"{parts[-1]}.py")
        if source.is_file():
            return importlib.util.spec_from_file_location(fullname, source)
        init = base / "__init__.py"
        if init.is_file():  # a folder of utils: its modules are found here too
            return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(base)])
        return None


def install() -> None:
    """Put the finder just ahead of Ansible's collection finder (once per process; a forked worker
    inherits it). Without that finder nothing needs it: Python's own import caches already."""
    if any(getattr(finder, "agentbox_bytecode_cache", False) for finder in sys.meta_path):
        return
    for index, finder in enumerate(sys.meta_path):
        if type(finder).__module__.startswith("ansible.utils.collection_loader"):
            sys.meta_path.insert(index, _CollectionUtilFinder)
            return
