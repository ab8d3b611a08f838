# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which environment a checkpoint image keeps: the image's own, never the box's runtime `env`.

A box's container config holds the image's Env plus what its create added (the user's `env`,
often API keys out of habit, and the AGENTBOX_* identity). A checkpoint keeps only the first; a
box restored from it gets its own `env` at create.

`docker commit` merges the container's Env into whatever config it is given (it cannot drop a
key) and older engines also keep the committing container's whole config, values included, as
the image's `container_config`. So a layered checkpoint is committed with the added keys blanked
and then re-registered, metadata only, with the image's own Env and no `container_config`
(`without_container_config`). A flattened checkpoint replays its config from scratch and leaves
the added keys out altogether.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import Any


def _split(entries: list[str]) -> dict[str, str]:
    pairs = (entry.partition("=") for entry in entries)
    return {key: value for key, _sep, value in pairs}


def image_env(container_env: list[str], own_env: list[str], *, blank_added: bool) -> list[str]:
    """The Env a checkpoint of a container keeps: `own_env` (its image's), in the image's order;
    keys the box added or changed are reset to the image's value, or blanked (`blank_added`) or
    dropped when the image has none."""
    own = _split(own_env)
    kept = [f"{key}={value}" for key, value in own.items()]
    if blank_added:
        kept += [f"{key}=" for key in _split(container_env) if key not in own]
    return kept


def without_container_config(engine: Any, image_id: str, tag: str, env: list[str]) -> str:
    """Re-register a committed image under `tag` with only its own config: Env set to `env`, and no
    `container_config` (older engines record the committing container's whole config there, Env
    values included, whatever config the commit was given). Returns the new image id. `engine`: an
    _engine_api or _engine_sdk client.

    Metadata only: the archive loaded holds the config and a manifest, no layer data; the engine
    finds every layer already in its store and reuses it.
    """
    attrs = engine.inspect_image(image_id)
    if attrs is None:
        raise ValueError(f"the committed image {image_id} is gone")
    config = dict(attrs.get("Config") or {})
    config["Env"] = env
    image_config = {
        "architecture": attrs.get("Architecture", ""),
        "os": attrs.get("Os", ""),
        "created": attrs.get("Created", ""),
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": list((attrs.get("RootFS") or {}).get("Layers") or [])},
    }
    raw = json.dumps(image_config, sort_keys=True).encode("utf-8")
    config_name = hashlib.sha256(raw).hexdigest() + ".json"
    layers = [f"{index}/layer.tar" for index in range(len(image_config["rootfs"]["diff_ids"]))]
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": layers}]).encode("utf-8")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in ((config_name, raw), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    answer = engine.load_image(archive.getvalue())
    if not any(f"Loaded image: {tag}" in str(line.get("stream", "")) for line in answer if isinstance(line, dict)):
        raise ValueError(f"the engine did not load the cleaned image config: {str(answer)[-500:]}")
    loaded = engine.inspect_image(tag)
    if loaded is None:
        raise ValueError(f"the engine loaded the cleaned image config but has no image {tag}")
    return str(loaded["Id"])
