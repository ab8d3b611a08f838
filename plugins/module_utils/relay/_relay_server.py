# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The relay daemon: one asyncio loop serving every box's socket, the approvals, the control socket.

A request arrives on the socket of one box (sock/<id>/relay.sock): that socket is the box's
identity, so nothing the box sends can name another box. The server reads one bounded line,
rate-limits per box, checks the request (_relay_protocol), looks the box up on its engine (its id
label must match), asks the user when the policy says so, runs the operation in a worker thread
(_relay_ops, one at a time per box) and writes the answer back. Every request ends as one line of
audit.jsonl. A bad request gets an error answer; the loop never stops for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from ..core._provider import ProviderError
from ..egress._egress_gateway import Gateway, raise_descriptor_limit
from . import _relay_files, _relay_idle, _relay_ops, _relay_policy, _relay_state
from ._relay_poll import Poller
from ._relay_protocol import (
    BUNDLE_GRACE,
    BUNDLE_MIN_RATE,
    MAX_APPROVAL_TIMEOUT,
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_RECEPTIONS,
    MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
    RateLimiter,
    Request,
    RequestError,
    approval_reason,
    bundle_behind_at,
    bundle_header,
    encode,
    parse_request,
)
from ._relay_tunnel import Tunnel

LOG = logging.getLogger("agentbox-relay")
READ_TIMEOUT = 30.0  # a box that connects must send its request within this
BUNDLE_WAIT = 300.0  # a box asked for a push's bundle makes it within this (git bundle create of a big push)
RESCAN_INTERVAL = 2.0  # registrations made while the relay could not be told
MAX_CONNECTIONS_PER_BOX = 8
FACTS_TTL = 60.0
IDLE_EXIT = 600.0  # a relay with no box registered this long ends itself
PRUNE_EVERY = 30  # rescans between two checks for removed boxes (about a minute)


@dataclasses.dataclass
class Pending:
    """A request waiting for the user."""

    id: str
    box: str
    box_id: str
    request: Request
    reason: str
    asked: float
    deadline: float
    decision: asyncio.Future
    expires_at: float = 0.0  # wall clock: what a restart keeps
    attached: bool = True  # a box waits on it now; False for one restored after a relay restart

    def line(self) -> str:
        return f"{self.id} {self.box} {self.request.operation} {self.request.describe()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "box": self.box,
            "operation": self.request.operation,
            "arguments": self.request.args,
            "reason": self.reason,
            "waiting_seconds": round(time.monotonic() - self.asked, 1),
            "expires_in_seconds": round(self.deadline - time.monotonic(), 1),
            "line": self.line(),
        }

    def record(self) -> dict[str, Any]:
        """What pending.json keeps of it, for the next relay."""
        return {"id": self.id, "box": self.box, "box_id": self.box_id, "operation": self.request.operation,
                "arguments": self.request.args, "reason": self.reason, "expires_at": self.expires_at,
                "decision": self.decision.result() if self.decision.done() else None}

    @classmethod
    def restored(cls, row: dict[str, Any], loop: asyncio.AbstractEventLoop) -> Pending | None:
        """A pending.json row as a Pending no box waits on yet; None when expired or not understood
        (the request is checked again as if the box had sent it)."""
        try:
            left = float(row["expires_at"]) - time.time()
            if left <= 0:
                return None
            request = parse_request(encode({"v": PROTOCOL_VERSION, "op": row["operation"], "args": row["arguments"],
                                            "timeout": min(left, MAX_APPROVAL_TIMEOUT)}))
            now = time.monotonic()
            made = cls(id=str(row["id"]), box=str(row["box"]), box_id=str(row["box_id"]), request=request,
                       reason=str(row["reason"]), asked=now, deadline=now + left, decision=loop.create_future(),
                       expires_at=float(row["expires_at"]), attached=False)
        except (KeyError, TypeError, ValueError):
            return None
        if row.get("decision") in ("approved", "denied"):
            made.decision.set_result(row["decision"])
        return made


