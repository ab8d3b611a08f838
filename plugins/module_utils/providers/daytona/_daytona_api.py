# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Daytona SDK (daytona==0.226.1) as the daytona provider's transport: the client, calls with
bounded retries, and every failure turned into a ProviderError naming the box and the operation.

Resilience, on top of what the SDK already does by itself (urllib3 retries idempotent GETs on a
dropped connection or a 429/503 carrying Retry-After; toolbox calls are re-sent on
RemoteDisconnected even when they are POSTs):
  * idempotent calls are retried a bounded number of times with backoff on 429, 502, 503, 504 and
    connection errors; 500 and every 4xx fail at once;
  * every call has a timeout; every failure is a ProviderError naming the box and the operation.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...core._provider import BoxNotFound, EngineUnreachable, ProviderError
from ._daytona_state import is_ghost

# Some of these are for the provider's other files, which import them from here.
try:
    from daytona import (  # pylint: disable=unused-import
        CreateSandboxFromImageParams,
        CreateSandboxFromSnapshotParams,
        Daytona,
        DaytonaAuthenticationError,
        DaytonaConfig,
        DaytonaConflictError,
        DaytonaConnectionError,
        DaytonaError,
        DaytonaNotFoundError,
        DaytonaSessionEndedError,
        FileUpload,
        Image,
        ListSandboxesQuery,
        Resources,
        SandboxListSortDirection,
        SandboxListSortField,
        SessionExecuteRequest,
    )

    HAS_DAYTONA = True
    DAYTONA_IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # pragma: no cover - reported when the provider is used
    HAS_DAYTONA = False
    DAYTONA_IMPORT_ERROR = exc
    DaytonaError = Exception  # type: ignore[assignment,misc]
    # Defined so that the provider's files import; nothing reaches them before make_client() said why.
    CreateSandboxFromImageParams = CreateSandboxFromSnapshotParams = None  # type: ignore[assignment,misc]
    Daytona = DaytonaConfig = None  # type: ignore[assignment,misc]
    DaytonaAuthenticationError = DaytonaConflictError = DaytonaConnectionError = None  # type: ignore[assignment,misc]
    DaytonaNotFoundError = DaytonaSessionEndedError = FileUpload = Image = None  # type: ignore[assignment,misc]
    ListSandboxesQuery = Resources = SessionExecuteRequest = None  # type: ignore[assignment,misc]
    SandboxListSortDirection = SandboxListSortField = None  # type: ignore[assignment,misc]

try:
    # What the API client raises where the SDK does not wrap a call (snapshot.activate): the status and body.
    from daytona_api_client.exceptions import ApiException as OpenApiError

    OPENAPI_ERRORS: tuple[type[BaseException], ...] = (OpenApiError,)
except ImportError:  # pragma: no cover - comes with the SDK
    OPENAPI_ERRORS = ()

try:
    import httpx

    HTTPX_ERRORS: tuple[type[BaseException], ...] = (httpx.TransportError,)
except ImportError:  # pragma: no cover - httpx comes with the SDK
    httpx = None  # type: ignore[assignment]
    HTTPX_ERRORS = ()

try:
    from urllib3.exceptions import MaxRetryError, ProtocolError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    URLLIB3_ERRORS: tuple[type[BaseException], ...] = (MaxRetryError, ProtocolError, Urllib3Timeout)
except ImportError:  # pragma: no cover - urllib3 comes with the SDK
    URLLIB3_ERRORS = ()

DEFAULT_API_URL = "https://app.daytona.io/api"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
DEFAULT_RETRIES = 3  # retries after the first attempt
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 4.0)
# Daytona's rate-limit windows are a minute long: a Retry-After up to that (and a margin) is honoured...
MAX_RETRY_AFTER = 65.0
# ...but all the retries of one call stay within this many seconds.
RETRY_DEADLINE_SECONDS = 150.0
API_TIMEOUT = 30.0
POLL_SECONDS = 1.0  # between reads of a state that is changing


