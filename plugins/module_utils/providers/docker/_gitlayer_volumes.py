# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The git layers' Docker volumes (local engine): made, removed and rescued through an engine client.

What a layer is and why it exists is in _gitlayer (the trust boundary); this is the engine side of it,
used by the Docker provider when it creates and removes a box. `engine` is the provider's client:
_engine_api.EngineAPI, or _engine_sdk.SDKEngine for the engines only the SDK reaches (same methods).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from typing import Any

from ...core._errors import ProviderError
from ...core._naming import CONTAINER_PREFIX, label
from ...git import _git_view
from ...git._git_view import view_path, views_dir

KIND = "gitlayer"
BOX_UID = 1000  # the box user, whose host uid owns a view's directories


def layer_names(box: str, box_id: str, index: int) -> tuple[str, str, str]:
    """(overlay, upper, work) volume names of a box's index-th layer; the id keeps a new box of
    an old name from ever meeting a previous box's writes."""
    stem = f"{CONTAINER_PREFIX}{box}-{box_id}-git{index}"
    return stem, f"{stem}-upper", f"{stem}-work"


def create_layers(engine: Any, box: str, box_id: str, labels: dict[str, str], paths: list[str],
                  box_root: tuple[int, int] = (0, 0)) -> dict[str, str]:
    """Make the views and volumes; {overlay volume: host .git path} to mount at that same path.
    `box_root`: the host (uid, gid) of root in the box (the engine's user-namespace remap).

    On failure the views and volumes made so far are removed before the error goes on.
    """
    layers = make_layers(engine, box, box_id, labels, paths, box_root)
    return {overlay: path for overlay, (path, _options) in layers.items()}


def make_layers(engine: Any, box: str, box_id: str, labels: dict[str, str], paths: list[str],
                box_root: tuple[int, int] = (0, 0)) -> dict[str, tuple[str, dict[str, str]]]:
    """create_layers, with each overlay's mount options: {overlay volume: (host .git path, {lowerdir, upperdir,
    workdir})}, for a caller that mounts the overlay itself (a claimed pooled box: docs/pool.md)."""
    for path in paths:
        if any(char in path for char in ",:\n"):
            raise ProviderError(
                f"{path!r} holds a ',', ':' or line break, which an overlay mount cannot name: move the repository",
                box=box,
                operation="create",
            )
    made: list[str] = []
    mounts: dict[str, tuple[str, dict[str, str]]] = {}
    tagged = {**labels, label("kind"): KIND}
    owner = (box_root[0] + BOX_UID, box_root[1] + BOX_UID)
    os.makedirs(views_dir(), mode=0o711, exist_ok=True)
    try:
        for index, path in enumerate(paths):
            view = view_path(box, box_id, index)
            _git_view.build(path, view, owner, labels.get(label("branch"), ""))
            overlay, upper_name, work_name = layer_names(box, box_id, index)
            upper = engine.create_volume(upper_name, tagged)
            made.append(upper_name)
            work = engine.create_volume(work_name, tagged)
            made.append(work_name)
            dirs = {"lowerdir": view, "upperdir": upper["Mountpoint"], "workdir": work["Mountpoint"]}
            options = ",".join(f"{key}={value}" for key, value in dirs.items())
            engine.create_volume(overlay, {**tagged, label("gitdir"): path}, "local",
                                 {"type": "overlay", "device": "overlay", "o": options})
            made.insert(0, overlay)
            mounts[overlay] = (path, dirs)
    except BaseException:
        _remove(engine, made)
        remove_views(box, box_id)
        raise
    return mounts


def remove_views(box: str, box_id: str | None = None) -> None:
    """Remove the box's views of the host .git (of that id only, when given)."""
    pattern = re.compile(re.escape(box) + "-" + (re.escape(box_id) if box_id else "[0-9a-z]+") + r"-git\d+")
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(views_dir()):
            if pattern.fullmatch(name):
                shutil.rmtree(os.path.join(views_dir(), name), ignore_errors=True)


