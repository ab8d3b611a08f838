# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names, identities and labels of boxes. Every validation of user-given names lives here.

Pure functions, no I/O beyond os.path: safe to import from modules, plugins and tests.
"""

from __future__ import annotations

import calendar
import hashlib
import os
import re
import secrets
import time

LABEL_PREFIX = "io.agentbox."
CONTAINER_PREFIX = "agentbox-"
BRANCH_PREFIX = "agentbox/"
CHECKPOINT_IMAGE_PREFIX = "agentbox-ckpt-"
# Inside every box: its user (uid 1000, passwordless sudo), and the tmpfs directory of its secret files (written
# through exec's stdin by Provider.write_secrets: never in env, labels, a layer or a checkpoint).
BOX_USER = "vscode"
SECRETS_DIR = "/run/agentbox/secrets"
BOX_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
# Checkpoint names become image tags: Docker allows [A-Za-z0-9_.-]{1,128}; we keep it lower case.
CHECKPOINT_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
DEFAULT_NAME_STEM_MAX = 30
# Linux refuses a longer hostname (sethostname: EINVAL), and a Docker box's hostname is agentbox-<box>.
HOSTNAME_MAX = 64
CONTAINER_BOX_NAME_MAX = HOSTNAME_MAX - len(CONTAINER_PREFIX)


class NameError_(ValueError):
    """A user-given name or path is not acceptable. The message says what to do."""


def validate_box_name(name: str) -> str:
    # fullmatch: `$` alone would let a trailing newline through.
    if not isinstance(name, str) or not BOX_NAME_PATTERN.fullmatch(name):
        raise NameError_(
            f"invalid box name {name!r}: use 1-63 characters from a-z, 0-9, '_', '.', '-', "
            "starting with a letter or digit (for example 'myrepo-fix-login')"
        )
    # The name becomes the branch agentbox/<name>: git refuses these in a ref name.
    if ".." in name or name.endswith((".lock", ".")):
        raise NameError_(
            f"invalid box name {name!r}: it names the git branch {BRANCH_PREFIX}{name}, and git refuses a "
            "branch name containing '..' or ending in '.lock' or '.'; pick another name"
        )
    return name


def validate_checkpoint_name(name: str) -> str:
    if not isinstance(name, str) or not CHECKPOINT_NAME_PATTERN.fullmatch(name):
        raise NameError_(
            f"invalid checkpoint name {name!r}: use 1-63 characters from a-z, 0-9, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return name


# Names no new checkpoint takes: as a create's `checkpoint`, `default` means the project's default and `none`
# no checkpoint, so a checkpoint called so could never be chosen by its name (and a box naming one `default`
# would pass for the project's default in a listing).
RESERVED_CHECKPOINT_NAMES = ("default", "none")


def check_checkpoint_name_free(name: str) -> str:
    """`name`, unless it is reserved (RESERVED_CHECKPOINT_NAMES): NameError_ saying so."""
    if name in RESERVED_CHECKPOINT_NAMES:
        raise NameError_(f"checkpoint name {name!r} is reserved (as a create's checkpoint, 'default' means the "
                         "project's default and 'none' no checkpoint): pick another name")
    return name


def workspace_path(path: str | None) -> str:
    """The absolute, symlink-free path of a workspace directory that must exist."""
    raw = path or os.getcwd()
    resolved = os.path.realpath(os.path.expanduser(raw))
    if not os.path.isdir(resolved):
        raise NameError_(f"workspace {raw!r} is not a directory: pass an existing directory as 'workspace'")
    return resolved


def project_id(workspace: str) -> str:
    """First 16 hex digits of sha1 of the workspace's absolute path (no trailing slash)."""
    absolute = os.path.abspath(workspace).rstrip("/") or "/"
    return hashlib.sha1(absolute.encode("utf-8")).hexdigest()[:16]


def project_of(project: str | None, workspace: str | None) -> str | None:
    """The project a task's options name: its workspace's when given, else `project` (None: every project)."""
    return project_id(workspace_path(workspace)) if workspace else project


def new_box_id() -> str:
    return secrets.token_hex(4)


def default_box_name(workspace: str, box_id: str) -> str:
    stem = re.sub(r"[^a-z0-9_.-]+", "-", os.path.basename(workspace.rstrip("/")).lower()).strip("-._")
    stem = re.sub(r"\.{2,}", ".", stem)  # '..' is not allowed in the branch name
    stem = stem[:DEFAULT_NAME_STEM_MAX].rstrip("-._") or "box"
    return validate_box_name(f"{stem}-{box_id}")


def container_name(box: str) -> str:
    return CONTAINER_PREFIX + box


def docker_volume_name(box: str) -> str:
    return f"{CONTAINER_PREFIX}{box}-docker"


def box_branch(box: str, suffix: int = 1) -> str:
    return f"{BRANCH_PREFIX}{box}" if suffix <= 1 else f"{BRANCH_PREFIX}{box}-{suffix}"


def checkpoint_image(project: str, checkpoint: str) -> str:
    return f"{CHECKPOINT_IMAGE_PREFIX}{project}:{checkpoint}"


def label(key: str) -> str:
    return LABEL_PREFIX + key


def box_labels(
    *,
    box: str,
    box_id: str,
    project: str,
    workspace: str,
    branch: str,
    image_fingerprint: str,
    provider: str,
    engine: str,
    checkpoint: str | None = None,
    created: str | None = None,
) -> dict[str, str]:
    """The io.agentbox.* labels that identify a box everywhere (they are the source of truth)."""
    labels = {
        "box": box,
        "id": box_id,
        "project": project,
        "workspace": workspace,
        "branch": branch,
        "created": created or now_iso(),
        "image_fingerprint": image_fingerprint,
        "provider": provider,
        "engine": engine,
        "kind": "box",
    }
    if checkpoint:
        labels["checkpoint"] = checkpoint
    return {label(k): v for k, v in labels.items()}


def strip_labels(labels: dict[str, str] | None) -> dict[str, str]:
    """io.agentbox.* labels without their prefix; other labels dropped."""
    return {k[len(LABEL_PREFIX):]: v for k, v in (labels or {}).items() if k.startswith(LABEL_PREFIX)}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def parse_iso(moment: str | None) -> float | None:
    """Epoch seconds of a now_iso() time (UTC, 2026-11-30T19:00:00Z), None when absent or malformed."""
    if not moment:
        return None
    try:
        return float(calendar.timegm(time.strptime(moment, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def sanitize_group(value: str) -> str:
    """An Ansible-safe group name fragment: letters, digits and '_' only."""
    return re.sub(r"[^A-Za-z0-9_]", "_", value)
