"""Checks on request bodies and query parameters, shared by the API areas: a bad value is a 400."""

from __future__ import annotations

from typing import Any

from .errors import ApiError


def str_map(value: Any, field_name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ApiError(400, f"{field_name} must be an object of string values")
    return dict(value)


def optional_int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be an integer")
    if value < minimum:
        raise ApiError(400, f"{key} must be at least {minimum}")
    return value


def query_str(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


def query_int(query: dict[str, list[str]], key: str, default: int, minimum: int) -> int:
    raw = query_str(query, key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ApiError(400, f"{key} must be an integer") from exc
    if value < minimum:
        raise ApiError(400, f"{key} must be at least {minimum}")
    return value


def page_limit(query: dict[str, list[str]], default: int) -> int:
    """A list's `limit`, as Daytona's @PageLimit checks it (class-validator Min(1), Max(200)): 400 outside."""
    limit = query_int(query, "limit", default, minimum=1)
    if limit > 200:
        raise ApiError(400, "limit must not be greater than 200")
    return limit
