# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boxd SDK (boxd==0.2.19) behind one small client: settings, one cached client per process, and
every SDK error turned into a ProviderError that says which box, which call and what to do.

The SDK's own retries are off (max_retries=0): it would re-send a create whose answer was lost. Reads
are retried here, a bounded number of times; nothing that changes a machine is re-sent blindly.

The address is the SDK's own default unless one is given (`boxd._urls.DEFAULT_BASE_URL`, the gRPC front
door `https://boxd.sh:9443`). An API key is exchanged for a token once per host (_boxd_token), and the
client is given the token: the SDK would exchange again in every process.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from ...core._errors import BoxNotFound, EngineUnreachable, ProviderError
from . import _boxd_token

# gRPC's default epoll1 poller aborts a child forked while a channel is live (Ansible and git fork
# while a box is made); the poll poller does not. Must be set before grpc is first imported.
os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")
# Its info line about descriptors a forked child inherited is noise in every Ansible task's output.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

try:
    from boxd import (
        APIConnectionError,
        APIStatusError,
        AuthenticationError,
        Boxd,
        BoxdError,
        ConflictError,
        NotFoundError,
        PermissionDeniedError,
        RateLimitError,
    )
    from boxd._urls import DEFAULT_BASE_URL as SDK_BASE_URL  # the SDK's own default and exchange URL rule
    from boxd._urls import exchange_url_for

    HAS_BOXD = True
    BOXD_IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # pragma: no cover - reported when the provider is used
    HAS_BOXD = False
    BOXD_IMPORT_ERROR = exc
    BoxdError = Exception  # type: ignore[assignment,misc]
    SDK_BASE_URL = "https://boxd.sh:9443"  # boxd==0.2.19's default, for messages before the SDK is installed

API_TIMEOUT = 60.0
READ_RETRIES = 3
BACKOFF = (0.3, 0.8, 2.0)

# gRPC's words (grpc-core) for a host that does not resolve, and for a peer that is not an HTTP/2 server.
NAME_UNRESOLVED = re.compile(r"errors resolving|DNS resolution failed|Domain name not found", re.I)
NOT_GRPC = re.compile(r"Failed parsing HTTP/2|Expected SETTINGS frame|Trying to connect an http1\.x server", re.I)


class BoxdConflict(ProviderError):
    """boxd refused because of the machine's state (already exists, stopped, changing)."""


class BoxdSettings:
    """Key, token, URL and org: the arguments first, then the SDK's own environment variables. A token (given
    or BOXD_TOKEN) wins over a key: it is used as given, the key is not exchanged."""

    def __init__(self, api_key: str | None = None, token: str | None = None, base_url: str | None = None,
                 org: str | None = None) -> None:
        self.token = token or os.environ.get("BOXD_TOKEN") or None
        self.api_key = None if self.token else api_key or os.environ.get("BOXD_API_KEY") or None
        self.base_url = (base_url or os.environ.get("BOXD_BASE_URL") or SDK_BASE_URL).strip().rstrip("/")
        scheme, sep, rest = self.base_url.partition("://")
        if sep and scheme.lower() in ("http", "https"):
            self.base_url = f"{scheme.lower()}://{rest}"  # a scheme is case-blind (RFC 3986); the SDK's test is not
        self.org = org or os.environ.get("BOXD_ORG") or None

    @property
    def exchange_url(self) -> str:
        """Where the API key is exchanged: the console host of the base URL (the SDK's rule)."""
        return exchange_url_for(self.base_url)

    def bearer(self) -> str:
        """The token the API is called with: the one given, else the API key's (exchanged once per host)."""
        if self.token:
            return self.token
        return _boxd_token.token_for(self.api_key or "", self.exchange_url)

    def check(self) -> None:
        if not HAS_BOXD:
            raise ProviderError(f"the boxd provider needs the boxd SDK (pip install boxd==0.2.19): {BOXD_IMPORT_ERROR}")
        if not (self.api_key or self.token):
            raise ProviderError(
                "the boxd provider needs a credential: set BOXD_API_KEY (or BOXD_TOKEN, or the boxd_api_key "
                "option); nothing was created"
            )
        url = urlsplit(self.base_url)
        where = "check BOXD_BASE_URL or boxd_base_url; nothing was created"
        if self.base_url.rstrip(":").lower() in ("http", "https"):
            raise ProviderError(f"boxd base URL {self.base_url!r} names no host (https://HOST[:PORT]); {where}")
        if "://" not in self.base_url:
            raise ProviderError(f"boxd base URL {self.base_url!r} has no scheme: write https://{self.base_url} (or "
                                f"http://{self.base_url} for a local emulator); {where}")
        if url.scheme not in ("http", "https"):
            raise ProviderError(f"boxd base URL {self.base_url!r} must start with https:// (or http:// for a "
                                f"local emulator), not {url.scheme}://; {where}")
        if not url.hostname:
            raise ProviderError(f"boxd base URL {self.base_url!r} names no host (https://HOST[:PORT]); {where}")
        if url.path or url.query or url.fragment:
            raise ProviderError(f"boxd base URL {self.base_url!r} is a host and port only (boxd's API has no "
                                f"path): use {url.scheme}://{url.netloc}; {where}")


