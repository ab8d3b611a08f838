"""The warm pool's settings, key and memory budget (box/_pool), without an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.box import _pool
from tests.unit.support.inprocess import run_module_inprocess


def test_the_pool_key_changes_with_each_part_of_it() -> None:
    base = _pool.pool_key("docker", "local", "abc", None)
    assert len(base) == 16 and base == _pool.pool_key("docker", "local", "abc", "")
    others = {_pool.pool_key("docker_ssh", "local", "abc", None), _pool.pool_key("docker", "h1", "abc", None),
              _pool.pool_key("docker", "local", "abd", None), _pool.pool_key("docker", "local", "abc", "ck")}
    assert base not in others and len(others) == 4


@pytest.mark.parametrize(("settings", "says"), [
    ({"size": -1}, "0 or more"),
    ({"size": 1, "ttl_minutes": 0}, "1 or more"),
    ({"size": 1, "max_memory": "lots"}, "number with a unit"),
])
def test_bad_pool_settings_say_what_to_give(settings: dict, says: str) -> None:
    with pytest.raises(_pool.PoolError, match=says):
        _pool.PoolSettings(**settings)


def test_max_memory_holds_fewer_boxes_than_size_when_it_must() -> None:
    assert _pool.memory_bytes("2g") == 2 * 1024**3 and _pool.memory_bytes("512m") == 512 * 1024**2
    assert _pool.memory_bytes("1.5gb") == int(1.5 * 1024**3) and _pool.memory_bytes("4096") == 4096
    settings = _pool.PoolSettings(size=5, max_memory="200m")
    assert _pool.allowed(settings, {}) == 5  # nothing measured yet: the size
    assert _pool.allowed(settings, {"box_memory": 64 * 1024**2}) == 3
    assert _pool.allowed(_pool.PoolSettings(size=2), {"box_memory": 10**12}) == 2  # no bound set


def test_a_broken_pools_file_is_no_pool_and_owners_differ_by_file(tmp_path: Path) -> None:
    path = tmp_path / "pools.json"
    assert _pool.configured(str(path)) == {}
    path.write_text("{not json")
    assert _pool.configured(str(path)) == {}
    path.write_text('{"pools": {"k": {"size": 1}}}')
    assert _pool.configured(str(path)) == {"k": {"size": 1}}
    assert _pool.owner(str(path)) != _pool.owner(str(tmp_path / "other.json"))


@pytest.mark.parametrize("provider", ["daytona", "boxd"])
def test_pool_yml_on_a_cloud_provider_says_a_pool_is_not_available(provider: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    result = run_module_inprocess("agentbox_pool", {"provider": provider, "size": 2})
    assert result["failed"] and f"a warm pool is not available on provider {provider}" in result["msg"], result
    assert not (tmp_path / ".agentbox" / "pool" / "pools.json").exists()
    shown = run_module_inprocess("agentbox_pool", {"provider": provider, "state": "show"})
    assert not shown["failed"] and shown["available"] is False and shown["boxes"] == [], shown
