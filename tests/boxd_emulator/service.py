"""The boxd API calls the emulator answers, on the servicer class generated in the SDK.

Calls not overridden here answer UNIMPLEMENTED (the generated base class does that), so a provider
that starts using a new call fails loudly against the emulator instead of getting a made-up answer.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import docker.errors
import grpc
from boxd._generated import api_pb2, api_pb2_grpc

from tests.daytona_emulator.docker_backend import BackendError, PathIsDirectory, PathNotFound, exec_exit_code

from .machines import Fleet, Machine, Refused
from .ports import PUBLIC_HOST, demux

EXEC_MARKER = "BOXD_EMULATOR_EXEC_ID"
CHUNK = 1 << 20  # streamed output and downloads: 1 MiB messages, well under the 4 MiB cap
UNARY_DOWNLOAD_CAP = 4 << 20
PREFER_BASH = 'if command -v bash >/dev/null 2>&1; then exec bash -c "$1"; fi; exec sh -c "$1"'


def _status(code: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, code)


def _vm(machine: Machine) -> api_pb2.GetVmResponse:
    return api_pb2.GetVmResponse(
        vm_id=machine.id, name=machine.name, image_ref=machine.image, status=machine.status,
        disk_bytes=machine.disk_bytes, vcpu=machine.vcpu, memory_bytes=machine.memory_bytes,
        auto_suspend_timeout_secs=machine.auto_suspend_secs, created_at=int(machine.created_at),
        labels=machine.labels, egress_allow=machine.egress_allow, source=machine.source,
        access_domain="boxd.emulator.invalid",
    )


def _forward(forward: Any) -> api_pb2.ExposePortResponse:
    return api_pb2.ExposePortResponse(vm_name=forward.machine_name, vm_id=forward.machine_id, dns=PUBLIC_HOST,
                                      public_port=forward.public_port, vm_port=forward.vm_port,
                                      protocol=forward.protocol)


def _snapshot_info(snap: Any) -> api_pb2.SnapshotInfo:
    return api_pb2.SnapshotInfo(snapshot_id=snap.id, name=snap.name, version=snap.version, status=snap.status,
                                size_bytes=snap.size_bytes, vcpu=snap.vcpu, memory_bytes=snap.memory_bytes,
                                created_at=int(snap.created_at * 1000), updated_at=int(snap.updated_at * 1000),
                                storage=snap.storage, archived=snap.storage != "local",
                                failed_version=snap.failed_version, failure_reason=snap.failure_reason)


# What a create may not carry next to a spec (the spec holds them; boxd refuses both, as the SDK says).
def _next_to_spec(request: Any, fields: tuple[str, ...]) -> None:
    given = [name for name in fields if (getattr(request.config, name) if name in ("vcpu", "memory_bytes")
                                         else getattr(request, name))]
    if given:
        raise Refused("INVALID_ARGUMENT", f"{', '.join(given)} cannot be given next to a spec: put them in it")


class BoxdService(api_pb2_grpc.BoxdApiServicer):
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    # ---- machines --------------------------------------------------------------------------------------
    def CreateVm(self, request: Any, context: Any) -> Any:
        env = {e.key: e.value for e in request.env}
        labels, egress = dict(request.labels), []
        config = request.config
        if request.HasField("spec"):
            # The spec holds the labels, env and egress (the SDK's create(spec=...)); no base: the default image.
            _next_to_spec(request, ("image_ref", "env", "labels", "networks", "isolated", "vcpu", "memory_bytes"))
            if request.spec.HasField("base"):
                raise Refused("UNIMPLEMENTED", "the emulator does not model a spec's base (team or snapshot)")
            env, labels, egress = dict(request.spec.env), dict(request.spec.labels), list(request.spec.egress)
        machine = self.fleet.create(
            name=request.name, image=request.image_ref or self.fleet.image, labels=labels, env=env,
            vcpu=config.vcpu, memory_bytes=config.memory_bytes, disk_bytes=config.disk_bytes,
            auto_suspend_secs=config.srf.auto_suspend_timeout_secs, egress=egress,
        )
        return api_pb2.CreateVmResponse(vm_id=machine.id, name=machine.name, image=machine.image,
                                        status=machine.status)

    def CreateVmFromSnapshot(self, request: Any, context: Any) -> Any:
        snap = self.fleet.restorable(request.snapshot)
        config = request.config
        labels = {**snap.labels, **dict(request.labels)}  # merged over the captured labels, as documented
        egress, env = list(snap.egress), {}
        if request.HasField("spec"):
            # Merged over the snapshot's own: maps with the spec winning, lists combined (SDK, boxd.spec).
            _next_to_spec(request, ("labels", "vcpu", "memory_bytes"))
            labels = {**snap.labels, **dict(request.spec.labels)}
            egress += [entry for entry in request.spec.egress if entry not in egress]
            env = dict(request.spec.env)
        machine = self.fleet.create(
            name=request.name, image=snap.image_ref, labels=labels, env=env, vcpu=config.vcpu or snap.vcpu,
            memory_bytes=config.memory_bytes or snap.memory_bytes, disk_bytes=config.disk_bytes,
            auto_suspend_secs=config.srf.auto_suspend_timeout_secs, source="snapshot", egress=egress,
        )
        return api_pb2.CreateVmResponse(vm_id=machine.id, name=machine.name, image=machine.image,
                                        status=machine.status)

    def GetVm(self, request: Any, context: Any) -> Any:
        machine = self.fleet.get(request.vm_id)
        self.fleet.settle(machine)
        return _vm(machine)

    def ListVms(self, request: Any, context: Any) -> Any:
        selector = [term for term in request.label_selector if term]
        machines = self.fleet.listing(selector)
        for machine in machines:
            self.fleet.settle(machine)
        return api_pb2.ListVmsResponse(vms=[_vm(m) for m in machines])

    def DestroyVm(self, request: Any, context: Any) -> Any:
        self.fleet.destroy(request.vm_id)
        return api_pb2.DestroyVmResponse()

    def StartVm(self, request: Any, context: Any) -> Any:
        self.fleet.start(request.vm_id)
        return api_pb2.StartVmResponse()

    def StopVm(self, request: Any, context: Any) -> Any:
        self.fleet.stop(request.vm_id)
        return api_pb2.StopVmResponse()

    def SuspendVm(self, request: Any, context: Any) -> Any:
        began = time.monotonic()
        self.fleet.suspend(request.vm_id)
        return api_pb2.SuspendVmResponse(suspend_us=int((time.monotonic() - began) * 1e6))

    def HibernateVm(self, request: Any, context: Any) -> Any:
        self.fleet.suspend(request.vm_id, "hibernated")
        return api_pb2.HibernateVmResponse()

    def ResumeVm(self, request: Any, context: Any) -> Any:
        began = time.monotonic()
        self.fleet.wake(request.vm_id, only=("suspended",))  # a hibernated machine is woken, not resumed
        return api_pb2.ResumeVmResponse(resume_us=int((time.monotonic() - began) * 1e6))

    def WakeVm(self, request: Any, context: Any) -> Any:
        self.fleet.wake(request.vm_id)
        return api_pb2.WakeVmResponse()

    def SetAutoSuspendTimeout(self, request: Any, context: Any) -> Any:
        machine = self.fleet.get(request.vm_id)
        machine.auto_suspend_secs = request.timeout_secs
        return api_pb2.SetAutoSuspendTimeoutResponse()

    def SetVmEgressAllow(self, request: Any, context: Any) -> Any:
        # Recorded and reported, not enforced: the containers keep their network (docs/boxd-emulator.md).
        machine = self.fleet.get(request.vm)
        machine.egress_allow = list(request.entries)
        return api_pb2.SetVmEgressAllowResponse(entries=machine.egress_allow)

    def ExposePort(self, request: Any, context: Any) -> Any:
        machine = self.fleet.get(request.vm_id or request.vm)
        if not 0 < request.vm_port < 65536:
            raise Refused("INVALID_ARGUMENT", f"vm_port {request.vm_port} is not a port (1-65535)")
        protocol = request.protocol or "tcp"
        if protocol not in ("tcp", "udp", "both"):
            raise Refused("INVALID_ARGUMENT", f"protocol {protocol!r}: tcp, udp or both")
        if protocol != "tcp":
            raise Refused("UNIMPLEMENTED", "the emulator forwards tcp only")
        try:
            forward = self.fleet.forwards.expose(machine.id, machine.name, request.vm_port, protocol)
        except ValueError as exc:
            raise Refused("FAILED_PRECONDITION", str(exc)) from exc
        return _forward(forward)

    def UnexposePort(self, request: Any, context: Any) -> Any:
        machine = self.fleet.get(request.vm_id or request.vm)
        forward = self.fleet.forwards.unexpose(machine.id, request.vm_port)
        if forward is None:
            raise Refused("NOT_FOUND", f"machine {machine.id} does not expose port {request.vm_port}")
        return api_pb2.UnexposePortResponse(forward=_forward(forward))

    def ListExposedPorts(self, request: Any, context: Any) -> Any:
        machine_id = self.fleet.get(request.vm).id if request.vm else None
        return api_pb2.ListExposedPortsResponse(forwards=[_forward(f) for f in self.fleet.forwards.listing(machine_id)])

    # ---- exec ------------------------------------------------------------------------------------------
    def Exec(self, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
        first = next(request_iterator, None)
        if first is None or not first.command:
            raise Refused("INVALID_ARGUMENT", "the first exec chunk must carry the command")
        machine = self.fleet.usable(first.vm_id)
        token = secrets.token_hex(8)
        api = self.fleet.backend.long_client.api
        machine.busy += 1
        finished = threading.Event()

        def caller_gone() -> None:
            # The call ended before the command did (cancel, deadline, a dropped stream): kill what it
            # started now, as boxd does, even while the command waits on stdin and prints nothing.
            if not finished.is_set():
                threading.Thread(target=self.fleet.backend.kill_marked,
                                 args=(machine.container, f"{EXEC_MARKER}={token}"), daemon=True).start()

        context.add_callback(caller_gone)
        try:
            exec_id = api.exec_create(machine.container, ["/bin/sh", "-c", PREFER_BASH, "boxd-exec", first.command],
                                      stdin=True, stdout=True, stderr=True, tty=False, user="0",
                                      environment={EXEC_MARKER: token})["Id"]
            sock = api.exec_start(exec_id, socket=True)._sock
            feeder = threading.Thread(target=_feed_stdin, args=(request_iterator, sock), daemon=True)
            feeder.start()
            done = False
            try:
                for is_stderr, data in demux(sock, CHUNK):
                    yield api_pb2.ExecChunk(data=data, is_stderr=is_stderr)
                done = True
                finished.set()
            finally:
                if not done or not context.is_active():
                    # The caller went away (cancel, deadline, a dropped stream): kill what it started, as
                    # boxd does. The output is drained meanwhile, or the engine blocks on the full socket.
                    threading.Thread(target=_drain, args=(sock,), daemon=True).start()
                    self.fleet.backend.kill_marked(machine.container, f"{EXEC_MARKER}={token}")
                sock.close()
            code = exec_exit_code(lambda: api.exec_inspect(exec_id))
            yield api_pb2.ExecChunk(exit_code=code)
        except docker.errors.APIError as exc:
            raise Refused("INTERNAL", f"exec failed: {exc.explanation or exc}") from exc
        finally:
            machine.busy -= 1
            machine.last_active = time.monotonic()

    # ---- files -----------------------------------------------------------------------------------------
    def UploadFileStream(self, request_iterator: Iterator[Any], context: Any) -> Any:
        first = next(request_iterator, None)
        if first is None or not first.path.startswith("/"):
            raise Refused("INVALID_ARGUMENT", "an upload needs an absolute path in its first chunk")
        machine = self.fleet.usable(first.vm_id)
        parts = [first.data]
        for chunk in request_iterator:
            parts.append(chunk.data)
        data = b"".join(parts)
        if len(data) != first.total_size:
            raise Refused("DATA_LOSS", f"upload carried {len(data)} bytes, announced {first.total_size}")
        machine.busy += 1
        try:
            self._atomic_write(machine, first.path, data)
        finally:
            machine.busy -= 1
            machine.last_active = time.monotonic()
        return api_pb2.UploadFileResponse(bytes_written=len(data))

    def UploadFile(self, request: Any, context: Any) -> Any:
        machine = self.fleet.usable(request.vm_id)
        self._atomic_write(machine, request.path, request.data)
        return api_pb2.UploadFileResponse(bytes_written=len(request.data))

    def _atomic_write(self, machine: Machine, path: str, data: bytes) -> None:
        """Parents created, written under a temporary name, then renamed: a reader never sees half a file."""
        parent, _slash, base = path.rstrip("/").rpartition("/")
        temporary = f"{parent}/.{base}.boxd-upload-{secrets.token_hex(4)}"
        backend = self.fleet.backend
        try:
            backend.write_file(machine.container, temporary, data, 0, 0, "0")
        except BackendError as exc:
            raise Refused("INTERNAL", str(exc)) from exc
        moved = backend.exec_argv(machine.container, ["mv", "-f", "--", temporary, path], user="0")
        if moved.exit_code != 0:
            backend.exec_argv(machine.container, ["rm", "-f", "--", temporary], user="0")
            raise Refused("INTERNAL", f"upload of {path} failed: {moved.output.decode(errors='replace').strip()}")

    def _read(self, machine: Machine, path: str) -> bytes:
        machine.busy += 1
        try:
            return self.fleet.backend.read_file(machine.container, path)
        except PathNotFound as exc:
            raise Refused("NOT_FOUND", f"no such file: {path}") from exc
        except PathIsDirectory as exc:
            raise Refused("INVALID_ARGUMENT", f"{path} is a directory") from exc
        except BackendError as exc:
            raise Refused("INTERNAL", str(exc)) from exc
        finally:
            machine.busy -= 1
            machine.last_active = time.monotonic()

    def DownloadFileStream(self, request: Any, context: Any) -> Iterator[Any]:
        data = self._read(self.fleet.usable(request.vm_id), request.path)
        if not data:
            yield api_pb2.DownloadFileChunk(total_size=0)
            return
        for offset in range(0, len(data), CHUNK):
            yield api_pb2.DownloadFileChunk(total_size=len(data), data=data[offset:offset + CHUNK])

    def DownloadFile(self, request: Any, context: Any) -> Any:
        data = self._read(self.fleet.usable(request.vm_id), request.path)
        if len(data) > UNARY_DOWNLOAD_CAP - 1024:
            raise Refused("RESOURCE_EXHAUSTED", f"{request.path} is {len(data)} bytes, over the 4 MiB message cap: "
                          "use the streamed download")
        return api_pb2.DownloadFileResponse(data=data)

    # ---- snapshots -------------------------------------------------------------------------------------
    def CreateSnapshot(self, request: Any, context: Any) -> Any:
        snap = self.fleet.snapshot(request.vm, request.name)
        return api_pb2.CreateSnapshotResponse(snapshot_id=snap.id, name=snap.name, version=snap.capturing,
                                              status=snap.status)

    def GetSnapshot(self, request: Any, context: Any) -> Any:
        return api_pb2.GetSnapshotResponse(snapshot=_snapshot_info(self.fleet.get_snapshot(request.name)))

    def ListSnapshots(self, request: Any, context: Any) -> Any:
        with self.fleet.lock:
            snaps = list(self.fleet.snapshots.values())
        for snap in snaps:
            self.fleet.settle_snapshot(snap)
        return api_pb2.ListSnapshotsResponse(snapshots=[_snapshot_info(s) for s in snaps])

    def DeleteSnapshot(self, request: Any, context: Any) -> Any:
        self.fleet.delete_snapshot(request.name)
        return api_pb2.DeleteSnapshotResponse()


def _feed_stdin(requests: Iterator[Any], sock: socket.socket) -> None:
    """Forward stdin chunks to the process; the client's half-close becomes the process's EOF."""
    try:
        for chunk in requests:
            if chunk.stdin and chunk.data:
                sock.sendall(chunk.data)
    except (OSError, grpc.RpcError, ValueError):
        pass
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(CHUNK):
            pass
    except OSError:
        pass


def refused_to_status(exc: Refused) -> tuple[grpc.StatusCode, str]:
    return _status(exc.code), exc.message
