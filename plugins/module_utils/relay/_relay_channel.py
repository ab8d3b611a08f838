# Copyright: agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every per-box relay channel shares: the request handler's type and one thread that keeps
trying the channel, backing off while the box cannot be reached and retrying at once when kicked."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

LOG = logging.getLogger("agentbox-relay")

# handle(registration, request line, answer(reply), wait_for_hangup()) on the relay's loop.
Handler = Callable[[dict[str, Any], bytes, Callable[[dict[str, Any]], Awaitable[None]], Callable[[], Awaitable[Any]]],
                   Awaitable[None]]


class BoxChannel:
    """A thread per box that calls attempt() until stop(); a failed or empty attempt doubles the wait
    (first_wait up to longest_wait), a fruitful one or a kick() brings it back to first_wait."""

    kind = "channel"
    first_wait = 1.0
    longest_wait = 10.0

    def __init__(self, registration: dict[str, Any], handle: Handler, loop: asyncio.AbstractEventLoop):
        self.registration = registration
        self.handle = handle
        self.loop = loop
        self.stopping = threading.Event()
        self.wake = threading.Event()  # set by kick(): try now, not after the back-off
        self.thread = threading.Thread(target=self._run, name=f"{self.kind}-{registration['id']}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def kick(self) -> None:
        """The box may have just started: try the channel now."""
        self.wake.set()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def attempt(self) -> bool:
        """One try at the channel; True when it carried something. Raises when the box is unreachable."""
        raise NotImplementedError

    def _run(self) -> None:
        wait = self.first_wait
        while not self.stopping.is_set():
            try:
                fruitful = self.attempt()
            except Exception as exc:  # noqa: BLE001 - a box not made yet, stopped or unreachable is tried later
                LOG.info("%s of box %s not reached: %s", self.kind, self.registration["name"], exc)
                fruitful = False
            wait = self.first_wait if fruitful else min(wait * 2, self.longest_wait)
            if self.wake.wait(wait):
                self.wake.clear()
                wait = self.first_wait
