# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Docker provider: boxes as containers on the local engine or on an engine reached over SSH.

The two differ only in how the client reaches the engine (`_engine_sdk.client_for`); every operation
below is the same for both. Boxes are found by their io.agentbox.* labels, never by a local
state file, so any machine that reaches the engine sees the same boxes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from typing import IO, Any

from ...access import _editor_volumes
from ...core._host_files import ensure_private_dir, ssh_config_file
from ...core._naming import (
    BOX_USER,
    CONTAINER_BOX_NAME_MAX,
    SECRETS_DIR,
    container_name,
    docker_volume_name,
    label,
    strip_labels,
)
from ...core._provider import (
    BoxFacts,
    BoxNotFound,
    BoxSpec,
    Command,
    EngineUnreachable,
    ExecResult,
    OutputTooLarge,
    Provider,
    ProviderError,
    SshProxy,
)
from ...core._sizes import BadValue
from . import _box_engine, _claimed
from ._box_container import container_config, probe_in_image, proxy_environment
from ._engine_api import (
    EngineAPI,
    EngineAPIError,
    EngineUnanswered,
    local_engine,
    pause_patiently,
)
from ._engine_sdk import API_TIMEOUT, SDKEngine, client_for, engine_error, engine_unreachable, forget_client
from ._gitlayer_volumes import create_layers, remove_layers, rescue_commits

WEB_PORT = 80
# The capabilities a box needs for Docker-in-box and FUSE; never --privileged.
BOX_CAPABILITIES = ["SYS_ADMIN", "NET_ADMIN"]
BOX_SECURITY_OPT = ["seccomp=unconfined", "apparmor=unconfined"]
RUN_DIR = "/run/agentbox"
DOCKER_STATES = {
    "running": "running",
    "paused": "paused",
    "created": "stopped",
    "exited": "stopped",
    "dead": "stopped",
    "restarting": "stopped",
    "removing": "stopped",
}


class _Summary:
    """Just enough of a container object for _facts, made from a listing entry."""

    def __init__(self, name: str, attrs: dict[str, Any]):
        self.name = name
        self.attrs = attrs


class _Gone(Exception):
    """What was to be removed is not there (any more)."""


def _or_gone(remove: Any, *args: Any, **kwargs: Any) -> None:
    """A removal, with the engine's 404 as _Gone."""
    try:
        remove(*args, **kwargs)
    except EngineAPIError as exc:
        if exc.status == 404:
            raise _Gone() from exc
        raise


