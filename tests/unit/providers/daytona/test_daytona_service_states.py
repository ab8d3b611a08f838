"""Unit tests of the Daytona provider's reading of the real service's habits (issue 19): states with a
desired state, ghosts of deleted sandboxes, per-throttler Retry-After headers, the in-box user switch."""

from __future__ import annotations

import getpass
import subprocess
from types import SimpleNamespace

from daytona import DaytonaRateLimitError

from ansible_collections.agentbox.box.plugins.module_utils.core import _shell_line as shell_line
from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona import _daytona as dt
from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona import _daytona_state as st


def sandbox(state: str, desired: str | None = None, name: str = "box") -> SimpleNamespace:
    return SimpleNamespace(state=state, desired_state=desired, name=name)


def test_a_state_counts_only_once_the_sandbox_is_heading_there() -> None:
    assert st.settled("started", "started") and st.settled("started", "")
    assert not st.settled("started", "stopped")  # a stop (or auto-stop) is under way
    assert st.settled("archiving", "archived")
    assert st.changing("started", "stopped") and st.changing("unknown", "started")
    assert not st.changing("stopped", "archived")  # start is still allowed there
    assert not st.changing("stopped", "stopped")


def test_unknown_reads_as_where_the_sandbox_is_heading() -> None:
    assert st.box_state_of(sandbox("unknown", "started")) == "running"
    assert st.box_state_of(sandbox("unknown", "stopped")) == "stopped"
    assert st.box_state_of(sandbox("archived", "archived")) == "paused"
    assert st.state_name(SimpleNamespace(value="UNKNOWN_DEFAULT_OPEN_API")) == "unknown"
    assert "unknown" in st.TRANSITIONAL


def test_ghosts_of_deleted_sandboxes_are_never_boxes() -> None:
    assert st.is_ghost(sandbox("started", "destroyed"))  # deleted, not yet torn down
    assert st.is_ghost(sandbox("stopped", "stopped", name="DESTROYED_box_1732900000000"))
    assert st.is_ghost(sandbox("destroyed", "destroyed"))
    assert not st.is_ghost(sandbox("started", "started"))
    assert st.box_state_of(sandbox("started", "destroyed")) == "missing"


def test_snapshots_inactive_are_usable_failed_are_not() -> None:
    assert st.snapshot_usable(SimpleNamespace(state="inactive"))
    assert st.snapshot_usable(SimpleNamespace(state="active"))
    assert not st.snapshot_usable(SimpleNamespace(state="build_failed"))
    assert not st.snapshot_usable(None)


def test_per_throttler_retry_after_headers_are_honoured() -> None:
    named = DaytonaRateLimitError(
        "slow down", status_code=429, headers={"Retry-After-sandbox-lifecycle": "42", "X-RateLimit-Limit-x": "1"}
    )
    assert dt.retry_after(named) == 42.0 and dt.backoff_delay(0, named) == 42.0
    both = DaytonaRateLimitError("x", status_code=429, headers={"retry-after-authenticated": "5", "Retry-After": "7"})
    assert dt.retry_after(both) == 7.0  # the longest wait asked for
    dated = DaytonaRateLimitError("x", status_code=429, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert dt.retry_after(dated) is None and dt.backoff_delay(1, dated) == 1.0
    assert dt.MAX_RETRY_AFTER >= 60 and dt.RETRY_DEADLINE_SECONDS > dt.MAX_RETRY_AFTER


def test_command_line_switches_user_in_the_box_only_when_needed() -> None:
    me = getpass.getuser()
    line = shell_line.command_line(["sh", "-c", 'id -un; printf %s "$V"'], user=me, env={"V": "a b"})
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, f"{me}\na b")  # already that user: no sudo involved
    assert "agentbox-as" in line and "sudo -n -E -H -u" in shell_line.AS_USER_SCRIPT
    # With the daemon's user known, the old static form is kept.
    assert shell_line.command_line(["id"], user="vscode", sandbox_user="vscode") == "sh -c 'exec id'"


