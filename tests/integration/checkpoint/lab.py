"""The checkpoint tests' world: a temp HOME, workspaces, boxes and checkpoints made by the modules
themselves (agentbox_box, agentbox_checkpoint, agentbox_checkpoint_info), run as Ansible runs them: the
module file with its arguments file. HOME points at the lab's temp dir, so manifests and project config
never touch the real ~/.agentbox. A lab removes its boxes, checkpoint images and temp dir at the end,
failed or not (conftest.py makes one a test, or one a module for what its tests only read)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker

from ansible_collections.agentbox.box.plugins.module_utils.core import _naming

REPO = Path(__file__).resolve().parents[3]

IMAGE = os.environ.get("AGENTBOX_TEST_BOX_IMAGE", "agentbox/box:latest")
GIT = ["git", "-c", "safe.directory=*", "-c", "user.name=Host", "-c", "user.email=host@example.invalid"]


class Lab:
    """One test's world: a temp HOME, workspaces, and everything made in it (removed at the end)."""

    def __init__(self, client: Any, root: Path):
        self.client = client
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.tag = secrets.token_hex(3)
        self.boxes: list[str] = []
        self.projects: set[str] = set()

    # -- host side --------------------------------------------------------------------------
    def workspace(self, name: str = "ws") -> Path:
        path = self.root / name
        path.mkdir()
        self.git(path, "init", "-q", "-b", "main")
        (path / ".gitignore").write_text("node_modules/\n.env\n")
        (path / "README.md").write_text("line 1\nline 2\nline 3\nline 4\nline 5\n")
        (path / "app.js").write_text("console.log('v1')\n")
        self.git(path, "add", ".")
        self.git(path, "commit", "-q", "-m", "init")
        # The host is mid-work: a tracked edit and an untracked note are carried into every box.
        with open(path / "app.js", "a") as handle:
            handle.write("// host edit in progress\n")
        (path / "notes.txt").write_text("host notes\n")
        subprocess.run(["chown", "-R", "1000:1000", str(path)], check=True)
        self.projects.add(_naming.project_id(str(path)))
        return path

    def git(self, repo: Path, *args: str) -> str:
        done = subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    def host_git_state(self, repo: Path) -> dict[str, str]:
        """What a box must never change in the host's .git: refs (stash included), HEAD, index, config."""
        dot_git = repo / ".git"
        return {
            "refs": self.git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
            "HEAD": (dot_git / "HEAD").read_text(),
            "index": hashlib.sha256((dot_git / "index").read_bytes()).hexdigest(),
            "config": (dot_git / "config").read_text(),
        }

    def chown(self, path: Path) -> None:
        subprocess.run(["chown", "-R", "1000:1000", str(path)], check=True)

    # -- modules ----------------------------------------------------------------------------
    def module(self, name: str, args: dict[str, Any], *, check_mode: bool = False) -> dict[str, Any]:
        payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode, "_ansible_diff": True}}
        fd, args_file = tempfile.mkstemp(suffix=".json", dir=self.root)
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
        pythonpath = os.pathsep.join(p for p in (str(REPO / ".collections"), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "HOME": str(self.home), "PYTHONPATH": pythonpath}
        done = subprocess.run(
            [sys.executable, "-m", f"ansible_collections.agentbox.box.plugins.modules.{name}", args_file],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=self.root,
            check=False,
        )
        os.unlink(args_file)
        try:
            return json.loads(done.stdout)
        except ValueError:
            raise AssertionError(f"{name} did not answer JSON:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}") from None

    def box(self, name: str, workspace: Path, **extra: Any) -> dict[str, Any]:
        full = f"ckt-{self.tag}-{name}"
        self.boxes.append(full)
        result = self.module("agentbox_box", {"name": full, "workspace": str(workspace), "image": IMAGE, **extra})
        return result

    def ok_box(self, name: str, workspace: Path, **extra: Any) -> dict[str, Any]:
        result = self.box(name, workspace, **extra)
        assert not result.get("failed"), result.get("msg")
        return result

    def checkpoint(self, **args: Any) -> dict[str, Any]:
        return self.module("agentbox_checkpoint", args, check_mode=args.pop("_check", False))

    def ok_checkpoint(self, **args: Any) -> dict[str, Any]:
        result = self.checkpoint(**args)
        assert not result.get("failed"), result.get("msg")
        return result

    # -- in the box -------------------------------------------------------------------------
    def sh(self, box: str, script: str, user: str = "vscode") -> str:
        container = self.client.containers.get(_naming.container_name(box))
        code, output = container.exec_run(["bash", "-c", script], user=user, demux=True)
        out, err = output
        assert code == 0, f"{script!r} in {box} exited {code}: {(err or b'').decode()} {(out or b'').decode()}"
        return (out or b"").decode()

    def cleanup(self) -> None:
        for box in self.boxes:
            for container in self.client.containers.list(all=True, filters={"name": f"^/agentbox-{box}$"}):
                container.remove(force=True, v=True)
            for volume in self.client.volumes.list(filters={"name": f"agentbox-{box}-"}):
                try:
                    volume.remove(force=True)
                except docker.errors.APIError:
                    pass
        for project in self.projects:
            repository = _naming.CHECKPOINT_IMAGE_PREFIX + project
            for image in self.client.images.list(name=repository):
                for tag in image.tags:
                    if tag.startswith(repository + ":"):
                        try:
                            self.client.images.remove(tag, force=True)
                        except docker.errors.APIError:
                            pass
            for image in self.client.images.list(filters={"label": f"io.agentbox.project={project}", "dangling": True}):
                try:
                    self.client.images.remove(image.id, force=True)
                except docker.errors.APIError:
                    pass


@contextlib.contextmanager
def open_lab(client: Any) -> Iterator[Lab]:
    """A lab in a temp dir, cleaned up at the end."""
    # Not pytest's tmp_path: its parents are private to root, and host git runs as the repo's owner
    # (uid 1000), who must be able to reach the workspace.
    root = Path(tempfile.mkdtemp(prefix="agentbox-ckpt-test-"))
    root.chmod(0o755)
    world = Lab(client, root)
    try:
        yield world
    finally:
        try:
            world.cleanup()
        finally:
            shutil.rmtree(root, ignore_errors=True)


def image_exists(client: Any, reference: str) -> bool:
    try:
        client.images.get(reference)
        return True
    except docker.errors.ImageNotFound:
        return False


def layers_contain(client: Any, image: str, needles: list[bytes], *, over: str | None = None) -> list[bytes]:
    """Which needles occur in what `image` holds over the image `over` (all of it when None): the names,
    link targets, extended attributes and contents of every entry of each layer it adds, read on this
    host where the engine keeps them (overlay2: one directory per layer, as inspect reports them).

    A layer of `over` is skipped only when it is provably `over`'s: the image's layers start with
    exactly `over`'s (RootFS diff ids, the sha256 of each layer's content) and the engine keeps them in
    `over`'s own directories; a box writes only to its container's layer, never into an image's. On
    another storage driver the whole exported filesystem is searched (filesystem_contains)."""
    attrs = client.api.inspect_image(image)
    if attrs["GraphDriver"]["Name"] != "overlay2":
        return filesystem_contains(client, image, needles)
    layers, dirs = _layer_dirs(attrs)
    skip = 0
    if over is not None:
        base_layers, base_dirs = _layer_dirs(client.api.inspect_image(over))
        assert layers[: len(base_layers)] == base_layers, f"{image} is not layered over {over}"
        assert dirs[: len(base_dirs)] == base_dirs, f"{image} does not share {over}'s layers on disk"
        skip = len(base_layers)
    found: set[bytes] = set()
    for directory in dirs[skip:]:
        found.update(_tree_contains(directory, needles))
    return sorted(found)


def _layer_dirs(attrs: dict[str, Any]) -> tuple[list[str], list[str]]:
    """An overlay2 image's layers, bottom first: (diff ids, the directory holding each layer's content)."""
    data = attrs["GraphDriver"]["Data"]
    lower = [d for d in (data.get("LowerDir") or "").split(":") if d]
    dirs = [*reversed(lower), data["UpperDir"]]
    layers = list(attrs["RootFS"]["Layers"])
    assert len(layers) == len(dirs), (layers, dirs)
    return layers, dirs


def _tree_contains(root: str, needles: list[bytes]) -> set[bytes]:
    """Needles in a directory tree's entry names, link targets, extended attributes and file contents
    (no link followed; devices, fifos and sockets are names only: overlay's whiteouts are devices)."""
    found: set[bytes] = set()
    keep = max(len(n) for n in needles)

    def scan(data: bytes) -> None:
        found.update(n for n in needles if n in data)

    def attributes(path: bytes) -> None:
        for attr in os.listxattr(path, follow_symlinks=False):
            scan(os.fsencode(attr) + b"=" + os.getxattr(path, attr, follow_symlinks=False))

    def unreadable(error: OSError) -> None:
        raise error  # a directory left out would be a part not searched

    attributes(os.fsencode(root))
    for parent, subdirs, files in os.walk(os.fsencode(root), onerror=unreadable):
        for name in [*subdirs, *files]:
            path = os.path.join(parent, name)
            scan(name)
            attributes(path)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                scan(os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    tail = b""
                    while chunk := handle.read(16 << 20):
                        window = tail + chunk
                        scan(window)
                        tail = window[-keep:]
    return found


def filesystem_contains(client: Any, image: str, needles: list[bytes]) -> list[bytes]:
    """Which needles occur anywhere in the image's exported filesystem (streamed, never on disk)."""
    container = client.containers.create(image, command=["true"])
    try:
        found: set[bytes] = set()
        keep = max(len(n) for n in needles)
        tail = b""
        for chunk in client.api.export(container.id, chunk_size=1 << 20):
            window = tail + chunk
            found.update(n for n in needles if n in window)
            tail = window[-keep:]
        return sorted(found)
    finally:
        container.remove(force=True, v=True)
