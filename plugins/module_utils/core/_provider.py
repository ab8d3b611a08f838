# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one provider interface every box operation goes through.

Modules, the inventory plugin and the connection plugin talk only to `Provider`. A provider
is one place per backend (local Docker, Docker over SSH, Daytona) that knows how to create,
find, change and run commands in a box. Workspace seeding (`_seed`) and checkpoints
(`_checkpoint`) are written once against this interface.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ..egress._egress_policy import EgressPolicy

# The errors live at the bottom rank (_errors), re-exported here: modules, plugins and tests import them from _provider.
from ._errors import (  # noqa: F401  # pylint: disable=unused-import
    BoxNotFound,
    EngineUnreachable,
    ExecTimedOut,
    OutputTooLarge,
    ProviderError,
)

BOX_STATES = ("running", "paused", "stopped", "missing")
# How much of a text the box wrote (an exec's output, a failure line) a message on the host carries.
BOX_TEXT_LIMIT = 2000
# How much of a command's output (stdout and stderr together) the host reads from a box unless the caller
# says otherwise: what a box prints is the box's to choose, and the host's memory is not (docs/architecture.md,
# "Reads of what a box wrote"). Reads of named box data pass their own, smaller caps.
EXEC_OUTPUT_LIMIT = 16 << 20
# Refusals go to the host's log (the relay's relay.log) as one line each; a task's own error says it too.
LOG = logging.getLogger("agentbox")
LOG.addHandler(logging.NullHandler())  # no stray lines on a task's stderr where nothing set up logging


@dataclasses.dataclass
class ExecResult:
    rc: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    def check(self, what: str, box: str | None = None) -> ExecResult:
        if self.rc != 0:
            detail = (self.stderr or self.stdout).decode("utf-8", "replace").strip()[-BOX_TEXT_LIMIT:]
            raise ProviderError(f"{what} exited {self.rc}: {detail}", box=box)
        return self


class CappedOutput:
    """A command's stdout and stderr as the host collects them, at most `limit` bytes of the two
    together (None: no cap). Every provider's exec reads through one: once the output passes the cap
    nothing more is kept, the provider stops reading (closing its stream) and raises refused()."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.size = 0
        self.over = False
        self._parts: dict[bool, list[bytes]] = {False: [], True: []}

    def room(self, size: int) -> bool:
        """Whether `size` more bytes stay within the cap: a transport that announces a frame's size
        asks before reading the frame."""
        return self.limit is None or self.size + size <= self.limit

    def add(self, data: bytes, stderr: bool = False) -> bool:
        """Keep `data`; False, keeping nothing, once the output is past the cap (stop reading then)."""
        if self.over or not self.room(len(data)):
            self.over = True
            return False
        self.size += len(data)
        self._parts[stderr].append(data)
        return True

    def refused(self, argv: list[str], box: str | None = None) -> OutputTooLarge:
        return OutputTooLarge(f"{argv[0] if argv else 'the command'} printed more than the {self.limit} bytes the "
                              "host reads: refused", box=box)

    def result(self, rc: int) -> ExecResult:
        return ExecResult(rc=rc, stdout=b"".join(self._parts[False]), stderr=b"".join(self._parts[True]))


def too_large(box: str, what: str, limit: int) -> OutputTooLarge:
    """The refusal of box data over its cap: the box's own error, and one line in the host's log."""
    message = (f"the box's {what} is over {limit} bytes: refused, the host reads no more of it (the box may have "
               "been tampered with: see what in it writes that, or destroy it)")
    LOG.warning("box %s: %s", box, message)
    return OutputTooLarge(message, box=box)


@dataclasses.dataclass(frozen=True)
class Command:
    """One command to run in a box, as Provider.exec was given it: what each provider's run_command takes."""

    argv: list[str]
    user: str | None = "vscode"
    workdir: str | None = None
    env: dict[str, str] | None = None
    stdin: bytes | IO[bytes] | None = None
    timeout: float | None = None
    # At most this many bytes of output read (CappedOutput), None: all of it.
    limit: int | None = None