def test_listings_drop_ghosts_and_repeats() -> None:
    first = SimpleNamespace(id="a", state="started", desired_state="started", name="a")
    moved = SimpleNamespace(id="a", state="stopped", desired_state="stopped", name="a")  # read again, later page
    ghost = SimpleNamespace(id="g", state="started", desired_state="destroyed", name="DESTROYED_g_1")
    other = SimpleNamespace(id="b", state="archived", desired_state="archived", name="b")
    assert st.live_sandboxes([first, ghost, other, moved]) == [moved, other]
    assert st.live_sandboxes([first, SimpleNamespace(id="a", state="destroying", desired_state="destroyed",
                                                     name="DESTROYED_a_2")]) == []  # fmt: skip


def test_output_lives_on_disk_and_survives_a_resent_waiter(tmp_path) -> None:
    control, outputs = tmp_path / "shm" / "n1", tmp_path / "disk"
    line = shell_line.command_line(["sh", "-c", "printf out; printf err >&2; exit 3"], user=None)
    subprocess.run(["sh", "-c", dt.LAUNCH_SCRIPT, "launch", str(control), line, "", str(outputs)], check=True)

    def wait() -> tuple:
        done = subprocess.run(["sh", "-c", dt.WAIT_SCRIPT, "wait", str(control), "5"], capture_output=True,
                              text=True, check=True)  # fmt: skip
        return dt.parse_wait_output(done.stdout)

    assert wait() == ("DONE", 3, b"out", b"err")
    assert wait() == ("DONE", 3, b"out", b"err")  # asked again after a lost answer
    assert (outputs / "n1" / "out").read_bytes() == b"out" and not (control.parent / "n1.done" / "out").exists()
    subprocess.run(["sh", "-c", dt.FORGET_OUTPUTS_SCRIPT, "forget", str(control.parent)], check=True)
    assert not (outputs / "n1").exists() and not (control.parent / "n1.done").exists()


def test_an_image_is_pinned_by_digest_by_image_id_or_sent_by_tag_with_a_warning() -> None:
    """pinned_image's three paths. The digest path needs an image pulled from a registry (none here), so its
    lookup is a stand-in; the image-id path and the fallback use this machine's real engine (the image-id path
    end to end: tests/integration/providers/daytona/test_daytona_service_behaviour.py::test_a_moved_image_tag_is_built_anew)."""
    import uuid

    import docker

    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona import _daytona_sandboxes as sb
    from tests.daytona_emulator import TEST_IMAGE, ensure_test_image, remove_test_image

    pinned = "registry.example/team/box@sha256:" + "a" * 64
    assert sb.pinned_image(pinned) == (pinned, None)  # already a digest: no lookup at all
    pulled = {"Id": "sha256:" + "1" * 64,
              "RepoDigests": ["other/box@sha256:" + "b" * 64, "localhost:5000/team/box@sha256:" + "c" * 64]}  # fmt: skip
    assert sb.pinned_image("localhost:5000/team/box:v1", lambda _image: pulled) == (
        "localhost:5000/team/box@sha256:" + "c" * 64, None)  # fmt: skip  # the digest of its own repository
    client = docker.from_env()
    built = ensure_test_image(client)
    reference = f"localhost/agentbox-pin-{uuid.uuid4().hex[:6]}/box:v1"
    client.images.get(TEST_IMAGE).tag(*reference.rsplit(":", 1))
    try:
        image, warning = sb.pinned_image(reference)  # built here, never pushed: no digest, its id names it
        assert warning is None
        assert image.dockerfile() == f"FROM {reference}\nLABEL io.agentbox.image-id={client.images.get(reference).id}\n"
        client.images.remove(reference)
        image, warning = sb.pinned_image(reference)  # the engine no longer knows it: sent as given, and said so
        assert image == reference and warning and reference in warning and "unpinned" in warning
    finally:
        remove_test_image(client, reference)
        if built:
            remove_test_image(client)
