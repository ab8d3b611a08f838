# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The warm pool (docs/pool.md): boxes created, booted to ready and paused before anyone asks, per key
(provider, engine, image fingerprint, checkpoint).

Settings live in ~/.agentbox/pool/pools.json (playbooks/pool.yml writes them), one entry per pool:

    {"pools": {"<key>": {"provider": "docker", "engine": "local", "image": "agentbox/box:latest",
                         "checkpoint": null, "size": 2, "max_memory": "2g", "ttl_minutes": 60}}}

A pooled container carries io.agentbox.kind=pool and io.agentbox.pool=<key>, never io.agentbox.box, so
listings, the inventory, destroy and prune of users' boxes never see it. `refill` (pool.yml, and the host
daemon between requests) brings each pool to its size under a host lock, so whatever it finds not paused
there is what a killed refill left: it goes, as do boxes past their time to live, boxes of a key no pool
has any more (the image or checkpoint changed: the fingerprint says so), and volumes without a container.
`take` is the claim: an unpause on the engine, which only one caller can win, then a rename.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from typing import Any

from ..core import _host_files, _journal, _naming, _sizes
from ..core._boot import BOOT_COMMAND, boot_box_then
from ..core._provider import BoxSpec, Provider, ProviderError

DEFAULT_TTL_MINUTES = 60
WEB_PORT = 80
# Where the in-box cgroup says how much memory the box holds (a private cgroup namespace: its own root):
# cgroup v2's file, else v1's (hosts still on cgroup v1 have no memory.current, and the pool read 0).
MEMORY_FILES = ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes")


class PoolError(ProviderError):
    pass


@dataclasses.dataclass
class PoolSettings:
    size: int = 0
    max_memory: str = ""  # '' is no bound beyond size
    ttl_minutes: int = DEFAULT_TTL_MINUTES

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 0:
            raise PoolError(f"pool size {self.size!r} should be a whole number, 0 or more (0 turns the pool off)")
        if not isinstance(self.ttl_minutes, int) or self.ttl_minutes < 1:
            raise PoolError(f"pool ttl_minutes {self.ttl_minutes!r} should be a whole number of minutes, 1 or more")
        if self.max_memory:
            memory_bytes(self.max_memory)


def memory_bytes(value: str) -> int:
    """The pool's memory budget in bytes (the parser of a box's own memory limit: _sizes)."""
    try:
        return _sizes.memory_bytes(str(value))
    except _sizes.BadValue as exc:
        raise PoolError(f"pool max_memory {value!r} should be a number with a unit, e.g. 2g or 512m") from exc


def pool_key(provider: str, engine: str, fingerprint: str, checkpoint: str | None) -> str:
    """The pool a create draws from: 16 hex of sha1 over what makes two boxes interchangeable before a workspace."""
    text = json.dumps([provider, engine, fingerprint, checkpoint or ""])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def pools_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), "pool", "pools.json")


def configured(path: str | None = None) -> dict[str, dict[str, Any]]:
    text = _host_files.read_text(path or pools_path())
    try:
        loaded = json.loads(text) if text else {}
    except ValueError:
        return {}
    pools = loaded.get("pools") if isinstance(loaded, dict) else None
    return pools if isinstance(pools, dict) else {}


def _write(change: Any, path: str | None = None) -> None:
    path = path or pools_path()
    _host_files.ensure_private_dir(os.path.dirname(path))

    def apply(old: str | None) -> str:
        pools = json.loads(old).get("pools", {}) if old else {}
        change(pools)
        return json.dumps({"pools": pools}, indent=1, sort_keys=True) + "\n"

    _host_files.update(path, apply)


def image_key(provider: Provider, image: str, checkpoint: str | None) -> tuple[str, str]:
    """(key, fingerprint) of `image` on the provider's engine; PoolError when the image is gone."""
    labels = provider.image_labels(image)
    if not labels and not provider.image_exists(image):
        raise PoolError(f"image {image!r} is not on engine {provider.engine}: the pool keeps no box for it "
                        "(build it with playbooks/build_image.yml)")
    fingerprint = labels.get(_naming.label("image_fingerprint"), "")
    return pool_key(provider.name, provider.engine, fingerprint, checkpoint), fingerprint


