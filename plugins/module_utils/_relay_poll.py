# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The relay's channel to a box that cannot reach the host (Daytona, boxd): the host polls.

The in-box client writes its request to /run/agentbox/relay-queue/<id>.req. Every POLL_INTERVAL
the relay runs one toolbox command in the box that prints every queued request and renames each
to <id>.taken (so a request is collected once); each answer line is written back as <id>.out,
replaced whole each time (the client reads the lines it has not shown yet). What arrives through
the exec of that box is that box's request. Each poll first asks the provider for the box's state
and collects only from a running box: an exec wakes a suspended boxd machine (and a poll would then
keep it awake for ever). Cost: one state lookup and one exec call per running box per interval while
idle, plus one per answer line; latency: up to one interval plus an exec round trip (about 2 s here
against the emulators). A box that is not running is asked again after at most IDLE_INTERVAL.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
from collections.abc import Callable
from typing import Any

from ._relay_channel import LOG, BoxChannel, Handler
from ._relay_protocol import MAX_REQUEST_BYTES

QUEUE_DIR = "/run/agentbox/relay-queue"
POLL_INTERVAL = 2.0
# Queue entries are named by hex ids (the in-box client makes them); anything else is not ours.
REQUEST_ID = re.compile(r"[0-9a-f]{1,64}")
IDLE_INTERVAL = 15.0
MAX_PER_POLL = 16
# One listing: MAX_PER_POLL lines of an id, a tab and a request in base64, and room for the exec's stderr.
COLLECT_LIMIT = MAX_PER_POLL * (64 + 4 * (MAX_REQUEST_BYTES + 3) // 3 + 8) + 4096

# Made 0700 for the box user; each queued request printed as "<id>\t<base64>" and set aside.
COLLECT = r"""
d=$1 max=$2 limit=$3
mkdir -p "$d" && chmod 0700 "$d" && cd "$d" || exit 0
n=0
for f in *.req; do
  [ -e "$f" ] || break
  id=${f%.req}
  case $id in *[!0-9a-f]*) rm -f "$f"; continue ;; esac
  mv "$f" "$id.taken" || continue
  printf '%s\t' "$id"; head -c "$limit" "$id.taken" | base64 -w0; echo
  n=$((n + 1)); [ "$n" -ge "$max" ] && break
done
exit 0
"""
ANSWER = r'cat > "$1.tmp" && mv "$1.tmp" "$1"'


class Poller(BoxChannel):
    """One polled box's queue, collected by a thread; requests are handled on the relay's loop."""

    kind = "poll"
    first_wait = POLL_INTERVAL
    longest_wait = IDLE_INTERVAL

    def __init__(self, registration: dict[str, Any], handle: Handler, loop: asyncio.AbstractEventLoop,
                 provider_factory: Callable[[dict[str, Any]], Any]):
        super().__init__(registration, handle, loop)
        self.provider_factory = provider_factory
        self.provider: Any = None
        self.exec_lock = threading.Lock()  # one toolbox call at a time per box

    def attempt(self) -> bool:
        self.provider = self.provider or self.provider_factory(self.registration)
        # The state first: a paused (boxd: suspended) box would be woken by the exec, and kept awake.
        facts = self.provider.find(self.registration["name"])
        if facts is None or facts.id != self.registration["id"] or facts.state != "running":
            return False
        self._collect(self.provider)
        return True

    def _collect(self, provider: Any) -> None:
        with self.exec_lock:
            run = provider.exec(self.registration["name"],
                                ["sh", "-c", COLLECT, "sh", QUEUE_DIR, str(MAX_PER_POLL), str(MAX_REQUEST_BYTES + 1)],
                                limit=COLLECT_LIMIT, what=f"relay queue ({QUEUE_DIR})")
        run.check("collecting the relay queue", self.registration["name"])
        # The listing comes from the box: what the box-side script promised is checked again here.
        for row in run.stdout.decode("ascii", "replace").splitlines()[:MAX_PER_POLL]:
            request_id, _tab, encoded = row.partition("\t")
            if not REQUEST_ID.fullmatch(request_id) or len(encoded) > 4 * (MAX_REQUEST_BYTES + 3) // 3 + 4:
                LOG.warning("box %s listed a malformed queue entry; ignored", self.registration["name"])
                continue
            try:
                line = base64.b64decode(encoded, validate=True)
            except ValueError:
                line = b"\x00"  # answered as malformed
            asyncio.run_coroutine_threadsafe(self._request(provider, request_id, line), self.loop)

    async def _request(self, provider: Any, request_id: str, line: bytes) -> None:
        answers: list[str] = []
        never: asyncio.Future = self.loop.create_future()  # no hang-up signal on a queue

        async def send(message: dict[str, Any]) -> None:
            answers.append(json.dumps(message))
            data = ("\n".join(answers) + "\n").encode("utf-8")
            target = f"{QUEUE_DIR}/{request_id}.out"

            def write() -> None:
                with self.exec_lock:
                    provider.exec(self.registration["name"], ["sh", "-c", ANSWER, "sh", target], stdin=data)

            await asyncio.to_thread(write)

        async def hangup() -> Any:
            return await never

        try:
            await self.handle(self.registration, line, send, hangup)
        except Exception:
            LOG.exception("request from box %s failed", self.registration["name"])
            await send({"type": "error", "rc": 1, "message": "the relay failed on this request; see relay.log"})
