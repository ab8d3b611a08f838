# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The box image: fingerprint a rendered build context, find or build its image, make a base image.

A build context is a directory holding a rendered `Dockerfile` plus the files it copies. Its
fingerprint is a sha256 over every file in it; the image is tagged `<repository>:<first 16 hex>`
and `<repository>:latest`, so an unchanged context never builds twice on one engine.

Only the standard library is imported at module level; the docker SDK is handed in by the caller.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ansible_collections.agentbox.box.plugins.module_utils.core._naming import label

DEFAULT_REPOSITORY = "agentbox/box"
DEFAULT_BASE = "debian:bookworm"
LATEST_TAG = "latest"
FINGERPRINT_LABEL = label("image_fingerprint")
KIND_LABEL = label("kind")
BASE_LABEL = label("base")
AGENTS_LABEL = label("agents")
VNC_LABEL = label("vnc")
SHORT_FINGERPRINT_LENGTH = 16
FAILURE_TAIL_LINES = 30
# Debian's Docker tags may be a numbered release; debootstrap wants the code name.
DEBIAN_RELEASE_NAMES = {"11": "bullseye", "12": "bookworm", "13": "trixie"}
DEBIAN_SOURCES_DIR = "/etc/apt/sources.list.d"
DEBIAN_SOURCES_LIST = "/etc/apt/sources.list"


class ImageError(Exception):
    """The image could not be found, built or made. The message says what to do."""


# --------------------------------------------------------------------------------------------
# Fingerprint


@dataclasses.dataclass(frozen=True)
class ContextFile:
    """One file of a build context: its path relative to the context, its bytes, and its mode."""

    path: str
    content: bytes
    executable: bool = False


def recorded_labels(base: str, agents: list[str], vnc: bool) -> dict[str, str]:
    """The labels that record the request's options on the image (besides kind and fingerprint)."""
    return {BASE_LABEL: base, AGENTS_LABEL: ",".join(agents), VNC_LABEL: "true" if vnc else "false"}


# What recorded_labels gives for the module's defaults: these add nothing to the fingerprint.
DEFAULT_LABELS = recorded_labels(DEFAULT_BASE, [], False)


def compute_fingerprint(files: Iterable[ContextFile], labels: dict[str, str] | None = None) -> str:
    """sha256 over the files sorted by relative path: one line `<path>\\0<mode>\\0<sha256>` each.

    The order the files are given in does not matter; a path, a byte or the executable bit does
    (COPY keeps the mode, so it is part of what ends up in the image). Each of `labels` (see
    recorded_labels) that is not its default adds a line too: the image carries them, so one built
    with vnc=true must not be reused for vnc=false. At the defaults the fingerprint is the files'
    alone, the same as before labels counted, so an existing default image is not rebuilt.
    """
    by_path: dict[str, ContextFile] = {}
    for entry in files:
        normalised = entry.path.replace(os.sep, "/").removeprefix("./")
        if normalised in by_path:
            raise ImageError(f"the build context lists {normalised!r} twice: give every file one name")
        by_path[normalised] = entry
    outer = hashlib.sha256()
    for path in sorted(by_path):
        entry = by_path[path]
        mode = "755" if entry.executable else "644"
        outer.update(f"{path}\0{mode}\0{hashlib.sha256(entry.content).hexdigest()}\n".encode())
    for name, value in sorted((labels or {}).items()):
        if DEFAULT_LABELS.get(name) != value:
            # The value hashed: a newline in it cannot forge another line.
            outer.update(f"label\0{name}\0{hashlib.sha256(value.encode()).hexdigest()}\n".encode())
    return outer.hexdigest()


