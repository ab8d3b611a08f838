"""A chain of checkpoints on the real engine: each restored box stacks one more layer, until the
default max_layers flattens the next one; a smaller max_layers flattens sooner, and cleanup=false
captures the box as it is (lab.py: the modules run as Ansible runs them)."""

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
    and from the box restored from it a second checkpoint with max_layers=1 is flattened."""
    workspace = lab.workspace()
    box = lab.ok_box("g0", workspace)["box"]["name"]
    note = f"session-{secrets.token_hex(6)}"
    lab.sh(box, f"echo {note} > /var/tmp/session-note", user="root")  # the in-box cleanup empties /var/tmp
    names: list[str] = []
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
            box = lab.ok_box(f"g{generation}", workspace, checkpoint=saved["name"])["box"]["name"]
        if generation == 1:
            assert lab.sh(box, "cat /var/tmp/session-note") == f"{note}\n"  # captured as it was: no cleanup ran
            # The restored box already stacks one checkpoint layer: with max_layers=1 the next one is flattened.
            second = lab.ok_checkpoint(box=box, name="ml2", max_layers=1)["checkpoint"]
            assert second["type"] == "flattened" and second["layers"] == 0 and second["parents"] == ["gen1"]
            assert "session-note" not in lab.sh(box, "ls -A /var/tmp")  # the default cleanup ran this time
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
    last = lab.ok_box("g4", workspace, checkpoint="gen4")["box"]["name"]
    assert lab.sh(last, "cat /workspace/node_modules/gen*/v").split() == ["1", "2", "3", "4"]