def set_pool(provider: Provider, image: str, checkpoint: str | None, settings: PoolSettings,
             path: str | None = None) -> str:  # fmt: skip
    """Record the pool of (provider, engine, image, checkpoint) with `settings` (size 0 removes it); its key."""
    store = getattr(provider, "pool_store", None)
    if store is None:
        raise PoolError(f"a warm pool is not available on provider {provider.name}: it keeps no paused boxes "
                        "(docs/pool.md); creates there go on as before")
    key, _fingerprint = image_key(provider, image, checkpoint)

    def change(pools: dict[str, Any]) -> None:
        for old in [k for k, v in pools.items() if (v.get("provider"), v.get("engine"), v.get("image"),
                                                    v.get("checkpoint")) == (provider.name, provider.engine,
                                                                             image, checkpoint)]:
            pools.pop(old)  # the same pool under an older fingerprint
        if settings.size:
            pools[key] = {"provider": provider.name, "engine": provider.engine, "image": image,
                          "checkpoint": checkpoint, **dataclasses.asdict(settings)}

    _write(change, path)
    return key


def owner(path: str | None = None) -> str:
    """Whose pooled boxes these are (12 hex of sha1 of the settings file's path): a refill or drain touches only
    its own, so two users (or test runs) sharing an engine never remove each other's."""
    return hashlib.sha1(os.path.realpath(path or pools_path()).encode()).hexdigest()[:12]


def _lock_path(path: str | None) -> str:
    path = path or pools_path()
    _host_files.ensure_private_dir(os.path.dirname(path))
    return path + ".refill"


def refill(provider: Provider, path: str | None = None) -> dict[str, Any]:
    """One pass over this provider's engine: remove what must go, then make what each pool lacks.
    {made, removed, problems}; a pool whose image is gone is a problem, never an exception."""
    report: dict[str, Any] = {"made": [], "removed": [], "problems": []}
    store = provider.pool_store()  # type: ignore[attr-defined]
    mine = {k: v for k, v in configured(path).items()
            if v.get("provider") == provider.name and v.get("engine") == provider.engine}
    with _host_files.locked(_lock_path(path)):
        wanted: dict[str, dict[str, Any]] = {}
        for key, entry in mine.items():
            try:
                current, _fp = image_key(provider, entry["image"], entry.get("checkpoint"))
            except PoolError as exc:
                report["problems"].append(str(exc))
                continue
            if current != key:
                report["problems"].append(f"image {entry['image']!r} changed since pool {key} was set: its boxes "
                                          "are replaced (run playbooks/pool.yml again to keep the pool)")
                continue
            wanted[key] = entry
        now = time.time()
        for item in store.pooled(owner=owner(path)):
            entry = wanted.get(item["key"])
            created = _naming.parse_iso(item["created"]) or 0.0
            why = ""
            if entry is None:
                why = "its pool is gone or its image changed"
            elif item["state"] != "paused":
                why = f"it is {item['state']}, not paused (a refill or claim was cut short, or it was damaged)"
            elif now - created > int(entry.get("ttl_minutes", DEFAULT_TTL_MINUTES)) * 60:
                why = "past its time to live"
            if why:
                store.remove(item["container"], item["labels"].get("pool_box", ""))
                report["removed"].append({"container": item["container"], "why": why})
        _undo_killed_claims(provider, report)
        for volume in store.volumes_left(owner(path)):
            store.remove_volume(volume)
            report["removed"].append({"volume": volume, "why": "its pooled box is gone"})
        for key, entry in wanted.items():
            settings = PoolSettings(int(entry.get("size", 0)), str(entry.get("max_memory") or ""),
                                    int(entry.get("ttl_minutes", DEFAULT_TTL_MINUTES)))
            have = len(store.pooled(key, owner(path)))
            while have < allowed(settings, entry):
                try:
                    made, memory = make_pooled(provider, key, entry["image"], entry.get("checkpoint"), owner(path))
                except ProviderError as exc:
                    report["problems"].append(f"pool {key}: a box could not be made: {exc}")
                    break
                if memory:
                    _write(lambda pools, k=key, m=memory: pools.get(k, {}).update(box_memory=m), path)
                    entry["box_memory"] = memory
                report["made"].append(made)
                have += 1
    return report


def _undo_killed_claims(provider: Provider, report: dict[str, Any]) -> None:
    """Creates killed during or after their claim (their journal names a pooled box and no process holds it):
    rolled back as the next create of that name would do it, so a kill -9 leaks nothing past this pass."""
    from . import _rollback

    directory = _journal.journal_dir(provider.name, provider.engine)
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for box in [n.removesuffix(".json") for n in names if n.endswith(".json") and not n.startswith(".")]:
        journal = _journal.Journal(provider.name, provider.engine, box)
        try:
            stale = journal.claim()
        except _journal.CreateInProgress:
            continue  # a live create: its own
        try:
            if stale and stale.get("pool_claim"):
                _rollback.roll_back(provider, stale)
                journal.forget()
                why = f"its create was killed after it claimed {stale['pool_claim']}"
                report["removed"].append({"box": box, "why": why})
        finally:
            journal.release()


