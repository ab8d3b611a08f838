"""The gRPC server: token auth, fault rules, the request log and the emulator's control calls.

Plain HTTP/2 on 127.0.0.1 (the SDK dials `http://` base URLs without TLS), behind a front on the same
port that also answers the API key exchange over HTTP/1.1 (front.py). A call is let in with the static
token ($BOXD_TOKEN) or a token the exchange issued. Message size is capped at 4 MiB in both directions,
grpcio's default and production's cap for unary calls.

Fault rules (set with the control call `AddFault`, or `--fault JSON` on the command line):
    {"method": "Exec", "action": "error", "code": "FAILED_PRECONDITION", "message": "...", "times": 1}
    action: "error"       refuse before doing anything
            "error_after" do the work, then answer with the error (a lost answer)
            "drop"        streaming answers: send `after` messages, then reset the stream (UNAVAILABLE)
            "delay"       wait `seconds` first, then answer normally
            "drop_input"  streamed requests (Exec's stdin, uploads): pass `after` request messages on, then
                          cancel the call (the caller sees CANCELLED) and never deliver the rest: the
                          service kills the command it started, as boxd does for a caller that went away
    times: how many calls it hits (default 1; 0 = every call); method: the RPC name, or "*".
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from boxd._generated import api_pb2_grpc
from google.protobuf.message import Message

from .front import Exchange, Front
from .machines import Fleet, Refused
from .service import BoxdService, refused_to_status

MESSAGE_CAP = 4 << 20
CONTROL_SERVICE = "boxd.emulator.Control"
FAULT_ACTIONS = ("error", "error_after", "drop", "delay", "drop_input")
DROP_HOLD_SECONDS = 120.0  # how long a cut input stream stays silent before its reader is let go


class Faults:
    def __init__(self) -> None:
        self.rules: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.next_id = 1

    def add(self, rule: dict[str, Any]) -> dict[str, Any]:
        action = rule.get("action", "error")
        if action not in FAULT_ACTIONS:
            raise ValueError(f"fault action must be one of {', '.join(FAULT_ACTIONS)}, not {action!r}")
        code = rule.get("code", "UNAVAILABLE")
        if not isinstance(getattr(grpc.StatusCode, code, None), grpc.StatusCode):
            raise ValueError(f"unknown gRPC status {code!r}")
        with self.lock:
            stored = {"method": "*", "times": 1, "message": f"injected {action}", "seconds": 0.0, "after": 1,
                      **rule, "action": action, "code": code, "id": self.next_id, "hits": 0}
            self.next_id += 1
            self.rules.append(stored)
        return stored

    def take(self, method: str) -> dict[str, Any] | None:
        with self.lock:
            for rule in self.rules:
                if rule["method"] in ("*", method):
                    rule["hits"] += 1
                    if rule["times"] and rule["hits"] >= rule["times"]:
                        self.rules.remove(rule)
                    return dict(rule)
        return None

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()


class Gate(grpc.ServerInterceptor):
    """Every call: the bearer token, then the fault rules, then the call; Refused becomes its status."""

    def __init__(self, token: str, exchange: Exchange, faults: Faults, log: list[dict[str, Any]]) -> None:
        self.token = token
        self.exchange = exchange
        self.faults = faults
        self.log = log

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        control = details.method.startswith(f"/{CONTROL_SERVICE}/")
        metadata = dict(details.invocation_metadata or ())
        bearer = str(metadata.get("authorization", "")).removeprefix("Bearer ")
        authorized = bearer == self.token or self.exchange.valid(bearer)
        if not control:
            self.log.append({"method": method, "time": time.time()})

        def before(context: Any) -> dict[str, Any] | None:
            if not authorized:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid or missing token")
            rule = None if control else self.faults.take(method)
            if rule and rule["action"] == "delay":
                time.sleep(float(rule["seconds"]))
            if rule and rule["action"] == "error":
                context.abort(getattr(grpc.StatusCode, rule["code"]), rule["message"])
            return rule

        def unary_answer(behaviour: Callable[..., Any]) -> Callable[..., Any]:
            def run(request: Any, context: Any) -> Any:
                rule = before(context)
                if rule and rule["action"] == "drop_input" and not isinstance(request, Message):
                    request = _cut_input(request, context, int(rule["after"]))
                try:
                    answer = behaviour(request, context)
                except Refused as exc:
                    context.abort(*refused_to_status(exc))
                if rule and rule["action"] in ("error_after", "drop"):
                    context.abort(getattr(grpc.StatusCode, rule["code"]), rule["message"])
                return answer
            return run

        def streamed_answer(behaviour: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
            def run(request: Any, context: Any) -> Iterator[Any]:
                rule = before(context)
                if rule and rule["action"] == "drop_input":
                    request = _cut_input(request, context, int(rule["after"]))
                sent = 0
                try:
                    for item in behaviour(request, context):
                        if rule and rule["action"] == "drop" and sent >= int(rule["after"]):
                            context.abort(grpc.StatusCode.UNAVAILABLE, "stream reset by peer (injected)")
                        yield item
                        sent += 1
                except Refused as exc:
                    context.abort(*refused_to_status(exc))
                if rule and rule["action"] == "error_after":
                    context.abort(getattr(grpc.StatusCode, rule["code"]), rule["message"])
            return run

        kwargs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(unary_answer(handler.unary_unary), **kwargs)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(unary_answer(handler.stream_unary), **kwargs)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(streamed_answer(handler.unary_stream), **kwargs)
        return grpc.stream_stream_rpc_method_handler(streamed_answer(handler.stream_stream), **kwargs)


def _cut_input(requests: Iterator[Any], context: Any, after: int) -> Iterator[Any]:
    """A request stream whose caller vanishes after `after` messages: the call is cancelled and the rest
    never arrives (no end of input either, so whatever reads it is stopped by the cancel, not by an EOF)."""
    for count, item in enumerate(requests, start=1):
        yield item
        if count >= after:
            break
    context.cancel()
    threading.Event().wait(DROP_HOLD_SECONDS)


class Emulator:
    def __init__(self, *, token: str, image: str, instance_id: str, port: int = 0, start_seconds: float = 0.3,
                 stop_seconds: float = 0.2, box_capabilities: bool = True,
                 faults: list[dict[str, Any]] | None = None, api_key: str = "", exchange_limit: int = 10,
                 exchange_window: float = 60.0) -> None:
        if not token:
            raise ValueError("the emulator needs a token: set BOXD_TOKEN")
        self.token = token
        self.instance_id = instance_id
        self.fleet = Fleet(instance_id, image, start_seconds, stop_seconds, box_capabilities)
        self.faults = Faults()
        for rule in faults or []:
            self.faults.add(rule)
        self.log: list[dict[str, Any]] = []
        self.exchange = Exchange(api_key, exchange_limit, exchange_window)
        options = [("grpc.max_receive_message_length", MESSAGE_CAP), ("grpc.max_send_message_length", MESSAGE_CAP)]
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=48, thread_name_prefix="boxd-emu"),
                                  interceptors=[Gate(token, self.exchange, self.faults, self.log)], options=options)
        api_pb2_grpc.add_BoxdApiServicer_to_server(BoxdService(self.fleet), self.server)
        self.server.add_generic_rpc_handlers([self._control_handler()])
        grpc_port = self.server.add_insecure_port("127.0.0.1:0")  # private: the front carries HTTP/2 to it
        if not grpc_port:
            raise OSError("cannot listen on 127.0.0.1")
        self.front = Front(port, grpc_port, self.exchange, self.log.append)
        self.port = self.front.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server.start()
        self.front.start()
        self.fleet.start_background()

    def stop(self) -> None:
        self.front.stop()
        self.server.stop(grace=2).wait()
        self.fleet.shutdown()

    # ---- control calls (JSON in, JSON out) -------------------------------------------------------------
    def _control_handler(self) -> Any:
        calls: dict[str, Callable[[dict[str, Any]], Any]] = {
            "Health": lambda _req: {"instance_id": self.instance_id},
            "State": lambda _req: {"machines": [m.public() for m in self.fleet.listing([])],
                                   "snapshots": sorted(self.fleet.snapshots)},
            "AddFault": self.faults.add,
            "ClearFaults": lambda _req: self.faults.clear(),
            "Requests": lambda _req: list(self.log),
            "Tick": lambda _req: self.fleet.tick(),
            "FailSnapshot": lambda req: self.fleet.fail_snapshot(req["name"], req.get("reason", "injected")).status,
            "ArchiveSnapshot": lambda req: self.fleet.archive_snapshot(req["name"]).storage,
            "Configure": self._configure,
        }

        def wrap(call: Callable[[dict[str, Any]], Any]) -> Any:
            def answer(request: bytes, context: Any) -> bytes:
                try:
                    return json.dumps(call(json.loads(request or b"{}"))).encode()
                except (ValueError, KeyError, TypeError) as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                except Refused as exc:
                    context.abort(*refused_to_status(exc))
                return b""
            return grpc.unary_unary_rpc_method_handler(answer)

        return grpc.method_handlers_generic_handler(CONTROL_SERVICE, {name: wrap(c) for name, c in calls.items()})

    def _configure(self, settings: dict[str, Any]) -> dict[str, Any]:
        for key in ("start_seconds", "stop_seconds", "snapshot_seconds"):
            if key in settings:
                setattr(self.fleet, key, float(settings[key]))
        if "exchange_limit" in settings or "exchange_window" in settings:
            self.exchange.configure(int(settings.get("exchange_limit", self.exchange.limit)),
                                    float(settings.get("exchange_window", self.exchange.window)))
        return {"start_seconds": self.fleet.start_seconds, "stop_seconds": self.fleet.stop_seconds,
                "snapshot_seconds": self.fleet.snapshot_seconds, "exchange_limit": self.exchange.limit, "exchange_window": self.exchange.window}
