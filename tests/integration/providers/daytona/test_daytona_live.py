"""Smoke test of the daytona provider against the live Daytona service.

Runs only when DAYTONA_API_KEY is set; otherwise every test reports SKIPPED (never passed). It uses
DAYTONA_API_URL / DAYTONA_TARGET when set, and starts boxes from the snapshot (or registry image) named
by AGENTBOX_DAYTONA_LIVE_IMAGE (default agentbox/box:latest: make that snapshot first, see
docs/providers/daytona.md). It checks that commands run as vscode (Daytona runs them as the image's
USER), and makes a checkpoint round trip: a snapshot is captured, a second box restored from it, both
deleted. Everything it makes is deleted at the end, even on failure.

    DAYTONA_API_KEY=... .venv/bin/pytest -rs tests/integration/providers/daytona/test_daytona_live.py
"""

from __future__ import annotations

import io
import os
import tarfile
import time
import uuid
from collections.abc import Iterator

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not os.environ.get("DAYTONA_API_KEY"),
        reason="live Daytona smoke test: set DAYTONA_API_KEY (and AGENTBOX_DAYTONA_LIVE_IMAGE) to run it",
    ),
]

IMAGE = os.environ.get("AGENTBOX_DAYTONA_LIVE_IMAGE", "agentbox/box:latest")


@pytest.fixture(scope="module")
def live() -> Iterator[dict]:
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

    provider = DaytonaProvider()
    if not provider.image_exists(IMAGE):
        pytest.fail(f"no Daytona snapshot {IMAGE!r} and it is not a registry image: set AGENTBOX_DAYTONA_LIVE_IMAGE")
    name = f"agentbox-live-{uuid.uuid4().hex[:6]}"
    box_id = uuid.uuid4().hex[:8]
    labels = _naming.box_labels(box=name, box_id=box_id, project="1" * 16, workspace="/live-smoke", branch="",
                                image_fingerprint="", provider="daytona", engine=provider.engine)  # fmt: skip
    made: list[str] = []
    try:
        started = time.monotonic()
        facts = provider.create(BoxSpec(name=name, box_id=box_id, project="1" * 16, workspace="/live-smoke",
                                        image=IMAGE, labels=labels, secrets={"token": "live-secret"}))  # fmt: skip
        print(f"live create: {time.monotonic() - started:.1f} s")
        yield {"provider": provider, "name": name, "facts": facts, "snapshots": made}
    finally:
        provider.destroy(name)
        for snapshot in made:
            provider.delete_snapshot(snapshot)


def test_create_exec_files_preview(live: dict) -> None:
    provider, name = live["provider"], live["name"]
    assert live["facts"].state == "running" and live["facts"].web_url
    run = provider.exec(name, ["sh", "-c", "printf out; printf err >&2; exit 5"])
    assert (run.rc, run.stdout, run.stderr) == (5, b"out", b"err")
    assert provider.exec(name, ["id", "-un"]).stdout == b"vscode\n"
    assert provider.exec(name, ["id", "-un"], user="root").stdout == b"root\n"
    owned = provider.exec(name, ["sh", "-c", 'f=$HOME/.owner; : > "$f"; stat -c %U "$f"; echo "$HOME"; rm "$f"'])
    assert owned.stdout == b"vscode\n/home/vscode\n"
    assert provider.exec(name, ["cat", "/run/agentbox/secrets/token"]).stdout == b"live-secret"
    env = provider.exec(name, ["env"]).stdout
    assert b"live-secret" not in env
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("live/x.bin")
        payload = os.urandom(1 << 20)
        info.size, info.mode, info.uid, info.gid = len(payload), 0o751, 1000, 1000
        archive.addfile(info, io.BytesIO(payload))
    provider.put_archive(name, "/tmp", iter([buffer.getvalue()]))
    back = b"".join(provider.get_archive(name, "/tmp/live/x.bin"))
    with tarfile.open(fileobj=io.BytesIO(back)) as archive:
        member = archive.getmember("x.bin")
        assert archive.extractfile(member).read() == payload and member.mode & 0o777 == 0o751
    started = time.monotonic()
    run = provider.exec(name, ["sh", "-c", "sleep 330; echo late"])
    assert (run.rc, run.stdout) == (0, b"late\n"), "a command longer than the ~5 minute proxy cut"
    print(f"live long exec: {time.monotonic() - started:.0f} s")


def test_pause_resume(live: dict) -> None:
    provider, name = live["provider"], live["name"]
    started = time.monotonic()
    assert provider.pause(name).state == "paused"
    print(f"live pause: {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    assert provider.resume(name).state == "running"
    print(f"live resume: {time.monotonic() - started:.1f} s")
    assert provider.exec(name, ["true"]).rc == 0


def test_checkpoint_round_trip(live: dict) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec
    from ansible_collections.agentbox.box.plugins.module_utils.providers._snapshot_store import snapshot_name

    provider, name = live["provider"], live["name"]
    provider.exec(name, ["sh", "-c", "echo kept > /home/vscode/kept.txt"]).check("write")
    snapshot = snapshot_name("1" * 16, "live")
    live["snapshots"].append(snapshot)
    started = time.monotonic()
    provider.commit(name, snapshot, {})
    print(f"live checkpoint: {time.monotonic() - started:.1f} s")
    assert provider.image_exists(snapshot)
    assert provider.exec(name, ["cat", "/home/vscode/kept.txt"]).stdout == b"kept\n"
    restored, box_id = f"{name}-r", uuid.uuid4().hex[:8]
    labels = _naming.box_labels(box=restored, box_id=box_id, project="1" * 16, workspace="/live-smoke", branch="",
                                image_fingerprint="", provider="daytona", engine=provider.engine)  # fmt: skip
    started = time.monotonic()
    try:
        provider.create(BoxSpec(name=restored, box_id=box_id, project="1" * 16, workspace="/live-smoke",
                                image=snapshot, labels=labels))  # fmt: skip
        print(f"live restore: {time.monotonic() - started:.1f} s")
        assert provider.exec(restored, ["cat", "/home/vscode/kept.txt"]).stdout == b"kept\n"
        assert provider.exec(restored, ["id", "-un"]).stdout == b"vscode\n"
    finally:
        provider.destroy(restored)