def allowed(settings: PoolSettings, entry: dict[str, Any]) -> int:
    """Boxes the pool may hold: its size, fewer when max_memory cannot hold that many (by the last box's memory)."""
    if not settings.max_memory or not entry.get("box_memory"):
        return settings.size
    return min(settings.size, memory_bytes(settings.max_memory) // max(int(entry["box_memory"]), 1))


def make_pooled(provider: Provider, key: str, image: str, checkpoint: str | None, owner_id: str) -> tuple[str, int]:
    """Create one pooled box, boot it to ready and pause it: (its container, the memory it held, bytes)."""
    box_id = _naming.new_box_id()
    name = f"pool-{key[:8]}-{box_id}"
    _key, fingerprint = image_key(provider, image, checkpoint)
    labels = {_naming.label(k): v for k, v in {
        "kind": "pool", "pool": key, "pool_box": name, "pool_owner": owner_id, "id": box_id, "created": _naming.now_iso(), "image": image,
        "image_fingerprint": fingerprint, "provider": provider.name, "engine": provider.engine,
        "checkpoint": checkpoint or "",
    }.items()}
    spec = BoxSpec(name=name, box_id=box_id, project="", workspace="", image=image, labels=labels, ports=[WEB_PORT])
    facts = provider.create(spec)
    try:
        # Without the supervisor: a claim's boot starts it on the box's workspace and its agentbox.yaml.
        # The memory it holds booted is read in the same exec (the pool's max_memory is judged by it).
        read = " || ".join(f"cat {path} 2>/dev/null" for path in MEMORY_FILES)
        summary, output = boot_box_then(provider, name, after=f'echo "memory=$({read})"', flags="--no-supervisor")
        if summary is None:
            raise ProviderError(f"image {image} has no {BOOT_COMMAND}: a pooled box is booted before its claim",
                                box=name, operation="pool")
        # The box's word (a checkpoint's image may be any box's): ASCII digits, bounded, or nothing known.
        found = [line[len("memory="):] for line in output.splitlines() if line.startswith("memory=")]
        memory = int(found[-1]) if found and re.fullmatch(r"[0-9]{1,15}", found[-1]) else 0
        provider.pause(name)
    except BaseException:
        provider.pool_store().remove(facts.container, name)  # type: ignore[attr-defined]
        raise
    return facts.container, memory


def refill_all(path: str | None = None) -> list[dict[str, Any]]:
    """One refill pass on every engine a pool is set for (the host daemon's, between its requests); an engine
    that fails is a problem in its report, never an exception."""
    from ..providers._registry import SSH_ENGINE_PROVIDERS, get_provider

    reports = []
    for provider_name, engine in sorted({(v.get("provider"), v.get("engine")) for v in configured(path).values()}):
        report: dict[str, Any] = {"provider": provider_name, "engine": engine}
        provider = None
        try:
            options = {"engine": engine} if provider_name in SSH_ENGINE_PROVIDERS else {}
            provider = get_provider(str(provider_name), **options)
            report.update(refill(provider, path))
        except Exception as exc:  # noqa: BLE001 - one engine down must not stop the others' pools
            report["problems"] = [str(exc)]
        finally:
            close = getattr(provider, "close", None)
            if close is not None:
                close()
        reports.append(report)
    return reports


def drain(provider: Provider, key: str | None = None, path: str | None = None) -> list[str]:
    """Remove the pooled boxes (of `key`) on this provider's engine; their containers."""
    store = provider.pool_store()  # type: ignore[attr-defined]
    removed = []
    with _host_files.locked(_lock_path(path)):
        for item in store.pooled(key, owner(path)):
            store.remove(item["container"], item["labels"].get("pool_box", ""))
            removed.append(item["container"])
    return removed


def take(provider: Provider, key: str, container: str) -> dict[str, Any] | None:
    """Claim a paused pooled box of `key` (unpaused, renamed to `container`); the pooled box's record (under its
    new container name, running) or None when the pool has none left. Two callers never get the same box."""
    store = getattr(provider, "pool_store", None)
    if store is None:
        return None
    pool = store()
    for item in pool.pooled(key):
        if item["state"] == "paused" and pool.take(item["container"], container):
            return {**item, "container": container, "pooled_as": item["container"]}
    return None


def show(provider: Provider, path: str | None = None) -> dict[str, Any]:
    """The pools set for this provider's engine and the pooled boxes found there."""
    store = getattr(provider, "pool_store", None)
    pools = {k: v for k, v in configured(path).items()
             if v.get("provider") == provider.name and v.get("engine") == provider.engine}
    boxes = store().pooled(owner=owner(path)) if store is not None else []
    return {"pools": pools, "boxes": [{k: v for k, v in b.items() if k != "labels"} for b in boxes],
            "available": store is not None}
