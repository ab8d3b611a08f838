# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The egress gateway (docs/egress.md): an HTTP proxy per box, run on the relay's asyncio loop.

Each box registered on this machine's engine gets a socket, sock/<id>/gateway.sock, next to its relay
socket in the directory already bound into the box (/run/agentbox/relay/): the socket a connection
came in on is the box, nothing it sends can name another box. A connection carries one request:
`CONNECT host:port` (a tunnel, TLS inside) or a plain-HTTP request in absolute form
(`GET http://host/path`), sent on with `Connection: close`. The box's policy (_egress_policy, recorded
by the host in the box's registration) decides; a name is resolved on the host and a non-public address
is refused unless the user named that host in egress_allow, and the gateway connects to the address it
checked (no second lookup a name's owner could answer differently). A refusal is an HTTP 403 whose
reason phrase and body name the host and the setting to change. Every connection ends as one line of
~/.agentbox/gateway/audit.jsonl. A request in origin form to an API prefix (/anthropic/..., /openai/...:
the agent's base URL in the box) goes on to that API with the credential the host keeps for the box
(_egress_credentials) in place of the box's placeholder.

Bounds: a request head of at most 64 KiB within 30 s; at most `box_connections` connections per box
at once, the rest wait in that box's own listen queue (in the kernel, no descriptor of the host's
taken), so a box that floods the gateway slows only itself; bytes are streamed 64 KiB at a time with
backpressure, never a whole body in memory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import ipaddress
import logging
import os
import resource
import socket
import ssl
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..core._host_files import ensure_private_dir
from ..relay import _relay_state
from ._egress_credentials import APIS, forget, read_credential, upstream
from ._egress_forwarder import PORT as FORWARDER_PORT
from ._egress_policy import Decision, EgressError, EgressPolicy, denial_message, request_host

LOG = logging.getLogger("agentbox-relay")
SOCKET_NAME = "gateway.sock"  # in sock/<id>/, seen in the box as /run/agentbox/relay/gateway.sock
MAX_HEAD = 64 * 1024
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
IDLE_TIMEOUT = 900.0  # a connection on which nothing moved either way this long is closed
CHUNK = 64 * 1024
BOX_CONNECTIONS = 64
BOX_LOOKUPS = 4  # name lookups of one box at once
RESOLVER_THREADS = 16
LOOKUP_TIMEOUT = 10.0
# Headers that belong to one hop (RFC 9110 7.6.1) and the proxy's own: never sent on.
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate",
                         "te", "trailer", "upgrade"})


class HeadError(ValueError):
    """A request the gateway cannot read: answered with `status` and the message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Head:
    method: str
    host: str  # normalized (request_host)
    port: int
    target: str  # origin form for a plain request ("/path?q"); "" for CONNECT
    version: str
    headers: list[tuple[str, str]]
    api: str = ""  # an origin-form request to the in-box API endpoint (APIS): the host adds the credential


def gateway_home() -> str:
    return os.path.join(os.path.expanduser("~"), ".agentbox", "gateway")


def audit_path() -> str:
    return os.path.join(gateway_home(), "audit.jsonl")


def audit(entry: dict[str, Any]) -> None:
    """One line of audit.jsonl (0600, in a 0700 directory)."""
    ensure_private_dir(gateway_home())
    _relay_state.append_line(audit_path(), entry)


RECORDED = "recorded"  # set on an entry once its line is written; never part of the line


def record(entry: dict[str, Any]) -> None:
    """The connection's line, once: one short append on the loop as the relay's own (no thread a flood could
    take); a disk that refuses it is logged, never the connection's failure."""
    try:
        audit({key: value for key, value in entry.items() if key != RECORDED})
    except OSError:
        LOG.exception("egress gateway: cannot write %s", audit_path())
    entry[RECORDED] = True


def read_audit() -> list[dict[str, Any]]:
    return _relay_state.read_lines(audit_path())