Send = Callable[[dict[str, Any]], Awaitable[None]]
Hangup = Callable[[], Awaitable[Any]]


class BundleGate:
    """The bounds all boxes' socket bundles share (docs/relay.md, "Bundles over the socket"): at most `slots`
    at once and one per box, each sent at `rate` bytes per second or more once `grace` seconds have passed
    (bundle_behind_at). Used on the loop only, so never locked.

    AGENTBOX_RELAY_BUNDLE_GRACE (seconds) and AGENTBOX_RELAY_BUNDLE_SLOTS in the relay's environment
    at its start replace BUNDLE_GRACE and MAX_BUNDLE_RECEPTIONS: for tests, which shrink them."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.grace = _positive(environ, "AGENTBOX_RELAY_BUNDLE_GRACE", BUNDLE_GRACE)
        self.slots = int(_positive(environ, "AGENTBOX_RELAY_BUNDLE_SLOTS", MAX_BUNDLE_RECEPTIONS, whole=True))
        self.rate = float(BUNDLE_MIN_RATE)
        self.holders: set[str] = set()  # ids of the boxes receiving now: one slot each

    @property
    def busy(self) -> int:
        return len(self.holders)

    @contextlib.contextmanager
    def slot(self, box_id: str) -> Iterator[None]:
        """One reception for box `box_id`; refused at once when the box holds one already (fairness: a box
        never takes a second slot from the others) or all slots are taken: waiting would hold the box's lock
        and a worker thread, the very things the bound keeps free, and the box has made nothing yet."""
        if box_id in self.holders:
            raise RequestError("this box is sending the host another push's bundle now (one at a time per box): "
                               "nothing was sent; run the same command again once that push ends")
        if self.busy >= self.slots:
            raise RequestError(f"the host is receiving {self.busy} other push(es) from boxes now (at most "
                               f"{self.slots} at once): nothing was sent; run the same command again in a minute")
        self.holders.add(box_id)
        try:
            yield
        finally:
            self.holders.discard(box_id)


def _positive(environ: Mapping[str, str], name: str, default: float, whole: bool = False) -> float:
    """A setting from the environment; the default, with a warning, when it is no positive number."""
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        value = 0
    if not 0 < value < float("inf"):
        LOG.warning("%s=%r is not a positive %s: using %g", name, raw, "whole number" if whole else "number", default)
        return default
    return value


class SocketBundles:
    """A push's new commits sent by the box on its own connection (no docker exec): the host says
    which commits it wants in a "bundle" message, the box answers with a header line
    {"tip", "size"} and `size` bytes of git bundle. The bytes are the box's to forge: at most
    MAX_BUNDLE_BYTES, streamed to the file the caller names (never held in memory), each read under
    a timeout and all of them by a deadline set by the size; at most gate.slots boxes at once. What
    they hold is checked by _ship like any bundle from a box. Called from the operation's worker
    thread; the reads run on the loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop,
                 gate: BundleGate, box_id: str):
        self.reader = reader
        self.writer = writer
        self.loop = loop
        self.gate = gate
        self.box_id = box_id

    def __call__(self, path: str, ref: str, base: str, have: str, destination: str) -> tuple[str, bool]:
        return asyncio.run_coroutine_threadsafe(self._receive(path, ref, base, have, destination), self.loop).result()

    async def _receive(self, path: str, ref: str, base: str, have: str, destination: str) -> tuple[str, bool]:
        with self.gate.slot(self.box_id):  # taken before the box is asked: a refused box makes no bundle
            return await self._receive_held(path, ref, base, have, destination)

    async def _receive_held(self, path: str, ref: str, base: str, have: str, destination: str) -> tuple[str, bool]:
        await self._send(encode({"type": "bundle", "path": path, "ref": ref, "base": base, "have": have,
                                 "limit": MAX_BUNDLE_BYTES}))
        try:
            line = await asyncio.wait_for(self.reader.readline(), BUNDLE_WAIT)
        except ValueError as exc:  # longer than the stream's limit
            raise RequestError(f"the box's bundle header is over {MAX_REQUEST_BYTES} bytes: refused") from exc
        except TimeoutError as exc:
            raise RequestError(f"the box sent no bundle within {BUNDLE_WAIT:.0f} s") from exc
        if not line:
            raise RequestError("the box closed its connection instead of sending the bundle")
        header = bundle_header(line)
        if header.get("missing"):
            raise ProviderError(f"the box's repo at {path} has no branch {ref.removeprefix('refs/heads/')} any more",
                                operation="fetch")
        size = header["size"]
        if size:
            with open(destination, "xb") as handle:  # a new file in the caller's private directory
                await self._take_in(size, handle)
        return header["tip"], bool(size)

    async def _take_in(self, size: int, handle: Any) -> None:
        """`size` bytes of bundle into `handle`, each read under READ_TIMEOUT, and never below the gate's rate
        once its grace has passed (bundle_behind_at): the first bound reached cuts the reception."""
        gate, left = self.gate, size
        started = self.loop.time()
        while left:
            behind = started + bundle_behind_at(size - left, gate.grace, gate.rate) - self.loop.time()
            try:
                chunk = await asyncio.wait_for(self.reader.read(min(left, 1 << 20)), max(min(READ_TIMEOUT, behind), 0))
            except TimeoutError as exc:
                if behind > READ_TIMEOUT:  # a pause, not the rate, ended it
                    raise RequestError(f"the box stopped sending its bundle for {READ_TIMEOUT:.0f} s") from exc
                came, took = size - left, self.loop.time() - started
                LOG.warning("box %s: a bundle of %d bytes cut after %.0f s, %d bytes short (below the rate)",
                            self.box_id, size, took, left)
                raise RequestError(
                    f"the box's bundle of {size} bytes came slower than the {gate.rate / (1 << 20):g} MiB/s the host "
                    f"requires after {gate.grace:g} s ({came} bytes in {took:.0f} s): cut, nothing fetched") from exc
            if not chunk:
                raise RequestError(f"the box's bundle ended {left} bytes short of the size it gave")
            handle.write(chunk)
            left -= len(chunk)

    async def _send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()


