"""agentbox_image's ca_certificates, agents and vnc on the real engine, through the module.

One image is built (a small Dockerfile on the base image, laid out as the role's template lays out
the CAs); everything else runs in check mode, so nothing more is built. The image is tagged under
this test's own repository and removed at the end. The module's own main runs directly (conftest.py):
the tests are about what it does with these options; test_box_image.py runs it through Ansible.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import run_module_direct

pytestmark = pytest.mark.integration
BASE = "debian:bookworm"  # the box image's base: on the engine wherever the box image was built
# As the role's template copies them: ca/agentbox-ca-<n>.crt into the system's extra CA directory.
# The bundle line reads them back in the order the shell lists them (agentbox-ca-0, -1, ...).
DOCKERFILE = """\
FROM debian:bookworm
COPY ["ca/agentbox-ca-0.crt", "ca/agentbox-ca-1.crt", "/usr/local/share/ca-certificates/"]
RUN cat /usr/local/share/ca-certificates/agentbox-ca-*.crt > /agentbox-ca-bundle
"""
AGENTS = ["@example/agent-one@1.2.3", "agent-two@4.5.6"]


def make_ca(directory: Path, name: str) -> str:
    """A real self-signed CA certificate (PEM text), made by openssl."""
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-addext", "basicConstraints=critical,CA:TRUE", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert.read_text()


@pytest.fixture
def repository(docker_client: docker.DockerClient) -> Iterator[str]:
    """A fresh image repository; every tag in it is removed afterwards."""
    name = f"agentbox-test/ca-{secrets.token_hex(4)}"
    yield name
    for image in docker_client.images.list(name=name):
        for reference in image.tags:
            if reference.startswith(name + ":"):
                try:
                    docker_client.images.remove(reference)
                except docker.errors.APIError:
                    pass


def test_cas_agents_and_vnc_reach_the_image_and_its_fingerprint(
    docker_client: docker.DockerClient, repository: str, tmp_path: Path
) -> None:
    first, second = make_ca(tmp_path, "agentbox-test-ca-one"), make_ca(tmp_path, "agentbox-test-ca-two")
    assert first != second
    args: dict[str, Any] = {
        "dockerfile": DOCKERFILE, "ca_certificates": [first, second], "agents": AGENTS, "vnc": True,
        "base": BASE, "tag": repository, "build_log": str(tmp_path / "build.log"),
    }  # fmt: skip

    built = run_module_direct("agentbox_image", args)
    assert not built["failed"] and built["built"] is True, built.get("msg")
    image = docker_client.images.get(built["tag"])
    assert image.id == built["image_id"]
    # The labels record the options.
    assert image.labels == {
        "io.agentbox.image_fingerprint": built["fingerprint"], "io.agentbox.kind": "image",
        "io.agentbox.base": BASE, "io.agentbox.agents": ",".join(AGENTS), "io.agentbox.vnc": "true",
    }  # fmt: skip
    # Read back from the image itself: each CA byte for byte, and in the order given.
    script = (
        "cat /usr/local/share/ca-certificates/agentbox-ca-0.crt; echo '--cut--';"
        "cat /usr/local/share/ca-certificates/agentbox-ca-1.crt; echo '--cut--'; cat /agentbox-ca-bundle"
    )
    output = docker_client.containers.run(built["tag"], ["sh", "-c", script], remove=True).decode()
    assert output.split("--cut--\n") == [first, second, first + second]

    # The same run again finds it; check mode from here on, so nothing else is built.
    again = run_module_direct("agentbox_image", args, check_mode=True)
    assert (again["fingerprint"], again["would_build"], again["changed"]) == (built["fingerprint"], False, False)
    variants = {
        "another CA": {"ca_certificates": [first, make_ca(tmp_path, "agentbox-test-ca-three")]},
        "the CAs swapped": {"ca_certificates": [second, first]},
        "vnc false": {"vnc": False},
        "other agents": {"agents": AGENTS[:1]},
    }
    fingerprints = {built["fingerprint"]}
    for what, change in variants.items():
        preview = run_module_direct("agentbox_image", {**args, **change}, check_mode=True)
        assert not preview["failed"], (what, preview.get("msg"))
        # The vnc=true image must not be reused (with its wrong label) for vnc=false, and so on.
        assert preview["would_build"] is True and preview["built"] is False, (what, preview)
        assert preview["fingerprint"] not in fingerprints, what
        fingerprints.add(preview["fingerprint"])
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(preview["tag"])
    assert sorted(tag for image in docker_client.images.list(name=repository) for tag in image.tags) == sorted(
        [built["tag"], f"{repository}:latest"]
    )


def test_default_options_keep_the_fingerprint_of_the_files_alone(repository: str, tmp_path: Path) -> None:
    """The labels count only when they are not the defaults: an image built before they counted
    (every default box image) keeps its fingerprint and is not rebuilt."""
    from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._image import (
        compute_fingerprint,
        context_from_parts,
    )

    defaults = run_module_direct("agentbox_image", {"dockerfile": "FROM debian:bookworm\n", "tag": repository}, check_mode=True)
    assert defaults["fingerprint"] == compute_fingerprint(context_from_parts("FROM debian:bookworm\n"))
    vnc = run_module_direct("agentbox_image", {"dockerfile": "FROM debian:bookworm\n", "tag": repository, "vnc": True},
                            check_mode=True)
    assert vnc["fingerprint"] != defaults["fingerprint"]


def test_ca_certificates_with_a_context_directory_are_refused(repository: str, tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM debian:bookworm\n")
    refused = run_module_direct(
        "agentbox_image",
        {"context": str(context), "ca_certificates": [make_ca(tmp_path, "agentbox-test-ca")], "tag": repository},
    )
    assert refused["failed"] is True
    assert "ca_certificates" in refused["msg"] and "context" in refused["msg"], refused["msg"]
    assert "put the certificates in the context directory" in refused["msg"], refused["msg"]
