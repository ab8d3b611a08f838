"""A provider whose boxes are real directories on this machine, for unit tests of the workflows.

Each box is a directory holding a root filesystem (`<base>/boxes/<name>/root`). `exec` really runs
the argv there: in a private mount namespace (`unshare -m`) the host's /usr and /dev are bound into
that root, the box's git layers are mounted as overlays at the host .git paths (as the local engine
mounts them, _gitlayer), and the command runs `chroot`ed into it as the box user. So /workspace,
/etc/agentbox, /home/vscode/.agentbox-worktrees and /run/agentbox are the box's own directories,
and a workflow's in-box scripts, git included, do their real work. put_archive and get_archive are
tar run in the box. Labels, state and images are held in memory. Needs root (mount, chroot).

Not a mock: nothing is recorded or replayed. `fail_on` makes one method raise ProviderError (once,
or on its n-th call) so a test can fail a workflow at a chosen step.

Checkpoints (`checkpoint_store()`) are snapshots, as on a cloud: the shared snapshot workflow
(_snapshot_store) over `commit`, which copies the box's root as a new image directory. Like a
snapshot or `docker commit`, it keeps the box's files and not its tmpfs /run/agentbox (secrets,
carried files) nor the box's runtime `env`, which is the box's and not its image's.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from ansible_collections.agentbox.box.plugins.module_utils.core._naming import SECRETS_DIR, now_iso, strip_labels
from ansible_collections.agentbox.box.plugins.module_utils.core._provider import (
    BoxFacts,
    BoxSpec,
    CappedOutput,
    Command,
    ExecResult,
    Provider,
    ProviderError,
)
from ansible_collections.agentbox.box.plugins.module_utils.git._seed import BOX_UID, SEED_RECORD, WORKSPACE
from ansible_collections.agentbox.box.plugins.module_utils.providers._snapshot_store import SnapshotCheckpoints

BOX_USERS = {"root": (0, 0, "/root"), "vscode": (BOX_UID, BOX_UID, "/home/vscode")}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host files the box needs for the host's binaries to run in it (the dynamic loader's cache, NSS).
HOST_ETC = ("ld.so.cache", "nsswitch.conf")

# Runs as root in a fresh mount namespace: mount the box's view, then chroot into it.
# Arguments: root, uid, gid, then "layers" n (lower upper work)*n,
# "mounts" n (source target)*n, "--" and the command to run in the box.
_LAUNCH = r"""
set -e
root=$1 uid=$2 gid=$3
shift 4
n=$1; shift
while [ "$n" -gt 0 ]; do
  mkdir -p "$root$1"
  mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$root$1"
  shift 3; n=$((n - 1))
done
shift
n=$1; shift
while [ "$n" -gt 0 ]; do
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  mount -o remount,bind,ro "$root$2"
  shift 2; n=$((n - 1))
