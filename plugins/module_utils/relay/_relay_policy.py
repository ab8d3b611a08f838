# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host user's relay policy (~/.agentbox/relay/policy.json), read again for every request that needs
it (an edit applies without a restart); every key is optional:

    {"ci_paths": [".github/workflows/", ...], "ci_paths_extra": ["deploy/"],
     "box_checkpoints": 5, "box_checkpoint_bytes": 21474836480}

`ci_paths` replaces the default list of CI configuration paths, `ci_paths_extra` adds to it: a push whose
commits add or change one of them waits for the user, as a push to another branch does (CI runs what a
pushed branch says, with the repository's secrets). A path ending in `/` means everything under it;
any other is matched whole, with `*`, `?` and `[...]` as in shell patterns (`*` crosses `/`).
`box_checkpoints` and `box_checkpoint_bytes` bound the checkpoints a box takes through the relay
(`agentbox-ctl checkpoint`), each box apart. A value that is not understood is reported and its
default applies: the box never gets a looser policy from a broken file.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable
from typing import Any

DEFAULT_CI_PATHS = (
    ".github/workflows/", ".github/actions/", ".gitlab-ci.yml", ".gitlab/", ".circleci/", "Jenkinsfile",
    ".travis.yml", "azure-pipelines.yml", ".azure-pipelines/", "bitbucket-pipelines.yml", ".buildkite/",
    ".drone.yml", ".woodpecker.yml", ".woodpecker/",
)  # fmt: skip
DEFAULT_BOX_CHECKPOINTS = 5
DEFAULT_BOX_CHECKPOINT_BYTES = 20 * 1024**3


def policy_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".agentbox", "relay", "policy.json")


def read_settings(path: str) -> tuple[dict[str, Any], str | None]:
    """A user's settings file (this one, the idle policy's): its JSON object ({} when there is none), and what
    is wrong with it, if anything (then {}: the caller's defaults apply)."""
    try:
        with open(path, encoding="utf-8") as handle:
            loaded = json.load(handle)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as exc:
        return {}, str(exc)
    return (loaded, None) if isinstance(loaded, dict) else ({}, "it is not a JSON object")


def load(path: str | None = None) -> dict[str, Any]:
    """{ci_paths, box_checkpoints, box_checkpoint_bytes, problems}: the file's values over the defaults."""
    raw, problem = read_settings(path or policy_path())
    problems = [problem] if problem else []
    unknown = sorted(set(raw) - {"ci_paths", "ci_paths_extra", "box_checkpoints", "box_checkpoint_bytes"})
    if unknown:
        problems.append(f"unknown keys {', '.join(unknown)}")
    lists = {}
    for key, default in (("ci_paths", list(DEFAULT_CI_PATHS)), ("ci_paths_extra", [])):
        value = raw.get(key, default)
        if not isinstance(value, list) or not all(isinstance(item, str) and item.strip("/") for item in value):
            problems.append(f"{key} must be a list of paths")
            value = default
        lists[key] = value
    ci_paths = [*lists["ci_paths"], *lists["ci_paths_extra"]]
    limits = {}
    for key, default in (("box_checkpoints", DEFAULT_BOX_CHECKPOINTS),
                         ("box_checkpoint_bytes", DEFAULT_BOX_CHECKPOINT_BYTES)):  # fmt: skip
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append(f"{key} must be a whole number, 0 or more, not {value!r}")
            value = default
        limits[key] = value
    return {"ci_paths": tuple(dict.fromkeys(ci_paths)), **limits, "problems": problems}


def ci_files(paths: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The paths (relative to a repository's root) that are CI configuration by `patterns`, sorted."""
    patterns = list(patterns)

    def matches(path: str) -> bool:
        for pattern in patterns:
            if pattern.endswith("/"):
                if path.startswith(pattern):
                    return True
            elif path == pattern or fnmatch.fnmatchcase(path, pattern):
                return True
        return False

    return sorted({path for path in paths if matches(path)})