def resolve_overrides(text: str | None) -> dict[str, str]:
    """AGENTBOX_GATEWAY_RESOLVE, `name=address[,name=address]` (as curl's --resolve): names the gateway
    sends to the given address instead of asking DNS. The host user's own setting (tests point a
    registry's name at a stand-in on 127.0.0.1), so the address may be private."""
    found: dict[str, str] = {}
    for item in (text or "").replace(" ", ",").split(","):
        if not item:
            continue
        name, _equals, address = item.partition("=")
        host = request_host(name)
        try:
            if host is None:
                raise ValueError(name)
            found[host] = str(ipaddress.ip_address(address.strip()))
        except ValueError:
            LOG.warning("AGENTBOX_GATEWAY_RESOLVE: %r is not name=address: left out", item)
    return found


NAT64 = ipaddress.ip_network("64:ff9b::/96")
# The documentation ranges (RFC 5737, RFC 3849): never a network's own services, and the address a test
# network's transparent proxy answers every name at (this project's CI machine: 203.0.113.80). Python
# counts them as private; the gateway counts them as public, as any host process reaching them does.
DOCUMENTATION = tuple(ipaddress.ip_network(net) for net in
                      ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))


def is_public(text: str) -> bool:
    """A global unicast address, and no IPv6 form of an IPv4 address that is not (mapped, 6to4, NAT64:
    Python calls 64:ff9b::7f00:1 and 2002:7f00:1:: global, they reach 127.0.0.1)."""
    address = ipaddress.ip_address(text.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None and not embedded.is_global:
            return False
    if any(address in net for net in DOCUMENTATION if net.version == address.version):
        return True
    return address.is_global and not address.is_multicast


def raise_descriptor_limit() -> None:
    """Two descriptors per connection: the soft limit up to the hard one (often 1024 of 524288)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def split_host_port(text: str, default_port: int | None) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or (with a default port) a bare host."""
    if text.startswith("["):
        host, _bracket, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _colon, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise HeadError(f"CONNECT {text!r}: give host:port")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise HeadError(f"{text!r}: the port is not a number from 1 to 65535")
    return host, int(port_text)


def parse_head(data: bytes) -> Head:
    """The request line and headers (data ends with the blank line)."""
    try:
        text = data.decode("latin-1")
    except UnicodeDecodeError as exc:  # latin-1 decodes every byte; kept for the type checker
        raise HeadError("the request is not HTTP") from exc
    lines = text.split("\r\n") if "\r\n" in text else text.split("\n")
    words = lines[0].split(" ")
    if len(words) != 3 or not words[2].startswith("HTTP/1.") or not words[0].isalpha():
        raise HeadError(f"the request line {lines[0][:200]!r} is not HTTP/1.x")
    method, target, version = words
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name.strip() != name or any(c in name for c in " \t"):
            raise HeadError(f"the header line {line[:200]!r} is not a header")
        headers.append((name, value.strip()))
    if method.upper() != "CONNECT" and target.lower().startswith(tuple(
            f"http://{name}:{FORWARDER_PORT}/" for name in ("127.0.0.1", "localhost"))):
        target = "/" + target.split("/", 3)[3]  # a client that sent its base URL through the proxy variables too
    if method.upper() != "CONNECT" and target.startswith("/"):
        for api, spec in APIS.items():
            if target == spec["prefix"] or target.startswith((spec["prefix"] + "/", spec["prefix"] + "?")):
                return Head(method.upper(), "", 0, target[len(spec["prefix"]):] or "/", version, headers, api=api)
        raise HeadError(f"{method} {target[:200]!r}: the gateway's API endpoints are "
                        f"{', '.join(spec['prefix'] for spec in APIS.values())}; anything else goes through "
                        "HTTP_PROXY as an absolute http:// URL")
    if method.upper() == "CONNECT":
        host, port = split_host_port(target, None)
        path = ""
    else:
        parts = urlsplit(target)
        if parts.scheme.lower() != "http" or not parts.netloc:
            raise HeadError(f"{method} {target[:200]!r}: the gateway takes CONNECT host:port, or an absolute "
                            "http:// URL (set HTTP_PROXY and HTTPS_PROXY to the gateway)")
        if "@" in parts.netloc:
            raise HeadError("a URL with user information is not sent on")
        host, port = split_host_port(parts.netloc, 80)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
    name = request_host(host)
    if name is None:
        raise HeadError(f"{host[:200]!r} is not a host name")
    return Head(method.upper(), name, port, path, version, headers)


def forwarded_head(head: Head) -> bytes:
    """A plain request as the upstream gets it: origin form, one hop's headers dropped, Connection: close.
    Host is the host that was checked, whatever the box wrote there: another name in it would reach
    another site behind the same address (a CDN's)."""
    named = {value.strip().lower() for key, value in head.headers if key.lower() == "connection"
             for value in value.split(",")}  # fmt: skip
    kept = [(key, value) for key, value in head.headers if key.lower() not in HOP_HEADERS | named | {"host"}]
    name = f"[{head.host}]" if ":" in head.host else head.host
    kept.insert(0, ("Host", name if head.port == 80 else f"{name}:{head.port}"))
    lines = [f"{head.method} {head.target} {head.version}", *(f"{k}: {v}" for k, v in kept), "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def api_head(head: Head, host: str, path: str, credential: Mapping[str, Any]) -> bytes:
    """A request to the in-box API endpoint as the API host gets it: what the box sent as its credential
    (the placeholder) dropped, the host's added."""
    named = {value.strip().lower() for key, value in head.headers if key.lower() == "connection"
             for value in value.split(",")}  # fmt: skip
    dropped = HOP_HEADERS | named | {"host", "x-api-key", "authorization", "anthropic-beta"}
    kept = [(key, value) for key, value in head.headers if key.lower() not in dropped]
    betas = [b.strip() for key, value in head.headers if key.lower() == "anthropic-beta" for b in value.split(",")]
    if credential.get("beta") and credential["beta"] not in betas:
        betas.append(str(credential["beta"]))
    if any(betas):
        kept.append(("anthropic-beta", ",".join(b for b in betas if b)))
    kept.insert(0, ("Host", host))
    kept.extend((str(key), str(value)) for key, value in (credential.get("headers") or {}).items())
    lines = [f"{head.method} {path} {head.version}", *(f"{k}: {v}" for k, v in kept), "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def answer(status: int, phrase: str, body: str) -> bytes:
    data = (body + "\n").encode("utf-8")
    head = (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(data)}"
            f"\r\nX-Agentbox-Egress: denied\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + data


PHRASES = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}


@dataclasses.dataclass
class BoxGate:
    """One box's socket: who it is, its policy, its connection slots and its accept loop."""

    box_id: str
    name: str
    policy: EgressPolicy
    listener: socket.socket
    slots: asyncio.Semaphore
    lookups: asyncio.Semaphore  # the box's name lookups at once, on the gateway's own resolver threads
    task: asyncio.Task | None = None
    record: Any = None  # the registration's egress record the policy came from


class Gateway:
    """Every box's gateway socket, on the caller's loop (the relay's)."""

    def __init__(self, environ: Mapping[str, str] | None = None, box_connections: int | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.environ = dict(environ)
        self.overrides = resolve_overrides(environ.get("AGENTBOX_GATEWAY_RESOLVE"))
        given = environ.get("AGENTBOX_GATEWAY_BOX_CONNECTIONS", "")
        self.box_connections = box_connections or (int(given) if given.isdigit() and int(given) > 0 else BOX_CONNECTIONS)
        self.boxes: dict[str, BoxGate] = {}
        self.connections: set[asyncio.Task] = set()
        # Lookups block a thread each: on threads of their own, never the loop's default executor, which the
        # relay's operations use; each box gets BOX_LOOKUPS of them at once.
        self.resolver = concurrent.futures.ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="egress-dns")

    # -- boxes --------------------------------------------------------------------------------------
    async def sync(self, registrations: Mapping[str, Mapping[str, Any]]) -> None:
        """Serve a gateway socket for every box on this machine's engine whose registration records an
        egress policy (made with one); close those of boxes gone; take up a policy the host recorded anew."""
        for box_id in [b for b in self.boxes if "egress" not in registrations.get(b, {})]:
            self.close_box(box_id)
            forget(box_id)  # the box is gone (or holds no policy): its agent's credential goes with it
        for box_id, registration in registrations.items():
            if _relay_state.channel_of(dict(registration)) != "socket" or "egress" not in registration:
                continue
            record = registration.get("egress")
            gate = self.boxes.get(box_id)
            if gate is not None:
                if gate.record != record:
                    gate.policy, gate.record = policy_of(registration), record
                continue
            try:
                listener = await asyncio.to_thread(_relay_state.bind_box_socket, box_id, SOCKET_NAME)
            except (OSError, _relay_state.RelayError) as exc:
                LOG.error("egress gateway: cannot listen for box %s: %s", registration.get("name"), exc)
                continue
            self.serve(box_id, str(registration.get("name", box_id)), policy_of(registration), listener)
            self.boxes[box_id].record = record

    def serve(self, box_id: str, name: str, policy: EgressPolicy, listener: socket.socket) -> BoxGate:
        """Accept the box's connections on `listener` (bound, listening or not)."""
        listener.listen(self.box_connections)
        listener.setblocking(False)
        gate = BoxGate(box_id, name, policy, listener, asyncio.Semaphore(self.box_connections),
                       asyncio.Semaphore(BOX_LOOKUPS))
        gate.task = asyncio.ensure_future(self._accept(gate))
        self.boxes[box_id] = gate
        return gate

    def close_box(self, box_id: str) -> None:
        gate = self.boxes.pop(box_id, None)
        if gate is not None:
            if gate.task is not None:
                gate.task.cancel()
            gate.listener.close()

    def close(self) -> None:
        for box_id in list(self.boxes):
            self.close_box(box_id)
        for task in list(self.connections):
            task.cancel()
        self.resolver.shutdown(wait=False, cancel_futures=True)

    async def _accept(self, gate: BoxGate) -> None:
        """A connection is taken from the box's queue only when one of its slots is free."""
        loop = asyncio.get_running_loop()
        while True:
            await gate.slots.acquire()
            try:
                connection, _address = await loop.sock_accept(gate.listener)
            except OSError as exc:
                gate.slots.release()
                LOG.warning("egress gateway: accept for box %s failed: %s", gate.name, exc)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.ensure_future(self._connection(gate, connection))
            self.connections.add(task)
            task.add_done_callback(self.connections.discard)

    # -- one connection ------------------------------------------------------------------------------
    async def _connection(self, gate: BoxGate, connection: socket.socket) -> None:
        entry: dict[str, Any] = {"box": gate.name, "box_id": gate.box_id, "host": None, "port": None,
                                 "bytes_in": 0, "bytes_out": 0}
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(sock=connection, limit=MAX_HEAD)
            await self._carry(gate, reader, writer, entry)
        except Exception as exc:  # noqa: BLE001 - one connection's failure is its own line, never the gateway's
            entry.setdefault("decision", "allowed" if entry.get("bytes_in") else "denied")
            entry.setdefault("reason", f"failed: {exc}")
        finally:
            if writer is not None:
                writer.close()
            else:
                connection.close()
            gate.slots.release()
            if "decision" in entry and not entry.get(RECORDED):
                record(entry)

    async def _carry(self, gate: BoxGate, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     entry: dict[str, Any]) -> None:
        try:
            data = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            head = parse_head(data[:-4])
        except (asyncio.LimitOverrunError, ValueError) as exc:
            error = exc if isinstance(exc, HeadError) else HeadError(f"the request head is over {MAX_HEAD} bytes", 431)
            await self._refuse(writer, entry, error.status, str(error), "malformed request")
            return
        except (asyncio.IncompleteReadError, TimeoutError):
            return  # nothing asked: nothing to audit
        if head.api:
            await self._api(gate, reader, writer, head, entry)
            return
        entry.update(host=head.host, port=head.port)
        decision, addresses = gate.policy.decide(head.host), []
        if decision.allowed:
            decision, addresses = await self._addresses(gate, head, decision)
        if not decision.allowed:
            message = denial_message(gate.name, head.host, head.port, decision)
            phrase = f"agentbox egress: {head.host}:{head.port} not allowed (see egress_allow)"
            await self._refuse(writer, entry, 403, message, decision.reason, phrase)
            return
        entry.update(decision="allowed", reason=decision.reason)
        try:
            if not addresses:
                raise OSError(f"{head.host} is not resolved on the host")
            upstream_reader, upstream_writer = await self._open(addresses, head.port)
        except (OSError, TimeoutError) as exc:
            problem = str(exc) or "timed out"
            entry["reason"] = f"{decision.reason}; not connected: {problem}"
            message = f"agentbox egress gateway: {head.host}:{head.port} is allowed but not reached from the host: {problem}"
            await self._send(writer, answer(502, PHRASES[502], message))
            return
        try:
            if head.method == "CONNECT":
                await self._send(writer, b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                first = forwarded_head(head)
                await self._send(upstream_writer, first)
                entry["bytes_out"] += len(first)
            await self._pump(reader, writer, upstream_reader, upstream_writer, entry)
        finally:
            upstream_writer.close()

    async def _api(self, gate: BoxGate, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: Head,
                   entry: dict[str, Any]) -> None:
        """A request to the in-box API endpoint: on to the API host with the credential the host wrote for
        the box (_egress_credentials), under the box's policy; an upstream the relay's environment sets
        (tests) is the host's own choice, reached wherever it is."""
        credential = read_credential(gate.box_id, head.api)  # one small file per request: a new key applies at once
        if credential is None:
            entry.update(host=head.api)
            message = (f"agentbox egress gateway: the host keeps no {head.api} credential for box {gate.name}: start "
                       "the agent from the host (ansible-playbook playbooks/agent.yml), which gives it to the gateway")
            await self._refuse(writer, entry, 403, message, "no credential on the host")
            return
        overridden = bool(self.environ.get(APIS[head.api]["override"]))
        url = urlsplit(upstream(credential, head.api, self.environ))
        host = request_host(url.hostname or "") or ""
        port = url.port or (443 if url.scheme == "https" else 80)
        entry.update(host=host, port=port)
        target = Head("CONNECT", host, port, "", head.version, [])
        decision = Decision(True, f"{APIS[head.api]['override']} (the relay's environment)") if overridden \
            else gate.policy.decide(host)
        addresses = [url.hostname or host] if overridden else []
        if decision.allowed and not overridden:
            decision, addresses = await self._addresses(gate, target, decision)
        if not decision.allowed:
            await self._refuse(writer, entry, 403, denial_message(gate.name, host, port, decision), decision.reason)
            return
        entry.update(decision="allowed", reason=f"{decision.reason}; {credential.get('kind', 'no credential')} added")
        try:
            upstream_reader, upstream_writer = await self._open(addresses, port, host if url.scheme == "https" else None)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            entry["reason"] += f"; not connected: {exc or 'timed out'}"
            message = f"agentbox egress gateway: the {head.api} API at {host}:{port} is not reached from the host: {exc}"
            await self._send(writer, answer(502, PHRASES[502], message))
            return
        try:
            name = f"[{host}]" if ":" in host else host
            first = api_head(head, name if port == (443 if url.scheme == "https" else 80) else f"{name}:{port}",
                             url.path.rstrip("/") + head.target, credential)
            await self._send(upstream_writer, first)
            await self._pump(reader, writer, upstream_reader, upstream_writer, entry)
        finally:
            upstream_writer.close()

    async def _addresses(self, gate: BoxGate, head: Head, decision: Decision) -> tuple[Decision, list[str]]:
        """The addresses to connect to: the override, or the name's addresses from DNS; only public ones
        unless the user named the host (egress_allow) or overrode it."""
        if head.host in self.overrides:
            return decision, [self.overrides[head.host]]
        try:
            async with gate.lookups:
                infos = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                    self.resolver, socket.getaddrinfo, head.host, head.port, 0, socket.SOCK_STREAM), LOOKUP_TIMEOUT)
        except (OSError, TimeoutError):
            return decision, []  # answered as not reached
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if decision.named:
            return decision, addresses
        public = [address for address in addresses if is_public(address)]
        if not public:
            return Decision(False, f"resolves to a non-public address ({', '.join(addresses[:3])})"), []
        return decision, public

    @staticmethod
    async def _open(addresses: Iterable[str], port: int, tls_host: str | None = None
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the first address that answers; TLS to `tls_host` (the host's trust store) when given."""
        failure: Exception = OSError("no address")
        tls = {"ssl": ssl.create_default_context(), "server_hostname": tls_host} if tls_host else {}
        for address in addresses:
            try:
                return await asyncio.wait_for(asyncio.open_connection(address, port, limit=CHUNK, **tls),
                                              CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                failure = exc
        raise failure

    async def _pump(self, box_reader: asyncio.StreamReader, box_writer: asyncio.StreamWriter,
                    up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, entry: dict[str, Any]) -> None:
        """Both directions until both ended (an end is passed on as a half close), or nothing moved for
        IDLE_TIMEOUT."""
        loop = asyncio.get_running_loop()
        moved = [loop.time()]

        async def one_way(source: asyncio.StreamReader, sink: asyncio.StreamWriter, key: str) -> None:
            while True:
                try:
                    chunk = await asyncio.wait_for(source.read(CHUNK), IDLE_TIMEOUT)
                except TimeoutError:
                    if loop.time() - moved[0] < IDLE_TIMEOUT:
                        continue  # the other way is busy
                    raise
                if not chunk:
                    if sink.can_write_eof():
                        with contextlib.suppress(OSError):
                            sink.write_eof()
                    return
                sink.write(chunk)
                await sink.drain()
                entry[key] += len(chunk)
                moved[0] = loop.time()

        out = asyncio.ensure_future(one_way(box_reader, up_writer, "bytes_out"))
        back = asyncio.ensure_future(one_way(up_reader, box_writer, "bytes_in"))
        try:
            # The upstream's end ends the connection; the box's end only half-closes (its request is sent, the
            # answer still comes). A failure either way ends both.
            done = (await asyncio.wait({out, back}, return_when=asyncio.FIRST_COMPLETED))[0]
            if back not in done and out.exception() is None:
                await asyncio.wait({back})
        finally:
            for task in (out, back):
                task.cancel()
            await asyncio.gather(out, back, return_exceptions=True)

    async def _refuse(self, writer: asyncio.StreamWriter, entry: dict[str, Any], status: int, message: str,
                      reason: str, phrase: str | None = None) -> None:
        entry.update(decision="denied", reason=reason)
        record(entry)  # on record before the box hears it: whoever reads the answer finds the line
        with contextlib.suppress(OSError):
            await self._send(writer, answer(status, phrase or PHRASES.get(status, "Refused"), message))

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()


def policy_of(registration: Mapping[str, Any]) -> EgressPolicy:
    """The box's policy as the host recorded it; one not understood is `none` (never looser), logged."""
    try:
        return EgressPolicy.from_record(registration.get("egress"))
    except EgressError as exc:
        LOG.error("egress gateway: box %s's recorded policy is not understood (%s): nothing allowed",
                  registration.get("name"), exc)
        return EgressPolicy("none")