class Relay:
    def __init__(self) -> None:
        self.registrations: dict[str, dict[str, Any]] = {}
        self.servers: dict[str, asyncio.base_events.Server] = {}
        self.pending: dict[str, Pending] = {}
        self.limiter = RateLimiter()
        self.bundle_gate = BundleGate(os.environ)  # read once, at the relay's start
        self.box_locks: dict[str, asyncio.Lock] = {}
        self.connections: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}  # box id -> requests being handled (the idle policy keeps those boxes)
        self.tunnels: dict[str, Tunnel | Poller] = {}  # channels of docker_ssh and Daytona boxes
        self.gateway = Gateway(os.environ)  # the egress gateway's socket per box (docs/egress.md)
        self.facts: dict[str, tuple[float, Any]] = {}  # box id -> (when looked up, BoxFacts)
        self.stopping = asyncio.Event()
        self.policy_problems: list[str] = []  # what was last logged of the policy file
        self.started = time.time()
        self.idle_since = time.monotonic()

    # -- boxes' sockets ---------------------------------------------------------------------------
    async def sync(self) -> None:
        """Serve every registered box; close the sockets of boxes no longer registered."""
        self.registrations = await asyncio.to_thread(_relay_state.registered_boxes)
        for box_id in list(self.servers):
            if box_id not in self.registrations:
                server = self.servers.pop(box_id)
                server.close()
                self.facts.pop(box_id, None)
                LOG.info("box %s forgotten: its socket is closed", box_id)
        for box_id in list(self.tunnels):
            if box_id not in self.registrations:
                self.tunnels.pop(box_id).stop()
                self.facts.pop(box_id, None)
        for box_id, registration in self.registrations.items():
            kind = _relay_state.channel_of(registration)
            if kind in ("tunnel", "poll") and box_id not in self.tunnels:
                loop = asyncio.get_running_loop()
                if kind == "tunnel":
                    channel: Tunnel | Poller = Tunnel(registration, self.handle, loop)
                else:
                    channel = Poller(registration, self.handle, loop, _relay_ops.provider_of)
                self.tunnels[box_id] = channel
                channel.start()
            if box_id in self.servers or kind != "socket":
                continue
            await self._listen(box_id)
        await self.gateway.sync(self.registrations)

    async def _listen(self, box_id: str) -> None:
        """Serve the box's socket. What stands at its name (a previous relay's socket, or whatever the box
        put there) is replaced without following it (_relay_state.bind_box_socket); a box whose socket
        cannot be made is logged and tried again at the next rescan, and no other box waits for it."""
        path = _relay_state.box_socket(box_id)
        try:
            listener = await asyncio.to_thread(_relay_state.bind_box_socket, box_id)
        except (OSError, _relay_state.RelayError) as exc:
            LOG.error("cannot listen on %s: %s", path, exc)
            return
        try:
            server = await asyncio.start_unix_server(
                lambda reader, writer: self.serve_box(box_id, reader, writer), sock=listener,
                limit=MAX_REQUEST_BYTES + 1,
            )
        except OSError as exc:
            listener.close()
            LOG.error("cannot listen on %s: %s", path, exc)
            return
        self.servers[box_id] = server
        LOG.info("serving box %s (%s) on %s", self.registrations[box_id]["name"], box_id, path)

    async def serve_box(self, box_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        registration = self.registrations.get(box_id)
        try:
            if registration is None:
                await self._send(writer, _error("this box is not registered with the relay any more", rc=1))
                return
            if self.connections.get(box_id, 0) >= MAX_CONNECTIONS_PER_BOX:
                await self._send(writer, _error(f"more than {MAX_CONNECTIONS_PER_BOX} requests at once from this box"))
                return
            self.connections[box_id] = self.connections.get(box_id, 0) + 1
            try:
                await self._serve_one(registration, reader, writer)
            finally:
                self.connections[box_id] -= 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            LOG.exception("request from box %s failed", box_id)
            with contextlib.suppress(Exception):
                await self._send(writer, _error("the relay failed on this request; see relay.log on the host"))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_one(
        self, registration: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        entry: dict[str, Any] = {"box": registration["name"], "box_id": registration["id"],
                                 "provider": registration["provider"]}

        async def send(message: dict[str, Any]) -> None:
            await self._send(writer, message)

        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
        except ValueError:  # the line is longer than the stream's limit
            self._audit(entry, "rejected", {"error": f"request over {MAX_REQUEST_BYTES} bytes"})
            await send(_error(f"request over {MAX_REQUEST_BYTES} bytes: refused"))
            return
        except TimeoutError:
            await send(_error(f"no request within {READ_TIMEOUT:.0f} s"))
            return
        bundles = SocketBundles(reader, writer, asyncio.get_running_loop(), self.bundle_gate, registration["id"])
        await self.handle(registration, line, send, lambda: reader.read(1), bundles)

    async def handle(
        self, registration: dict[str, Any], line: bytes, send: Send, hangup: Hangup, bundles: SocketBundles | None = None
    ) -> None:
        """One request line from a box, whatever carried it; `hangup` completes when the box leaves.
        `bundles`: the box's own socket, which can carry a push's bundle (tunnels and polls cannot)."""
        box_id = registration["id"]
        self.in_flight[box_id] = self.in_flight.get(box_id, 0) + 1
        try:
            await self._handle(registration, line, send, hangup, bundles)
        finally:
            self.in_flight[box_id] -= 1
            if not self.in_flight[box_id]:
                del self.in_flight[box_id]

    def busy(self) -> set[str]:
        """Box ids with a request in flight: the idle policy never pauses them (docs/idle.md)."""
        return {box_id for box_id, count in self.in_flight.items() if count}

    async def _handle(
        self, registration: dict[str, Any], line: bytes, send: Send, hangup: Hangup, bundles: SocketBundles | None
    ) -> None:
        box, box_id = registration["name"], registration["id"]
        entry: dict[str, Any] = {"box": box, "box_id": box_id, "provider": registration["provider"]}
        if not line.strip():
            return
        if len(line) > MAX_REQUEST_BYTES:
            self._audit(entry, "rejected", {"error": f"request over {MAX_REQUEST_BYTES} bytes"})
            await send(_error(f"request over {MAX_REQUEST_BYTES} bytes: refused"))
            return
        if not self.limiter.allow(box_id):
            self._audit(entry, "rejected", {"error": "rate limit"})
            await send(_error("too many requests from this box: wait a minute and try again"))
            return
        try:
            request = parse_request(line.rstrip(b"\n"))
        except RequestError as exc:
            self._audit(entry, "rejected", {"error": str(exc)})
            await send(_error(str(exc), rc=2))
            return
        entry.update(operation=request.operation, arguments=request.args)
        try:
            provider, facts = await self._box(registration)
        except Exception as exc:  # noqa: BLE001 - the engine's answer, whatever it is, goes back to the box
            self._audit(entry, "rejected", {"error": str(exc)})
            await send(_error(str(exc)))
            return
        try:
            decision = "allowed"
            lock = self.box_locks.setdefault(box_id, asyncio.Lock())
            staged: Any = None
            if request.operation in STAGED:
                # The request's first half, before the policy decides: a push's commits into the host repository
                # (its own branch only), so the policy sees what it carries (CI configuration) before anything
                # reaches the remote; a copy's host path checked (where, and what the user must approve).
                async with lock:
                    staged = await asyncio.to_thread(STAGED[request.operation], self, provider, facts, request,
                                                     bundles if request.bundles else None)
            if isinstance(staged, _relay_ops.Outcome):
                self._audit(entry, decision, staged.summary())
                await send({"type": "result", "rc": staged.rc, "stdout": staged.stdout, "stderr": staged.stderr,
                            "data": staged.data})
                return
            reason = staged.approval(request, facts.branch) if staged else approval_reason(request, facts.branch)
            if reason:
                entry["reason"] = reason
                decision = await self._ask_user(registration, request, reason, send, hangup, entry)
                if decision != "approved":
                    message = {"denied": "denied on the host", "timeout": "no answer on the host in time: denied",
                               "abandoned": "the box stopped waiting",
                               "relay-stopped": "the relay on the host stopped; the request stays pending there: "
                                                "run the same command again once the relay is back (an answer given "
                                                "meanwhile applies then)"}[decision]
                    self._audit(entry, decision, {"rc": 1})
                    await send(_error(message, rc=1))
                    return
                if staged is None or staged.wakes_box:  # a staged push needs nothing more of the box
                    # The answer may have come hours later: a box paused or stopped meanwhile runs again first.
                    facts = await asyncio.to_thread(_relay_ops.wake, provider, facts)
            started = time.monotonic()
            channel = bundles if request.bundles else None
            async with lock:
                if staged is not None:
                    outcome = await asyncio.to_thread(staged.run, provider, facts, request, channel,
                                                      decision == "approved")
                else:
                    outcome = await asyncio.to_thread(_relay_ops.carry_out, provider, facts, request, channel)
            entry["seconds"] = round(time.monotonic() - started, 3)
            self._audit(entry, decision, outcome.summary())
            if request.operation == "open":
                LOG.info("box %s asks to open %s", box, request.args["url"])
            await send({"type": "result", "rc": outcome.rc, "stdout": outcome.stdout, "stderr": outcome.stderr,
                        "data": outcome.data})
            if outcome.after is not None:
                async with lock:
                    later = await asyncio.to_thread(outcome.after)
                self._audit({**entry, "phase": "after the answer"}, decision, later.summary())
        finally:
            await asyncio.to_thread(provider.close)

    def ci_patterns(self) -> tuple[str, ...]:
        """The CI configuration paths of the policy file (_relay_policy), read for each push; a problem in the
        file is logged once (its defaults apply)."""
        policy = _relay_policy.load()
        if policy["problems"] != self.policy_problems:
            for problem in policy["problems"]:
                LOG.warning("relay policy file %s: %s (the default applies there)", _relay_policy.policy_path(), problem)
            self.policy_problems = policy["problems"]
        return policy["ci_paths"]

    async def _box(self, registration: dict[str, Any]) -> tuple[Any, Any]:
        """The box's provider and facts. The facts (workspace, branch, labels) never change for a box
        id, and only that box has its socket bound: they are looked up on the engine once per
        FACTS_TTL, not per request (a busy engine answers in hundreds of milliseconds)."""
        box_id = registration["id"]
        cached = self.facts.get(box_id)
        if cached is not None and time.monotonic() - cached[0] < FACTS_TTL:
            return _relay_ops.provider_of(registration), cached[1]
        provider, facts = await asyncio.to_thread(_relay_ops.box_of, registration)
        self.facts[box_id] = (time.monotonic(), facts)
        return provider, facts

    async def _ask_user(
        self,
        registration: dict[str, Any],
        request: Request,
        reason: str,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        hangup: Callable[[], Awaitable[Any]],
        entry: dict[str, Any],
    ) -> str:
        """Park the request until the user answers, the timeout passes or the box hangs up."""
        loop = asyncio.get_running_loop()
        pending = self._restored_match(registration["id"], request)
        if pending is None:
            approval_id = secrets.token_hex(3)
            while approval_id in self.pending:
                approval_id = secrets.token_hex(3)
            now = time.monotonic()
            pending = Pending(
                id=approval_id, box=registration["name"], box_id=registration["id"], request=request, reason=reason,
                asked=now, deadline=now + request.timeout, decision=loop.create_future(),
                expires_at=time.time() + request.timeout,
            )
            self.pending[approval_id] = pending
        pending.attached = True
        approval_id = pending.id
        entry["approval"] = approval_id
        self.persist_pending()
        try:
            if pending.decision.done():  # answered while the relay restarted and the box was away
                return pending.decision.result()
            timeout = max(0.0, pending.deadline - time.monotonic())
            LOG.info("waiting for approval %s: %s (%s)", approval_id, pending.line(), reason)
            await send({"type": "waiting", "approval": approval_id, "reason": reason, "timeout": round(timeout)})
            left = asyncio.ensure_future(hangup())
            try:
                done, _pending = await asyncio.wait({pending.decision, left}, timeout=timeout,
                                                    return_when=asyncio.FIRST_COMPLETED)
            finally:
                left.cancel()
            if pending.decision in done:
                return pending.decision.result()
            return "abandoned" if left in done else "timeout"
        finally:
            if not self.stopping.is_set():  # a stopping relay leaves it in pending.json for the next one
                self.pending.pop(approval_id, None)
                self.persist_pending()

    def _restored_match(self, box_id: str, request: Request) -> Pending | None:
        """The oldest request restored after a restart that this box sends again, the same one."""
        same = [p for p in self.pending.values() if not p.attached and p.box_id == box_id
                and p.request.operation == request.operation and p.request.args == request.args]
        return min(same, key=lambda p: p.asked) if same else None

    def restore_pending(self) -> None:
        """Requests still waiting when the previous relay stopped: listed again until their deadline, an
        answer kept until the box sends the same request again."""
        loop = asyncio.get_running_loop()
        for row in _relay_state.load_pending():
            pending = Pending.restored(row, loop)
            if pending is not None and pending.id not in self.pending:
                self.pending[pending.id] = pending
        if self.pending:
            LOG.info("%d request(s) still pending from before the restart", len(self.pending))
        self.persist_pending()

    def expire_pending(self) -> None:
        """Restored requests no box came back for by their deadline: denied, as a waiting one would be."""
        now = time.monotonic()
        expired = [p for p in self.pending.values() if not p.attached and p.deadline <= now]
        for pending in expired:
            del self.pending[pending.id]
            self._audit({"box": pending.box, "box_id": pending.box_id, "operation": pending.request.operation,
                         "arguments": pending.request.args, "approval": pending.id}, "timeout",
                        {"rc": 1, "output": "restored after a relay restart; the box did not ask again in time"})
        if expired:
            self.persist_pending()

    def persist_pending(self) -> None:
        try:
            _relay_state.save_pending([p.record() for p in self.pending.values()
                                       if not p.attached or not p.decision.done()])
        except OSError:
            LOG.exception("cannot write pending.json: pending requests will not survive a restart")

    def answer(self, approval_id: str, approve: bool) -> dict[str, Any]:
        pending = self.pending.get(approval_id)
        if pending is None or pending.decision.done():
            waiting = ", ".join(sorted(self.pending)) or "none"
            raise RequestError(f"no pending request {approval_id!r} (pending: {waiting})")
        pending.decision.set_result("approved" if approve else "denied")
        if not pending.attached:
            self.persist_pending()  # kept, answered, until the box sends that request again
        return pending.to_dict()

    # -- the control socket (the host user only) --------------------------------------------------
    async def serve_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
            command = json.loads(line)
            answer = await self._control(command)
        except Exception as exc:  # noqa: BLE001 - answer every control request
            answer = {"ok": False, "error": str(exc)}
        with contextlib.suppress(Exception):
            await self._send(writer, answer)
        writer.close()

    async def _control(self, command: dict[str, Any]) -> dict[str, Any]:
        name = command.get("cmd")
        if name == "status":
            return {"ok": True, "pid": os.getpid(), "started": self.started, "boxes": len(self.servers),
                    "pending": len(self.pending), "gateway": sorted(self.gateway.boxes)}  # doctor.yml compares it
        if name == "list":
            self.expire_pending()
            waiting = [p for p in self.pending.values() if not p.decision.done()]
            return {"ok": True, "pending": [p.to_dict() for p in sorted(waiting, key=lambda p: p.asked)]}
        if name in ("approve", "deny"):
            return {"ok": True, "answered": self.answer(str(command.get("id", "")), name == "approve")}
        if name == "reload":
            await self.sync()
            channel = self.tunnels.get(str(command.get("box", "")))
            if channel is not None:
                channel.kick()
            return {"ok": True, "boxes": sorted(self.servers)}
        if name == "stop":
            self.stopping.set()
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {name!r}"}

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        writer.write(encode(message))
        await writer.drain()

    @staticmethod
    def _audit(entry: dict[str, Any], decision: str, result: dict[str, Any]) -> None:
        try:
            _relay_state.audit({**entry, "decision": decision, "result": result})
        except OSError:
            LOG.exception("cannot write the audit log")

    def should_exit(self) -> str | None:
        """Why the relay should end by itself: its directory is gone (a temporary HOME removed), or it
        has served no box for IDLE_EXIT seconds (the next create starts it again)."""
        if not os.path.isdir(_relay_state.relay_home()):
            return f"{_relay_state.relay_home()} is gone"
        if self.registrations or self.pending:
            self.idle_since = time.monotonic()
        elif time.monotonic() - self.idle_since > IDLE_EXIT:
            return f"no box registered for {IDLE_EXIT:.0f} s"
        return None

    async def rescan_forever(self) -> None:
        rounds = 0
        while not self.stopping.is_set():
            reason = self.should_exit()
            if reason:
                LOG.info("stopping: %s", reason)
                self.stopping.set()
                break
            if rounds % PRUNE_EVERY == 0:
                try:
                    await asyncio.to_thread(prune_registrations, self.registrations)
                except Exception:  # an engine that does not answer now is asked again later
                    LOG.exception("pruning the registrations of removed boxes failed")
            rounds += 1
            self.expire_pending()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), RESCAN_INTERVAL)
            if not self.stopping.is_set():
                try:
                    await self.sync()
                except Exception:  # a failed rescan is retried at the next interval
                    LOG.exception("rescan of the registrations failed")