class DockerProvider(Provider):
    """Boxes as containers. `engine` is 'local' or an SSH destination (provider docker_ssh)."""

    shares_host_filesystem = True
    image_user_ids = True
    max_box_name = CONTAINER_BOX_NAME_MAX  # the container's hostname, agentbox-<box>, fits Linux's limit

    def __init__(self, engine: str | None = None, ssh_options: dict[str, Any] | None = None,
                 isolation: str | None = None, remote_socket: str | None = None, **_ignored: Any):
        super().__init__()
        self._engine = engine or "local"
        # Boxes live on a box engine (user namespaces) unless isolation 'none' asks for the user's
        # engine; one not told its isolation also finds boxes of the user's engine (_box_engine).
        self.isolation = _box_engine.check_isolation(isolation)
        self._isolation_given = bool(isolation)
        # A remote engine's daemon: its box engine's socket there when that answers (found on first use,
        # or given by reopen_options), else None, the docker CLI's default daemon on that host.
        self._remote_socket: str | None = remote_socket or None
        self._remote_known = bool(remote_socket) or (self._isolation_given and self.isolation == "none")
        self.name = "docker" if self._engine == "local" else "docker_ssh"
        # Only the local engine sees the controller's files (the workspace .git bind mounts).
        self.shares_host_filesystem = self._engine == "local"
        self.relay_channel = "socket" if self._engine == "local" else "tunnel"
        self.transfers_images = self._engine != "local"  # a remote engine gets the local engine's images
        self.thread_safe_client = self._engine == "local"
        # A remote engine publishes on its own 127.0.0.1; an editor attaches to this machine's engine only.
        self.port_urls = "published" if self._engine == "local" else "forwarded"
        self.attaches_dev_containers = self._engine == "local"
        self._ssh_options = ssh_options or {}
        # The per-task calls go straight to the engine's socket when the standard library can
        # reach it (the local engine without TLS); otherwise the SDK makes them too.
        self._docker_host: str | None = None  # the local engine's address (docker_host)
        self._direct: EngineAPI | None = None
        if self._engine == "local":
            self._use_local_engine(self.isolation)

    @property
    def holds_egress(self) -> bool:
        return self._engine == "local" and self.isolation == "userns"

    def _use_local_engine(self, isolation: str) -> None:
        self.isolation = isolation
        self._docker_host = _box_engine.engine_host(isolation)
        # The box engine is ours (a unix socket, never TLS); the user's engine as DOCKER_* say.
        environ = {"DOCKER_HOST": self._docker_host} if isolation == "userns" else None
        self._direct = local_engine(API_TIMEOUT, environ)

    @property  # type: ignore[override]
    def docker_host(self) -> str | None:
        """The local engine's address (None for a remote engine): what `docker -H` needs."""
        return self._docker_host

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        return self._engine

    @property
    def ssh_options(self) -> dict[str, Any]:
        """The SSH settings of a docker_ssh engine (the relay opens its own channel with them)."""
        return dict(self._ssh_options)

    @property
    def client(self) -> Any:
        return client_for(self._engine, self._ssh_options, self._docker_host or self._engine_socket())

    def _engine_socket(self) -> str | None:
        """A remote engine's daemon: its box engine's socket when one answers there (and isolation 'none'
        was not asked for), else None (the docker CLI's default daemon there). None for the local engine."""
        if self._engine == "local":
            return None
        if not self._remote_known:
            from ...ssh._ssh import connection_for  # the SSH transport is loaded only for remote engines

            connection = connection_for(self._engine, **self._ssh_options)
            box_engine = _box_engine.REMOTE_BOX_ENGINE
            self._remote_socket = box_engine if connection.answers(box_engine) else None
            self._remote_known = True
        return self._remote_socket

    def _use_engine(self, isolation: str) -> None:
        """Reach the boxes of this isolation: locally its engine; on a remote engine ('none') its default daemon."""
        if self._engine == "local":
            self._use_local_engine(isolation)
        else:
            self.isolation, self._remote_socket, self._remote_known = isolation, None, True

    # -- reaching boxes from other processes --------------------------------------------------------
    def reopen_options(self) -> dict[str, Any]:
        if self._engine == "local":
            return {"isolation": self.isolation}
        # The relay and the wake may run with another environment: keep the SSH settings this one used.
        config_file = ssh_config_file(self._ssh_options.get("config_file"))
        options = {"engine": self._engine, "ssh_options": {**self._ssh_options, "config_file": config_file},
                   "isolation": self.isolation}
        if self._engine_socket():
            options["remote_socket"] = self._engine_socket()  # the relay's tunnel and the wake use that daemon
        return options

    def reopen_environment(self) -> dict[str, str]:
        if self._engine != "local":
            return {}
        name = "AGENTBOX_ENGINE" if self.isolation == "userns" else "DOCKER_HOST"
        return {name: os.environ[name]} if os.environ.get(name) else {}

    def terminal_command(self, facts: BoxFacts, command: str, ssh: str = "ssh") -> str:
        if self._engine != "local" and self._engine_socket():
            # `docker -H ssh://` reaches only the engine's default daemon: run docker there over ssh (the
            # user's own ssh and config: `ssh` is the boxes' aliases' form). ssh:// takes user@host:port.
            return (f"ssh -t ssh://{self._engine.removeprefix('ssh://')} docker -H {self._engine_socket()} exec -it "
                    f"-u vscode {facts.container} {command}")
        return f"docker {self._host_option()}exec -it -u vscode {facts.container} {command}"

    def _host_option(self) -> str:
        """`-H <address> ` for the docker CLI when the engine is not the CLI's default one."""
        if self._engine != "local":
            return f"-H ssh://{self._engine} "
        if self._docker_host and self._docker_host != _box_engine.user_engine_host({}):
            return f"-H {self._docker_host} "
        return ""

    def forward_port(self, name: str, published: int, local_port: int | None) -> tuple[int, int]:
        if self._engine == "local":
            return super().forward_port(name, published, local_port)  # published on this machine already
        from ...ssh import _ssh  # the SSH transport is loaded only for boxes on remote engines

        return _ssh.start_forward_daemon(self._engine, published, local_port or 0, **self._ssh_options)

    def port_relay_argv(self, name: str, port: int) -> list[str]:
        from ...access._port_relay import BOX_RELAY
        from ...ssh import _ssh_proxy

        relay = ["python3", "-c", BOX_RELAY, str(port)]
        if self._engine != "local":  # over the engine's shared SSH connection, as `ssh agentbox-<box>`
            ensure_private_dir(_ssh_proxy.control_dir())
            return _ssh_proxy.engine_proxy_argv(name, self._engine, self._ssh_options, self._engine_socket(), relay)
        return _ssh_proxy.local_proxy_argv(name, self._docker_host, relay)

    def discard(self) -> None:
        self.close()
        forget_client(self._engine, self._docker_host or self._remote_socket)

    def ssh_proxy(self, name: str) -> SshProxy:
        from ...ssh import _ssh_proxy

        if self._engine != "local":
            ensure_private_dir(_ssh_proxy.control_dir())  # the engine connection's shared socket lives there
            return SshProxy(_ssh_proxy.engine_proxy_argv(name, self._engine, self._ssh_options, self._engine_socket()))
        warnings = []
        if not shutil.which("docker"):
            warnings.append(f"the docker CLI is not on this machine; `ssh {_ssh_proxy.alias(name)}` runs it: "
                            "install it (apt-get install docker.io)")  # fmt: skip
        return SshProxy(_ssh_proxy.local_proxy_argv(name, self._docker_host), warnings=warnings)

    @property
    def api(self) -> Any:
        return self.client.api

    @contextlib.contextmanager
    def _engine_call(self, name: str, operation: str, missing: str | None = None) -> Iterator[EngineAPI | SDKEngine]:
        """The engine's client (_calls), with its failures turned into the provider's errors: a box that is
        paused, stopped or gone, and `missing` for a 404 about something else (a path in the box)."""
        try:
            yield self._calls()
        except EngineUnanswered as exc:
            raise engine_unreachable(self._engine, exc, self._docker_host) from exc
        except EngineAPIError as exc:
            raise engine_error(exc.status, exc.message, name, operation, self._engine, missing) from exc

    def _facts(self, container: Any) -> BoxFacts:
        attrs = container.attrs
        labels = strip_labels(attrs.get("Config", {}).get("Labels"))
        # Boxes made before the box engine carry no isolation label: they ran on the user's engine.
        labels.setdefault("isolation", "none")
        state = DOCKER_STATES.get(attrs.get("State", {}).get("Status", ""), "missing")
        ports: dict[str, int] = {}
        for key, bindings in (attrs.get("NetworkSettings", {}).get("Ports") or {}).items():
            if bindings:
                ports[key.split("/")[0]] = int(bindings[0]["HostPort"])
        web = ports.get(str(WEB_PORT))
        return BoxFacts(
            name=labels.get("box", container.name.removeprefix("agentbox-")),
            id=labels.get("id", ""),
            provider=self.name,
            engine=self._engine,
            state=state,
            container=container.name,
            image=labels.get("image") or attrs.get("Config", {}).get("Image", ""),
            project=labels.get("project", ""),
            workspace=labels.get("workspace", ""),
            branch=labels.get("branch", ""),
            created=labels.get("created", ""),
            ports=ports,
            labels=labels,
            checkpoint=labels.get("checkpoint") or None,
            web_url=f"http://127.0.0.1:{web}/" if web and self._engine == "local" else None,
        )

    # -- discovery ------------------------------------------------------------------------------
    def find(self, name: str) -> BoxFacts | None:
        with self._engine_call(name, "find") as engine:
            attrs = engine.inspect_container(container_name(name))
            attrs = _claimed.as_box(engine, attrs) if attrs is not None else None  # a claimed pooled box
        if attrs is None and self._other_isolation():
            # A box not told its isolation may be an unisolated one on the user's engine.
            other = self._other_engine()
            with contextlib.suppress(EngineUnreachable):
                if other.find(name) is not None:
                    self._use_engine(other.isolation)
                    return self.find(name)
        if attrs is None:
            return None
        container = _Summary(str(attrs.get("Name", "")).lstrip("/"), attrs)
        if label("box") not in (container.attrs.get("Config", {}).get("Labels") or {}):
            raise ProviderError(
                f"container {container.name!r} exists but was not made by agentbox (no io.agentbox.box label); "
                "pick another box name or remove that container",
                box=name,
            )
        return self._facts(container)

    def list_boxes(self, project: str | None = None) -> list[BoxFacts]:
        # One request (list_boxes runs on every inventory read and relay pass; over docker_ssh each request is a
        # round trip): the engine's label filters are ANDed, so boxes and pooled containers cannot be asked for
        # in one filter, and the kinds are told apart here. /containers/json already carries labels, state and
        # ports; a pooled container a claim made a box under another name is read through its claim record
        # (_claimed: one more request, only when there is one), the project's label included.
        with self._engine_call("", "list boxes") as engine:
            listed = engine.containers([label("kind")])
            summaries = [s for s in listed if (s.get("Labels") or {}).get(label("kind")) == "box"] + \
                _claimed.listed_as_boxes(engine, listed)
        boxes = [self._facts_from_summary(s) for s in summaries
                 if not project or (s.get("Labels") or {}).get(label("project")) == project]
        if self._other_isolation():
            # The user's engine may still hold unisolated boxes (made with isolation none, or before
            # the box engine): listed too, whenever that engine answers.
            with contextlib.suppress(EngineUnreachable):
                boxes += self._other_engine().list_boxes(project)
        return sorted(boxes, key=lambda f: f.name)

    def _other_isolation(self) -> str | None:
        """The other engine's isolation, where a box of this provider may also live: only for a
        provider not told its isolation that uses a box engine, and only when the user's engine is
        another daemon (locally DOCKER_HOST; on a remote engine its default daemon)."""
        if self._isolation_given or self.isolation != "userns":
            return None
        if self._engine == "local":
            return "none" if _box_engine.user_engine_host() != self._docker_host else None
        return "none" if self._engine_socket() else None

    def _other_engine(self) -> DockerProvider:
        """This engine's unisolated boxes' provider (see _other_isolation)."""
        engine = None if self._engine == "local" else self._engine
        return DockerProvider(engine=engine, ssh_options=self._ssh_options, isolation=self._other_isolation())

    def _facts_from_summary(self, summary: dict[str, Any]) -> BoxFacts:
        """BoxFacts from a /containers/json entry (the listing), in the shape _facts gives."""
        ports: dict[str, int] = {}
        for port in summary.get("Ports") or []:
            if port.get("PublicPort") and port.get("Type", "tcp") == "tcp":
                ports.setdefault(str(port["PrivatePort"]), int(port["PublicPort"]))
        names = summary.get("Names") or ["/"]
        attrs = {
            "Config": {"Labels": summary.get("Labels") or {}, "Image": summary.get("Image", "")},
            "State": {"Status": summary.get("State", "")},
            "NetworkSettings": {"Ports": {f"{k}/tcp": [{"HostPort": str(v)}] for k, v in ports.items()}},
        }
        return self._facts(_Summary(names[0].lstrip("/"), attrs))

    # -- lifecycle ------------------------------------------------------------------------------
    def create(self, spec: BoxSpec) -> BoxFacts:
        cname = container_name(spec.name)
        volume = docker_volume_name(spec.name)
        volume_labels = {**spec.labels, label("kind"): "volume"}
        resources = spec.resources or {}
        created_volume = False
        container: str | None = None
        layers: dict[str, str] = {}
        engine = None
        try:
            engine = self._calls()
            box_root = self._box_root_ids(engine, spec.name)
            if spec.egress:
                self._check_egress_network(engine, spec.name)  # again: never a box with a policy on an open network
            # Only a volume made here is removed on failure: one with this name may belong to a box
            # that another run is creating at this moment.
            # `volume create` of an existing name answers with that volume: it is ours only when it
            # carries this box's id (a run racing for the name may have made it a moment ago).
            made = engine.create_volume(volume, volume_labels)
            created_volume = (made.get("Labels") or {}).get(label("id")) == spec.box_id
            binds = [(volume, "/var/lib/docker", "rw")]
            # Never the host's .git itself: an overlay whose writes stay in the box's volumes (_gitlayer).
            layers = create_layers(engine, spec.name, spec.box_id, spec.labels, spec.bind_paths, box_root)
            binds += [(layer, path, "rw") for layer, path in layers.items()]
            binds += [(host_path, box_path, "ro") for host_path, box_path in spec.mounts.items()]
            # Editor servers with their extensions, per box (never shared): _editor_volumes.
            for editor_volume, box_path, editor_labels in _editor_volumes.box_volumes(spec.name, volume_labels):
                engine.create_volume(editor_volume, editor_labels)
                binds.append((editor_volume, box_path, "rw"))
            config = container_config(
                image=spec.image,
                name=cname,
                command=["sleep", "infinity"],
                labels={**spec.labels, **_editor_volumes.container_labels(), label("isolation"): self.isolation},
                env=spec.box_env(),
                binds=binds,
                ports=list(spec.ports),
                cap_add=BOX_CAPABILITIES,
                devices=[("/dev/fuse", "/dev/fuse", "rwm")],
                security_opt=BOX_SECURITY_OPT,
                tmpfs={RUN_DIR: "mode=0755,uid=1000,gid=1000"},
                extra_hosts={"host.docker.internal": "host-gateway"},
                memory=resources.get("memory"),
                nano_cpus=int(float(resources["cpus"]) * 1e9) if resources.get("cpus") else None,
                pids_limit=resources.get("pids_limit"),
                proxies=[] if spec.egress else proxy_environment(),  # the gateway is its only way out
                network=_box_engine.EGRESS_NETWORK if spec.egress else "default",
            )
            try:
                container = engine.create_container(config, cname)
            except EngineAPIError as exc:
                if exc.status == 404 and "no such image" in exc.message.lower():
                    raise ProviderError(
                        f"image {spec.image!r} is not on engine {self._engine}: build it with the box_image role "
                        "(playbooks/create_box.yml does) or pass another 'image'",
                        box=spec.name,
                        operation="create",
                    ) from exc
                if exc.status == 409:
                    raise ProviderError(
                        f"a container called {cname!r} already exists on engine {self._engine}: pick another box name",
                        box=spec.name,
                        operation="create",
                    ) from exc
                raise
            engine.start_container(container)
            if spec.secrets:
                self.write_secrets(spec.name, spec.secrets)
            attrs = engine.inspect_container(container)
            if attrs is None:
                raise ProviderError("the box's container went away as it started", box=spec.name, operation="create")
            return self._facts_of(attrs)
        except BaseException as exc:
            if engine is not None:
                self._remove_half_made(engine, container, volume if created_volume else None, spec.name, layers)
            if isinstance(exc, EngineUnanswered):
                raise engine_unreachable(self._engine, exc, self._docker_host) from exc
            if isinstance(exc, EngineAPIError):
                raise ProviderError(exc.message, box=spec.name, operation="create") from exc
            if isinstance(exc, BadValue):
                raise ProviderError(str(exc), box=spec.name, operation="create") from exc
            raise

    def check_can_create(self, name: str, egress: bool = False) -> None:
        with self._calling(name, "create") as engine:
            self._box_root_ids(engine, name)
            if egress:
                self._check_egress_network(engine, name)

    def _check_egress_network(self, engine: EngineAPI | SDKEngine, name: str) -> None:
        """A box with an egress policy goes only on the box engine's egress network (docs/egress.md); which
        boxes can is `holds_egress`, checked by the create before this."""
        problem = _box_engine.egress_network_problem(engine.inspect_network(_box_engine.EGRESS_NETWORK))
        if problem:
            raise ProviderError(f"cannot hold the box's network to the egress gateway: {problem}", box=name,
                                operation="create")

    def _box_root_ids(self, engine: EngineAPI | SDKEngine, name: str) -> tuple[int, int]:
        """The host (uid, gid) of root in a box of this engine; refuses an engine that does not remap
        user namespaces unless isolation 'none' was asked for."""
        remapped = _box_engine.remapped_ids(str(engine.info().get("DockerRootDir", "")))
        if remapped is None and self.isolation != "none" and self._engine == "local":
            raise ProviderError(
                f"the engine at {self._docker_host} does not remap user namespaces, so root in a box would be root "
                "on this host: point AGENTBOX_ENGINE at the box engine (scripts/ensure-box-engine.sh), or create "
                "with isolation=none to accept that",
                box=name,
                operation="create",
            )
        if remapped is None and self.isolation != "none":
            # Never unisolated on a remote engine unless asked for: no box engine answers there (or the
            # SSH user may not use it) and its default daemon does not remap.
            raise ProviderError(
                f"engine {self._engine} does not remap user namespaces (no box engine answers at "
                f"{_box_engine.REMOTE_BOX_ENGINE} there for this SSH user, and its default Docker daemon does "
                f"not remap), so root in a box would be root on that host: "
                + _box_engine.remote_setup_hint(self._engine),
                box=name,
                operation="create",
            )
        return remapped or (0, 0)

    def _calls(self) -> EngineAPI | SDKEngine:
        """The client of a box's create and removal: the standard-library one where it reaches the
        engine, else the SDK's (TLS, ssh) behind the same methods."""
        if self._direct is not None:
            return self._direct
        return SDKEngine(self.api, self._engine)

    @contextlib.contextmanager
    def _calling(self, name: str, operation: str) -> Iterator[EngineAPI | SDKEngine]:
        """_calls(), with an engine that does not answer and its error answers turned into the
        provider's errors."""
        try:
            yield self._calls()
        except EngineUnanswered as exc:
            raise engine_unreachable(self._engine, exc, self._docker_host) from exc
        except EngineAPIError as exc:
            raise ProviderError(exc.message, box=name or None, operation=operation) from exc

    @staticmethod
    def _remove_half_made(
        engine: EngineAPI | SDKEngine,
        container: str | None,
        volume: str | None,
        box: str | None = None,
        layers: dict[str, str] | None = None,
    ) -> None:
        """Undo a create by what it made: the container by its id, the volumes it made by name."""
        if container is not None:
            with contextlib.suppress(EngineAPIError, EngineUnanswered):
                engine.remove_container(container, force=True, volumes=True)
        # The box's git layers: each overlay, then its upper and work volumes (named by this box's id).
        # The box's editor server volumes were made in the same run as its volume: both are ours.
        names = [layer + suffix for layer in layers or {} for suffix in ("", "-upper", "-work")]
        names += [volume, *(_editor_volumes.per_box_volumes(box) if volume and box else [])] if volume else []
        for name in names:
            with contextlib.suppress(EngineAPIError, EngineUnanswered):
                engine.remove_volume(name, force=True)

    def write_secrets(self, name: str, secrets: dict[str, str]) -> None:
        """Secrets go to a tmpfs file each: never in env, labels or the writable layer.

        Written through exec's stdin: the engine's archive API cannot reach into a tmpfs mount.
        """
        for key in secrets:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", key) or key.startswith("."):
                raise ProviderError(
                    f"secret name {key!r} must be 1-128 characters from A-Z, a-z, 0-9, '_', '.', '-'",
                    box=name,
                    operation="create",
                )
        self.exec(
            name, ["install", "-d", "-m", "0700", "-o", BOX_USER, "-g", BOX_USER, SECRETS_DIR], user="root"
        ).check("making the secrets directory", name)
        for key, value in secrets.items():
            self.exec(
                name,
                ["sh", "-c", 'umask 077 && cat > "$0/$1"', SECRETS_DIR, key],
                user=BOX_USER,
                stdin=value.encode("utf-8"),
            ).check(f"writing secret {key}", name)

    def _box_attrs(
        self, engine: EngineAPI | SDKEngine, name: str, operation: str, container: str | None = None
    ) -> dict[str, Any]:
        """The box's container as the engine inspects it (by `container`, its id, once known)."""
        attrs = engine.inspect_container(container or container_name(name))
        if attrs is None:
            raise BoxNotFound(f"no box called {name!r} on engine {self._engine}", box=name, operation=operation)
        return _claimed.as_box(engine, attrs)

    def _facts_of(self, attrs: dict[str, Any]) -> BoxFacts:
        return self._facts(_Summary(str(attrs.get("Name", "")).lstrip("/"), attrs))

    def _current(self, name: str, operation: str) -> BoxFacts:
        with self._calling(name, operation) as engine:
            return self._facts_of(self._box_attrs(engine, name, operation))

    def _transition(self, name: str, operation: str, method: str, wanted: str) -> BoxFacts:
        """`method` (start/pause/unpause_container) on the box's container, then its facts, which
        must say `wanted`."""
        with self._calling(name, operation) as engine:
            container = str(self._box_attrs(engine, name, operation)["Id"])
            if method == "pause_container":
                pause_patiently(engine.pause_container, container)
            else:
                getattr(engine, method)(container)
            attrs = self._box_attrs(engine, name, operation, container)
            if method == "start_container":
                _claimed.reattach(engine, attrs)  # a claimed box's workspace mounts, in its new namespace
            facts = self._facts_of(attrs)
        if facts.state != wanted:
            raise ProviderError(f"box is {facts.state}, expected {wanted}", box=name, operation=operation)
        return facts

    def start(self, name: str) -> BoxFacts:
        facts = self._current(name, "start")
        if facts.state == "paused":
            return self.resume(name)
        if facts.state == "running":
            return facts
        return self._transition(name, "start", "start_container", "running")

    def stop(self, name: str) -> BoxFacts:
        facts = self._current(name, "stop")
        if facts.state == "paused":
            self._transition(name, "stop", "unpause_container", "running")
        if facts.state == "stopped":
            return facts
        with self._calling(name, "stop") as engine:
            container = str(self._box_attrs(engine, name, "stop")["Id"])
            engine.stop_container(container, timeout=10)
            return self._facts_of(self._box_attrs(engine, name, "stop", container))

    def pause(self, name: str) -> BoxFacts:
        facts = self._current(name, "pause")
        if facts.state == "paused":
            return facts
        if facts.state != "running":
            raise ProviderError("only a running box can be paused; start it first", box=name, operation="pause")
        return self._transition(name, "pause", "pause_container", "paused")

    def resume(self, name: str) -> BoxFacts:
        facts = self._current(name, "resume")
        if facts.state == "running":
            return facts
        if facts.state == "stopped":
            return self._transition(name, "start", "start_container", "running")
        return self._transition(name, "resume", "unpause_container", "running")

    def destroy(self, name: str) -> None:
        with self._calling(name, "destroy") as engine:
            pooled_as = _claimed.pooled_as(engine, name)  # a claimed box: its pooled box's volumes go too
            with contextlib.suppress(_Gone):
                _or_gone(engine.remove_container, container_name(name), force=True, volumes=True)
            _claimed.remove_pool_volumes(engine, pooled_as)
            for volume_name in (docker_volume_name(name), *_editor_volumes.per_box_volumes(name)):
                with contextlib.suppress(_Gone):
                    _or_gone(engine.remove_volume, volume_name, force=True)
            remove_layers(engine, name)

    def destroy_if_id(self, name: str, box_id: str) -> bool:
        """Remove the container and volume of box `box_id` only: by the engine's id once the label
        matched, so a container someone else made under this name in between is never hit."""
        removed = False
        with self._calling(name, "undo create") as engine:
            attrs = engine.inspect_container(container_name(name))
            attrs = _claimed.as_box(engine, attrs) if attrs is not None else None
            pooled_as = _claimed.pooled_as(engine, name)
            if attrs is not None and ((attrs.get("Config") or {}).get("Labels") or {}).get(label("id")) == box_id:
                with contextlib.suppress(_Gone):
                    _or_gone(engine.remove_container, str(attrs["Id"]), force=True, volumes=True)
                    removed = True
                _claimed.remove_pool_volumes(engine, pooled_as)
            for volume_name in (docker_volume_name(name), *_editor_volumes.per_box_volumes(name)):
                try:
                    volume = engine.inspect_volume(volume_name)
                    if volume is not None and (volume.get("Labels") or {}).get(label("id")) == box_id:
                        engine.remove_volume(volume_name, force=True)
                except EngineAPIError:
                    pass  # gone, or in use by the container of the run that won the name
            remove_layers(engine, name, box_id)
        return removed

    def remove_leftover_volumes(self, name: str) -> list[dict[str, Any]]:
        wanted = [f"{label('box')}={name}", f"{label('kind')}=volume"]
        removed = []
        with self._calling(name, "destroy") as engine:
            # Commits still in the box's git layers are brought into the host before the layers go.
            rescue_commits(engine, name)
            for volume in engine.volumes(wanted):
                try:
                    engine.remove_volume(str(volume["Name"]), force=True)
                except EngineAPIError as exc:
                    if exc.status == 404:
                        continue
                    raise
                removed.append({"name": volume["Name"], "labels": volume.get("Labels") or {}})
            # The box's git layers too (a box's commits not yet fetched go with them).
            removed += [{"name": layer, "labels": {}} for layer in remove_layers(engine, name)]
        return removed

    # -- inside the box -------------------------------------------------------------------------
    def run_command(self, name: str, command: Command) -> ExecResult:
        cname = container_name(name)
        argv, user, workdir, env, stdin = command.argv, command.user, command.workdir, command.env, command.stdin
        # The time bound on the local engine's own client; the SDK's (remote engines) has none.
        try:
            with self._engine_call(name, "exec") as engine:  # the read itself stops at command.limit
                bound = {"timeout": command.timeout} if isinstance(engine, EngineAPI) and command.timeout is not None else {}
                rc, stdout, stderr = engine.exec(cname, argv, user=user, workdir=workdir, env=env, stdin=stdin,
                                                 max_output=command.limit, **bound)
        except OutputTooLarge as exc:
            raise OutputTooLarge(str(exc), box=name) from exc
        return ExecResult(rc=rc, stdout=stdout, stderr=stderr)

    def put_archive(self, name: str, path: str, tar_stream: Iterable[bytes] | IO[bytes]) -> None:
        with self._engine_call(name, f"copy into {path}") as engine:
            engine.put_archive(container_name(name), path, tar_stream)

    def get_archive(self, name: str, path: str) -> Iterator[bytes]:
        with self._engine_call(name, "copy out", f"{path} does not exist in the box") as engine:
            return engine.get_archive(container_name(name), path)

    # -- images and checkpoints -----------------------------------------------------------------
    def checkpoint_store(self) -> Any:
        """The engine side of checkpoints: images on this engine (_image_store)."""
        from ._image_store import ImageStore  # lazy: only checkpoints need it

        return ImageStore(self, self._calls)

    def pool_store(self) -> Any:
        """The engine side of the warm pool: pooled containers on this engine (_pool_containers)."""
        from ._pool_containers import PoolContainers  # lazy: only the pool needs it

        return PoolContainers(self._calls, self._engine, self._facts_of)

    def image_exists(self, image: str) -> bool:
        with self._calling("", "image lookup") as engine:
            return engine.inspect_image(image) is not None

    def bring_image(self, image: str) -> dict[str, Any]:
        from . import _image_transfer  # only remote engines need it: local creates do not import it

        return _image_transfer.ensure_image(self, image).to_dict()

    def image_labels(self, image: str) -> dict[str, str]:
        with self._calling("", "image lookup") as engine:
            attrs = engine.inspect_image(image) or {}
        return (attrs.get("Config") or {}).get("Labels") or {}

    def probe_image(self, image: str, argv: list[str], user: str = BOX_USER, timeout: float = 60) -> ExecResult | None:
        with self._calling("", "probe of the image") as engine:
            rc, out, err = probe_in_image(engine, image, argv, user, timeout, isinstance(engine, EngineAPI))
        return ExecResult(rc=rc, stdout=out, stderr=err)

    def commit(self, name: str, image: str, labels: dict[str, str], env: list[str] | None = None) -> dict[str, Any]:
        repository, _sep, tag = image.rpartition(":")
        conf: dict[str, Any] = {"Labels": labels}
        if env is not None:
            conf["Env"] = env  # the image's own environment, not the box's (see _ckpt_env)
        with self._calling(name, "checkpoint") as engine:
            container = str(self._box_attrs(engine, name, "checkpoint")["Id"])
            image_id = engine.commit_container(container, repository, tag, conf, pause=True)
            attrs = engine.inspect_image(image_id) or {}
        return {"id": image_id, "size": attrs.get("Size", 0)}
