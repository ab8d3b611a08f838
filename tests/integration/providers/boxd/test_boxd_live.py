"""The boxd provider against production boxd: runs only with BOXD_API_KEY set (then it makes and deletes
one machine); reported as skipped otherwise (the skip gate's allow-list names BOXD_API_KEY)."""

from __future__ import annotations

import os
import secrets

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.environ.get("BOXD_API_KEY"), reason="live boxd test: set BOXD_API_KEY to run it"),
]


def test_live_create_exec_pause_destroy(tmp_path) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.core._naming import box_labels
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec
    from ansible_collections.agentbox.box.plugins.module_utils.providers.boxd._boxd import BoxdProvider

    provider = BoxdProvider()
    name = f"live-{secrets.token_hex(3)}"
    box_id = secrets.token_hex(8)
    labels = box_labels(box=name, box_id=box_id, project="0" * 16, workspace=str(tmp_path), branch="",
                        image_fingerprint="", provider="boxd", engine=provider.engine, checkpoint=None)
    image = os.environ.get("AGENTBOX_BOXD_LIVE_IMAGE", "ubuntu:24.04")
    provider.create(BoxSpec(name=name, box_id=box_id, project="0" * 16, workspace=str(tmp_path), image=image,
                            labels=labels))
    try:
        result = provider.exec(name, ["sh", "-c", "echo out; echo err >&2; exit 3"], user="root")
        assert (result.rc, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
        assert provider.exec(name, ["sleep", "30"], user="root", timeout=1).rc == 124
        assert provider.pause(name).state == "paused"
        assert provider.exec(name, ["echo", "woke"], user="root").stdout == b"woke\n"
    finally:
        provider.destroy(name)
    assert provider.find(name) is None
