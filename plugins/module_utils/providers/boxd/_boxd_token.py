# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""boxd API keys exchanged for a token once per host and key, not once per process.

boxd's gRPC API takes one credential, a bearer token. The SDK (boxd==0.2.19, `boxd._credentials`)
exchanges a `bxd_` API key for one by POSTing `{"api_key": KEY}` to `<console>/api/v1/auth/token`
(HTTPS, answered `{"token", "expires_at"}`; a token lasts an hour; the endpoint is rate-limited per
source address, 429, and the SDK asks callers to reuse one token). The SDK keeps the token in its
client, so every process exchanged again: Ansible forks a worker per task and host, and each SSH
ProxyCommand and relay poll is a process of its own, which met 429s in parallel runs.

Here the controller exchanges once: the token is kept in ~/.agentbox/boxd/tokens/<hash>.json (0600 in
a 0700 directory; the name is a hash of the exchange URL and the key, the key itself is never written)
and taken under a lock, so processes that start together wait for one exchange and share its token
until five minutes before it expires (the SDK's own margin). Forked workers, modules, the SSH pipe and
the relay all read it there.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import Any

from ...core import _host_files
from ...core._errors import EngineUnreachable, ProviderError

EXCHANGE_SKEW_SECONDS = 300  # exchange again this long before the token expires (the SDK's margin)
EXCHANGE_TIMEOUT = 10.0
DEFAULT_RETRY_AFTER = 5.0
MAX_RETRY_AFTER = 60.0

# This process's copy: the file is read again only when the token nears its end.
_MEMO: dict[str, tuple[str, float]] = {}
_MEMO_LOCK = threading.Lock()


def tokens_dir() -> str:
    return os.path.join(_host_files.agentbox_dir(), "boxd", "tokens")


def cache_path(api_key: str, exchange_url: str) -> str:
    digest = hashlib.sha256(f"{exchange_url}\0{api_key}".encode()).hexdigest()[:32]
    return os.path.join(tokens_dir(), f"{digest}.json")


def _fresh(entry: tuple[str, float] | None) -> bool:
    return entry is not None and time.time() < entry[1] - EXCHANGE_SKEW_SECONDS


def _read(path: str) -> tuple[str, float] | None:
    try:
        data = json.loads(_host_files.read_text(path) or "null")
        return str(data["token"]), float(data["expires_at"])
    except (ValueError, TypeError, KeyError):
        return None  # absent or unreadable: exchange again


def token_for(api_key: str, exchange_url: str) -> str:
    """A token for `api_key`: this process's, the host's cached one, or a new one from the exchange."""
    path = cache_path(api_key, exchange_url)
    with _MEMO_LOCK:
        entry = _MEMO.get(path)
    if _fresh(entry):
        return entry[0]  # type: ignore[index]
    _host_files.ensure_private_dir(tokens_dir())
    with _host_files.locked(path):
        entry = _read(path)
        if not _fresh(entry):
            entry = exchange(api_key, exchange_url)
            _host_files.write_atomic(path, json.dumps({"token": entry[0], "expires_at": entry[1]}), 0o600)
    with _MEMO_LOCK:
        _MEMO[path] = entry
    return entry[0]


def _retry_after(headers: Any) -> float:
    try:
        wait = float(headers.get("retry-after", ""))
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER
    return min(max(wait, 0.0), MAX_RETRY_AFTER) or DEFAULT_RETRY_AFTER


def exchange(api_key: str, exchange_url: str) -> tuple[str, float]:
    """(token, expires_at) for the key; a 429 is waited out once, as its Retry-After asks (at most 60 s)."""
    import httpx  # the SDK's own HTTP client; lazy: a token given as-is never needs it

    where = f"boxd's API key exchange at {exchange_url}"
    for attempt in range(2):
        try:
            with httpx.Client(timeout=EXCHANGE_TIMEOUT) as client:
                answer = client.post(exchange_url, json={"api_key": api_key})
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"{where} did not answer ({type(exc).__name__}: {exc}): check the network and BOXD_BASE_URL "
                "(the exchange is on the console host it names), then try again", operation="token exchange"
            ) from exc
        if answer.status_code == 429 and attempt == 0:
            time.sleep(_retry_after(answer.headers))
            continue
        return _parsed(answer, where)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _parsed(answer: Any, where: str) -> tuple[str, float]:
    status, body = answer.status_code, (answer.text or "").strip()[:300]
    if status == 401:
        raise ProviderError(f"{where} refused the API key (401 {body or 'invalid or expired API key'}): check "
                            "BOXD_API_KEY (or boxd_api_key)", operation="token exchange")
    if status == 429:
        raise ProviderError(f"{where} is rate-limited per address and refused again after the wait it asked for "
                            f"(429 {body}): a token lasts an hour and every process here shares one, so this "
                            "is other traffic from this address; try again later, or set BOXD_TOKEN",
                            operation="token exchange")
    if status != 200:
        raise ProviderError(f"{where} answered {status}: {body or 'no body'}", operation="token exchange")
    try:
        data = answer.json()
        return str(data["token"]), float(data["expires_at"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ProviderError(f"{where} answered 200 without a token and its expiry: {body}",
                            operation="token exchange") from exc
