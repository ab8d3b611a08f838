"""`agentbox-ctl cp` through a real relay and a real box on the box engine: a file out of the box into the
workspace, a host file into the box, a copy outside the workspace that waits for the user, and what is refused
(`..`, a host symlink, a symlink the box sends). One box for the module; the path rules and the hostile tar
cases run in-process in tests/unit/relay/test_relay_files.py.

The box gets the checkout's agentbox-ctl and agentbox-relay-client first (the box image bakes the same files;
an image built before this change lacks `cp`), as root, as the image build would put them."""

from __future__ import annotations

import concurrent.futures
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core._tarstream import tar_of_files
from tests.conftest import REPO
from tests.integration.relay import test_relay as shared
from tests.integration.relay.test_relay import DEADLINE, ctl, in_box

# The same module-scoped fixtures as test_relay (a private HOME and relay, one origin, boxes).
engine = shared.engine
host = shared.host
project = shared.project
make_box = shared.make_box

pytestmark = pytest.mark.integration
CLIENTS = ("agentbox-ctl", "agentbox-relay-client")


@pytest.fixture(scope="module")
def box(make_box: Callable[[], str], engine: docker.DockerClient) -> Iterator[str]:
    name = make_box()
    files = {name: ((REPO / "roles/inbox_supervisor/files" / name).read_bytes(), 0o755) for name in CLIENTS}
    engine.containers.get(f"agentbox-{name}").put_archive("/usr/local/bin", b"".join(tar_of_files(files, 0, 0)))
    yield name


def as_box(engine: docker.DockerClient, box: str, script: str) -> str:
    rc, out, err = in_box(engine, box, ["sh", "-c", script])
    assert rc == 0, err
    return out


def test_cp_out_of_the_box_and_into_it_within_the_workspace(
    host: shared.Host, box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    workspace = project["workspace"]
    as_box(engine, box, "printf 'made in the box\\n' > /tmp/report.txt && chmod 4755 /tmp/report.txt")
    landed = workspace / "report.txt"
    # A new file in the host's working tree changes it: nothing lands until the user approves.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ctl, engine, box, "cp", "/tmp/report.txt", "host:")
        approval = host.wait_pending(box)
        assert not landed.exists()
        host.relay("approvals", "--approve", approval)
        rc, out, err = asked.result(timeout=DEADLINE)
    assert rc == 0, err
    assert "writes a new file" in err
    assert f"copied /tmp/report.txt to {landed} on the host (16 bytes)" in out
    assert landed.read_text() == "made in the box\n"
    assert stat.S_IMODE(landed.stat().st_mode) == 0o644  # no setuid, no execute: whatever the box said
    assert landed.stat().st_uid == workspace.stat().st_uid

    (workspace / "from-host.txt").write_text("from the host\n")
    rc, out, err = ctl(engine, box, "cp", "host:from-host.txt", "/tmp/")
    assert rc == 0, err
    assert as_box(engine, box, "cat /tmp/from-host.txt && stat -c '%U %a' /tmp/from-host.txt") == \
        "from the host\nvscode 644\n"
    decisions = [(e["arguments"]["direction"], e["decision"], e["result"]["rc"]) for e in host.audit()
                 if e.get("operation") == "file.cp" and e["arguments"]["host"] in ("report.txt", "from-host.txt")]
    assert decisions == [("out", "approved", 0), ("in", "allowed", 0)]


def test_cp_outside_the_workspace_waits_for_the_user(
    host: shared.Host, box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    outside = project["origin"].parent / "drop"
    outside.mkdir(exist_ok=True)
    os.chown(outside, 1000, 1000)
    as_box(engine, box, "printf 'for the user\\n' > /tmp/handoff.txt")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ctl, engine, box, "cp", "/tmp/handoff.txt", f"host:{outside}/handoff.txt")
        approval = host.wait_pending(box)
        assert f"{approval} {box} file.cp box=/tmp/handoff.txt direction=out host={outside}/handoff.txt" in host.pending()
        assert not (outside / "handoff.txt").exists()
        host.relay("approvals", "--approve", approval)
        rc, _out, err = asked.result(timeout=DEADLINE)
    assert rc == 0, err
    assert "outside the box's workspace" in err and (outside / "handoff.txt").read_text() == "for the user\n"
    assert (outside / "handoff.txt").stat().st_uid == 1000

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # replacing a file is asked too; denied: unchanged
        asked = pool.submit(ctl, engine, box, "cp", "/tmp/handoff.txt", "host:README.md")
        host.relay("approvals", "--deny", host.wait_pending(box))
        rc, _out, err = asked.result(timeout=DEADLINE)
    assert rc == 1 and "replaces the existing file" in err and "denied on the host" in err
    assert (project["workspace"] / "README.md").read_text() == "hello\n"


def test_cp_refuses_dot_dot_host_links_and_links_from_the_box(
    host: shared.Host, box: str, project: dict[str, Path], engine: docker.DockerClient
) -> None:
    workspace = project["workspace"]
    (workspace / "out").symlink_to(project["origin"].parent)
    as_box(engine, box, "printf x > /tmp/x.txt && ln -sf /etc/shadow /tmp/shadow-link")
    rc, _out, err = ctl(engine, box, "cp", "/tmp/x.txt", "host:../x.txt")
    assert rc == 2 and "holds '..'" in err
    rc, _out, err = ctl(engine, box, "cp", "/tmp/x.txt", "host:out/x.txt")
    assert rc == 1 and "which is a symbolic link on the host: links are never followed" in err
    # What the box sends is read only once the user has approved the write; a link is refused then.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ctl, engine, box, "cp", "/tmp/shadow-link", "host:shadow.txt")
        host.relay("approvals", "--approve", host.wait_pending(box))
        rc, _out, err = asked.result(timeout=DEADLINE)
    assert rc == 1 and "is a symlink, not a regular file" in err
    rc, _out, err = ctl(engine, box, "cp", "/tmp/x.txt", "host:.git/hooks/pre-commit")
    assert rc == 1 and "never writes a repository's own files" in err
    rc, _out, err = ctl(engine, box, "cp", "/tmp/x.txt", "/tmp/y.txt")
    assert rc == 2 and "exactly one of SOURCE and DESTINATION is a host path" in err
    assert not (workspace / "shadow.txt").exists() and not (project["origin"].parent / "x.txt").exists()
    assert not (workspace / ".git/hooks/pre-commit").exists()
