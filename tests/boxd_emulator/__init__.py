"""A local emulator of the boxd gRPC API, for testing the `boxd` provider with the real SDK.

    from tests.boxd_emulator import running_emulator

    with running_emulator(image=TEST_IMAGE) as emu:
        client = Boxd(token=emu.token, base_url=emu.base_url)
        emu.control.add_fault(method="Exec", action="drop", after=2)

docs/boxd-emulator.md describes what it models and what it does not.
"""

import os

# gRPC's default epoll1 poller aborts a child forked while a channel is live (Ansible and git fork);
# the poll poller does not. Set before grpc is imported anywhere in this process.
os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")

from .harness import Control, RunningEmulator, running_emulator

__all__ = ["Control", "RunningEmulator", "running_emulator"]
