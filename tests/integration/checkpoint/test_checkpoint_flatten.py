"""Flattening on the real engine, on a tiny image: the config replayed exactly (values Dockerfile
syntax would mangle included), one layer over scratch, and nothing under /run/agentbox carried."""

from __future__ import annotations

import io
import secrets
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxFacts  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image_flatten  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider  # noqa: E402

pytestmark = pytest.mark.integration
LEAK = b"leaked-" + secrets.token_hex(12).encode()


def _rootfs() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in (("etc/hello", b"hello from the image\n"), ("run/agentbox/secrets/TOKEN", LEAK)):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


@pytest.fixture
def made(docker_client: docker.DockerClient) -> Iterator[dict[str, Any]]:
    client = docker_client
    tag = secrets.token_hex(4)
    repository = f"agentbox-test/ckpt-flat-{tag}"
    refs = {"base": f"{repository}:base", "flat": f"{repository}:flat"}
    container = None
    try:
        client.api.import_image(
            src=_rootfs(),
            repository=repository,
            tag="base",
            changes=[
                'ENV PATH="/bin"',
                'ENV TRICKY="\\$HOME and \\"quotes\\" and \\\\backslash and a=b"',
                "USER 1000:1000",
                "WORKDIR /work dir",
                "EXPOSE 80/tcp",
                "EXPOSE 6080/tcp",
                'ENTRYPOINT ["/bin/tini", "--"]',
                'CMD ["sleep", "infinity"]',
                'LABEL "org.example.note"="say \\"\\$hi\\""',
            ],
        )
        container = client.containers.create(
            refs["base"],
            name=f"agentbox-ckt-flat-{tag}",
            environment={"EXTRA": "from the box"},
            labels={"io.agentbox.box": f"ckt-flat-{tag}", "io.agentbox.kind": "box"},
        )
        yield {"client": client, "container": container, "refs": refs, "tag": tag}
    finally:
        if container is not None:
            container.remove(force=True, v=True)
        for ref in refs.values():
            try:
                client.images.remove(ref, force=True)
            except docker.errors.APIError:
                pass


def test_flatten_replays_the_config_and_drops_run_agentbox(made: dict[str, Any]) -> None:
    client, container, refs = made["client"], made["container"], made["refs"]
    facts = BoxFacts(
        name=f"ckt-flat-{made['tag']}",
        id="",
        provider="docker",
        engine="local",
        state="stopped",
        container=container.name,
        image=refs["base"],
        project="",
        workspace="",
        branch="",
        created="",
    )
    ours = {"io.agentbox.kind": "checkpoint", "io.agentbox.checkpoint": "flat"}
    result = _image_flatten.flatten(DockerProvider().checkpoint_store().engine, facts, refs["flat"], ours)

    image = client.images.get(refs["flat"])
    assert result["id"] == image.id
    assert len(image.attrs["RootFS"]["Layers"]) == 1 and len(image.history()) == 1
    source = client.containers.get(container.id).attrs["Config"]
    config = image.attrs["Config"]
    for key in ("User", "WorkingDir", "Cmd", "Entrypoint", "ExposedPorts"):
        assert config[key] == source[key], key
    # The image's own environment is replayed; what the box's container added is not kept.
    assert config["Env"] == client.images.get(refs["base"]).attrs["Config"]["Env"]
    assert 'TRICKY=$HOME and "quotes" and \\backslash and a=b' in config["Env"]
    assert "EXTRA=from the box" in source["Env"] and "EXTRA=from the box" not in config["Env"]
    assert config["Labels"] == {**source["Labels"], **ours}
    assert config["Labels"]["org.example.note"] == 'say "$hi"'

    probe = client.containers.create(refs["flat"])
    try:
        exported = b"".join(client.api.export(probe.id))
    finally:
        probe.remove(force=True, v=True)
    with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
        names = tar.getnames()
        assert tar.extractfile("etc/hello").read() == b"hello from the image\n"
    assert "run/agentbox/secrets/TOKEN" not in names and LEAK not in exported
