"""A chain of checkpoints on the real engine: each restored box stacks one more layer, until the
default max_layers flattens the next one; a smaller max_layers flattens sooner, and cleanup=false
captures the box as it is (lab.py: the modules run as Ansible runs them). Its boxes are made with boot=False: the
chain is the checkpoints' layers, config, labels and files, and the cleanup, an exec of its own; nothing of it
needs the in-box services (a booted box's checkpoint and restore: test_checkpoint.py)."""

from __future__ import annotations

import secrets
from typing import Any

import docker
import pytest

from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
from tests.integration.checkpoint.lab import IMAGE, Lab

pytestmark = pytest.mark.integration


def assert_same_config(image_config: dict[str, Any], container_config: dict[str, Any]) -> None:
    for key in ("User", "WorkingDir", "Cmd", "Entrypoint"):
        assert (image_config.get(key) or None) == (container_config.get(key) or None), key
    # The environment is the image's own: the box's (AGENTBOX_*, its `env`) is not kept.
    assert image_config.get("Env") == docker.from_env().images.get(IMAGE).attrs["Config"]["Env"]
    assert sorted(image_config.get("ExposedPorts") or {}) == sorted(container_config.get("ExposedPorts") or {})


def test_three_layered_in_a_chain_then_the_fourth_is_flattened_and_max_layers_and_cleanup_false(lab: Lab) -> None:
    """One chain proves both: gen1 is taken with cleanup=false and max_layers=1 (one layer is allowed),
    and of the box restored from it a checkpoint with max_layers=1 would be flattened, while gen2, with
    the default max_layers, is layered and runs the default cleanup there."""
    workspace = lab.workspace()
    box = lab.ok_box("g0", workspace, boot=False)["box"]["name"]
    note = f"session-{secrets.token_hex(6)}"
    lab.sh(box, f"echo {note} > /var/tmp/session-note", user="root")  # the in-box cleanup empties /var/tmp
    names: list[str] = []
    boxes = [box]
    for generation in range(1, 5):
        lab.sh(
            box,
            f"cd /workspace && mkdir -p node_modules/gen{generation} && echo {generation} > node_modules/gen{generation}/v",
        )
        options: dict[str, Any] = {"cleanup": False, "max_layers": 1} if generation == 1 else {}
        saved = lab.ok_checkpoint(box=box, name=f"gen{generation}", **options)["checkpoint"]
        names.append(saved["name"])
        assert saved["parents"] == list(reversed(names[:-1])), saved
        if generation < 4:
            assert saved["type"] == "layered" and saved["layers"] == generation
            box = lab.ok_box(f"g{generation}", workspace, checkpoint=saved["name"], boot=False)["box"]["name"]
            boxes.append(box)
        if generation == 1:
            assert lab.sh(box, "cat /var/tmp/session-note") == f"{note}\n"  # captured as it was: no cleanup ran
            # The restored box already stacks one checkpoint layer: with max_layers=1 the next one is flattened.
            # Planned in check mode: the capture takes the plan's type, layers and parents as they are, and
            # gen4 below is a real flattened capture of a restored box.
            second = lab.ok_checkpoint(box=box, name="ml2", max_layers=1, _check=True)["checkpoint"]
            assert second["type"] == "flattened" and second["layers"] == 0 and second["parents"] == ["gen1"]
        if generation == 2:
            # gen2 was taken of the box restored from gen1 with the default cleanup (011cf34: it ran there).
            assert "session-note" not in lab.sh(boxes[1], "ls -A /var/tmp")
    assert saved["type"] == "flattened" and saved["layers"] == 0

    flat = lab.client.images.get(saved["image"])
    history = flat.history()
    assert len(history) == 1 and len(flat.attrs["RootFS"]["Layers"]) == 1, history
    layered = lab.client.images.get(_naming.checkpoint_image(_naming.project_id(str(workspace)), "gen3"))
    assert len(layered.attrs["RootFS"]["Layers"]) > 1
    container = lab.client.containers.get(_naming.container_name(box))
    source_config = container.attrs["Config"]
    assert_same_config(flat.attrs["Config"], source_config)
    expected_labels = dict(source_config["Labels"])
    expected_labels.update({k: v for k, v in flat.labels.items() if k.startswith("io.agentbox.")})
    assert flat.labels == expected_labels
    assert {k: v for k, v in flat.labels.items() if not k.startswith("io.agentbox.")} == {
        k: v for k, v in source_config["Labels"].items() if not k.startswith("io.agentbox.")
    }
    # Everything the chain accumulated is in the single layer, and a box starts from it.
    last = lab.ok_box("g4", workspace, checkpoint="gen4", boot=False)["box"]["name"]
    assert lab.sh(last, "cat /workspace/node_modules/gen*/v").split() == ["1", "2", "3", "4"]
