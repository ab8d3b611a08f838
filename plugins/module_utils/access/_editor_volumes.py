# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Volumes that keep editor servers warm in Docker boxes.

Per box: ~/.vscode-server and ~/.cursor-server (the server VS Code or Cursor installs on first
attach, its caches, settings and extensions) survive stop/start and go with the box. Nothing an
editor loads is shared between boxes: an extension one box planted in a shared volume would run in
another box's editor server. Extension volumes shared by earlier versions are no longer mounted;
prune_checkpoints.yml lists them (the user's to reclaim with docker volume rm).
"""

from __future__ import annotations

import json

from ..core._naming import label

BOX_HOME = "/home/vscode"
EDITORS = {"vscode": ".vscode-server", "cursor": ".cursor-server"}
# What VS Code's and Cursor's Dev Containers read when attaching to a running container: be the
# box user in /workspace (so the server lands in the per-box volume, not in /root).
DEV_CONTAINER_METADATA = [{"remoteUser": "vscode", "workspaceFolder": "/workspace"}]


def server_volume(box: str, editor: str) -> str:
    return f"agentbox-{box}-{editor}-server"


def box_volumes(box: str, volume_labels: dict[str, str]) -> list[tuple[str, str, dict[str, str]]]:
    """(volume, mount path, labels) of every editor volume a new box mounts: one per editor, the box's own.

    They carry the box's volume labels (kind=volume, box, id, workspace, branch...): whatever
    removes a box's volumes removes them too. Not its worktree records: the box's own volume
    carries those, and a box's leftovers are cleaned once per record, not once per volume."""
    identity = {key: value for key, value in volume_labels.items() if key != label("worktrees")}
    return [(server_volume(box, editor), f"{BOX_HOME}/{directory}", {**identity, label("editor"): editor})
            for editor, directory in EDITORS.items()]


def per_box_volumes(box: str) -> list[str]:
    """The volumes destroy removes with the box."""
    return [server_volume(box, editor) for editor in EDITORS]


def container_labels() -> dict[str, str]:
    return {"devcontainer.metadata": json.dumps(DEV_CONTAINER_METADATA, separators=(",", ":"))}


def mount_dirs() -> list[str]:
    """Mount points the box user must own (a new volume's root belongs to root)."""
    return [f"{BOX_HOME}/{directory}" for directory in EDITORS.values()]