@dataclasses.dataclass
class SshProxy:
    """How `ssh agentbox-<box>` reaches the box's sshd from this machine (Provider.ssh_proxy)."""

    argv: list[str]  # a command whose standard input and output are the box's `sshd -i`
    expires_at: str | None = None  # when the access it carries runs out (a Daytona gateway token)
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class BoxSpec:
    """Everything a provider needs to create a box. Built by the module from user options."""

    name: str
    box_id: str
    project: str
    workspace: str
    image: str
    labels: dict[str, str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    # Container ports to publish; each gets an ephemeral port on the engine's 127.0.0.1.
    ports: list[int] = dataclasses.field(default_factory=list)
    # memory (bytes or '2g'), cpus (float), pids_limit (int)
    resources: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Host directories bind-mounted at the same path (local engine only: the workspace .git dirs).
    bind_paths: list[str] = dataclasses.field(default_factory=list)
    # Host directory -> path in the box, bound read-only (local engine only: the relay's socket directory).
    mounts: dict[str, str] = dataclasses.field(default_factory=dict)
    # Per-box secrets: written to a tmpfs in the box (/run/agentbox/secrets), never in env/labels.
    secrets: dict[str, str] = dataclasses.field(default_factory=dict)
    # The box has an egress policy: its only way out is the host's gateway (docs/egress.md).
    egress: bool = False

    def box_env(self) -> dict[str, str]:
        """The box's environment: who it is and where its workspace lives, then the user's own variables."""
        return {
            "AGENTBOX": "1",
            "AGENTBOX_BOX_NAME": self.name,
            "AGENTBOX_BOX_ID": self.box_id,
            "AGENTBOX_PROJECT": self.project,
            "AGENTBOX_HOST_WORKSPACE": self.workspace,
            **self.env,
        }


@dataclasses.dataclass
class BoxFacts:
    """What is known of one box; returned by every module under the key `box`."""

    name: str
    id: str
    provider: str
    engine: str
    state: str
    container: str
    image: str
    project: str
    workspace: str
    branch: str
    created: str
    ports: dict[str, int] = dataclasses.field(default_factory=dict)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    checkpoint: str | None = None
    web_url: str | None = None
    # The engine deletes the box as soon as it stops (a Daytona box made with `ephemeral`): the idle policies
    # leave it to the engine's own auto-stop, since a pause or stop from here would delete it.
    ephemeral: bool = False

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: its deep copy is most of an inventory's per-box cost. Only these two hold containers.
        facts = dict(self.__dict__)
        facts["ports"], facts["labels"] = dict(self.ports), dict(self.labels)
        return facts


def worktree_records(facts: BoxFacts) -> list[dict[str, str]]:
    """The box's worktrees as its `worktrees` label records them ([] when it has none)."""
    raw = facts.labels.get("worktrees")
    if not raw:
        return []
    try:
        return json.loads(raw)
    except ValueError:
        return []


class Provider(abc.ABC):
    """One backend. Methods take box names (validated by `_naming`) and raise ProviderError."""

    #: 'docker', 'docker_ssh' or 'daytona'
    name: str = ""
    #: True when host paths can be bind-mounted into boxes (the local engine): seeding then
    #: uses a git worktree on the host's .git; otherwise it ships a clone.
    shares_host_filesystem: bool = False
    #: How the host relay reaches a box: 'socket' (a unix socket bound into the box), 'tunnel' (over
    #: the engine's SSH connection) or 'poll' (the box cannot reach the host: the relay collects a
    #: queue in the box through exec, checking first that the box runs so a poll never wakes it).
    relay_channel: str = "socket"
    # Capabilities: what differs between providers, asked by the workflows instead of a provider's name.
    #: Boxes run on an engine that may lack the controller's images (a remote Docker engine): create
    #: brings the image there first (`bring_image`).
    transfers_images: bool = False
    #: A resume restarts the box's processes and empties its tmpfs (a Daytona pause is a stop): the
    #: box's keys and access are set up again after one.
    resume_restarts_processes: bool = False
    #: Taking a checkpoint stops the box (a Daytona snapshot): a request from inside the box is answered first.
    snapshot_stops_box: bool = False
    #: The provider's client may serve several threads at once (the local engine): per-box probes run side by side.
    thread_safe_client: bool = False
    #: How a port of a box is reached from this machine: 'published' (a port on this machine's 127.0.0.1, listed
    #: in BoxFacts.ports), 'forwarded' (a port on a remote engine's 127.0.0.1, listed in BoxFacts.ports and reached
    #: through forward_port), 'signed' (preview_url signs a URL that expires) or 'exposed' (preview_url answers
    #: the public URL of a port the box exposed at create, which does not expire).
    port_urls: str = "published"
    #: The box is a container on this machine's Docker engine: an editor's Dev Containers extension attaches to it.
    attaches_dev_containers: bool = False
    # The address of this machine's engine that holds the box's container, for an editor or CLI
    # that attaches it (None: the CLI's default engine).
    docker_host: str | None = None
    #: Boxes run the collection's image unchanged, so a user's ids are the image's (vscode 1000:1000, root 0:0)
    #: and the connection plugin need not ask the box.
    image_user_ids: bool = False
    #: The SSH access a proxy carries runs out (a Daytona gateway token): when ssh is refused on a running box,
    #: the alias's wake asks the provider for new access instead of starting the box.
    ssh_access_expires: bool = False
    #: The longest box name a box of this provider can take (the name rule allows 63): a Docker box's
    #: hostname is agentbox-<box>, which Linux caps at 64 characters. Create refuses a longer one first.
    max_box_name: int = 63

    @property
    def holds_egress(self) -> bool:
        """A new box of this provider can be held to the host's egress gateway (docs/egress.md): the local box
        engine only."""
        return False

    def egress_network(self, policy: EgressPolicy) -> bool:
        """Hold the boxes this provider creates to `policy` with its own network setting instead of the gateway
        (Daytona's, boxd's: docs/egress.md "Daytona and boxd"): True when it does; False when it has none
        (the box would have the open network). ProviderError names what to write when the policy cannot be
        expressed there, or the `network` create option was given too (one or the other)."""
        return False

    def __init__(self) -> None:
        # What warn() left for the task's output until take_warnings() hands it over.
        self.pending_warnings: list[str] = []

    @property
    @abc.abstractmethod
    def engine(self) -> str:
        """Where boxes live: 'local', an SSH destination, or an API URL."""

    # -- discovery --------------------------------------------------------------------------
    @abc.abstractmethod
    def find(self, name: str) -> BoxFacts | None:
        """The box called `name`, or None."""

    @abc.abstractmethod
    def list_boxes(self, project: str | None = None) -> list[BoxFacts]:
        """Every box on this engine (of one project when given), found by its labels."""

    # -- lifecycle --------------------------------------------------------------------------
    @abc.abstractmethod
    def create(self, spec: BoxSpec) -> BoxFacts:
        """Create and start the box; nothing is seeded yet. Removes what it made on failure."""

    @abc.abstractmethod
    def start(self, name: str) -> BoxFacts: ...

    @abc.abstractmethod
    def stop(self, name: str) -> BoxFacts: ...

    @abc.abstractmethod
    def pause(self, name: str) -> BoxFacts: ...

    @abc.abstractmethod
    def resume(self, name: str) -> BoxFacts: ...

    @abc.abstractmethod
    def destroy(self, name: str) -> None:
        """Remove the box and its per-box volumes. A missing box is not an error."""

    def destroy_if_id(self, name: str, box_id: str) -> bool:
        """Remove the box only if it is the one with id `box_id` (undo of a create: another run may
        own the name by now). True when it was removed."""
        try:
            facts = self.find(name)
        except ProviderError:
            return False  # something not made by agentbox carries the name: not ours to touch
        if facts is None or facts.id != box_id:
            return False
        self.destroy(name)
        return True

    def remove_leftover_volumes(self, name: str) -> list[dict[str, Any]]:
        """Per-box volumes of a box whose container is gone, removed: [{name, labels}]. The caller
        has found no box of that name (a volume in use by a container is refused by the engine)."""
        return []

    # -- inside the box ---------------------------------------------------------------------
    def exec(
        self,
        name: str,
        argv: list[str],
        *,
        user: str = "vscode",
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | IO[bytes] | None = None,
        timeout: float | None = None,
        limit: int | None = EXEC_OUTPUT_LIMIT,
        what: str | None = None,
    ) -> ExecResult:
        """Run argv in the box and wait; stdout and stderr kept apart, exit code exact. `timeout` (and any
        exec_deadline around the call, whichever ends first): ExecTimedOut past it, where the provider bounds
        an exec's time (the local engine, Daytona, boxd). The host reads at most `limit` bytes of output
        (None: all, for the user's own commands only): past it the provider stops reading and the box gets
        OutputTooLarge, "the box's <what> is over <limit> bytes", logged as one line on the host (too_large)."""
        try:
            return self.run_command(name, Command(argv, user, workdir, env, stdin, exec_time_left(timeout), limit))
        except OutputTooLarge as exc:
            raise too_large(name, what or f"output of {argv[0] if argv else 'a command'}", limit or 0) from exc

    def run_command(self, name: str, command: Command) -> ExecResult:
        """exec's work, the one method a provider writes for it: it reads the output through
        CappedOutput(command.limit) and raises its refused() past the cap."""
        raise NotImplementedError(f"the {self.name!r} provider runs no commands")

    @abc.abstractmethod
    def put_archive(self, name: str, path: str, tar_stream: Iterable[bytes] | IO[bytes]) -> None:
        """Extract a tar stream at `path` in the box (streamed, never buffered whole)."""

    @abc.abstractmethod
    def get_archive(self, name: str, path: str) -> Iterator[bytes]:
        """A tar stream of `path` in the box."""

    @abc.abstractmethod
    def write_secrets(self, name: str, secrets: dict[str, str]) -> None:
        """Each secret a file `SECRETS_DIR/<key>` on the box's tmpfs, 0600 and the box user's, its value
        through exec's stdin: never in env, labels, a layer or a checkpoint. Create writes BoxSpec.secrets;
        a workflow writes again what a stop emptied (the screen's VNC password). A file already there is replaced."""

    # -- images and checkpoints -------------------------------------------------------------
    @abc.abstractmethod
    def image_exists(self, image: str) -> bool: ...

    def image_labels(self, image: str) -> dict[str, str]:
        """Labels of an image (or snapshot) on this engine; {} when absent or unsupported."""
        return {}

    def bring_image(self, image: str) -> dict[str, Any]:
        """Put `image` on this provider's engine when it lacks it (only asked when `transfers_images`);
        what was done, as create reports it under `image_transfer`."""
        raise ProviderError(f"the {self.name!r} provider does not transfer images")

    def probe_image(self, image: str, argv: list[str], user: str = "vscode", timeout: float = 60) -> ExecResult | None:
        """argv run as `user` in a throwaway container of `image` that is never a box (gone after); None where
        the provider cannot run one without making a box (the clouds)."""
        return None

    def checkpoint_store(self) -> Any:
        """The engine side of this provider's checkpoints, which _checkpoint works through: images on
        a Docker engine (_image_store), snapshots on a cloud (_snapshot_store)."""
        raise ProviderError(f"checkpoints are not supported on the {self.name!r} provider")

    @abc.abstractmethod
    def commit(self, name: str, image: str, labels: dict[str, str], env: list[str] | None = None) -> dict[str, Any]:
        """Capture the box's filesystem as `image` (layered), with `env` as its Env when given (the
        image's own, never the box's runtime env). Returns {'id', 'size'}."""

    def preview_url(self, name: str, port: int, expires_in: int) -> str:
        """A URL of a port of the box, for a provider whose port_urls is not 'published' (`expires_in`
        seconds for a signed one)."""
        raise ProviderError(f"the {self.name!r} provider hands out no preview URLs: use the box's published ports")

    def ssh_proxy(self, name: str) -> SshProxy:
        """How `ssh agentbox-<name>` reaches the box's sshd (the box runs and has its host key)."""
        raise ProviderError(f"`ssh agentbox-<box>` does not reach {self.name} boxes", box=name, operation="SSH access")

    def terminal_command(self, facts: BoxFacts, command: str, ssh: str = "ssh") -> str:
        """The shell line that runs `command` (shell text) as the box user on this machine's terminal. `ssh`:
        how to call ssh so it finds the alias (_access.ssh_program), for a provider that goes through it."""
        return f"{ssh} -t agentbox-{facts.name} {command}"  # the alias _access writes (_ssh_proxy.alias)

    def forward_port(self, name: str, published: int, local_port: int | None) -> tuple[int, int]:
        """For port_urls 'forwarded': start a forward of the engine's port `published` to this machine's
        127.0.0.1 (`local_port`, or a free one). Returns (pid of the forward, local port)."""
        raise ProviderError(f"the {self.name!r} provider forwards no ports", box=name, operation="port forward")

    def port_relay_argv(self, name: str, port: int) -> list[str]:
        """A command for this machine whose standard input and output are a TCP connection to the box's own
        127.0.0.1:`port` (through the engine, never a container's IP): agentbox_forward runs one per connection
        of a port the box did not publish at create."""
        raise ProviderError(f"the {self.name!r} provider forwards no ports but its preview URLs", box=name,
                            operation="port forward")  # fmt: skip

    def reopen_environment(self) -> dict[str, str]:
        """Environment variables (never a secret) another process needs to reach the same engine, with
        reopen_options: what this process was told outside its options (a DOCKER_HOST)."""
        return {}

    def discard(self) -> None:
        """Drop this provider after its engine failed: close it and any connection shared with other
        providers of the same engine in this process, so the next one connects afresh."""
        self.close()

    def warn(self, message: str) -> None:
        """Leave a warning for the task's output (take_warnings hands it over)."""
        self.pending_warnings.append(message)

    def take_warnings(self) -> list[str]:
        """The warnings the provider's calls left since the last take (e.g. a Daytona image sent by a tag that
        may move), once: the list is emptied."""
        taken, self.pending_warnings = self.pending_warnings, []
        return taken

    def reopen_options(self) -> dict[str, Any]:
        """The settings with which another process on this machine (the relay, the SSH alias's wake) makes a
        provider for the same boxes: `get_provider(self.name, **options)`. Never a secret: that process reads
        its API key from its own environment."""
        return {}

    def check_can_create(self, name: str, egress: bool = False) -> None:  # noqa: B027 - optional hook: most providers can always
        """Refuse, before anything is made or sent, a box this provider cannot make as asked (a Docker
        engine where root in the box would be root on its host, unless isolation none was asked for; `egress`:
        a box with an egress policy, on a network whose only way out is the host's gateway)."""

    def close(self) -> None:  # noqa: B027 - optional hook: most providers hold nothing to release
        """Release connections. Safe to call twice."""


# The end (time.monotonic) of every exec in the box made inside exec_deadline(): a workflow that runs several
# execs in a box that may never answer (a hostile box's replaced git) bounds them all at once, without each
# helper on the way passing a timeout along.
_EXEC_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("agentbox_exec_deadline", default=None)


def own_network(provider: str, network_given: bool, mapped: Callable[[], Any], hint: str) -> Any:
    """An egress policy as `provider`'s own network setting (Daytona's, boxd's: docs/egress.md "Daytona and
    boxd"): what `mapped` makes of it. ProviderError when the `network` create option was given too (`hint`
    says how the two relate), or when the policy cannot be said there (the mapping's ValueError, which names
    what to write instead)."""
    if network_given:
        raise ProviderError(f"egress and network were both given: a {provider} box's network is one or the other "
                            f"({hint}); drop one")
    try:
        return mapped()
    except ValueError as exc:
        raise ProviderError(str(exc)) from None


@contextlib.contextmanager
def exec_deadline(seconds: float | None) -> Iterator[None]:
    """Every Provider.exec inside ends within `seconds` from now, all of them together (None: no bound);
    past it, ExecTimedOut. An outer deadline that ends first still applies."""
    if seconds is None:
        yield
        return
    ends = time.monotonic() + max(0.0, seconds)
    outer = _EXEC_DEADLINE.get()
    token = _EXEC_DEADLINE.set(ends if outer is None else min(ends, outer))
    try:
        yield
    finally:
        _EXEC_DEADLINE.reset(token)


def exec_time_left(timeout: float | None = None) -> float | None:
    """Seconds an exec may take now: its own `timeout` or what is left of exec_deadline, whichever is less."""
    ends = _EXEC_DEADLINE.get()
    if ends is None:
        return timeout
    left = max(0.0, ends - time.monotonic())
    return left if timeout is None else min(timeout, left)


def read_box_file(provider: Provider, box: str, path: str, what: str, limit: int, *, user: str = "root") -> bytes | None:
    """The file at `path` in the box, `what` in messages, refused (too_large) past `limit` bytes. The
    cap is in the exec itself, `head -c` reading one byte past it, and on the host, which reads no
    more than that even from a box that replaced head. None when the box has no such file (or head
    cannot read it)."""
    argv = ["head", "-c", str(limit + 1), "--", path]
    try:
        # Beyond the cap, room for head's own error line.
        run = provider.run_command(box, Command(argv, user, timeout=exec_time_left(), limit=limit + 1 + BOX_TEXT_LIMIT))
    except OutputTooLarge as exc:
        raise too_large(box, what, limit) from exc
    if run.rc != 0:
        return None
    if len(run.stdout) > limit:
        raise too_large(box, what, limit)
    return run.stdout