_CLIENTS: dict[tuple[int, str, str], tuple[str, Any]] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(settings: BoxdSettings) -> Any:
    """One SDK client per process and settings (a forked child makes its own: a gRPC channel does not
    survive a fork), given the settings' token; a new token (the old one near its end) makes a new client."""
    token = settings.bearer()
    key = (os.getpid(), settings.base_url, settings.token or settings.api_key or "")
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None or found[0] != token:
            for stale in [k for k in _CLIENTS if k[0] != os.getpid()]:
                del _CLIENTS[stale]
            # The old client is dropped, not closed: a stream of another thread may still read from it.
            found = (token, Boxd(token=token, base_url=settings.base_url, timeout=API_TIMEOUT, max_retries=0))
            _CLIENTS[key] = found
        return found[1]


def forget_client(settings: BoxdSettings) -> None:
    key = (os.getpid(), settings.base_url, settings.token or settings.api_key or "")
    with _CLIENTS_LOCK:
        found = _CLIENTS.pop(key, None)
    if found is not None:
        found[1].close()


def translate(exc: BaseException, base_url: str, box: str | None, operation: str) -> ProviderError:
    """The ProviderError for an SDK error: what failed and what to do."""
    detail = str(exc).strip() or type(exc).__name__
    if isinstance(exc, ProviderError):
        return exc
    if HAS_BOXD and isinstance(exc, AuthenticationError):
        return ProviderError(f"boxd at {base_url} refused the credential ({detail}): check BOXD_API_KEY / "
                             "BOXD_TOKEN (or boxd_api_key)", box=box, operation=operation)
    if HAS_BOXD and isinstance(exc, PermissionDeniedError):
        return ProviderError(f"boxd at {base_url} does not allow this ({detail}): check the key's org "
                             "(BOXD_ORG) and permissions", box=box, operation=operation)
    if HAS_BOXD and isinstance(exc, NotFoundError):
        return BoxNotFound(f"not found on boxd ({base_url}): {detail}", box=box, operation=operation)
    if HAS_BOXD and isinstance(exc, ConflictError):
        return BoxdConflict(f"boxd refused: {detail}", box=box, operation=operation)
    if HAS_BOXD and isinstance(exc, RateLimitError):
        return ProviderError(f"boxd's rate limit or quota refused the call ({detail}); try again later",
                             box=box, operation=operation)
    if HAS_BOXD and isinstance(exc, APIConnectionError) and NAME_UNRESOLVED.search(detail):
        return EngineUnreachable(f"boxd base URL {base_url}: its host name does not resolve ({detail}): check "
                                 "BOXD_BASE_URL or boxd_base_url", box=box, operation=operation)
    if HAS_BOXD and isinstance(exc, APIConnectionError) and NOT_GRPC.search(detail):
        return EngineUnreachable(f"something answered at {base_url}, but not boxd's API (no gRPC over HTTP/2: "
                                 f"{detail}): check BOXD_BASE_URL or boxd_base_url", box=box, operation=operation)
    if HAS_BOXD and isinstance(exc, APIConnectionError):
        return EngineUnreachable(f"boxd at {base_url} did not answer ({detail}): check the network and "
                                 "BOXD_BASE_URL, then try again", box=box, operation=operation)
    return ProviderError(f"boxd answered an error: {detail}", box=box, operation=operation)


def is_ambiguous(exc: BaseException) -> bool:
    """A failure after which the call may or may not have taken effect (connection lost, deadline, 5xx)."""
    return HAS_BOXD and isinstance(exc, (APIConnectionError, APIStatusError))


def is_already_exists(exc: BaseException) -> bool:
    """The conflict that means the name is in use (ALREADY_EXISTS), not a state or precondition refusal."""
    return HAS_BOXD and isinstance(exc, ConflictError) and getattr(exc, "code", None) == "already_exists"


def is_sdk_error(exc: BaseException) -> bool:
    return HAS_BOXD and isinstance(exc, BoxdError)


def call(fn: Callable[[], Any], base_url: str, *, box: str | None, operation: str, read: bool = False) -> Any:
    """fn() with SDK errors translated; a read that lost its connection is asked again, a few times."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_sdk_error(exc):
                raise
            if read and isinstance(exc, APIConnectionError) and attempt < READ_RETRIES:
                time.sleep(BACKOFF[attempt])
                attempt += 1
                continue
            raise translate(exc, base_url, box, operation) from exc
