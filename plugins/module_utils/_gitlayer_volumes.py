# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The git layers' Docker volumes (local engine): made, removed and rescued through a docker SDK client.

What a layer is and why it exists is in _gitlayer (the trust boundary); this is the engine side of it,
used by the Docker provider when it creates and removes a box.
"""

from __future__ import annotations

import os
from typing import Any

from ._errors import ProviderError
from ._naming import CONTAINER_PREFIX, label

KIND = "gitlayer"


def layer_names(box: str, box_id: str, index: int) -> tuple[str, str, str]:
    """(overlay, upper, work) volume names of a box's index-th layer; the id keeps a new box of
    an old name from ever meeting a previous box's writes."""
    stem = f"{CONTAINER_PREFIX}{box}-{box_id}-git{index}"
    return stem, f"{stem}-upper", f"{stem}-work"


def create_layers(client: Any, box: str, box_id: str, labels: dict[str, str], paths: list[str]) -> dict[str, str]:
    """Make the volumes; {overlay volume: host .git path} to mount at that same path.

    On failure the volumes made so far are removed before the error goes on.
    """
    for path in paths:
        if any(char in path for char in ",:\n"):
            raise ProviderError(
                f"{path!r} holds a ',', ':' or line break, which an overlay mount cannot name: move the repository",
                box=box,
                operation="create",
            )
    made: list[Any] = []
    mounts: dict[str, str] = {}
    tagged = {**labels, label("kind"): KIND}
    try:
        for index, path in enumerate(paths):
            overlay, upper_name, work_name = layer_names(box, box_id, index)
            upper = client.volumes.create(name=upper_name, labels=tagged)
            made.append(upper)
            work = client.volumes.create(name=work_name, labels=tagged)
            made.append(work)
            options = f"lowerdir={path},upperdir={upper.attrs['Mountpoint']},workdir={work.attrs['Mountpoint']}"
            layer = client.volumes.create(
                name=overlay,
                driver="local",
                driver_opts={"type": "overlay", "device": "overlay", "o": options},
                labels=tagged,
            )
            made.insert(0, layer)
            mounts[overlay] = path
    except BaseException:
        _remove(made)
        raise
    return mounts


def remove_layers(client: Any, box: str, box_id: str | None = None) -> list[str]:
    """Remove every git layer volume of the box called `box` (of that id only, when given; found
    by labels); their names."""
    wanted = [f"{label('box')}={box}", f"{label('kind')}={KIND}", *([f"{label('id')}={box_id}"] if box_id else [])]
    volumes = client.volumes.list(filters={"label": wanted})
    overlays = [volume for volume in volumes if not volume.name.endswith(("-upper", "-work"))]
    removed = _remove(overlays)
    # An overlay still there is mounted by a container (another create of this name, racing):
    # its upper and work volumes stay with it.
    kept = {volume.name for volume in overlays if volume.name not in removed}
    layers = [volume for volume in volumes if volume not in overlays and volume.name.rsplit("-", 1)[0] not in kept]
    return removed + _remove(layers)


def _remove(volumes: list[Any]) -> list[str]:
    removed = []
    for volume in volumes:
        try:
            volume.remove(force=True)
            removed.append(volume.name)
        except Exception:  # noqa: BLE001 - one volume that will not go must not keep the others
            pass
    return removed


def rescue_commits(client: Any, box: str) -> list[str]:
    """A box whose container was removed by hand (`docker rm -f`) left its git layers, holding
    commits never fetched. Bring each repository's box branch into the host from them, the usual
    way: a throwaway container of the box's image mounts the layer, bundles the branch as the box
    user, and the host fetches the bundle (verified by git). Only that branch moves; what cannot
    be read is left (the caller removes the layers). The branches moved, as 'repo:branch'."""
    import json
    import shutil
    import tempfile

    from . import _git

    moved: list[str] = []
    volumes = client.volumes.list(filters={"label": [f"{label('box')}={box}", f"{label('kind')}={KIND}"]})
    for volume in volumes:
        if volume.name.endswith(("-upper", "-work")):
            continue
        labels = {key.removeprefix(label("")): value for key, value in (volume.attrs.get("Labels") or {}).items()}
        options = dict(part.partition("=")[::2] for part in (volume.attrs.get("Options") or {}).get("o", "").split(","))
        lower, branch, workspace = options.get("lowerdir", ""), labels.get("branch", ""), labels.get("workspace", "")
        try:
            records = json.loads(labels.get("worktrees") or "[]")
        except ValueError:
            records = []
        for record in records:
            git_dir, sub = record.get("git_dir", ""), record.get("sub", "")
            root = os.path.join(workspace, sub) if sub else workspace
            if not (lower and branch and (git_dir == lower or git_dir.startswith(lower + "/")) and os.path.isdir(root)):
                continue
            host_tip = _git.git(root, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False)
            if host_tip.returncode != 0:
                continue
            base = host_tip.stdout.decode().strip()
            scratch = tempfile.mkdtemp(prefix="agentbox-rescue-")
            try:
                os.chmod(scratch, 0o777)  # the box user writes the bundle; the host only reads it through git
                script = 'git -c safe.directory="*" --git-dir="$1" bundle create -q /out/rescue.bundle "refs/heads/$2" "^$3"'
                try:
                    client.containers.run(
                        labels.get("image") or "agentbox/box:latest",
                        ["sh", "-c", script, "rescue", git_dir, branch, base],
                        user="1000:1000",
                        network_disabled=True,
                        remove=True,
                        volumes={volume.name: {"bind": lower, "mode": "rw"}, scratch: {"bind": "/out", "mode": "rw"}},
                    )
                except Exception:  # noqa: BLE001 - no new commits (empty bundle) or an unreadable layer
                    continue
                bundle = os.path.join(scratch, "rescue.bundle")
                if not os.path.isfile(bundle) or os.path.islink(bundle):
                    continue
                if _git.git(root, "bundle", "verify", "-q", bundle, check=False).returncode != 0:
                    continue
                _git.git(root, "fetch", "-q", "--no-tags", "--no-write-fetch-head", bundle, f"refs/heads/{branch}")
                tip = _git.git(root, "bundle", "list-heads", bundle, f"refs/heads/{branch}").stdout.split()[:1]
                if tip and _git.git(root, "update-ref", "-m", f"agentbox: rescued from box {box}'s git layer",
                                    f"refs/heads/{branch}", tip[0].decode(), base, check=False).returncode == 0:
                    moved.append(f"{root}:{branch}")
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return moved
