# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Volumes that keep editor servers warm in Docker boxes.

Per box: ~/.vscode-server and ~/.cursor-server (the server VS Code or Cursor installs on first
attach, its caches and settings) survive stop/start and go with the box. Per host user and
engine: one extensions volume per editor, mounted at <server>/extensions in every box, so an
extension installed once is there in the next box. The shared ones are kept when a box goes;
prune_checkpoints.yml lists them (and their size is the user's to reclaim with docker volume rm).
"""

from __future__ import annotations

import getpass
import json
import re

from ._naming import label

BOX_HOME = "/home/vscode"
EDITORS = {"vscode": ".vscode-server", "cursor": ".cursor-server"}
KIND_EXTENSIONS = "editor-extensions"
# What VS Code's and Cursor's Dev Containers read when attaching to a running container: be the
# box user in /workspace (so the server lands in the per-box volume, not in /root).
DEV_CONTAINER_METADATA = [{"remoteUser": "vscode", "workspaceFolder": "/workspace"}]


def _user() -> str:
    return re.sub(r"[^a-z0-9_.-]", "-", getpass.getuser().lower())[:32] or "user"


def server_volume(box: str, editor: str) -> str:
    return f"agentbox-{box}-{editor}-server"


def extensions_volume(editor: str) -> str:
    return f"agentbox-{editor}-extensions-{_user()}"


def box_volumes(box: str, volume_labels: dict[str, str]) -> list[tuple[str, str, dict[str, str]]]:
    """(volume, mount path, labels) of every editor volume a new box mounts, outer before inner.

    The per-box ones carry the box's volume labels (kind=volume, box, id, workspace, branch...):
    whatever removes a box's volumes removes them too. Not its worktree records: the box's own
    volume carries those, and a box's leftovers are cleaned once per record, not once per volume.
    The shared ones belong to no box: kind=editor-extensions, editor, user."""
    identity = {key: value for key, value in volume_labels.items() if key != label("worktrees")}
    result = []
    for editor, directory in EDITORS.items():
        server_labels = {**identity, label("editor"): editor}
        result.append((server_volume(box, editor), f"{BOX_HOME}/{directory}", server_labels))
        shared_labels = {label("kind"): KIND_EXTENSIONS, label("editor"): editor, label("user"): _user()}
        result.append((extensions_volume(editor), f"{BOX_HOME}/{directory}/extensions", shared_labels))
    return result


def per_box_volumes(box: str) -> list[str]:
    """The volumes destroy removes with the box (the shared extension volumes stay)."""
    return [server_volume(box, editor) for editor in EDITORS]


def container_labels() -> dict[str, str]:
    return {"devcontainer.metadata": json.dumps(DEV_CONTAINER_METADATA, separators=(",", ":"))}


def mount_dirs() -> list[str]:
    """Mount points the box user must own (a new volume's root belongs to root)."""
    dirs = []
    for directory in EDITORS.values():
        dirs += [f"{BOX_HOME}/{directory}", f"{BOX_HOME}/{directory}/extensions"]
    return dirs
