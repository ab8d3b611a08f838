"""The box's screen for real: the screen image built by the role (a cached build of its own on top of the box
image), a box made with vnc, its own Chromium (agentbox-browser) on a page a server in the box serves, and
screen.yml's URL (a private page on this machine) opened by this machine's headless Chromium: noVNC says connected
and shows that page. The VNC password is in no label, environment, image, log (screen.yml's output and its Ansible
log_path included) or checkpoint-visible file, and the screen comes back after a stop and a start. The test
talks only to 127.0.0.1. Bad input and vnc-less boxes: tests/unit/access/test_screen.py.

`AGENTBOX_SCREEN_SCREENSHOT=docs/img/screen.png` keeps the screenshot there (refreshed on purpose only)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.access import _screen
from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from tests.conftest import REPO, make_repo, run_module_direct
from tests.integration.access.test_access import destroy_quietly, enter_home, new_home, playbook
from tests.integration.support.cdp import Browser

pytestmark = pytest.mark.integration

PAGE_PORT = 8000  # the page's server, on the box's own loopback
# A page the box's Chromium shows: its colour is what the host's screenshot looks for on the box's screen.
PAGE = ("<!doctype html><title>agentbox screen {token}</title><body style='margin:0;background:#ff00ff;"
        "font:48px sans-serif;color:#fff'><h1 style='margin:80px'>served in the box: {token}</h1></body>")
# Magenta pixels on noVNC's canvas (the box's screen as this machine's browser received it).
MAGENTA = """(() => { const c = document.querySelector('#noVNC_container canvas'); if (!c || !c.width) return 0;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i] > 230 && d[i + 1] < 30 && d[i + 2] > 230) n++; return n; })()"""


def docker_exec(name: str, *argv: str, user: str = "vscode", detach: bool = False) -> str:
    done = subprocess.run(["docker", "exec", *(["-d"] if detach else []), "-u", user, f"agentbox-{name}", *argv],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def screen_image(box_image: str) -> str:
    """The screen image on top of the suite's box image, through the role: built once, then found by fingerprint."""
    repository = box_image.rsplit(":", 1)[0]
    done = playbook("playbooks/build_image.yml", "-e", f"box_image_tag={repository}", "-e", "box_image_screen=true",
                    env={"ANSIBLE_TIMEOUT": "60"})  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.search(rf"({re.escape(repository)}-screen:[0-9a-f]{{16}}) on ", done.stdout)
    assert found, done.stdout[-3000:]
    return found.group(1)


@pytest.fixture(scope="module")
def screen_home() -> Iterator[Path]:
    path = new_home()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def screen_box(screen_image: str, screen_home: Path) -> Iterator[str]:
    """A box with a screen and a page served in it; its own Chromium shows the page."""
    root = Path(tempfile.mkdtemp(prefix="abs-", dir="/tmp"))
    root.chmod(0o755)
    token = secrets.token_hex(3)
    name = f"scr-{token}"
    workspace = make_repo(root / "ws", {"index.html": PAGE.format(token=token)})
    with pytest.MonkeyPatch.context() as patch:
        enter_home(patch, screen_home)
        made = run_module_direct("agentbox_box", {"name": name, "workspace": str(workspace), "vnc": True,
                                                  "image": screen_image}, env={"HOME": str(screen_home)})  # fmt: skip
        assert not made["failed"], made.get("msg")
        try:
            yield name
        finally:
            destroy_quietly([name])
            shutil.rmtree(root, ignore_errors=True)


def show_page_in_the_box(name: str) -> str:
    """The page's server and the box's Chromium on it (agentbox-browser); the page's title once Chromium loaded it."""
    docker_exec(name, "python3", "-m", "http.server", str(PAGE_PORT), "--bind", "127.0.0.1", "--directory",
                "/workspace", detach=True)  # fmt: skip
    said = docker_exec(name, "agentbox-browser", f"http://127.0.0.1:{PAGE_PORT}/")
    assert "Chromium on display :1" in said, said
    # DevTools of the box's Chromium on the box's loopback (the agent's CDP way in): the page it shows.
    probe = ("import json,time,urllib.request as u\nfor _ in range(300):\n try:\n"
             "  pages=[p for p in json.load(u.urlopen('http://127.0.0.1:9222/json/list')) if p['type']=='page']\n"
             "  t=[p['title'] for p in pages if p['url'].startswith('http://127.0.0.1:8000')]\n"
             "  if t and t[0].startswith('agentbox screen'): print(t[0]); break\n except OSError: pass\n"
             " time.sleep(0.1)\n")
    return docker_exec(name, "python3", "-c", probe).strip()


def screen_url(name: str, home: Path, log: Path) -> tuple[str, str]:
    """screen.yml's URL (of the box's page on this machine) and all it wrote: its output (-v: the module's result
    too) and its Ansible log."""
    done = playbook("playbooks/screen.yml", "-v", "-e", f"box={name}", env={"HOME": str(home), "ANSIBLE_LOG_PATH": str(log)})
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"screen:\s+(file:///\S+?\.html)[\"',\s]", done.stdout)
    assert found, done.stdout
    return found.group(1), done.stdout + done.stderr + log.read_text()


