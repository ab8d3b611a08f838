# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The box's screen (docs/screen.md): a desktop with Chromium in the box, watched through noVNC on this machine.

A box made with `vnc: true` runs the screen image (`agentbox/box-screen`, the box image plus the desktop) and
publishes the box's noVNC port on the engine's 127.0.0.1. Its VNC password is made on this machine from the
box's id and a key only this user reads (`~/.agentbox/screen.key`): written to the box's tmpfs at create and
at every start (a stop empties the tmpfs), so it is never in a label, the image, the container's config, a log
or a checkpoint. screen.yml prints the URL of a page on this machine (`~/.agentbox/screen/<box>.html`, 0600 in a
0700 folder) that takes the browser to noVNC with the password in the URL's fragment (never sent to a server, so
never in the box's web server's log), which connects at once: the password is in no output, so in no Ansible log.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from ..core import _host_files
from ..core._errors import ProviderError
from ..core._provider import BoxFacts, Provider
from . import _forwards

NOVNC_PORT = 6080
SECRET = "vnc_password"  # the secret file (core/_naming.SECRETS_DIR) that agentbox-boot reads
SCREEN_LABEL = "screen"  # io.agentbox.screen=true on a box made with vnc (the image's own label is io.agentbox.vnc)
IMAGE_LABEL = "io.agentbox.vnc"  # "true" on the screen image and on checkpoints made from its boxes
DEFAULT_IMAGE = "agentbox/box:latest"
SCREEN_IMAGE = "agentbox/box-screen:latest"
BUILD_HINT = "ansible-playbook playbooks/build_image.yml -e box_image_screen=true"
CREATE_HINT = "ansible-playbook playbooks/create_box.yml -e box=NAME -e vnc=true"
PASSWORD_LENGTH = 8  # VNC authentication reads the first 8 characters only


def key_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), "screen.key")


def host_key() -> bytes:
    """This user's key for the boxes' VNC passwords, made once (0600 in ~/.agentbox)."""
    path = key_path()
    _host_files.ensure_private_dir(os.path.dirname(path))
    _host_files.update(path, lambda text: text or base64.b64encode(os.urandom(32)).decode() + "\n")
    return (_host_files.read_text(path) or "").strip().encode()


def password(box_id: str) -> str:
    """The VNC password of the box with this id: 8 letters and digits, the same on every call on this machine."""
    digest = hmac.new(host_key(), f"agentbox-screen:{box_id}".encode(), hashlib.sha256).digest()
    letters = base64.b64encode(digest, altchars=b"xy").decode()
    return "".join(ch for ch in letters if ch.isalnum())[:PASSWORD_LENGTH]


def supported(provider: Provider) -> str:
    """'' when the provider can show a box's screen, else why not (said at create and by screen.yml)."""
    if provider.port_urls in ("published", "forwarded"):
        return ""
    return (f"the box's screen is not available on {provider.name} yet (Docker engines only: the local engine and "
            "docker_ssh; docs/screen.md)")  # fmt: skip


def image_for(image: str) -> str:
    """The image a box with vnc runs: the screen image in place of the default box image."""
    return SCREEN_IMAGE if image == DEFAULT_IMAGE else image


def check_image(image: str, labels: dict[str, str], engine: str) -> None:
    """Refuse, before anything is made, an image without the desktop for a box with vnc."""
    if not labels:
        raise ProviderError(f"image {image!r} is not on engine {engine}: build the screen image with {BUILD_HINT}")
    if labels.get(IMAGE_LABEL) != "true":
        raise ProviderError(f"image {image!r} has no screen (its label {IMAGE_LABEL} is not true): build the screen "
                            f"image with {BUILD_HINT} and create with vnc and the default image (a checkpoint of a "
                            "box without a screen has none either: checkpoint=none), or without vnc")


def give_password(provider: Provider, facts: BoxFacts) -> None:
    """A box with a screen lost its password with its tmpfs at a stop: write it again, before the boot reads it."""
    if facts.labels.get(SCREEN_LABEL) != "true":
        return
    provider.write_secrets(facts.name, {SECRET: password(facts.id)})