def read_context(context_dir: str) -> list[ContextFile]:
    """Every regular file under context_dir (symlinks followed, as `docker build` sends them)."""
    if not os.path.isdir(context_dir):
        raise ImageError(f"build context {context_dir!r} is not a directory: render the Dockerfile into one first")
    if not os.path.isfile(os.path.join(context_dir, "Dockerfile")):
        raise ImageError(f"build context {context_dir!r} has no Dockerfile: render roles/box_image's template into it")
    entries: list[ContextFile] = []
    for root, dirs, names in os.walk(context_dir, followlinks=True):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            if not os.path.isfile(full):
                continue
            with open(full, "rb") as handle:
                content = handle.read()
            rel = os.path.relpath(full, context_dir).replace(os.sep, "/")
            entries.append(ContextFile(rel, content, bool(os.stat(full).st_mode & 0o111)))
    return entries


def context_from_parts(
    dockerfile: str,
    programs: dict[str, str] | None = None,
    ca_certificates: list[str] | None = None,
    libraries: dict[str, str] | None = None,
) -> list[ContextFile]:
    """The build context the role's template expects: Dockerfile, bin/<program> (0755),
    ca/agentbox-ca-<n>.crt (0644) and lib/<relative path> (0644), from their texts."""
    entries = [ContextFile("Dockerfile", dockerfile.encode("utf-8"))]
    for name, content in sorted((programs or {}).items()):
        if not name or "/" in name or name in (".", ".."):
            raise ImageError(f"program name {name!r} is not a plain file name: programs go to /usr/local/bin/<name>")
        entries.append(ContextFile(f"bin/{name}", content.encode("utf-8"), executable=True))
    for path, content in sorted((libraries or {}).items()):
        parts = path.split("/")
        if "\\" in path or any(part in ("", ".", "..") for part in parts):
            raise ImageError(
                f"library path {path!r} is not a relative path of plain names (like agentbox_inbox/cli.py): "
                "libraries go to /usr/local/lib/agentbox/<path>"
            )
        entries.append(ContextFile(f"lib/{path}", content.encode("utf-8")))
    for index, pem in enumerate(ca_certificates or []):
        if "-----BEGIN CERTIFICATE-----" not in pem:
            raise ImageError(f"CA certificate number {index + 1} is not PEM text: give .crt/.pem files in PEM format")
        entries.append(ContextFile(f"ca/agentbox-ca-{index}.crt", pem.encode("utf-8")))
    return entries


def context_tar(files: Iterable[ContextFile]) -> io.BytesIO:
    """An uncompressed tar of the entries (root-owned, fixed times) to send as the build context."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        directories: set[str] = set()
        for entry in sorted(files, key=lambda item: item.path):
            parts = entry.path.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                directory = "/".join(parts[:depth])
                if directory not in directories:
                    directories.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
            info = tarfile.TarInfo(entry.path)
            info.size, info.mode = len(entry.content), 0o755 if entry.executable else 0o644
            archive.addfile(info, io.BytesIO(entry.content))
    buffer.seek(0)
    return buffer


def short_fingerprint(fingerprint: str) -> str:
    return fingerprint[:SHORT_FINGERPRINT_LENGTH]


def image_tag(repository: str, fingerprint: str) -> str:
    return f"{repository}:{short_fingerprint(fingerprint)}"


def validate_repository(repository: str) -> str:
    # A repository, not a full reference: the module adds the tags itself.
    pattern = r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
    if not re.match(pattern, repository or ""):
        raise ImageError(
            f"invalid image repository {repository!r}: give a repository without a tag, "
            "in lower case, for example 'agentbox/box'"
        )
    return repository


def split_reference(reference: str) -> tuple[str, str]:
    """('debian', 'bookworm') from 'debian:bookworm'; the tag defaults to latest."""
    last = reference.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = reference.rsplit(":", 1)
        return repository, tag
    return reference, LATEST_TAG


# --------------------------------------------------------------------------------------------
# Build log


class BuildLog:
    """Writes the build's output to a file and keeps its last lines for an error message."""

    def __init__(self, path: str):
        self.path = path
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._handle: IO[str] = open(path, "w", encoding="utf-8", errors="replace")
        self._tail: collections.deque[str] = collections.deque(maxlen=FAILURE_TAIL_LINES)
        self._partial = ""

    def write(self, text: str) -> None:
        self._handle.write(text)
        self._handle.flush()
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        self._tail.extend(line.rstrip("\r") for line in lines)

    def line(self, text: str) -> None:
        self.write(text.rstrip("\n") + "\n")

    def tail(self) -> str:
        lines = list(self._tail) + ([self._partial] if self._partial else [])
        return "\n".join(lines[-FAILURE_TAIL_LINES:])

    def close(self) -> None:
        self._handle.close()