class DaytonaCallError(ProviderError):
    """A Daytona call failed; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, *, box: str | None, operation: str, status: int | None = None):
        super().__init__(message, box=box, operation=operation)
        self.status = status


# -- pure helpers (unit-tested) ---------------------------------------------------------------------
def status_of(exc: BaseException) -> int | None:
    """The HTTP status behind an SDK, API client or httpx error, when there is one."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    if OPENAPI_ERRORS and isinstance(exc, OPENAPI_ERRORS) and isinstance(getattr(exc, "status", None), int):
        return exc.status  # type: ignore[attr-defined]
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def is_transport_error(exc: BaseException) -> bool:
    """No answer at all: refused, reset, dropped, or a read timeout (the SDK sometimes wraps urllib3's
    MaxRetryError in a plain DaytonaError, so the cause chain is searched too)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if HAS_DAYTONA and isinstance(current, DaytonaConnectionError):
            return True
        if HTTPX_ERRORS and isinstance(current, HTTPX_ERRORS):
            return True
        if URLLIB3_ERRORS and isinstance(current, URLLIB3_ERRORS):
            return True
        if isinstance(current, (ConnectionError, TimeoutError)):
            return True
        if status_of(current) is not None:
            return False  # an answer came back
        current = current.__cause__ or current.__context__
        seen += 1
    return False


def is_retryable(exc: BaseException) -> bool:
    """429, 502, 503, 504 or no answer: worth another try when the call is idempotent."""
    return status_of(exc) in RETRY_STATUSES or is_transport_error(exc)


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait: the longest of `Retry-After` and Daytona's per-throttler
    `Retry-After-<name>` headers (@nestjs/throttler: authenticated, sandbox-create, sandbox-lifecycle; each a
    window of up to a minute), capped at MAX_RETRY_AFTER."""
    headers = getattr(exc, "headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    if not headers:
        return None
    waits: list[float] = []
    try:
        for key, value in headers.items():
            lowered = str(key).lower()
            if lowered == "retry-after" or lowered.startswith("retry-after-"):
                try:
                    waits.append(float(value))
                except (TypeError, ValueError):
                    continue  # an HTTP date, or garbage: the default backoff applies
    except AttributeError:
        return None
    return min(max(waits), MAX_RETRY_AFTER) if waits else None


def backoff_delay(attempt: int, exc: BaseException | None = None) -> float:
    """Seconds before retry number `attempt` (0-based): Retry-After when given, else 0.5, 1, 2, 4."""
    hinted = retry_after(exc) if exc is not None else None
    if hinted is not None:
        return hinted
    return BACKOFF_SECONDS[min(attempt, len(BACKOFF_SECONDS) - 1)]


# Runs "$@" as $1 whoever the toolbox daemon runs as: Daytona's daemon runs as the image's USER (root when
# the image has none), not as the create's os_user, so the switch is decided in the box, per command.
def is_refusal_worth_retrying(exc: BaseException) -> bool:
    """429 and 503: the service refused before doing anything. (Gateway cuts are not retried blindly.)"""
    return status_of(exc) in (429, 503)


def is_api_error(exc: BaseException) -> bool:
    return (
        (HAS_DAYTONA and isinstance(exc, DaytonaError))
        or is_transport_error(exc)
        or (httpx is not None and isinstance(exc, httpx.HTTPStatusError))
        or bool(OPENAPI_ERRORS and isinstance(exc, OPENAPI_ERRORS))
    )


def detail_of(exc: BaseException) -> str:
    """What the failure says: an API client error's message from its body (not its headers), else its text."""
    body = getattr(exc, "body", None) if OPENAPI_ERRORS and isinstance(exc, OPENAPI_ERRORS) else None
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError, TypeError):
            message = None
        if message:
            return "; ".join(map(str, message)) if isinstance(message, list) else str(message)
    return str(exc).strip() or type(exc).__name__


def bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """fn() in a worker thread, given up on after `seconds` (for SDK calls that take no timeout)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name=f"daytona-{what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"{what} did not answer within {seconds:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@contextlib.contextmanager
def neutral_cwd() -> Iterator[None]:
    """Run the body in an empty private directory (no .env to read), then go back to where we were."""
    try:
        previous: str | None = os.getcwd()
    except OSError:  # the directory we were in is gone: nothing to go back to
        previous = None
    neutral = tempfile.mkdtemp(prefix="agentbox-daytona-")
    try:
        os.chdir(neutral)
        yield
    finally:
        if previous is not None:
            try:
                os.chdir(previous)
            except OSError:
                os.chdir(tempfile.gettempdir())
        shutil.rmtree(neutral, ignore_errors=True)


def make_client(api_url: str, api_key: str | None, target: str | None) -> Any:
    """A new SDK client (each starts an event thread: the provider keeps one per process)."""
    if not HAS_DAYTONA:
        raise ProviderError(
            f"the Python package 'daytona' (pinned daytona==0.226.1 in requirements.txt) is required on the "
            f"controller for provider daytona: {DAYTONA_IMPORT_ERROR}"
        )
    try:
        # The SDK fills what the config leaves empty (the key, the target: without DAYTONA_TARGET it is
        # always so) from ./.env and ./.env.local of the current directory: the workspace an agent
        # writes. Our settings come from the module and the process environment only.
        with neutral_cwd():
            return Daytona(DaytonaConfig(api_key=api_key or None, api_url=api_url, target=target or None))
    except DaytonaAuthenticationError as exc:
        raise ProviderError("no Daytona API key: set DAYTONA_API_KEY (or the module option daytona_api_key)") from exc


class DaytonaAPI:
    """Calls to one Daytona API with bounded retries, and the sandboxes looked up there (cached by name:
    a sandbox object carries the id and the toolbox URL)."""

    def __init__(self, api_url: str, retries: int):
        super().__init__()  # cooperative: in DaytonaProvider the next class is Provider
        self.api_url = api_url
        self.retries = retries
        # All the retries of one call end within this many seconds (lowered by tests through the provider).
        self.retry_deadline = RETRY_DEADLINE_SECONDS
        self.sandboxes: dict[str, Any] = {}

    @property
    def sdk(self) -> Any:
        """The SDK client; the provider keeps one per process."""
        raise NotImplementedError

    def api_error(
        self, exc: BaseException, box: str | None, operation: str, attempts: int = 1, deadline: float | None = None
    ) -> ProviderError:
        """A ProviderError that says what failed, for which box, and what to do; `deadline`: the retries
        stopped because the next wait would have passed the overall retry deadline (seconds)."""
        status = status_of(exc)
        detail = detail_of(exc)
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        if deadline is not None:
            tries += f" (retrying would pass the {deadline:g} s retry deadline)"
        if (HAS_DAYTONA and isinstance(exc, DaytonaAuthenticationError)) or status == 401:
            return DaytonaCallError(
                f"the Daytona API at {self.api_url} refused the API key (401): check DAYTONA_API_KEY "
                "or daytona_api_key",
                box=box,
                operation=operation,
                status=401,
            )
        if (HAS_DAYTONA and isinstance(exc, DaytonaNotFoundError)) or status == 404:
            return BoxNotFound(f"not found on Daytona ({self.api_url}): {detail}", box=box, operation=operation)
        if status is None and is_transport_error(exc):
            error = EngineUnreachable(
                f"the Daytona API at {self.api_url} did not answer{tries}: {detail}. Check the network and "
                "DAYTONA_API_URL, then try again",
                box=box,
                operation=operation,
            )
            return error
        if status == 429:
            wait = retry_after(exc)
            return DaytonaCallError(
                f"Daytona answered 429{tries}: {detail}. Its rate limit refused the call"
                + (f" (it asks to wait {wait:.0f} s)" if wait else "")
                + "; try again later, or make fewer calls at once",
                box=box,
                operation=operation,
                status=status,
            )
        if status in RETRY_STATUSES:
            return DaytonaCallError(
                f"Daytona answered {status}{tries}: {detail}. The service is overloaded or unreachable behind its "
                "proxy; try again later",
                box=box,
                operation=operation,
                status=status,
            )
        return DaytonaCallError(
            f"Daytona answered {status or 'an error'}: {detail}", box=box, operation=operation, status=status
        )

    def api_call(
        self,
        fn: Callable[[], Any],
        *,
        box: str | None,
        operation: str,
        idempotent: bool = True,
        retry_on: Callable[[BaseException], bool] | None = None,
    ) -> Any:
        """fn() with bounded retries (idempotent calls only) and errors turned into ProviderError."""
        attempt = 0
        deadline = time.monotonic() + self.retry_deadline
        while True:
            try:
                return fn()
            except ProviderError:
                raise
            except Exception as exc:
                if not is_api_error(exc):
                    raise
                retry = (retry_on or is_retryable)(exc) and idempotent
                delay = backoff_delay(attempt, exc)
                if retry and attempt < self.retries:
                    if time.monotonic() + delay <= deadline:
                        time.sleep(delay)
                        attempt += 1
                        continue
                    raise self.api_error(exc, box, operation, attempt + 1, self.retry_deadline) from exc
                raise self.api_error(exc, box, operation, attempt + 1) from exc

    # -- sandboxes ------------------------------------------------------------------------------
    def get_sandbox(self, name: str, operation: str) -> Any | None:
        """The sandbox called `name` (fresh), or None. get() is consistent; list() is not."""
        try:
            sandbox = self.api_call(
                lambda: self.sdk.get(name, request_timeout=API_TIMEOUT), box=name, operation=operation
            )
        except BoxNotFound:
            self.sandboxes.pop(name, None)
            return None
        if is_ghost(sandbox):
            self.sandboxes.pop(name, None)
            return None
        self.sandboxes[name] = sandbox
        return sandbox

    def cached_sandbox(self, name: str, operation: str, fresh: bool = False) -> Any:
        """The sandbox object for toolbox calls (cached: it carries the id and the toolbox URL)."""
        sandbox = None if fresh else self.sandboxes.get(name)
        if sandbox is None:
            sandbox = self.get_sandbox(name, operation)
        if sandbox is None:
            raise BoxNotFound(f"no box called {name!r} on Daytona ({self.api_url})", box=name, operation=operation)
        return sandbox