def prune_registrations(registrations: dict[str, dict[str, Any]]) -> list[str]:
    """Forget socket boxes (this machine's engine) removed without destroy_box (docker rm, another HOME):
    one listing per engine they live on.

    A registration younger than REGISTRATION_GRACE may belong to a create in progress; it stays.
    """
    local = {box_id: r for box_id, r in registrations.items() if _relay_state.channel_of(r) == "socket"}
    old = {box_id for box_id, r in local.items()
           if time.time() - float(r.get("registered_at", 0)) > _relay_state.REGISTRATION_GRACE}
    by_engine: dict[str, dict[str, Any]] = {}
    for box_id in old:
        registration = local[box_id]
        key = json.dumps([registration.get("provider"), registration.get("engine"), registration.get("options")],
                         sort_keys=True)  # fmt: skip
        by_engine.setdefault(key, registration)
    alive: set[str] = set()
    for registration in by_engine.values():
        provider = _relay_ops.provider_of(registration)
        try:
            alive |= {facts.id for facts in provider.list_boxes()}
        finally:
            provider.close()
    gone = sorted(old - alive)
    for box_id in gone:
        LOG.info("box %s (%s) no longer exists: forgetting it", local[box_id]["name"], box_id)
        problem = _relay_state.forget_box(box_id)
        if problem:
            LOG.warning("%s", problem)
    return gone