def run_logged(command: list[str], log: BuildLog) -> int:
    """Run a command with its output (stdout and stderr together) going to the log."""
    log.line("$ " + " ".join(command))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if process.stdout is not None:
        for chunk in iter(process.stdout.readline, b""):
            log.write(chunk.decode("utf-8", errors="replace"))
    return process.wait()


# --------------------------------------------------------------------------------------------
# Base image from Debian's packages


def debian_suite(base: str) -> str:
    """The Debian code name debootstrap needs for a base like debian:bookworm or debian:12-slim."""
    repository, tag = split_reference(base)
    if repository not in ("debian", "library/debian", "docker.io/library/debian"):
        raise ImageError(
            f"base {base!r} is not on the engine and cannot be pulled, and only Debian bases "
            "(debian:<codename>, e.g. debian:bookworm) can be built here with debootstrap: "
            f"load {base!r} into the engine (docker load) or use base: debian:bookworm"
        )
    suite = tag.removesuffix("-slim")
    suite = DEBIAN_RELEASE_NAMES.get(suite, suite)
    if not re.match(r"^[a-z]+$", suite) or suite == LATEST_TAG:
        raise ImageError(
            f"cannot tell the Debian release of base {base!r}: name it by code name, for example debian:bookworm"
        )
    return suite