def novnc_url(base: str) -> str:
    """noVNC's page at `base`, set to connect at once and scale; without the password (it asks for it)."""
    return f"{base.rstrip('/')}/vnc.html#autoconnect=1&resize=scale"


def page_path(box: str) -> str:
    return os.path.join(_host_files.agentbox_dir(), "screen", f"{box}.html")


def page_text(box: str, target: str) -> str:
    """The page that takes the browser to `target` (noVNC with the password in its fragment, which noVNC's
    WebUtil.getConfigVar reads from location.hash and no browser sends to a server); no referrer leaves it."""
    script = json.dumps(target).replace("<", "\\u003c")
    return ("<!doctype html>\n<meta charset=\"utf-8\">\n<meta name=\"referrer\" content=\"no-referrer\">\n"
            f"<title>agentbox screen: {html.escape(box)}</title>\n<script>location.replace({script});</script>\n"
            f"<p><a href=\"{html.escape(target)}\">the screen of box {html.escape(box)}</a></p>\n")


def write_page(box: str, target: str, check_mode: bool) -> bool:
    """Write the box's page (0600, in a 0700 folder) unless it already says the same: True when it changed
    (in check mode: would change, and nothing is written)."""
    path, text = page_path(box), page_text(box, target)
    if _host_files.read_text(path) == text:
        return False
    if not check_mode:
        _host_files.ensure_private_dir(os.path.dirname(path))
        _host_files.write_atomic(path, text, 0o600)
    return True


def screen(provider: Provider, name: str, check_mode: bool = False) -> dict[str, Any]:
    """screen.yml's answer for box `name`: `url` (the file URL of the box's page on this machine, which opens
    noVNC connecting at once), `page` (its path), `novnc` (noVNC's page on this machine's 127.0.0.1, without the
    password), `local_port`, `pid` of a forward (docker_ssh), `changed`, `box`. The password is in none of them.
    Fails with what to do for a box without a screen."""
    problem = supported(provider)
    if problem:
        raise ValueError(problem)
    facts = provider.find(name)
    if facts is None:
        raise ValueError(f"no box called {name!r} on engine {provider.engine}: list boxes with playbooks/list_boxes.yml")
    if facts.labels.get(SCREEN_LABEL) != "true":
        raise ValueError(f"box {name!r} has no screen (it was made without vnc): create a box with one, "
                         f"{CREATE_HINT} (docs/screen.md)")
    if facts.state != "running":
        raise ValueError(f"box {name!r} is {facts.state}: start it (playbooks/box_state.yml -e box={name} "
                         "-e state=started)")
    answer = _forwards.url_of_port(provider, facts, NOVNC_PORT, 0, check_mode)
    answer["box"] = facts.to_dict()
    if answer["url"] is None:
        return answer
    problem = page_problem(answer["url"])
    if problem:
        raise ProviderError(f"the screen of box {name!r} does not answer ({problem}): its logs are "
                            "/var/log/agentbox/vnc.log and novnc.log in the box", box=name, operation="screen")
    answer["novnc"] = novnc_url(answer["url"])
    target = f"{answer['novnc']}&password={password(facts.id)}"
    answer["changed"] = write_page(name, target, check_mode) or answer["changed"]
    answer["page"] = page_path(name)
    answer["url"] = "file://" + urllib.request.pathname2url(answer["page"])
    return answer


def page_problem(base: str, seconds: float = 5.0) -> str:
    """'' when noVNC's page answers at `base` (on this machine's 127.0.0.1) within `seconds` (a box that just
    started may not listen yet), else what went wrong. No proxy: the address is this machine's."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + seconds
    while True:
        try:
            with opener.open(f"{base.rstrip('/')}/vnc.html", timeout=seconds) as page:
                page.read(1024)
            return ""
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code} from noVNC's page"
        except OSError as exc:
            if time.monotonic() > deadline:
                return f"noVNC's page: {exc}"
        time.sleep(0.1)
