"""A local emulator of the Daytona HTTP API, for testing the `daytona` provider with the real SDK.

One-line use from pytest (see docs/daytona-emulator.md):

    from tests.daytona_emulator import running_emulator

    with running_emulator(image="agentbox-test/busybox:latest") as (api_url, api_key, admin):
        ...
"""

from .config import EMULATOR_LABEL, EmulatorConfig
from .harness import EmulatorAdmin, RunningEmulator, remove_instance_leftovers, running_emulator
from .testimage import TEST_IMAGE, ensure_test_image, remove_test_image

__all__ = [
    "EMULATOR_LABEL",
    "TEST_IMAGE",
    "EmulatorAdmin",
    "EmulatorConfig",
    "RunningEmulator",
    "ensure_test_image",
    "remove_instance_leftovers",
    "remove_test_image",
    "running_emulator",
]
