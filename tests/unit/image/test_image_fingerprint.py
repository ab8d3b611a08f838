"""Fingerprint of a box image build context, and the pure helpers around it (no Docker needed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# Import the collection from the checkout (.collections/ansible_collections/agentbox/box -> ../../..).
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._image import (  # noqa: E402
    ContextFile,
    ImageError,
    compute_fingerprint,
    read_context,
    recorded_labels,
)
from tests.unit.support.templating import render  # noqa: E402

TEMPLATE = REPO / "roles" / "box_image" / "templates" / "Dockerfile.j2"

BASE_FILES = [
    ContextFile("Dockerfile", b"FROM debian:bookworm\nCOPY bin/a /usr/local/bin/\n"),
    ContextFile("bin/agentbox-ctl", b"#!/usr/bin/env python3\nprint('ctl')\n", executable=True),
    ContextFile("bin/agentbox-checkpoint-cleanup", b"#!/bin/sh\nexit 0\n", executable=True),
]


def test_fingerprint_is_sha256_hex_and_stable() -> None:
    first = compute_fingerprint(BASE_FILES)
    assert len(first) == 64 and int(first, 16) >= 0
    assert compute_fingerprint(list(BASE_FILES)) == first
    # Equal content in new objects gives the same answer: only values count.
    copies = [ContextFile(f.path, bytes(f.content), f.executable) for f in BASE_FILES]
    assert compute_fingerprint(copies) == first


def test_fingerprint_ignores_listing_order() -> None:
    forward = compute_fingerprint(BASE_FILES)
    assert compute_fingerprint(reversed(BASE_FILES)) == forward
    assert compute_fingerprint([BASE_FILES[1], BASE_FILES[2], BASE_FILES[0]]) == forward
    assert compute_fingerprint([ContextFile("./" + f.path, f.content, f.executable) for f in BASE_FILES]) == forward


def test_recorded_labels_count_only_when_not_the_defaults() -> None:
    files_alone = compute_fingerprint(BASE_FILES)
    # The defaults add nothing: an image built before labels counted keeps its fingerprint.
    assert compute_fingerprint(BASE_FILES, recorded_labels("debian:bookworm", [], False)) == files_alone
    variants = [
        recorded_labels("debian:trixie", [], False),
        recorded_labels("debian:bookworm", ["agent@1"], False),
        recorded_labels("debian:bookworm", ["agent@2"], False),
        recorded_labels("debian:bookworm", [], True),
        recorded_labels("debian:bookworm", ["agent@1"], True),
    ]
    fingerprints = {compute_fingerprint(BASE_FILES, labels) for labels in variants}
    assert len(fingerprints) == len(variants) and files_alone not in fingerprints
    # A value cannot pose as another label's line.
    forged = recorded_labels("debian:bookworm", ["x\nlabel\0io.agentbox.vnc\0true"], False)
    assert compute_fingerprint(BASE_FILES, forged) != compute_fingerprint(
        BASE_FILES, recorded_labels("debian:bookworm", ["x"], True)
    )


@pytest.mark.parametrize("index", range(len(BASE_FILES)))
def test_fingerprint_changes_with_any_file_content(index: int) -> None:
    changed = list(BASE_FILES)
    changed[index] = ContextFile(changed[index].path, changed[index].content + b"\n", changed[index].executable)
    assert compute_fingerprint(changed) != compute_fingerprint(BASE_FILES)


def test_fingerprint_changes_with_a_path_a_mode_an_added_or_a_removed_file() -> None:
    original = compute_fingerprint(BASE_FILES)
    renamed = [*BASE_FILES[:2], ContextFile("bin/agentbox-cleanup", BASE_FILES[2].content, True)]
    not_executable = [*BASE_FILES[:2], ContextFile(BASE_FILES[2].path, BASE_FILES[2].content, False)]
    added = [*BASE_FILES, ContextFile("bin/new-tool", b"", True)]
    removed = BASE_FILES[:2]
    results = {compute_fingerprint(v) for v in (renamed, not_executable, added, removed)}
    assert original not in results
    assert len(results) == 4


def test_fingerprint_separates_path_from_content() -> None:
    # Moving bytes between the name and the content must not give the same hash.
    one = compute_fingerprint([ContextFile("ab", b"c")])
    other = compute_fingerprint([ContextFile("a", b"bc")])
    assert one != other


def test_fingerprint_refuses_a_path_given_twice() -> None:
    with pytest.raises(ImageError, match="twice"):
        compute_fingerprint([ContextFile("Dockerfile", b"a"), ContextFile("./Dockerfile", b"b")])


def _write_context(root: Path, files: list[ContextFile]) -> None:
    for entry in files:
        target = root / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(entry.content)
        target.chmod(0o755 if entry.executable else 0o644)


def test_read_context_matches_the_in_memory_fingerprint(tmp_path: Path) -> None:
    _write_context(tmp_path, BASE_FILES)
    from_disk = compute_fingerprint(read_context(str(tmp_path)))
    assert from_disk == compute_fingerprint(BASE_FILES)
    (tmp_path / "bin" / "agentbox-ctl").write_bytes(b"#!/usr/bin/env python3\nprint('ctl v2')\n")
    assert compute_fingerprint(read_context(str(tmp_path))) != from_disk


def test_read_context_sees_the_executable_bit(tmp_path: Path) -> None:
    _write_context(tmp_path, BASE_FILES)
    before = compute_fingerprint(read_context(str(tmp_path)))
    os.chmod(tmp_path / "bin" / "agentbox-ctl", 0o644)
    assert compute_fingerprint(read_context(str(tmp_path))) != before


def test_read_context_needs_a_dockerfile(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="no Dockerfile"):
        read_context(str(tmp_path))
    with pytest.raises(ImageError, match="not a directory"):
        read_context(str(tmp_path / "missing"))


def test_tags_use_sixteen_hex_digits() -> None:
    fingerprint = compute_fingerprint(BASE_FILES)
    assert _image.image_tag("agentbox/box", fingerprint) == f"agentbox/box:{fingerprint[:16]}"


@pytest.mark.parametrize("repository", ["agentbox/box", "localhost:5000/agentbox/box", "box"])
def test_repository_accepted(repository: str) -> None:
    assert _image.validate_repository(repository) == repository


@pytest.mark.parametrize("repository", ["", "agentbox/box:latest", "Agentbox/Box", "agentbox//box", "a b"])
def test_repository_refused_with_advice(repository: str) -> None:
    with pytest.raises(ImageError, match="for example 'agentbox/box'"):
        _image.validate_repository(repository)


@pytest.mark.parametrize(
    ("base", "suite"),
    [
        ("debian:bookworm", "bookworm"),
        ("debian:bookworm-slim", "bookworm"),
        ("debian:12", "bookworm"),
        ("docker.io/library/debian:trixie", "trixie"),
    ],
)
def test_debian_suite_of_base(base: str, suite: str) -> None:
    assert _image.debian_suite(base) == suite


@pytest.mark.parametrize("base", ["ubuntu:24.04", "debian", "debian:latest", "mydebian:bookworm", "debian:12.5"])
def test_debian_suite_refuses_other_bases(base: str) -> None:
    with pytest.raises(ImageError):
        _image.debian_suite(base)


def test_host_sources_both_formats(tmp_path: Path) -> None:
    (tmp_path / "etc/apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list").write_text(
        "# deb http://old.example/debian bookworm main\ndeb-src http://src.example/debian bookworm main\n"
    )
    (tmp_path / "etc/apt/sources.list.d/debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\nEnabled: no\n"
    )
    (tmp_path / "etc/apt/sources.list.d/extra.list").write_text(
        "deb [arch=amd64 signed-by=/k.gpg] https://vendor.example/apt stable main\n"
    )
    (tmp_path / "etc/apt/sources.list.d/off.list.disabled").write_text("deb http://never.example/debian x main\n")
    entries = _image.host_debian_sources(str(tmp_path))
    uris = [uri for uri, _digest in entries]
    assert uris == ["http://mirror.example/debian", "http://mirror.example/debian-security", "https://vendor.example/apt"]
    assert entries[0][1] == ["bookworm", "bookworm-updates"]
    assert _image.debian_mirrors(entries) == ("http://mirror.example/debian", "http://mirror.example/debian-security")


def test_no_mirror_when_nothing_is_debian(tmp_path: Path) -> None:
    (tmp_path / "etc/apt").mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list").write_text("deb file:/srv/debian bookworm main\n")
    assert _image.debian_mirrors(_image.host_debian_sources(str(tmp_path))) == (None, None)


def test_base_sources_list_adds_updates_and_security() -> None:
    text = _image.base_sources_list("bookworm", "http://m.example/debian", "http://m.example/debian-security")
    assert text.splitlines() == [
        "deb http://m.example/debian bookworm main",
        "deb http://m.example/debian bookworm-updates main",
        "deb http://m.example/debian-security bookworm-security main",
    ]
    assert "security" not in _image.base_sources_list("bookworm", "http://m.example/debian", None)


def test_build_log_keeps_the_last_thirty_lines(tmp_path: Path) -> None:
    log = _image.BuildLog(str(tmp_path / "logs" / "build.log"))
    for number in range(100):
        log.write(f"line {number}\n" if number % 2 else f"line {number}")
        if number % 2 == 0:
            log.write("\n")
    log.write("no newline yet")
    tail = log.tail().splitlines()
    log.close()
    assert len(tail) == 30
    assert tail[-1] == "no newline yet" and tail[-2] == "line 99" and tail[0] == "line 71"
    assert (tmp_path / "logs" / "build.log").read_text().count("\n") == 100


# The variants the template tests read, rendered once by Ansible's own template lookup (as the role does).
TEMPLATE_VARIANTS: dict[str, dict[str, object]] = {
    "bare": {},
    "full": {
        "box_image_files": ["agentbox-ctl", "agentbox-checkpoint-cleanup"],
        "box_image_agent_specs": [
            {"name": "claude", "package": "@anthropic-ai/claude-code@2.1.328"},
            {"name": "odd", "package": "left pad"},
        ],
        "box_image_base": "debian:bookworm-slim",
    },
    "two_cas": {"box_image_ca_count": "2"},
}
TEMPLATE_DEFAULTS = {"box_image_base": "debian:bookworm", "box_image_agent_specs": [],
                     "box_image_files": []}  # fmt: skip


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    """{variant: Dockerfile text}, through the ansible.builtin.template lookup, in-process."""
    lookup = "{{ lookup('ansible.builtin.template', template, template_vars=variables) }}"
    return {
        name: str(render(lookup, {"template": str(TEMPLATE), "variables": {**TEMPLATE_DEFAULTS, **variables}}))
        for name, variables in TEMPLATE_VARIANTS.items()
    }


def test_template_copes_with_no_files_no_agents_no_vnc(rendered: dict[str, str]) -> None:
    text = rendered["bare"]
    assert "COPY" not in text and "npm install --global" not in text and "tigervnc" not in text
    assert "ca-certificates/" not in text
    assert text.startswith("#") and "FROM debian:bookworm\n" in text
    assert 'CMD ["sleep", "infinity"]' in text and "WORKDIR /workspace" in text and "ENV LANG=C.UTF-8" in text


def test_template_copies_every_file_and_adds_optional_layers(rendered: dict[str, str]) -> None:
    text = rendered["full"]
    assert 'COPY ["bin/agentbox-checkpoint-cleanup", "bin/agentbox-ctl", "/usr/local/bin/"]' in text
    # One layer per agent, in the given order, each package quoted for the shell.
    claude = "npm install --global --no-audit --no-fund --no-update-notifier @anthropic-ai/claude-code@2.1.328;"
    odd = "npm install --global --no-audit --no-fund --no-update-notifier 'left pad';"
    assert claude in text and odd in text and text.index(claude) < text.index(odd)
    assert text.count("hardlink --quiet --ignore-time /usr/local/lib/node_modules") == 2
    assert "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt" in text
    assert "FROM debian:bookworm-slim\n" in text
    # Optional layers come before the COPY so a change to an in-box script keeps them cached.
    assert text.index("npm install --global") < text.index("COPY [")
    # The desktop is the screen image's, never the box image's (its build time stays as it was).
    assert "tigervnc" not in text and "chromium" not in text


def test_screen_template_is_the_box_image_plus_the_desktop_and_chromium() -> None:
    """Dockerfile.screen.j2 (box_image_screen: true), rendered as the role does: FROM the box image's fingerprint
    tag, the desktop's Debian packages in one layer without apt's lists, then agentbox-browser."""
    lookup = "{{ lookup('ansible.builtin.template', template, template_vars=variables) }}"
    text = str(render(lookup, {"template": str(TEMPLATE.with_name("Dockerfile.screen.j2")),
                               "variables": {"box_image_screen_base": "agentbox/box:0123456789abcdef"}}))  # fmt: skip
    assert "\nFROM agentbox/box:0123456789abcdef\n" in text
    install = text[text.index("apt-get install"):text.index("apt-get clean")]
    for package in ("chromium", "tigervnc-standalone-server", "tigervnc-tools", "novnc", "websockify", "openbox"):
        assert f" {package}" in install, package
    assert "rm -rf /var/lib/apt/lists/*" in text
    assert text.index("apt-get install") < text.index('COPY ["bin/agentbox-browser", "/usr/local/bin/"]')


def test_template_trusts_extra_certificate_authorities_before_any_package(rendered: dict[str, str]) -> None:
    text = rendered["two_cas"]
    copy = 'COPY ["ca/agentbox-ca-0.crt", "ca/agentbox-ca-1.crt", "/usr/local/share/ca-certificates/"]'
    assert copy in text
    assert text.index(copy) < text.index("apt-get install")


def test_context_from_parts_matches_the_same_context_on_disk(tmp_path: Path) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    parts = _image.context_from_parts(
        "FROM debian:bookworm\n", {"agentbox-ctl": "#!/bin/sh\n", "agentbox-boot": "#!/bin/sh\nboot\n"}, [pem]
    )
    assert [f.path for f in parts] == ["Dockerfile", "bin/agentbox-boot", "bin/agentbox-ctl", "ca/agentbox-ca-0.crt"]
    _write_context(tmp_path, parts)
    assert compute_fingerprint(read_context(str(tmp_path))) == compute_fingerprint(parts)


@pytest.mark.parametrize("name", ["", "../evil", "bin/x", ".."])
def test_context_from_parts_refuses_odd_program_names(name: str) -> None:
    with pytest.raises(ImageError, match="plain file name"):
        _image.context_from_parts("FROM x\n", {name: "data"})


def test_context_from_parts_refuses_a_certificate_that_is_not_pem() -> None:
    with pytest.raises(ImageError, match="not PEM"):
        _image.context_from_parts("FROM x\n", {}, ["just text"])


def test_context_tar_holds_exactly_the_fingerprinted_files() -> None:
    import tarfile

    with tarfile.open(fileobj=_image.context_tar(BASE_FILES)) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert set(members) == {"Dockerfile", "bin", "bin/agentbox-ctl", "bin/agentbox-checkpoint-cleanup"}
        assert members["bin"].isdir()
        assert members["bin/agentbox-ctl"].mode == 0o755 and members["Dockerfile"].mode == 0o644
        for entry in BASE_FILES:
            extracted = archive.extractfile(entry.path)
            assert extracted is not None and extracted.read() == entry.content


def test_build_steps_track_only_layers_this_build_made() -> None:
    steps = _image.BuildSteps()
    output = (
        "Step 1/4 : FROM debian:bookworm\n ---> c2497f74d8bf\n"
        "Step 2/4 : RUN apt-get update\n ---> Using cache\n ---> 107ee0978c3b\n"
        "Step 3/4 : RUN echo made\n ---> Running in 5a08aba69b3a\nmade\n"
        "Removing intermediate container 5a08aba69b3a\n ---> 01300bfe0628\n"
        "Step 4/4 : COPY a /b\n ---> bdb3"
    )
    # Fed in pieces that cut lines anywhere, as the engine's stream does.
    for start in range(0, len(output), 7):
        steps.feed(output[start : start + 7])
    steps.feed("68939f5e\n")
    assert steps.created == ["01300bfe0628", "bdb368939f5e"]
