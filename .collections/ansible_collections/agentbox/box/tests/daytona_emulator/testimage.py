"""A tiny local image for emulator tests: busybox, a `vscode` user (uid 1000), no registry needed.

The real box image (`agentbox/box:latest`) is built by the box_image role; until it exists, and in
tests that should not depend on it, sandboxes run this image. It is made with `docker import` from a
rootfs assembled in memory around the host's static busybox (Debian package `busybox-static`).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time

import docker
import docker.errors

TEST_IMAGE = "agentbox-test/busybox:latest"
TEST_IMAGE_LABEL = "io.agentbox.test-image"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")

_PASSWD = "root:x:0:0:root:/root:/bin/sh\nvscode:x:1000:1000:vscode:/home/vscode:/bin/sh\n"
_GROUP = "root:x:0:\nvscode:x:1000:\n"


class FixtureImageError(RuntimeError):
    """The test image cannot be built on this host."""


def _find_busybox() -> str:
    for candidate in BUSYBOX_CANDIDATES:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("busybox")
    if found:
        return found
    raise FixtureImageError(
        "no static busybox on this host: install it (Debian/Ubuntu: `apt-get install busybox-static`) "
        "or point AGENTBOX_EMULATOR_TEST_IMAGE at an image that has /bin/sh"
    )


def _add_dir(archive: tarfile.TarFile, path: str, mode: int = 0o755, uid: int = 0) -> None:
    info = tarfile.TarInfo(path)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.uid = info.gid = uid
    info.mtime = int(time.time())
    archive.addfile(info)


def _add_file(archive: tarfile.TarFile, path: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(path)
    info.size = len(data)
    info.mode = mode
    info.mtime = int(time.time())
    archive.addfile(info, io.BytesIO(data))


def build_rootfs(busybox_path: str) -> bytes:
    """A rootfs tarball: busybox with one symlink per applet, /etc/passwd, and the usual directories."""
    applets = subprocess.run(
        [busybox_path, "--list-full"], check=True, capture_output=True, text=True
    ).stdout.split()
    with open(busybox_path, "rb") as handle:
        busybox_bytes = handle.read()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for directory in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "home", "proc", "sys",
                          "dev", "run", "var", "var/tmp"):
            _add_dir(archive, directory, 0o700 if directory == "root" else 0o755)
        _add_dir(archive, "tmp", 0o1777)
        _add_dir(archive, "home/vscode", 0o755, uid=1000)
        _add_dir(archive, "workspace", 0o755, uid=1000)
        _add_file(archive, "bin/busybox", busybox_bytes, 0o755)
        for applet in applets:
            if applet == "bin/busybox":
                continue
            link = tarfile.TarInfo(applet)
            link.type = tarfile.SYMTYPE
            link.linkname = "/bin/busybox"
            link.mode = 0o777
            archive.addfile(link)
        _add_file(archive, "etc/passwd", _PASSWD.encode())
        _add_file(archive, "etc/group", _GROUP.encode())
    return buffer.getvalue()


def image_exists(client: docker.DockerClient, image: str) -> bool:
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def ensure_test_image(client: docker.DockerClient, tag: str = TEST_IMAGE) -> bool:
    """Make sure `tag` exists; return True when this call created it (so the caller removes it)."""
    if image_exists(client, tag):
        return False
    repository, _colon, version = tag.rpartition(":")
    rootfs = build_rootfs(_find_busybox())
    client.api.import_image_from_data(
        rootfs,
        repository=repository,
        tag=version,
        changes=[
            "USER vscode",
            "WORKDIR /home/vscode",
            "ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin",
            'CMD ["/bin/sh"]',
            f"LABEL {TEST_IMAGE_LABEL}=1",
        ],
    )
    if not image_exists(client, tag):
        raise FixtureImageError(f"docker import did not produce {tag}")
    return True


def remove_test_image(client: docker.DockerClient, tag: str = TEST_IMAGE) -> None:
    try:
        client.images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        pass
