"""Preview URLs (plain and signed) and SSH access tokens of the emulated control plane."""

from __future__ import annotations

import secrets
import time
import uuid
from typing import TYPE_CHECKING, Any

from .errors import ApiError
from .records import SandboxRecord, iso
from .request_params import query_int, query_str

if TYPE_CHECKING:
    from .core import Emulator

MAX_SIGNED_PREVIEW_SECONDS = 24 * 3600
_TOKEN_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


class PreviewAndSshAccess:
    """Mixed into Emulator (core.py), whose state and lock it uses."""

    def preview_url(self: Emulator, id_or_name: str, raw_port: str) -> dict[str, Any]:
        sb = self.find(id_or_name)
        port = _port(raw_port)
        with self.lock:
            return {"sandboxId": sb.id, "url": f"{self.base_url}/preview/{sb.id}/{port}", "token": sb.preview_token}

    def signed_preview_url(self: Emulator, id_or_name: str, raw_port: str,
                           query: dict[str, list[str]]) -> dict[str, Any]:
        sb = self.find(id_or_name)
        port = _port(raw_port)
        seconds = query_int(query, "expiresInSeconds", 60, minimum=1)
        if seconds > MAX_SIGNED_PREVIEW_SECONDS:
            raise ApiError(400, f"expiresInSeconds must be at most {MAX_SIGNED_PREVIEW_SECONDS}")
        token = secrets.token_urlsafe(24)
        with self.lock:
            self.signed_previews[token] = (sb.id, port, time.time() + seconds, seconds)
        return {"sandboxId": sb.id, "port": port, "token": token, "url": f"{self.base_url}/preview/s/{token}"}

    def expire_signed_preview_url(self: Emulator, id_or_name: str, raw_port: str, token: str) -> None:
        sb = self.find(id_or_name)
        with self.lock:
            entry = self.signed_previews.get(token)
            if entry is None or entry[0] != sb.id or entry[1] != _port(raw_port):
                raise ApiError(404, "Signed preview URL not found")
            del self.signed_previews[token]

    def signed_preview_records(self: Emulator) -> list[dict[str, Any]]:
        """Admin: every signed preview URL the API made, with the expiry it was asked for (tokens included)."""
        with self.lock:
            return [{"token": token, "sandboxId": sid, "port": port, "expiresInSeconds": seconds, "expiresAt": iso(until)}
                    for token, (sid, port, until, seconds) in self.signed_previews.items()]  # fmt: skip

    def expire_signed_preview_now(self: Emulator, token: str) -> dict[str, Any]:
        """Admin: the signed URL's time is up now (what waiting out expiresInSeconds would do)."""
        with self.lock:
            entry = self.signed_previews.get(token)
            if entry is None:
                raise ApiError(404, "no such signed preview URL")
            self.signed_previews[token] = (entry[0], entry[1], time.time(), entry[3])
            return {"sandboxId": entry[0], "port": entry[1], "expired": True}

    def resolve_preview(self: Emulator, sandbox_id: str, raw_port: str, token: str | None) -> tuple[SandboxRecord, int]:
        """A preview request with the sandbox's current token (a token from before a restart is refused)."""
        sb = self.find(sandbox_id)
        port = _port(raw_port)
        with self.lock:
            if not sb.public and token != sb.preview_token:
                raise ApiError(401, "Invalid or missing preview token", source="DAYTONA_PROXY")
        return sb, port

    def resolve_signed_preview(self: Emulator, token: str) -> tuple[SandboxRecord, int]:
        with self.lock:
            entry = self.signed_previews.get(token)
            if entry is None or entry[2] <= time.time():  # as Daytona's proxy: past its expiresInSeconds, refused
                raise ApiError(401, "Signed preview URL is invalid or expired", source="DAYTONA_PROXY")
        return self.find(entry[0]), entry[1]

    def create_ssh_access(self: Emulator, id_or_name: str, query: dict[str, list[str]]) -> dict[str, Any]:
        sb = self.find(id_or_name)
        minutes = query_int(query, "expiresInMinutes", 60, minimum=1)
        # As Daytona: 32 characters without '_' or '-', and a new access revokes the sandbox's older ones.
        token = "".join(secrets.choice(_TOKEN_ALPHABET) for _position in range(32))
        now = time.time()
        with self.lock:
            self.ssh_tokens = {t: v for t, v in self.ssh_tokens.items() if v[0] != sb.id}
            self.ssh_tokens[token] = (sb.id, now + minutes * 60)
        gateway = self.ssh_gateway
        command = f"ssh -p {gateway.port} {token}@{self.config.host}" if gateway else f"ssh {token}@ssh.emulator.invalid"
        return {
            "id": str(uuid.uuid4()), "sandboxId": sb.id, "token": token, "expiresAt": iso(now + minutes * 60),
            "createdAt": iso(now), "updatedAt": iso(now), "sshCommand": command,
        }

    def expire_ssh_access(self: Emulator, token: str) -> dict[str, Any]:
        """Admin: the token's time is up now (what waiting out expiresInMinutes would do)."""
        with self.lock:
            entry = self.ssh_tokens.get(token)
            if entry is None:
                raise ApiError(404, "no such SSH access token")
            self.ssh_tokens[token] = (entry[0], time.time())
            return {"sandboxId": entry[0], "expired": True}

    def revoke_ssh_access(self: Emulator, id_or_name: str, query: dict[str, list[str]]) -> dict[str, Any]:
        sb = self.find(id_or_name)
        token = query_str(query, "token")
        with self.lock:
            if token:
                self.ssh_tokens.pop(token, None)
            else:
                self.ssh_tokens = {t: v for t, v in self.ssh_tokens.items() if v[0] != sb.id}
            return self.sandbox_dto(sb)

    def validate_ssh_access(self: Emulator, query: dict[str, list[str]]) -> dict[str, Any]:
        token = query_str(query, "token")
        with self.lock:
            entry = self.ssh_tokens.get(token or "")
        valid = entry is not None and entry[1] > time.time() and entry[0] in self.sandboxes
        return {"valid": valid, "sandboxId": entry[0] if entry else ""}


def _port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError as exc:
        raise ApiError(400, "port must be an integer") from exc
    if not 1 <= port <= 65535:
        raise ApiError(400, "port must be between 1 and 65535")
    return port
