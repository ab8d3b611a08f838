# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files named like secrets: the rule, pure (the caller reads a file's head when the rule asks for it).

Such a file, untracked on the host, reaches a box only on its tmpfs (see _carry_env), whatever the
workspace's .gitignore says: never a layer of the box, so never a checkpoint. Tracked files are the
repository's content and travel as such.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Callable

# Secret by name alone.
SECRET_NAMES = (
    ".env*",  # .env, .env.local, .envrc...
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    ".netrc",
    "_netrc",
    ".git-credentials",
    ".pgpass",
    ".htpasswd",
)
# Secret by name when the first HEAD_BYTES say so: a private key, a registry file holding a token.
SECRET_CONTENT = (
    ("id_*", re.compile(rb"PRIVATE KEY")),
    (".npmrc", re.compile(rb"_authToken|_auth\s*=|_password\s*=")),
    (".yarnrc.yml", re.compile(rb"npmAuthToken|npmAuthIdent")),
    (".pypirc", re.compile(rb"password\s*[:=]")),
)
HEAD_BYTES = 64 << 10
# Every untracked file's name is tried: one compiled pattern for all of them.
_ANY_NAME = re.compile("|".join(fnmatch.translate(p) for p in (*SECRET_NAMES, *(p for p, _c in SECRET_CONTENT))))


def named_like_secret(path: str, head: Callable[[], bytes]) -> bool:
    """Whether the file at `path` (any relative path) is one to keep off the box's disk; `head()`
    gives its first HEAD_BYTES, read only when the name alone does not decide."""
    name = posixpath.basename(path)
    if not _ANY_NAME.match(name):
        return False
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_NAMES):
        return True
    if name.endswith(".pub"):
        return False
    for pattern, content in SECRET_CONTENT:
        if fnmatch.fnmatchcase(name, pattern):
            return content.search(head()) is not None
    return False
