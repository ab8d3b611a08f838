"""Neither the box's secrets nor its `env` reach a checkpoint of either kind, and a box restored from
one gets its own `env`; playbooks/checkpoint.yml takes a flattened project default. One box holds both
(secrets, and an API key in `env` as users pass them out of habit); it is captured once layered (the
module, as Ansible runs it: lab.py) and once flattened (the playbook), and each image is searched
once, its config and its filesystem, for every value: of the layered one what it adds over the box's
image (its other layers are provably the image's), of the flattened one its whole single layer."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from tests.integration.checkpoint.lab import IMAGE, REPO, Lab, image_exists, layers_contain, open_lab

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sealed(client: Any) -> Iterator[dict[str, Any]]:
    """The box, what it held before its checkpoints were taken, and per kind: the checkpoint, its
    `docker image inspect` and which values its filesystem holds. The tests only read these (and make
    boxes of their own)."""
    with open_lab(client) as lab:
        workspace = lab.workspace()
        token = "relay-" + secrets.token_hex(16)
        api_key = "sk-ant-fake-" + secrets.token_hex(20)
        env_key = "sk-env-" + secrets.token_hex(20)
        made = lab.ok_box(
            "sec",
            workspace,
            secrets={"RELAY_TOKEN": token, "ANTHROPIC_API_KEY": api_key},
            env={"HARMLESS": "visible", "MY_API_KEY": env_key},
        )
        box = made["box"]["name"]
        # What the box holds (so the searches below can fail), read before any checkpoint's cleanup.
        held = {
            "secret_file": lab.sh(box, "cat /run/agentbox/secrets/ANTHROPIC_API_KEY"),
            "env": lab.sh(box, "env"),
            "printenv": lab.sh(box, "printenv MY_API_KEY"),
        }
        # Positive controls: random tokens the search must find, in a file's content, a file's name and a
        # link's target (a plain word could also match inside other files and prove nothing).
        work, named, target = (f"{kind}-{secrets.token_hex(12)}" for kind in ("work", "name", "link"))
        lab.sh(box, f"cd /workspace && echo '{work}' > work.txt && touch '{named}' && ln -s '/nowhere/{target}' link")
        markers = sorted(marker.encode() for marker in (work, named, target))
        needles = [token.encode(), api_key.encode(), env_key.encode(), *markers]
        box_image = lab.client.containers.get(_naming.container_name(box)).attrs["Image"]
        layered = lab.ok_checkpoint(box=box, name="sec-0")["checkpoint"]
        # One pass for every value over what the layered image adds to the box's image (the layers
        # below are the box image's own, proven so by layers_contain).
        found = {"layered": layers_contain(lab.client, layered["image"], needles, over=box_image)}
        # The flattened one (the costly kind) through the playbook, as a user takes a project default.
        playbook = checkpoint_playbook(lab, "-e", f"box={box}", "-e", "checkpoint=pb-flat", "-e", "merged=true",
                                       "-e", "set_default=true")  # fmt: skip
        assert playbook.returncode == 0, playbook.stdout[-3000:] + playbook.stderr[-2000:]
        listed = lab.module("agentbox_checkpoint_info", {"box": box})
        flattened = {c["name"]: c for c in listed["checkpoints"]}["pb-flat"]
        # Its one layer holds the whole filesystem: all of it is searched.
        found["flattened"] = layers_contain(lab.client, flattened["image"], needles)
        kinds: dict[str, dict[str, Any]] = {}
        for kind, saved in (("layered", layered), ("flattened", flattened)):
            inspect = subprocess.run(["docker", "image", "inspect", saved["image"]], capture_output=True, check=True).stdout
            kinds[kind] = {"saved": saved, "inspect": inspect, "found": found[kind]}
        yield {"lab": lab, "workspace": workspace, "box": box, "token": token, "api_key": api_key,
               "env_key": env_key, "markers": markers, "held": held, "kinds": kinds,
               "playbook": playbook, "listed": listed}  # fmt: skip


def checkpoint_playbook(lab: Lab, *args: str) -> subprocess.CompletedProcess:
    """playbooks/checkpoint.yml under the lab's HOME, with the controller's own Python (it has the
    docker SDK; discovery would look under the temp HOME)."""
    argv = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-e",
            f"ansible_python_interpreter={sys.executable}", "playbooks/checkpoint.yml", *args]  # fmt: skip
    env = {**os.environ, "HOME": str(lab.home)}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)


def test_secrets_are_in_neither_kind_of_checkpoint(sealed: dict[str, Any]) -> None:
    lab, workspace, token, api_key = sealed["lab"], sealed["workspace"], sealed["token"], sealed["api_key"]
    held = sealed["held"]
    # The secrets are really in the box (so the search below can fail), and not in its environment.
    assert held["secret_file"] == api_key
    assert api_key not in held["env"] and token not in held["env"]
    # An agent copying a secret into the environment of its own processes does not matter: only files count.
    needles = [token.encode(), api_key.encode()]
    for kind, made in sealed["kinds"].items():
        saved, inspect = made["saved"], made["inspect"]
        assert saved["type"] == kind
        assert b"visible" not in inspect  # the box's env is not the checkpoint's (see the test below)
        assert not any(n in inspect for n in needles), saved["type"]
        # The markers are found, no secret is.
        assert made["found"] == sealed["markers"], saved["type"]

    # A box whose environment holds one of its secrets is refused, and nothing is made.
    # (checkpoint none: a fresh box, not one of the project default the playbook set)
    leaky = lab.ok_box("leak", workspace, checkpoint="none", secrets={"API_KEY": api_key}, env={"COPIED": api_key},
                       boot=False)  # the refusal reads the container's config: nothing need run in the box
    leaky = leaky["box"]["name"]
    refused = lab.checkpoint(box=leaky, name="leaky")
    assert refused.get("failed") and "COPIED" in refused["msg"] and api_key not in refused["msg"]
    assert not image_exists(lab.client, _naming.checkpoint_image(_naming.project_id(str(workspace)), "leaky"))


def test_box_env_is_in_neither_kind_of_checkpoint(sealed: dict[str, Any]) -> None:
    """Users pass API keys in `env` out of habit: a checkpoint keeps the image's own environment, and
    a box restored from it gets its own `env`."""
    lab, workspace, key = sealed["lab"], sealed["workspace"], sealed["env_key"]
    assert sealed["held"]["printenv"] == key + "\n"  # it is really there, so the searches can fail
    for kind, made in sealed["kinds"].items():
        saved, inspect = made["saved"], made["inspect"]
        assert key.encode() not in inspect, kind
        # Exactly the image's own environment: no key the box added, not even a blanked one.
        assert json.loads(inspect)[0]["Config"]["Env"] == lab.client.images.get(IMAGE).attrs["Config"]["Env"]
        assert made["found"] == sealed["markers"], kind
        own = "sk-own-" + secrets.token_hex(8)
        restored = lab.ok_box(f"env-r{int(kind == 'flattened')}", workspace, checkpoint=saved["name"],
                              env={"MY_API_KEY": own}, boot=False)  # its env is the container's: no boot needed
        name = restored["box"]["name"]
        assert lab.sh(name, "printenv MY_API_KEY; printenv AGENTBOX_BOX_NAME") == f"{own}\n{name}\n"


def test_checkpoint_playbook(sealed: dict[str, Any]) -> None:
    box, done, listed = sealed["box"], sealed["playbook"], sealed["listed"]
    assert "checkpoint: pb-flat (flattened, project default)" in done.stdout
    # The box's two checkpoints: the module's layered one, and the playbook's, the project default.
    assert sorted(c["name"] for c in listed["checkpoints"]) == ["pb-flat", "sec-0"] and listed["default"] == "pb-flat"
    # checkpoint.yml without a box stops at its first task: tests/integration/playbooks/test_playbook_inputs.py
    assert box in done.stdout  # the box it was told