done
mount --bind /usr "$root/usr"
mount -o remount,bind,ro "$root/usr"
mount --rbind /dev "$root/dev"
shift
exec chroot --userspec="$uid:$gid" --groups="$gid" "$root" "$@"
"""


@dataclasses.dataclass
class Box:
    spec: BoxSpec
    facts: BoxFacts
    directory: Path
    # (host .git path, upper, work): the box's writes to that .git land in its upper directory.
    layers: list[tuple[str, str, str]]
    mounts: dict[str, str]

    @property
    def root(self) -> Path:
        return self.directory / "root"


class FakeProvider(Provider):
    """Boxes as directories under `base`; see the module docstring."""

    name = "fake"
    # Whether a create holds its box to the host's egress gateway (the local box engine's answer); the tests of
    # the policy's choice set it (a plain attribute here, a property of the real providers).
    holds_egress = False

    def __init__(
        self,
        base: Path,
        *,
        shares_host_filesystem: bool = True,
        images: Iterable[str] = ("agentbox/box:latest",),
        name: str = "fake",
    ):
        if os.geteuid() != 0:
            raise RuntimeError("needs root: the fake provider mounts and chroots")
        super().__init__()
        # Another name is another provider to the workflows: its own checkpoints, defaults and journals.
        self.name = name
        self.base = Path(base)
        (self.base / "boxes").mkdir(parents=True, exist_ok=True)
        (self.base / "images").mkdir(parents=True, exist_ok=True)
        self.shares_host_filesystem = shares_host_filesystem
        self._engine = f"fake:{self.base}"
        # image -> (labels, root directory to start boxes from, or None for the bare skeleton)
        self.images: dict[str, tuple[dict[str, str], Path | None]] = {image: ({}, None) for image in images}
        self.boxes: dict[str, Box] = {}
        # (method, box, whether the box had its seed record when the call came): the order of a workflow's steps.
        self.calls: list[tuple[str, str | None, bool]] = []
        self._failures: dict[str, int] = {}

    # -- test controls ------------------------------------------------------------------------
    def fail_on(self, method: str, call: int = 1) -> None:
        """Make the `call`-th next call of `method` raise ProviderError (once)."""
        self._failures[method] = call

    def _step(self, method: str, box: str | None = None) -> None:
        known = self.boxes.get(box or "")
        self.calls.append((method, box, bool(known and (known.root / SEED_RECORD.lstrip("/")).exists())))
        left = self._failures.get(method)
        if left is None:
            return
        if left > 1:
            self._failures[method] = left - 1
            return
        del self._failures[method]
        raise ProviderError(f"injected failure of {method}", box=box, operation=method)

    def box_root(self, name: str) -> Path:
        return self._box(name).root

    # -- interface ----------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        return self._engine

    def find(self, name: str) -> BoxFacts | None:
        self._step("find", name)
        box = self.boxes.get(name)
        return dataclasses.replace(box.facts, labels=dict(box.facts.labels)) if box else None

    def list_boxes(self, project: str | None = None) -> list[BoxFacts]:
        self._step("list_boxes")
        return [
            dataclasses.replace(box.facts) for box in self.boxes.values() if project is None or box.facts.project == project
        ]

    def create(self, spec: BoxSpec) -> BoxFacts:
        self._step("create", spec.name)
        if spec.name in self.boxes:
            raise ProviderError(f"a box called {spec.name!r} already exists on {self._engine}", box=spec.name,
                                operation="create")  # fmt: skip
        if spec.image not in self.images:
            raise ProviderError(f"image {spec.image!r} is not on engine {self._engine}", box=spec.name, operation="create")
        directory = self.base / "boxes" / spec.name
        box = Box(spec=spec, facts=self._facts(spec), directory=directory, layers=[], mounts=dict(spec.mounts))
        directory.mkdir()
        try:
            self._make_root(box.root, self.images[spec.image][1])
            for index, path in enumerate(spec.bind_paths):
                upper, work = directory / f"git{index}-upper", directory / f"git{index}-work"
                upper.mkdir()
                work.mkdir()
                box.layers.append((path, str(upper), str(work)))
            self.boxes[spec.name] = box
            if spec.secrets:
                self.write_secrets(spec.name, spec.secrets)
        except BaseException:
            self.boxes.pop(spec.name, None)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return dataclasses.replace(box.facts)

    def start(self, name: str) -> BoxFacts:
        return self._set_state("start", name, "running")

    def stop(self, name: str) -> BoxFacts:
        return self._set_state("stop", name, "stopped")

    def pause(self, name: str) -> BoxFacts:
        return self._set_state("pause", name, "paused")

    def resume(self, name: str) -> BoxFacts:
        return self._set_state("resume", name, "running")

    def destroy(self, name: str) -> None:
        self._step("destroy", name)
        box = self.boxes.pop(name, None)
        if box is not None:
            shutil.rmtree(box.directory)

    def run_command(self, name: str, command: Command) -> ExecResult:
        self._step("exec", name)
        process = self._spawn(name, command.argv, user=command.user or "", workdir=command.workdir,
                              env=command.env)
        stdin = command.stdin
        data = stdin.read() if stdin is not None and not isinstance(stdin, bytes) else stdin
        try:
            stdout, stderr = process.communicate(data or b"", timeout=command.timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            return ExecResult(124, stdout, stderr)
        # A stand-in reads it all, then holds it to the cap as a provider's stream does.
        output = CappedOutput(command.limit)
        if not (output.add(stdout) and output.add(stderr, stderr=True)):
            raise output.refused(command.argv, name)
        return output.result(process.returncode)

    def put_archive(self, name: str, path: str, tar_stream: Iterable[bytes] | IO[bytes]) -> None:
        self._step("put_archive", name)
        # As the engine does: extracted as root, owners and modes as the archive has them.
        process = self._spawn(name, ["tar", "-x", "--same-owner", "-p", "-f", "-", "-C", path], user="root")
        chunks: Iterable[bytes] = iter(lambda: tar_stream.read(1 << 20), b"") if hasattr(tar_stream, "read") else tar_stream
        errors: list[bytes] = []
        reader = threading.Thread(target=lambda: errors.append(process.stderr.read()))  # type: ignore[union-attr]
        reader.start()
        try:
            for chunk in chunks:
                process.stdin.write(chunk)  # type: ignore[union-attr]
        except BrokenPipeError:
            pass
        finally:
            process.stdin.close()  # type: ignore[union-attr]
            process.stdout.read()  # type: ignore[union-attr]
            process.wait()
            reader.join()
        if process.returncode != 0:
            raise ProviderError(f"extracting into {path} failed: {b''.join(errors).decode(errors='replace')}",
                                box=name, operation="put_archive")  # fmt: skip

    def get_archive(self, name: str, path: str) -> Iterator[bytes]:
        self._step("get_archive", name)
        parent, base = os.path.split(path.rstrip("/")) if path != "/" else ("/", ".")
        run = self.exec(name, ["tar", "-c", "-f", "-", "-C", parent or "/", base], user="root", limit=None)
        if run.rc != 0:
            raise ProviderError(f"{path}: {run.stderr.decode(errors='replace')}", box=name, operation="get_archive")
        return iter([run.stdout[i:i + (1 << 16)] for i in range(0, len(run.stdout), 1 << 16)])

    def write_secrets(self, name: str, secrets: dict[str, str]) -> None:
        self._step("write_secrets", name)
        directory = self._box(name).root / SECRETS_DIR.lstrip("/")
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chown(directory, BOX_UID, BOX_UID)
        for key, value in secrets.items():
            path = directory / key
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as file:
                file.write(value)
            os.chown(path, BOX_UID, BOX_UID)

    def image_exists(self, image: str) -> bool:
        self._step("image_exists")
        return image in self.images

    def image_labels(self, image: str) -> dict[str, str]:
        return dict(self.images[image][0]) if image in self.images else {}

    def commit(self, name: str, image: str, labels: dict[str, str], env: list[str] | None = None) -> dict[str, Any]:
        self._step("commit", name)
        box = self._box(name)
        target = self.base / "images" / uuid.uuid4().hex
        # The root filesystem, owners and links kept; the git layers are volumes, not part of it.
        subprocess.run(["cp", "-a", str(box.root), str(target)], check=True)
        # /run/agentbox is a tmpfs on every real engine: neither a commit nor a snapshot sees it.
        for entry in (target / "run/agentbox").iterdir():
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        self.images[image] = (dict(labels), target)
        return {"id": target.name, "size": 0}

    def checkpoint_store(self) -> FakeSnapshots:
        return FakeSnapshots(self)

    # -- helpers ------------------------------------------------------------------------------
    def _box(self, name: str) -> Box:
        box = self.boxes.get(name)
        if box is None:
            raise ProviderError(f"no box called {name!r}", box=name)
        return box

    def _facts(self, spec: BoxSpec) -> BoxFacts:
        labels = strip_labels(spec.labels)
        return BoxFacts(
            name=spec.name,
            id=spec.box_id,
            provider=self.name,
            engine=self._engine,
            state="running",
            container=f"fake-{spec.name}",
            image=spec.image,
            project=spec.project,
            workspace=spec.workspace,
            branch=labels.get("branch", ""),
            created=labels.get("created", now_iso()),
            labels=labels,
            checkpoint=labels.get("checkpoint") or None,
        )

    def _set_state(self, method: str, name: str, state: str) -> BoxFacts:
        self._step(method, name)
        box = self._box(name)
        box.facts.state = state
        return dataclasses.replace(box.facts)

    @staticmethod
    def _make_root(root: Path, image_root: Path | None) -> None:
        """The box image's layout: the in-box paths the workflows use, the box user, the host's
        binaries (bound at exec), or the committed root an image was made from."""
        if image_root is not None:
            subprocess.run(["cp", "-a", str(image_root), str(root)], check=True)
            return
        root.mkdir()
        for directory in ("usr", "dev", "etc", "root", "tmp", "run/agentbox", "home/vscode", WORKSPACE.lstrip("/")):
            (root / directory).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        for link in ("bin", "sbin", "lib", "lib64"):
            if os.path.islink(f"/{link}"):
                (root / link).symlink_to(os.readlink(f"/{link}"))
        for name in HOST_ETC:
            if os.path.exists(f"/etc/{name}"):
                shutil.copy2(f"/etc/{name}", root / "etc" / name)
        (root / "etc/passwd").write_text(
            f"root:x:0:0:root:/root:/bin/sh\nvscode:x:{BOX_UID}:{BOX_UID}::/home/vscode:/bin/sh\n"
        )
        (root / "etc/group").write_text(f"root:x:0:\nvscode:x:{BOX_UID}:\n")
        for owned in ("home/vscode", WORKSPACE.lstrip("/")):
            os.chown(root / owned, BOX_UID, BOX_UID)

    def _spawn(
        self, name: str, argv: list[str], *, user: str, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        box = self._box(name)
        if box.facts.state != "running":
            raise ProviderError(f"the box is {box.facts.state}, not running", box=name, operation="exec")
        if user not in BOX_USERS:
            raise ProviderError(f"no user {user!r} in the box", box=name, operation="exec")
        uid, gid, home = BOX_USERS[user]
        layers = [part for layer in box.layers for part in layer]
        mounts = [part for source, target in box.mounts.items() for part in (source, target)]
        pairs = [f"{key}={value}" for key, value in {**box.spec.env, **(env or {})}.items()]
        command = [
            "unshare", "-m", "--propagation", "private", "--", "sh", "-c", _LAUNCH, "launch",
            str(box.root), str(uid), str(gid),
            "layers", str(len(box.layers)), *layers,
            "mounts", str(len(box.mounts)), *mounts,
            "--", "/usr/bin/env", "-i", f"HOME={home}", f"PATH={PATH}", f"USER={user}", *pairs,
            "/bin/sh", "-c", 'cd "$1" || exit 126; shift; exec "$@"', "cd", workdir or home, *argv,
        ]  # fmt: skip
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@dataclasses.dataclass
class Snapshot:
    name: str
    id: str
    root: Path


class FakeSnapshots(SnapshotCheckpoints):
    """Checkpoints of the fake provider: its committed image directories, as a cloud's snapshots."""

    cloud = "the fake engine"
    provider: FakeProvider

    def __init__(self, provider: FakeProvider):
        super().__init__(provider)
        self.kind = provider.name

    def snapshot(self, image: str) -> Snapshot | None:
        _labels, root = self.provider.images.get(image, ({}, None))
        return Snapshot(image, root.name, root) if root is not None else None

    def snapshots(self, prefix: str) -> list[Snapshot]:
        found = (self.snapshot(image) for image in sorted(self.provider.images) if image.startswith(prefix))
        return [snapshot for snapshot in found if snapshot is not None]

    def delete_snapshot(self, image: str) -> bool:
        self.provider._step("delete_snapshot")
        snapshot = self.snapshot(image)
        if snapshot is None:
            return False
        users = sorted(name for name, box in self.provider.boxes.items() if box.spec.image == image)
        if users:
            # As an engine refuses to remove an image a container uses.
            raise ProviderError(f"snapshot {image} is in use by {', '.join(users)}", operation="delete_snapshot")
        del self.provider.images[image]
        shutil.rmtree(snapshot.root)
        return True

    def prepare_capture(self, facts: BoxFacts) -> tuple[list[str], list[str], dict[str, Any]]:
        """The box's runtime env, for the secrets guard (as Daytona reads its sandbox's)."""
        box = self.provider._box(facts.name)
        return [], [f"{key}={value}" for key, value in box.spec.env.items()], {}
