"""Just enough multipart/form-data for the toolbox: parse bulk uploads, build bulk downloads."""

from __future__ import annotations

import json
import secrets
import urllib.parse
from dataclasses import dataclass


@dataclass
class FormPart:
    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def boundary_from_content_type(content_type: str) -> bytes | None:
    for piece in content_type.split(";")[1:]:
        key, _eq, value = piece.strip().partition("=")
        if key.lower() == "boundary":
            return value.strip().strip('"').encode("latin-1")
    return None


def _disposition_params(header: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for piece in header.split(";")[1:]:
        key, _eq, value = piece.strip().partition("=")
        value = value.strip()
        if value.startswith('"') and value.endswith('"'):
            value = value[1:-1].replace('\\"', '"')
        params[key.lower()] = value
    if "filename*" in params:
        charset, _sep, encoded = params["filename*"].partition("''")
        params["filename"] = urllib.parse.unquote(encoded, encoding=charset or "utf-8")
    return params


def parse_form(body: bytes, boundary: bytes) -> list[FormPart]:
    """Split a complete in-memory multipart body; binary safe (the boundary never occurs in the data)."""
    delimiter = b"--" + boundary
    parts: list[FormPart] = []
    for chunk in body.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break
        chunk = chunk[2:] if chunk.startswith(b"\r\n") else chunk
        raw_headers, separator, data = chunk.partition(b"\r\n\r\n")
        if not separator:
            continue
        if data.endswith(b"\r\n"):
            data = data[:-2]
        headers: dict[str, str] = {}
        for line in raw_headers.decode("utf-8", "replace").split("\r\n"):
            key, _colon, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        params = _disposition_params(headers.get("content-disposition", ""))
        parts.append(FormPart(params.get("name", ""), params.get("filename"), headers.get("content-type"), data))
    return parts


def build_download(results: list[tuple[str, bytes | None, dict | None]]) -> tuple[bytes, str]:
    """One part per requested path: `file` with the bytes, or `error` with a JSON daemon error."""
    boundary = secrets.token_hex(16)
    out = bytearray()
    for path, data, error in results:
        quoted = urllib.parse.quote(path, safe="")
        escaped = path.replace("\\", "\\\\").replace('"', '\\"')
        name = "file" if error is None else "error"
        out += f"--{boundary}\r\n".encode()
        out += (f'Content-Disposition: form-data; name="{name}"; filename="{escaped}"; '
                f"filename*=utf-8''{quoted}\r\n").encode()
        if error is None:
            assert data is not None
            out += f"Content-Type: application/octet-stream\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            out += data
        else:
            out += b"Content-Type: application/json\r\n\r\n"
            out += json.dumps(error).encode()
        out += b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"