def _sources_entries(text: str, deb822: bool) -> Iterator[tuple[str, list[str]]]:
    """(uri, suites) of every enabled binary `deb` entry in one apt sources file."""
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for raw in stanza.splitlines():
                if raw.startswith("#") or ":" not in raw or raw[:1].isspace():
                    continue
                key, _colon, value = raw.partition(":")
                fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                yield uri, fields.get("suites", "").split()
        return
    for raw in text.splitlines():
        words = re.sub(r"\[[^]]*\]", " ", raw.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb":
            yield words[1], [words[2]]


def host_debian_sources(root: str = "/") -> list[tuple[str, list[str]]]:
    """Enabled `deb` entries of the host's apt sources (sources.list, *.list, *.sources)."""
    paths = [os.path.join(root, DEBIAN_SOURCES_LIST.lstrip("/"))]
    sources_dir = os.path.join(root, DEBIAN_SOURCES_DIR.lstrip("/"))
    paths += sorted(glob.glob(os.path.join(sources_dir, "*.list")) + glob.glob(os.path.join(sources_dir, "*.sources")))
    entries: list[tuple[str, list[str]]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        entries.extend(_sources_entries(text, path.endswith(".sources")))
    return entries


def debian_mirrors(entries: list[tuple[str, list[str]]]) -> tuple[str | None, str | None]:
    """(archive mirror, security mirror) among the host's entries: the first `…/debian` and
    `…/debian-security` over http(s)."""
    archive = security = None
    for uri, _suites in entries:
        if not uri.startswith(("http://", "https://")):
            continue
        path = uri.rstrip("/").rsplit("/", 1)[-1]
        if path == "debian-security" and security is None:
            security = uri.rstrip("/")
        elif path == "debian" and archive is None:
            archive = uri.rstrip("/")
    return archive, security


def base_sources_list(suite: str, archive: str, security: str | None) -> str:
    lines = [f"deb {archive} {suite} main", f"deb {archive} {suite}-updates main"]
    if security:
        lines.append(f"deb {security} {suite}-security main")
    return "\n".join(lines) + "\n"


def _mounts_under(path: str) -> list[str]:
    try:
        with open("/proc/mounts", encoding="utf-8") as handle:
            points = [line.split()[1].replace("\\040", " ") for line in handle if len(line.split()) > 1]
    except OSError:
        return []
    prefix = path.rstrip("/") + "/"
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def remove_tree(path: str) -> None:
    """rm -rf that first lets go of anything debootstrap left mounted inside (proc, sys)."""
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    if _mounts_under(path):
        raise ImageError(f"could not unmount {', '.join(_mounts_under(path))}: unmount them, then delete {path}")
    shutil.rmtree(path, ignore_errors=True)


def build_base_with_debootstrap(
    client: Any, base: str, log: BuildLog, workdir: str | None = None, import_as: str | None = None
) -> str:
    """Make `base` (a debian:<suite> reference) from Debian's packages and import it under its own
    name, or under import_as when given. Returns the image id."""
    suite = debian_suite(base)
    if os.geteuid() != 0:
        raise ImageError(
            f"base image {base!r} is not on the engine and cannot be pulled; making it with debootstrap "
            "needs root: run the role once as root (sudo), or load the image (docker load -i <tar>), "
            "or set allow_base_build: false to only use images already on the engine"
        )
    debootstrap = shutil.which("debootstrap") or (os.path.exists("/usr/sbin/debootstrap") and "/usr/sbin/debootstrap")
    if not debootstrap:
        raise ImageError(
            f"base image {base!r} is not on the engine and cannot be pulled, and debootstrap is missing: "
            "install it (apt-get install debootstrap) or load the image (docker load -i <tar>)"
        )
    archive, security = debian_mirrors(host_debian_sources())
    if not archive:
        raise ImageError(
            f"base image {base!r} is not on the engine and cannot be pulled, and no Debian mirror is "
            f"configured in {DEBIAN_SOURCES_LIST} or {DEBIAN_SOURCES_DIR}/: add one, or load the image"
        )
    tmp = tempfile.mkdtemp(prefix="agentbox-base-", dir=workdir or "/var/tmp")
    try:
        rootfs = os.path.join(tmp, "rootfs")
        code = run_logged([str(debootstrap), "--variant=minbase", suite, rootfs, archive], log)
        if code != 0:
            raise ImageError(
                f"debootstrap of Debian {suite} from {archive} failed (exit {code}); last lines of {log.path}:\n"
                + log.tail()
            )
        with open(os.path.join(rootfs, "etc/apt/sources.list"), "w", encoding="utf-8") as handle:
            handle.write(base_sources_list(suite, archive, security))
        # The downloaded .debs and package lists are half the size and stale by the first build.
        for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"):
            for path in glob.glob(os.path.join(rootfs, pattern)):
                if os.path.isfile(path):
                    os.unlink(path)
        tarball = os.path.join(tmp, "rootfs.tar")
        code = run_logged(["tar", "--numeric-owner", "--xattrs", "-C", rootfs, "-cf", tarball, "."], log)
        if code != 0:
            raise ImageError(f"packing the Debian {suite} root file system failed; see {log.path}")
        repository, tag = split_reference(import_as or base)
        log.line(f"importing {tarball} as {repository}:{tag}")
        result = client.api.import_image_from_file(
            tarball,
            repository=repository,
            tag=tag,
            changes=['CMD ["bash"]', f"LABEL {KIND_LABEL}=base"],
        )
        log.line(str(result).strip())
        return client.images.get(f"{repository}:{tag}").id
    finally:
        remove_tree(tmp)


# --------------------------------------------------------------------------------------------
# Find or build the box image


@dataclasses.dataclass
class ImageRequest:
    """What to build. The context is either a directory (`context`) or given in parts (`dockerfile`,
    `programs`, `ca_certificates`, `libraries`), which is what the role passes."""

    context: str | None = None
    dockerfile: str | None = None
    programs: dict[str, str] = dataclasses.field(default_factory=dict)
    libraries: dict[str, str] = dataclasses.field(default_factory=dict)
    ca_certificates: list[str] = dataclasses.field(default_factory=list)
    base: str = DEFAULT_BASE
    repository: str = DEFAULT_REPOSITORY
    agents: list[str] = dataclasses.field(default_factory=list)
    vnc: bool = False
    build_log: str = "~/.agentbox/logs/box-image.log"
    force: bool = False
    allow_base_build: bool = True
    build: bool = True
    keep_previous: int = 1
    check_mode: bool = False


@dataclasses.dataclass
class ImageResult:
    changed: bool
    tag: str
    latest: str
    fingerprint: str
    image_id: str | None = None
    size: int | None = None
    build_seconds: float | None = None
    base_source: str | None = None
    built: bool = False
    would_build: bool = False
    latest_moved: bool = False
    log: str | None = None
    removed: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    msg: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _find_image(client: Any, reference: str, not_found: type[Exception]) -> Any | None:
    try:
        return client.images.get(reference)
    except not_found:
        return None


def _point_latest(client: Any, image: Any, repository: str, not_found: type[Exception]) -> bool:
    """Tag image as <repository>:latest unless it already is. True when the tag moved."""
    current = _find_image(client, f"{repository}:{LATEST_TAG}", not_found)
    if current is not None and current.id == image.id:
        return False
    image.tag(repository, LATEST_TAG)
    return True


def ensure_base(
    client: Any, request: ImageRequest, log: BuildLog, not_found: type[Exception], api_error: type[Exception]
) -> tuple[str, list[str]]:
    """Make sure the base image is on the engine. Returns (present|pulled|debootstrap, warnings)."""
    if _find_image(client, request.base, not_found) is not None:
        return "present", []
    repository, tag = split_reference(request.base)
    log.line(f"base {request.base} is not on the engine: pulling it")
    try:
        for event in client.api.pull(repository, tag=tag, stream=True, decode=True):
            log.line(json.dumps(event))
        if _find_image(client, request.base, not_found) is not None:
            return "pulled", []
    except api_error as exc:
        log.line(f"pull of {request.base} failed: {exc}")
    if not request.allow_base_build:
        raise ImageError(
            f"base image {request.base!r} is not on the engine and could not be pulled (see {log.path}), "
            "and allow_base_build is false: load it (docker load -i <tar>), or allow building it from "
            "Debian's packages (allow_base_build: true / box_image_allow_base_build: true)"
        )
    started = time.monotonic()
    build_base_with_debootstrap(client, request.base, log)
    seconds = time.monotonic() - started
    warning = (
        f"base image {request.base} could not be pulled; built it from Debian's packages with "
        f"debootstrap and imported it ({seconds:.0f}s)"
    )
    return "debootstrap", [warning]


class BuildSteps:
    """Follows the classic builder's output to know which layer images this build made (a step
    that was not taken from the cache), so that a failed build can remove them."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self._counts = False
        self._partial = ""

    def feed(self, text: str) -> None:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith("Step "):
                # FROM names an existing image; every other step makes one unless cached.
                self._counts = " : FROM " not in line.upper()
            elif line.startswith(" ---> Using cache"):
                self._counts = False
            else:
                made = re.match(r"^ ---> ([0-9a-f]{12,64})\s*$", line)
                if made and self._counts:
                    self.created.append(made.group(1))
                    self._counts = False

    def remove_created(self, client: Any, api_error: type[Exception]) -> int:
        removed = 0
        for image in reversed(self.created):
            try:
                # Never forced: an image another build or a tag now uses stays.
                client.api.remove_image(image, force=False, noprune=True)
                removed += 1
            except api_error:
                pass
        return removed


def run_build(
    client: Any,
    request: ImageRequest,
    files: list[ContextFile],
    fingerprint: str,
    log: BuildLog,
    api_error: type[Exception],
) -> str:
    """docker build of exactly the fingerprinted files (sent as a tar) with the low-level API.
    Returns the new image's id (untagged)."""
    labels = {
        FINGERPRINT_LABEL: fingerprint,
        KIND_LABEL: "image",
        **recorded_labels(request.base, request.agents, request.vnc),
    }
    image_id: str | None = None
    error: str | None = None
    steps = BuildSteps()
    try:
        stream = client.api.build(
            fileobj=context_tar(files),
            custom_context=True,
            dockerfile="Dockerfile",
            labels=labels,
            rm=True,
            forcerm=True,
            pull=False,
            nocache=request.force,
            decode=True,
        )
        for event in stream:
            if "stream" in event:
                log.write(event["stream"])
                steps.feed(event["stream"])
                found = re.match(r"Successfully built ([0-9a-f]+)", event["stream"].strip())
                if found:
                    image_id = found.group(1)
            if "aux" in event and isinstance(event["aux"], dict) and event["aux"].get("ID"):
                image_id = event["aux"]["ID"]
            if "error" in event:
                error = str(event.get("error", "")).strip()
                log.line(error)
            elif "status" in event:
                log.line(str(event["status"]))
    except api_error as exc:
        error = str(exc)
        log.line(error)
    if error or not image_id:
        removed = steps.remove_created(client, api_error)
        if removed:
            log.line(f"removed the {removed} layer image(s) this failed build made")
        raise ImageError(
            f"building {image_tag(request.repository, fingerprint)} failed: {error or 'no image id in the output'}\n"
            f"last lines of {log.path}:\n{log.tail()}"
        )
    return image_id


def prune_previous(
    client: Any, repository: str, current_id: str | None, keep: int, check_mode: bool, api_error: type[Exception]
) -> list[str]:
    """Remove this repository's older fingerprint images beyond the newest `keep`; returns their tags.

    Each is ~700 MB and a changed role makes a new one, so without this they pile up. An image a
    container still uses (a box, running or stopped, or one made from a checkpoint of it) is left
    alone, and nothing is ever forced."""
    # Only tags this module makes (<repository>:<16 hex>); a tag someone added by hand is not ours.
    ours = re.compile(re.escape(repository) + ":[0-9a-f]{" + str(SHORT_FINGERPRINT_LENGTH) + "}")
    older = []
    for image in client.images.list(name=repository, filters={"label": FINGERPRINT_LABEL}):
        tags = [tag for tag in image.tags if ours.fullmatch(tag)]
        if image.id != current_id and tags:
            older.append((image.attrs.get("Created", ""), image, tags))
    older.sort(key=lambda entry: entry[0], reverse=True)
    removed: list[str] = []
    for _created, image, tags in older[keep:]:
        if client.containers.list(all=True, filters={"ancestor": image.id}):
            continue
        for tag in sorted(tags):
            if not check_mode:
                try:
                    client.api.remove_image(tag, noprune=False)
                except api_error:
                    break  # in use after all (a container made meanwhile): it stays
            removed.append(tag)
    return removed


def ensure_image(
    client: Any,
    request: ImageRequest,
    not_found: type[Exception],
    api_error: type[Exception],
    clock: Callable[[], float] = time.monotonic,
) -> ImageResult:
    """Find the image of this context on the engine, or build it (and its base when needed); then
    prune older fingerprint images beyond request.keep_previous."""
    validate_repository(request.repository)
    if request.keep_previous < 0:
        raise ImageError(f"keep_previous must be 0 or more, not {request.keep_previous}")
    if request.context is not None:
        files = read_context(request.context)
    elif request.dockerfile is not None:
        files = context_from_parts(request.dockerfile, request.programs, request.ca_certificates, request.libraries)
    else:
        raise ImageError("give the build context: a directory (context) or the rendered Dockerfile (dockerfile)")
    fingerprint = compute_fingerprint(files, recorded_labels(request.base, request.agents, request.vnc))
    tag = image_tag(request.repository, fingerprint)
    latest = f"{request.repository}:{LATEST_TAG}"
    log_path = os.path.abspath(os.path.expanduser(request.build_log))
    result = ImageResult(changed=False, tag=tag, latest=latest, fingerprint=fingerprint, log=log_path)

    existing = _find_image(client, tag, not_found)
    if existing is not None and existing.labels.get(FINGERPRINT_LABEL) != fingerprint:
        # Same short tag, another image (made by hand, or a 64-bit prefix collision): do not trust it.
        result.warnings.append(f"{tag} exists but its {FINGERPRINT_LABEL} label differs: rebuilding it")
        existing = None
    if existing is not None and not request.force:
        result.image_id = existing.id
        result.size = existing.attrs.get("Size")
        if request.check_mode:
            current = _find_image(client, latest, not_found)
            result.latest_moved = result.changed = current is None or current.id != existing.id
            result.msg = f"{tag} is up to date" + ("; :latest would move to it" if result.changed else "")
            return _with_pruning(client, request, result, api_error)
        result.latest_moved = result.changed = _point_latest(client, existing, request.repository, not_found)
        result.msg = f"{tag} is up to date" + ("; moved :latest to it" if result.latest_moved else "")
        return _with_pruning(client, request, result, api_error)

    if not request.build:
        raise ImageError(
            f"image {tag} (fingerprint {fingerprint}) is not on the engine and building is disabled: "
            "run the role agentbox.box.box_image with box_image_build: true (or the module with build: true) "
            "to build it, or load it into the engine"
        )
    result.would_build = True
    if request.check_mode:
        result.changed = True
        result.msg = f"{tag} would be built (see build_log for the output once built)"
        return result

    log = BuildLog(log_path)
    started = clock()
    try:
        source = request.context or "the rendered Dockerfile and " + ", ".join(f.path for f in files if f.path != "Dockerfile")
        log.line(f"agentbox box image {tag} (fingerprint {fingerprint}) from {source}")
        result.base_source, base_warnings = ensure_base(client, request, log, not_found, api_error)
        result.warnings.extend(base_warnings)
        image_id = run_build(client, request, files, fingerprint, log, api_error)
        image = client.images.get(image_id)
        repository_tag = tag.rsplit(":", 1)[1]
        try:
            image.tag(request.repository, repository_tag)
            image.tag(request.repository, LATEST_TAG)
        except api_error as exc:
            _untag(client, tag, api_error)
            raise ImageError(f"tagging the built image {image_id} as {tag} failed: {exc}") from exc
        image.reload()
        log.line(f"tagged {tag} and {latest} ({image.attrs.get('Size')} bytes)")
    finally:
        log.close()
    result.build_seconds = round(clock() - started, 1)
    result.image_id = image.id
    result.size = image.attrs.get("Size")
    result.built = result.changed = result.latest_moved = True
    result.msg = f"built {tag} in {result.build_seconds}s (base {result.base_source})"
    return _with_pruning(client, request, result, api_error)


def _with_pruning(client: Any, request: ImageRequest, result: ImageResult, api_error: type[Exception]) -> ImageResult:
    result.removed = prune_previous(
        client, request.repository, result.image_id, request.keep_previous, request.check_mode, api_error
    )
    if result.removed:
        result.changed = True
        verb = "would remove" if request.check_mode else "removed"
        result.msg += f"; {verb} {len(result.removed)} older image tag(s): {', '.join(result.removed)}"
    return result


def _untag(client: Any, reference: str, api_error: type[Exception]) -> None:
    try:
        client.api.remove_image(reference, noprune=False)
    except api_error:
        pass