def remove_layers(engine: Any, box: str, box_id: str | None = None) -> list[str]:
    """Remove every git layer volume of the box called `box` (of that id only, when given; found
    by labels); their names."""
    wanted = [f"{label('box')}={box}", f"{label('kind')}={KIND}", *([f"{label('id')}={box_id}"] if box_id else [])]
    names = [str(volume.get("Name", "")) for volume in engine.volumes(wanted)]
    overlays = [name for name in names if not name.endswith(("-upper", "-work"))]
    removed = _remove(engine, overlays)
    # An overlay still there is mounted by a container (another create of this name, racing):
    # its upper and work volumes stay with it.
    kept = {name for name in overlays if name not in removed}
    layers = [name for name in names if name not in overlays and name.rsplit("-", 1)[0] not in kept]
    if not kept:
        remove_views(box, box_id)
    return removed + _remove(engine, layers)


def _remove(engine: Any, names: list[str]) -> list[str]:
    removed = []
    for name in names:
        try:
            engine.remove_volume(name, force=True)
            removed.append(name)
        except Exception:  # noqa: BLE001 - one volume that will not go must not keep the others
            pass
    return removed


def rescue_commits(engine: Any, box: str) -> list[str]:
    """A box whose container was removed by hand (`docker rm -f`) left its git layers, holding
    commits never fetched. Bring each repository's box branch into the host from them, the usual
    way: a throwaway container of the box's image mounts the layer, bundles the branch as the box
    user, and the host fetches the bundle (verified by git). Only that branch moves; what cannot
    be read is left (the caller removes the layers). The branches moved, as 'repo:branch'."""
    import json
    import shutil
    import tempfile

    from ...git import _git

    moved: list[str] = []
    volumes = engine.volumes([f"{label('box')}={box}", f"{label('kind')}={KIND}"])
    for volume in volumes:
        volume_name = str(volume.get("Name", ""))
        if volume_name.endswith(("-upper", "-work")):
            continue
        labels = {key.removeprefix(label("")): value for key, value in (volume.get("Labels") or {}).items()}
        options = dict(part.partition("=")[::2] for part in (volume.get("Options") or {}).get("o", "").split(","))
        # The layer is mounted at the host .git's path (a view's layer names it in a label).
        lower = labels.get("gitdir") or options.get("lowerdir", "")
        branch, workspace = labels.get("branch", ""), labels.get("workspace", "")
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
                binds = [f"{volume_name}:{lower}:rw", f"{scratch}:/out:rw"]
                if _run_once(engine, labels.get("image") or "agentbox/box:latest",
                             ["sh", "-c", script, "rescue", git_dir, branch, base], binds) != 0:
                    continue  # no new commits (empty bundle) or an unreadable layer
                bundle = os.path.join(scratch, "rescue.bundle")
                if not os.path.isfile(bundle) or os.path.islink(bundle):
                    continue
                if _git.git(root, "bundle", "verify", "-q", bundle, check=False).returncode != 0:
                    continue
                try:
                    fetched = _git.fetch_box_bundle(root, bundle, f"refs/heads/{branch}")
                except _git.RefusedObjects:
                    continue  # objects git's checks refuse are never rescued
                if fetched.returncode != 0:
                    detail = fetched.stderr.decode("utf-8", "replace").strip()
                    raise _git.GitError(f"git fetch of {branch} from the box's git layer into {root} failed: {detail}")
                tip = _git.git(root, "bundle", "list-heads", bundle, f"refs/heads/{branch}").stdout.split()[:1]
                if tip and _git.git(root, "update-ref", "-m", f"agentbox: rescued from box {box}'s git layer",
                                    f"refs/heads/{branch}", tip[0].decode(), base, check=False).returncode == 0:
                    moved.append(f"{root}:{branch}")
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return moved


def _run_once(engine: Any, image: str, argv: list[str], binds: list[str]) -> int:
    """`docker run --rm --network none -u 1000:1000`: its exit code, -1 when it could not run."""
    config = {
        "Image": image,
        "Cmd": argv,
        "User": "1000:1000",
        "NetworkDisabled": True,
        "Volumes": {bind.split(":")[1]: {} for bind in binds},
        "HostConfig": {"Binds": binds, "NetworkMode": "none"},
    }
    try:
        container = engine.create_container(config, "")
    except Exception:  # noqa: BLE001 - no image, no engine: nothing rescued
        return -1
    try:
        engine.start_container(container)
        return engine.wait_container(container)
    except Exception:  # noqa: BLE001
        return -1
    finally:
        with contextlib.suppress(Exception):
            engine.remove_container(container, force=True, volumes=True)