def _error(message: str, rc: int = 1) -> dict[str, Any]:
    return {"type": "error", "rc": rc, "message": message}


async def serve() -> int:
    """Run until stopped (control 'stop', SIGTERM, SIGINT). Returns 0, or 0 at once if one runs."""
    _relay_state.ensure_home()
    lock = os.open(_relay_state.path("relay.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        LOG.info("another relay already runs (see relay.pid): nothing to do")
        os.close(lock)
        return 0
    raise_descriptor_limit()  # the egress gateway holds two descriptors per box connection
    relay = Relay()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, relay.stopping.set)
    control_path = _relay_state.path("control.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(control_path)
    old_umask = os.umask(0o177)
    try:
        control = await asyncio.start_unix_server(relay.serve_control, path=control_path)
    finally:
        os.umask(old_umask)
    relay.restore_pending()
    await relay.sync()
    with open(_relay_state.path("relay.pid"), "w", encoding="utf-8") as handle:
        handle.write(f"{os.getpid()}\n")
    LOG.info("relay %d serving %d box(es)", os.getpid(), len(relay.servers))
    rescan = asyncio.ensure_future(relay.rescan_forever())
    idle_policy = asyncio.ensure_future(_relay_idle.run_forever(relay))  # docs/idle.md
    try:
        await relay.stopping.wait()
    finally:
        rescan.cancel()
        idle_policy.cancel()
        control.close()
        for server in relay.servers.values():
            server.close()
        relay.gateway.close()
        for tunnel in relay.tunnels.values():
            tunnel.stop()
        relay.persist_pending()  # before the waiting boxes are told: the next relay lists them again
        for pending in relay.pending.values():
            if not pending.decision.done():
                pending.decision.set_result("relay-stopped")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(control_path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_relay_state.path("relay.pid"))
        LOG.info("relay %d stopped", os.getpid())
        os.close(lock)
    return 0


def _stage_push(relay: Relay, provider: Any, facts: Any, request: Any, bundles: Any) -> Any:
    return _relay_ops.stage(provider, facts, request, bundles, relay.ci_patterns())


def _stage_copy(relay: Relay, provider: Any, facts: Any, request: Any, bundles: Any) -> Any:
    return _relay_files.stage(facts, request)


# Requests with a first half done before the policy decides; what they stage says why the user must approve
# (`approval`), whether the box must run again after a late answer (`wakes_box`), and does the rest (`run`).
STAGED: dict[str, Callable[..., Any]] = {"git.push": _stage_push, "file.cp": _stage_copy}