def novnc_target(page_url: str) -> str:
    """The noVNC URL, password in its fragment, that the box's page takes the browser to."""
    found = re.search(r'location\.replace\("(http://127\.0\.0\.1:\d+/vnc\.html#[^"]+)"\)',
                      Path(page_url.removeprefix("file://")).read_text())  # fmt: skip
    assert found, page_url
    return found.group(1)


def connected_pixels(url: str, shot: str = "") -> tuple[bool, int]:
    """This machine's headless Chromium on `url`: whether noVNC says connected, and the magenta pixels it shows."""
    with Browser(1280, 800) as browser:
        browser.open(url)
        connected = bool(browser.wait_for("document.documentElement.classList.contains('noVNC_connected')"))
        pixels = browser.wait_for(f"({MAGENTA}) > 100000 && ({MAGENTA})") or browser.evaluate(MAGENTA)
        if shot:
            browser.screenshot(shot)
    return connected, int(pixels or 0)


def test_screen_shows_the_box_desktop_with_its_own_chromium_on_a_page_served_in_the_box(
        screen_box: str, screen_home: Path, tmp_path: Path) -> None:  # fmt: skip
    token = screen_box.removeprefix("scr-")
    assert show_page_in_the_box(screen_box) == f"agentbox screen {token}"
    url, said = screen_url(screen_box, screen_home, tmp_path / "ansible.log")
    page = screen_home / ".agentbox" / "screen" / f"{screen_box}.html"
    assert url == f"file://{page}"
    assert stat.S_IMODE(page.stat().st_mode) == 0o600 and stat.S_IMODE(page.parent.stat().st_mode) == 0o700
    target = novnc_target(url)
    password = target.rsplit("password=", 1)[1]
    assert target.count("#") == 1 and "autoconnect=1" in target.split("#")[1] and len(password) == 8
    # Neither screen.yml's output (the module's result included) nor its Ansible log has the password.
    assert "127.0.0.1" in said and password not in said
    shot = os.environ.get("AGENTBOX_SCREEN_SCREENSHOT") or str(tmp_path / "screen.png")
    connected, pixels = connected_pixels(url, str(REPO / shot) if not os.path.isabs(shot) else shot)
    assert connected, "noVNC did not report connected"
    # The page fills most of Chromium's 1280x800 window: well over 100,000 magenta pixels reach this machine.
    assert pixels > 100000, pixels
    # A wrong password is refused: the screen is the box's password's only.
    wrong = target.replace(f"password={password}", "password=wrong123")
    with Browser(1280, 800) as browser:
        browser.open(wrong)
        refused = browser.wait_for("document.getElementById('noVNC_status') && "
                                   "/rejected/i.test(document.getElementById('noVNC_status').textContent) "
                                   "&& document.getElementById('noVNC_status').textContent")  # fmt: skip
        assert refused and not browser.evaluate("document.documentElement.classList.contains('noVNC_connected')")

    # The password is nowhere but the box's tmpfs: not the container's config, the image, the logs, the layer.
    config = json.loads(subprocess.run(["docker", "inspect", f"agentbox-{screen_box}"], capture_output=True,
                                       text=True, check=True).stdout)[0]  # fmt: skip
    assert password not in json.dumps(config) and password not in json.dumps(
        json.loads(subprocess.run(["docker", "image", "inspect", config["Image"]], capture_output=True, text=True,
                                  check=True).stdout))  # fmt: skip
    # Where the box writes (its layer, /workspace, logs, /tmp) and its tmpfs: the one secret file holds it.
    holders = docker_exec(screen_box, "sh", "-c", f"grep -rlsF {password} /home /root /etc /var/log /var/lib/agentbox "
                          "/tmp /run /workspace || true", user="root").split()  # fmt: skip
    assert holders == [f"{_naming.SECRETS_DIR}/{_screen.SECRET}"], holders
    assert "/run/agentbox" in docker_exec(screen_box, "sh", "-c", "findmnt -n -o TARGET -T /run/agentbox/vnc")


def test_the_screen_comes_back_after_a_stop_and_a_start(screen_box: str, screen_home: Path) -> None:
    env = {"HOME": str(screen_home)}
    before = run_module_direct("agentbox_screen", {"name": screen_box}, env=env)
    assert not before["failed"], before.get("msg")
    password = novnc_target(before["url"]).rsplit("password=", 1)[1]
    for state in ("stopped", "started"):
        moved = run_module_direct("agentbox_box", {"name": screen_box, "state": state}, env=env)
        assert not moved["failed"], moved.get("msg")
    after = run_module_direct("agentbox_screen", {"name": screen_box}, env=env)
    assert not after["failed"], after.get("msg")
    # The start gave the box its password again (the tmpfs was emptied): the same one, made here from the box's id;
    # the page says the new port (a start publishes another).
    assert after["url"] == before["url"] and str(after["local_port"]) in after["novnc"]
    assert password not in json.dumps(before) + json.dumps(after)
    assert novnc_target(after["url"]) == f"{after['novnc']}&password={password}"
    assert show_page_in_the_box(screen_box).startswith("agentbox screen")
    connected, pixels = connected_pixels(after["url"])
    assert connected and pixels > 100000, (connected, pixels)
