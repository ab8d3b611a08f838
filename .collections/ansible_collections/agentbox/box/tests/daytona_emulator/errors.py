"""Errors the emulator answers with, in the envelope the Daytona SDK maps to its exception classes."""

from __future__ import annotations

import datetime
from http import HTTPStatus
from typing import Any

SOURCE_API = "DAYTONA_API"
SOURCE_DAEMON = "DAYTONA_DAEMON"
SOURCE_PROXY = "DAYTONA_PROXY"

# The code the API adds beside the status; the SDK keys precise classes on (source, code) only for daemon codes.
_API_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    408: "REQUEST_TIMEOUT",
    409: "CONFLICT",
    410: "GONE",
    422: "UNPROCESSABLE_ENTITY",
    429: "TOO_MANY_REQUESTS",
    500: "INTERNAL_SERVER_ERROR",
    502: "BAD_GATEWAY",
    503: "SERVICE_UNAVAILABLE",
    504: "GATEWAY_TIMEOUT",
}


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class ApiError(Exception):
    """An error response: raised by handlers, turned into JSON by the server."""

    def __init__(self, status: int, message: str, *, code: str | None = None, source: str = SOURCE_API,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _API_CODES.get(status)
        self.source = source
        self.headers = headers or {}

    def body(self, method: str = "", path: str = "") -> dict[str, Any]:
        envelope: dict[str, Any] = {
            "statusCode": self.status,
            "message": self.message,
            "error": reason_phrase(self.status),
            "source": self.source,
            "timestamp": now_iso(),
            "path": path,
            "method": method,
        }
        if self.code:
            envelope["code"] = self.code
        return envelope


def error_body(status: int, message: str, *, code: str | None = None, source: str = SOURCE_API,
               method: str = "", path: str = "") -> dict[str, Any]:
    return ApiError(status, message, code=code, source=source).body(method, path)


class Reply:
    """A successful answer: JSON (dict/list), raw bytes with a content type, or no body."""

    def __init__(self, status: int = 200, body: Any = None, content_type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}
