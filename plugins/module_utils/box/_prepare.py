# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a first create needs, made ready ahead of it (`prepare.yml`): the box image on the provider's
engine, streamed to a remote engine that lacks it, with a host record of what was prepared where."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..core import _host_files
from ..core._provider import Provider, ProviderError


def record_path() -> str:
    """~/.agentbox/prepared.json: {"<provider>:<engine>": {image, prepared_at (first made ready), checked_at}}."""
    return os.path.join(_host_files.agentbox_dir(), "prepared.json")


def prepared() -> dict[str, Any]:
    """The record, {} when there is none or it is not an object (a bad record is rewritten, never trusted)."""
    try:
        data = json.loads(_host_files.read_text(record_path()) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def prepare(provider: Provider, image: str, check_mode: bool = False) -> dict[str, Any]:
    """Make `image` ready on the provider's engine. Returns {changed, where, image, path, transfer}:
    path `present` (already there), `streamed` or `pulled` (brought to a remote engine now), `would copy` (check mode)."""
    where = f"{provider.name}:{provider.engine}"
    present = provider.image_exists(image)
    if not present and not provider.transfers_images:
        raise ProviderError(
            f"image {image} is not on engine {provider.engine} and this provider cannot bring it: build it first "
            "(ansible-playbook playbooks/build_image.yml), or name one that is there with -e image=REF"
        )
    result: dict[str, Any] = {"changed": not present, "where": where, "image": image,
                              "path": "present" if present else "would copy", "transfer": {}}  # fmt: skip
    if check_mode:
        return result
    if provider.transfers_images:  # also when present: another image under that name there is replaced
        result["transfer"] = provider.bring_image(image)
        result["path"] = result["transfer"].get("path", "streamed")
        result["changed"] = result["path"] != "present"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def change(old: str | None) -> str:
        data = prepared() if old else {}
        previous = data.get(where) if isinstance(data.get(where), dict) else {}
        since = previous.get("prepared_at") if previous.get("image") == image else None
        data[where] = {"image": image, "prepared_at": since or now, "checked_at": now}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    _host_files.ensure_private_dir(_host_files.agentbox_dir())
    _host_files.update(record_path(), change)
    return result
