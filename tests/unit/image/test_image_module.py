"""agentbox_image run in-process: files that go with a generated Dockerfile are refused with a context
directory (with what to do instead), and an engine that does not answer is named, before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.support.inprocess import run_module_inprocess


@pytest.mark.parametrize(("part", "value", "kind"), [
    ("ca_certificates", ["-----BEGIN CERTIFICATE-----\n"], "certificates"),
    ("programs", {"hello": "#!/bin/sh\necho hi\n"}, "programs"),
    ("libraries", {"lib/x.py": "X = 1\n"}, "libraries"),
])  # fmt: skip
def test_dockerfile_parts_with_a_context_directory_are_refused(tmp_path: Path, part: str, value: object,
                                                               kind: str) -> None:  # fmt: skip
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm\n")
    refused = run_module_inprocess("agentbox_image", {"context": str(tmp_path), part: value, "tag": "agentbox-test/x"})
    assert refused["failed"] is True, refused
    assert refused["msg"].startswith(f"{part} goes with dockerfile, not with context"), refused["msg"]
    assert f"put the {kind} in the context directory" in refused["msg"], refused["msg"]


def test_a_box_engine_that_does_not_answer_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOX_ENGINE", "unix:///nonexistent/agentbox-test.sock")
    down = run_module_inprocess("agentbox_image", {"dockerfile": "FROM debian:bookworm\n", "tag": "agentbox-test/x",
                                                   "build_log": str(tmp_path / "build.log")}, check_mode=True)  # fmt: skip
    assert down["failed"] is True and "unix:///nonexistent/agentbox-test.sock does not answer" in down["msg"], down
    assert not (tmp_path / "build.log").exists()
