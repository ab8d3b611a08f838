"""agentbox_box's cloud create options (disk, network, ephemeral, auto_delete) run in-process: a bad value,
or an option the provider cannot honour, is refused with what to do before the provider is asked anything.
The provider's API address is a port where nothing listens: a check that asked it would fail otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.support.inprocess import run_module_inprocess

KEY = "agentbox-test-key-never-shown"
NOWHERE = {
    "daytona": {"daytona_api_url": "http://127.0.0.1:9/api", "daytona_api_key": KEY},
    "boxd": {"boxd_base_url": "http://127.0.0.1:9", "boxd_api_key": KEY},
    "docker": {},
}

BAD = [
    ("daytona", {"network": "10.0.0.0"}, "needs a CIDR prefix"),
    ("daytona", {"network": ["example.com/8"]}, "not an IPv4 network"),
    ("daytona", {"network": [f"10.0.{n}.0/24" for n in range(11)]}, "at most 10 networks"),
    ("daytona", {"disk": 0}, "disk must be a whole number of GiB"),
    ("daytona", {"ephemeral": True, "auto_delete": 5}, "drop auto_delete, or ephemeral"),
    ("daytona", {"auto_delete": -2}, "auto_delete must be -1"),
    ("boxd", {"network": "block_all"}, "boxd has no block_all"),
    ("boxd", {"network": ["github.com", "not a host"]}, "not a host is neither a host name nor a CIDR"),
    ("boxd", {"disk": 0}, "at least 1"),
    ("boxd", {"ephemeral": True}, "ephemeral can only be set for Daytona boxes"),
    ("boxd", {"auto_delete": 5, "disk": 10}, "auto_delete can only be set for Daytona boxes"),
    ("docker", {"disk": 10, "network": "block_all"}, "disk, network can only be set for Daytona boxes"),
]


@pytest.mark.parametrize(("provider", "args", "message"), BAD, ids=[f"{p}:{m[:25]}" for p, _a, m in BAD])
def test_bad_cloud_options_fail_before_the_provider_is_asked(home: Path, tmp_path: Path, provider: str, args: dict,
                                                             message: str) -> None:  # fmt: skip
    result = run_module_inprocess("agentbox_box", {"name": "bad1", "workspace": str(tmp_path), "provider": provider,
                                                   **NOWHERE[provider], **args})  # fmt: skip
    assert result["failed"] is True and message in result["msg"], result
    assert KEY not in str(result)
