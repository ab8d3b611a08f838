"""The box's screen on the fake provider, its modules run in-process: a box made with vnc runs the screen image,
publishes noVNC's port, is labelled, and holds its VNC password (made here from its id) on its tmpfs only,
written again at a start; screen.yml's module refuses, with what to do, a box without a screen, a box that
does not run, a provider that has none, and an image without the desktop. The real desktop, its URL and a real
browser: tests/integration/access/test_screen.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.access import _screen
from ansible_collections.agentbox.box.plugins.module_utils.box import _box
from tests.conftest import make_repo
from tests.unit.support.fake_provider import FakeProvider
from tests.unit.support.inprocess import provider_as, run_module_inprocess

SCREEN_LABELS = {"io.agentbox.vnc": "true"}


@pytest.fixture
def workspace(tmp_path: Path) -> str:
    return str(make_repo(tmp_path / "ws", {"a.txt": "a\n"}))


@pytest.fixture
def screen_engine(fake_docker: FakeProvider) -> FakeProvider:
    fake_docker.images[_screen.SCREEN_IMAGE] = (dict(SCREEN_LABELS), None)
    return fake_docker


def test_the_vnc_password_is_per_box_stable_and_made_from_a_private_key(home: Path) -> None:
    first, again, other = _screen.password("5b0a6d52"), _screen.password("5b0a6d52"), _screen.password("0c1d2e3f")
    assert first == again and first != other
    assert len(first) == _screen.PASSWORD_LENGTH and first.isalnum()
    key = home / ".agentbox" / "screen.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    key.write_text("another key\n")  # another machine's key: other passwords
    assert _screen.password("5b0a6d52") != first


def test_a_box_made_with_vnc_runs_the_screen_image_with_its_password_on_the_tmpfs_only(
        screen_engine: FakeProvider, workspace: str) -> None:  # fmt: skip
    result = run_module_inprocess("agentbox_box", {"name": "scr", "workspace": workspace, "vnc": True, "boot": False})
    assert result["failed"] is False, result
    facts = screen_engine.find("scr")
    assert facts.image == _screen.SCREEN_IMAGE and facts.labels["screen"] == "true"
    spec = screen_engine.boxes["scr"].spec
    assert _screen.NOVNC_PORT in spec.ports and _box.WEB_PORT in spec.ports
    secret = screen_engine.box_root("scr") / "run/agentbox/secrets" / _screen.SECRET
    password = _screen.password(facts.id)
    assert secret.read_text() == password
    # Never in a label, the environment or what the module returned.
    assert password not in json.dumps(spec.labels) + json.dumps(spec.env) + json.dumps(result)
    # A stop empties the tmpfs on a real engine: the start writes the password again before the boot.
    secret.unlink()
    assert run_module_inprocess("agentbox_box", {"name": "scr", "state": "stopped"})["failed"] is False
    started = run_module_inprocess("agentbox_box", {"name": "scr", "state": "started", "boot": False})
    assert started["failed"] is False, started
    assert secret.read_text() == password
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600


def test_a_box_without_vnc_has_no_screen_and_screen_says_how_to_make_one(screen_engine: FakeProvider,
                                                                         workspace: str) -> None:  # fmt: skip
    assert run_module_inprocess("agentbox_box", {"name": "plain", "workspace": workspace, "boot": False})["failed"] is False
    spec = screen_engine.boxes["plain"].spec
    assert _screen.NOVNC_PORT not in spec.ports and "screen" not in screen_engine.find("plain").labels
    assert not (screen_engine.box_root("plain") / "run/agentbox/secrets" / _screen.SECRET).exists()
    for check_mode in (False, True):
        result = run_module_inprocess("agentbox_screen", {"name": "plain"}, check_mode=check_mode)
        assert result["failed"] is True, result
        assert result["msg"] == ("box 'plain' has no screen (it was made without vnc): create a box with one, "
                                 "ansible-playbook playbooks/create_box.yml -e box=NAME -e vnc=true (docs/screen.md)")


BAD_SCREENS = [
    ({"name": "Bad Box"}, "invalid box name"),
    ({"name": "nobox"}, "no box called 'nobox'"),
    ({}, "box 'scr' is paused: start it (playbooks/box_state.yml -e box=scr -e state=started)"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SCREENS, ids=[m[:24] for _a, m in BAD_SCREENS])
def test_screen_of_bad_input_is_refused_and_wakes_nothing(screen_engine: FakeProvider, workspace: str, args: dict,
                                                          message: str) -> None:  # fmt: skip
    _box.create_box(screen_engine, _box.CreateRequest(name="scr", workspace=workspace, boot=False, vnc=True))
    screen_engine.pause("scr")
    result = run_module_inprocess("agentbox_screen", {"name": "scr", **args})
    assert result["failed"] is True and message in result["msg"], result
    assert screen_engine.find("scr").state == "paused"


def test_vnc_without_the_screen_image_is_refused_before_anything_is_made(fake_docker: FakeProvider,
                                                                         workspace: str) -> None:  # fmt: skip
    missing = run_module_inprocess("agentbox_box", {"name": "scr", "workspace": workspace, "vnc": True})
    assert missing["failed"] is True, missing
    assert f"create of box 'scr' failed: vnc: image '{_screen.SCREEN_IMAGE}' is not on engine " in missing["msg"]
    assert "ansible-playbook playbooks/build_image.yml -e box_image_screen=true" in missing["msg"]
    fake_docker.images["plain/image:1"] = ({"io.agentbox.vnc": "false"}, None)
    plain = run_module_inprocess("agentbox_box", {"name": "scr", "workspace": workspace, "vnc": True,
                                                  "image": "plain/image:1"})  # fmt: skip
    assert plain["failed"] is True and "image 'plain/image:1' has no screen (its label io.agentbox.vnc" in plain["msg"]
    assert fake_docker.boxes == {} and fake_docker.find("scr") is None


def test_daytona_and_boxd_say_the_screen_is_not_there_yet(tmp_path: Path, home: Path, workspace: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the fake provider mounts and chroots")
    for name, urls in (("daytona", "signed"), ("boxd", "exposed")):
        cloud = FakeProvider(tmp_path / name, shares_host_filesystem=False, name=name)
        cloud.port_urls = urls
        with provider_as(name, cloud):
            made = run_module_inprocess("agentbox_box", {"name": "scr", "workspace": workspace, "vnc": True,
                                                         "provider": name}, check_mode=True)  # fmt: skip
            shown = run_module_inprocess("agentbox_screen", {"name": "scr", "provider": name})
        wanted = f"the box's screen is not available on {name} yet (Docker engines only"
        assert made["failed"] is True and made["msg"].startswith(f"vnc: {wanted}"), made
        assert shown["failed"] is True and shown["msg"].startswith(wanted), shown
        assert cloud.boxes == {}


def test_the_screen_page_is_private_and_takes_the_browser_to_novnc_with_the_password_in_the_fragment(
        home: Path) -> None:  # fmt: skip
    novnc = _screen.novnc_url("http://127.0.0.1:4321/")
    assert novnc == "http://127.0.0.1:4321/vnc.html#autoconnect=1&resize=scale"
    target = f"{novnc}&password=Ab3dEf9h"
    page = Path(_screen.page_path("scr"))
    assert page == home / ".agentbox" / "screen" / "scr.html"
    assert _screen.write_page("scr", target, check_mode=True) is True and not page.parent.exists()
    assert _screen.write_page("scr", target, check_mode=False) is True
    assert stat.S_IMODE(page.stat().st_mode) == 0o600 and stat.S_IMODE(page.parent.stat().st_mode) == 0o700
    text = page.read_text()
    assert f"location.replace({json.dumps(target)});" in text and 'content="no-referrer"' in text
    assert _screen.write_page("scr", target, check_mode=False) is False  # the same page: unchanged
    # Another port after a start: the page changes; in check mode it only says so.
    moved = target.replace("4321", "4322")
    assert _screen.write_page("scr", moved, check_mode=True) is True and page.read_text() == text
    assert _screen.write_page("scr", moved, check_mode=False) is True and "4322" in page.read_text()
