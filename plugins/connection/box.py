# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: box
short_description: Run tasks inside an agentbox box, on any provider
version_added: 0.1.0
description:
  - Runs commands in a box through the collection's provider interface, so the same plugin reaches boxes on
    the local Docker engine, on Docker engines over SSH and on Daytona.
  - Commands run as C(vscode) unless O(remote_user) says otherwise; C(become) uses C(sudo) inside the box.
  - Files are copied in and out as tar streams, a chunk at a time (binary-safe, any file name).
  - Pipelining is on by default; every module then costs one exec in the box.
  - A paused box is resumed first (O(auto_resume)) and a stopped one started (O(auto_start), with its boot
    sequence, SSH keys and agents, as C(box_state.yml -e state=started) does); a missing box makes the host
    unreachable.
  - The P(agentbox.box.boxes#inventory) inventory plugin sets every variable this plugin needs.
author:
  - agentbox.box developers (@agentbox)
options:
  box:
    description:
      - The box's name. The inventory plugin sets C(agentbox_box); otherwise the inventory host name is used.
    type: str
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: agentbox_box
  provider:
    description: Where the box lives, V(docker), V(docker_ssh) or V(daytona).
    type: str
    default: docker
    choices: [docker, docker_ssh, daytona, boxd]
    vars:
      - name: agentbox_provider
  engine:
    description:
      - V(local) for the local engine (C(DOCKER_HOST) honoured), an SSH destination for V(docker_ssh), the API URL
        for V(daytona).
    type: str
    default: local
    vars:
      - name: agentbox_engine
  remote_user:
    description:
      - The user commands run as in the box. Default V(vscode), the box's user.
    type: str
    ini:
      - section: defaults
        key: remote_user
    env:
      - name: ANSIBLE_REMOTE_USER
    vars:
      - name: ansible_user
      - name: agentbox_user
    cli:
      - name: user
    keyword:
      - name: remote_user
  auto_resume:
    description:
      - Resume a paused box before running the task. With V(false) a paused box makes the host unreachable,
        with a message saying how to resume it.
    type: bool
    default: true
    vars:
      - name: agentbox_auto_resume
    env:
      - name: AGENTBOX_AUTO_RESUME
  auto_start:
    description:
      - Start a stopped box (for instance one the idle policy stopped, docs/idle.md) before running the task.
        With V(false) a stopped box makes the host unreachable, with a message saying how to start it.
    type: bool
    default: true
    vars:
      - name: agentbox_auto_start
    env:
      - name: AGENTBOX_AUTO_START
  pipelining:
    description:
      - Send modules to the box on the standard input of one exec instead of copying them first.
      - On by default, since there is no C(requiretty) in a box and it saves several execs per task.
    type: bool
    default: true
    env:
      - name: ANSIBLE_PIPELINING
    ini:
      - section: defaults
        key: pipelining
      - section: connection
        key: pipelining
    vars:
      - name: ansible_pipelining
      - name: agentbox_pipelining
  working_dir:
    description: Directory commands start in. Default the image's working directory.
    type: str
    vars:
      - name: agentbox_working_dir
  extra_env:
    description: Extra environment variables for every command (as Ansible variables only).
    type: dict
    vars:
      - name: agentbox_extra_env
  ssh_private_key_file:
    description: Private key for reaching the engine with V(docker_ssh). Default the SSH agent and C(~/.ssh/config).
    type: path
    vars:
      - name: agentbox_ssh_private_key_file
  ssh_strict_host_key_checking:
    description: Check the engine's host key with V(docker_ssh).
    type: bool
    default: true
    vars:
      - name: agentbox_ssh_strict_host_key_checking
  daytona_api_url:
    description: Daytona API URL. Default C(DAYTONA_API_URL).
    type: str
    vars:
      - name: agentbox_daytona_api_url
  daytona_target:
    description: Daytona target. Default C(DAYTONA_TARGET).
    type: str
    vars:
      - name: agentbox_daytona_target
  daytona_api_key:
    description:
      - Daytona API key. Default C(DAYTONA_API_KEY). Keep it in a vault; it is never logged.
    type: str
    vars:
      - name: agentbox_daytona_api_key
  boxd_base_url:
    description: The boxd cluster. Default C(BOXD_BASE_URL).
    type: str
    vars:
      - name: agentbox_boxd_base_url
  boxd_org:
    description: The boxd org. Default C(BOXD_ORG).
    type: str
    vars:
      - name: agentbox_boxd_org
  boxd_api_key:
    description:
      - boxd API key. Default C(BOXD_API_KEY) (or C(BOXD_TOKEN)). Keep it in a vault; it is never logged.
    type: str
    vars:
      - name: agentbox_boxd_api_key
notes:
  - C(async) tasks run without pipelining (an ansible-core rule), so they cost a few more execs each.
  - A become password is accepted but not needed in agentbox boxes (C(vscode) has passwordless sudo).
"""

EXAMPLES = r"""
# inventory.ini: a box by name, on the local engine
# [boxes]
# fix-login ansible_connection=agentbox.box.box

# A box on a remote engine, reached over SSH, as root:
# fix-login ansible_connection=agentbox.box.box agentbox_provider=docker_ssh agentbox_engine=builder1 ansible_user=root
"""

import os
import posixpath
from typing import Any

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_native, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

try:
    # First: the module_utils below then load from Python's bytecode cache (plugin_utils/_bytecode.py).
    from ansible_collections.agentbox.box.plugins.plugin_utils import _bytecode

    _bytecode.install()

    # isort: split

    from ansible_collections.agentbox.box.plugins.module_utils.box._box import set_state
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import (
        BoxNotFound,
        EngineUnreachable,
        ProviderError,
    )
    from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import provider_settings, where
    from ansible_collections.agentbox.box.plugins.plugin_utils._filetar import (
        NotARegularFile,
        extract_single_file,
        single_file_tar,
    )
    from ansible_collections.agentbox.box.plugins.plugin_utils._providers import forget_provider, provider_for

    IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # pragma: no cover - reported on first use
    IMPORT_ERROR = exc

display = Display()

DEFAULT_USER = "vscode"
# The box user's ids are fixed by the image (CONTRACT: vscode is uid 1000): no lookup needed.
KNOWN_IDS = {"vscode": (1000, 1000), "root": (0, 0)}
MAX_SYMLINK_HOPS = 20
# Per process: (provider, engine, box, user) -> (uid, gid) of users other than the known ones.
_ID_CACHE: dict[tuple[str, str, str, str], tuple[int, int]] = {}
# Per process: (provider, engine, box, remote user, become user) -> sudo needs no password.
_SUDO_NOPASSWD: dict[tuple[str, str, str, str, str], bool] = {}


class Connection(ConnectionBase):
    """Tasks in a box through Provider.exec / put_archive / get_archive."""

    transport = "agentbox.box.box"
    has_pipelining = True
    has_tty = False
    default_user = DEFAULT_USER

    def __init__(self, play_context: Any, new_stdin: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(play_context, new_stdin, *args, **kwargs)
        self._provider: Any = None
        self._resumed_checked = False

    # -- options ------------------------------------------------------------------------------
    @property
    def _box(self) -> str:
        return self.get_option("box") or self._play_context.remote_addr

    @property
    def _provider_name(self) -> str:
        return self.get_option("provider") or "docker"

    @property
    def _engine(self) -> str:
        return self.get_option("engine") or "local"

    def _user(self) -> str:
        return self.get_option("remote_user") or DEFAULT_USER

    def _provider_options(self) -> dict[str, Any]:
        return provider_settings(self._provider_name, self.get_option)  # the registry's one table

    def _where(self) -> str:
        return f"box {self._box!r} ({where(self._provider_name, self._engine)})"

    # -- connect ------------------------------------------------------------------------------
    def _connect(self) -> Connection:
        if IMPORT_ERROR is not None:
            raise AnsibleError(f"the agentbox.box collection could not load its provider code: {IMPORT_ERROR}")
        if not self._connected:
            try:
                self._provider = provider_for(self._provider_name, self._engine, self._provider_options())
            except EngineUnreachable as exc:
                raise AnsibleConnectionFailure(f"{self._where()}: {exc}") from exc
            except ProviderError as exc:
                raise AnsibleConnectionFailure(f"{self._where()}: {exc}") from exc
            display.vvv(f"ESTABLISH AGENTBOX CONNECTION FOR USER: {self._user()}", host=self._box)
            self._connected = True
        return self

    def _ensure_running(self, failure: Exception) -> None:
        """An operation failed: find out why. Resume a paused box (once), else say unreachable."""
        try:
            facts = self._provider.find(self._box)
        except EngineUnreachable as exc:
            forget_provider(self._provider_name, self._engine, self._provider_options())
            self._connected = False
            raise AnsibleConnectionFailure(f"{self._where()}: {exc}") from exc
        except ProviderError as exc:
            raise AnsibleConnectionFailure(f"{self._where()}: {exc}") from exc
        if facts is None:
            raise AnsibleConnectionFailure(
                f"{self._where()} does not exist: create it (playbooks/create_box.yml -e box={self._box}) "
                "or refresh the inventory"
            ) from None
        if facts.state in ("paused", "stopped"):
            option = "auto_resume" if facts.state == "paused" else "auto_start"
            if self._resumed_checked or not self.get_option(option):
                raise AnsibleConnectionFailure(
                    f"{self._where()} is {facts.state}: start it with playbooks/box_state.yml -e box={self._box} "
                    f"-e state=started, or set agentbox_{option}=true"
                ) from None
            display.vv(f"{'resuming' if option == 'auto_resume' else 'starting'} {facts.state} box {self._box}",
                       host=self._box)  # fmt: skip
            try:
                # The collection's own start: a stopped box boots, gets its SSH keys and agents back.
                set_state(self._provider, facts, "started")
            except ProviderError as exc:
                raise AnsibleConnectionFailure(f"{self._where()}: waking it failed: {exc}") from exc
            self._resumed_checked = True
            return
        if facts.state == "running" and isinstance(failure, BoxNotFound) and not self._resumed_checked:
            # Not where the provider looked first, found by find() after all (a box of the user's engine,
            # made with isolation none or before the box engine): the provider now looks there. Retry once.
            self._resumed_checked = True
            return
        if facts.state == "running":
            # Running and reachable: the failure was the operation's own.
            raise AnsibleConnectionFailure(f"{self._where()}: {failure}") from failure
        raise AnsibleConnectionFailure(f"{self._where()} is {facts.state}") from failure

    def _call(self, operation: Any) -> Any:
        """Run operation(); a failure caused by a paused box resumes it and retries once."""
        try:
            return operation()
        except BoxNotFound as exc:
            self._ensure_running(exc)
        except EngineUnreachable as exc:
            forget_provider(self._provider_name, self._engine, self._provider_options())
            self._connected = False
            raise AnsibleConnectionFailure(f"{self._where()}: {exc}") from exc
        except ProviderError as exc:
            self._ensure_running(exc)
        try:
            return operation()
        except ProviderError as exc:
            raise AnsibleConnectionFailure(f"{self._where()}: {exc}") from exc

    # -- commands -----------------------------------------------------------------------------
    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        executable = self._play_context.executable or "/bin/sh"
        argv = [executable, "-c", to_text(cmd, errors="surrogate_or_strict")]
        user = self._user()
        stdin = in_data
        if sudoable and self.become and self.become.expect_prompt() and self._sudo_wants_password(user):
            # sudo -S reads the password line from stdin one byte at a time; the rest is the command's.
            password = self.become.get_option("become_pass") or ""
            stdin = to_bytes(password, errors="surrogate_or_strict") + b"\n" + (in_data or b"")
        display.vvv(f"EXEC {argv!r} as {user}", host=self._box)
        env = self.get_option("extra_env") or None
        workdir = self.get_option("working_dir") or None
        # The task's own command, whose output the user asked for: read whole, as any connection does.
        result = self._call(
            lambda: self._provider.exec(self._box, argv, user=user, workdir=workdir, env=env, stdin=stdin, limit=None)
        )
        return result.rc, result.stdout, result.stderr

    def _sudo_wants_password(self, user: str) -> bool:
        become_user = (self.become.get_option("become_user") if self.become else None) or "root"
        key = (self._provider_name, self._engine, self._box, user, become_user)
        if key not in _SUDO_NOPASSWD:
            probe = self._call(
                lambda: self._provider.exec(self._box, ["sudo", "-n", "-u", become_user, "true"], user=user)
            )
            _SUDO_NOPASSWD[key] = probe.rc == 0
        return not _SUDO_NOPASSWD[key]

    # -- files --------------------------------------------------------------------------------
    @staticmethod
    def _remote_path(path: str) -> str:
        # Ansible hands absolute paths; a relative one is taken from / (no home is guaranteed).
        return posixpath.normpath(posixpath.join("/", to_text(path, errors="surrogate_or_strict")))

    def _ids(self, user: str) -> tuple[int, int]:
        if user in KNOWN_IDS and self._provider.image_user_ids:
            return KNOWN_IDS[user]
        key = (self._provider_name, self._engine, self._box, user)
        if key not in _ID_CACHE:
            run = self._call(lambda: self._provider.exec(self._box, ["sh", "-c", "id -u && id -g"], user=user))
            fields = run.stdout.split()
            if run.rc != 0 or len(fields) != 2:
                detail = to_text(run.stderr or run.stdout, errors="surrogate_or_replace").strip()
                raise AnsibleConnectionFailure(f"{self._where()}: cannot find the ids of user {user!r}: {detail}")
            _ID_CACHE[key] = (int(fields[0]), int(fields[1]))
        return _ID_CACHE[key]

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        local = to_bytes(in_path, errors="surrogate_or_strict")
        if not os.path.exists(local):
            raise AnsibleFileNotFound(f"file or module does not exist: {to_native(in_path)}")
        remote = self._remote_path(out_path)
        directory, name = posixpath.split(remote)
        display.vvv(f"PUT {in_path} TO {remote}", host=self._box)
        uid, gid = self._ids(self._user())
        local_text = to_text(local, errors="surrogate_or_strict")

        def send() -> None:
            # A fresh stream per attempt: a retry after resuming must start from the first byte.
            self._provider.put_archive(self._box, directory, single_file_tar(local_text, name, uid, gid))

        try:
            self._call(send)
        except OSError as exc:
            raise AnsibleError(f"cannot read {in_path}: {exc}") from exc

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        remote = self._remote_path(in_path)
        display.vvv(f"FETCH {remote} TO {out_path}", host=self._box)
        local = to_bytes(out_path, errors="surrogate_or_strict")
        partial = local + b".agentbox-part"
        seen: set[str] = set()
        try:
            for _hop in range(MAX_SYMLINK_HOPS):
                if remote in seen:
                    raise AnsibleError(f"{self._where()}: {in_path} is a symbolic link loop")
                seen.add(remote)
                try:
                    with open(partial, "wb") as out:
                        self._call(
                            lambda path=remote: extract_single_file(self._provider.get_archive(self._box, path), out)
                        )
                except NotARegularFile as exc:
                    if exc.link_target is None:
                        raise AnsibleError(f"{self._where()}: cannot fetch {in_path}: {exc}") from exc
                    remote = posixpath.normpath(posixpath.join(posixpath.dirname(remote), exc.link_target))
                    continue
                os.replace(partial, local)
                return
            raise AnsibleError(f"{self._where()}: {in_path} goes through more than {MAX_SYMLINK_HOPS} links")
        finally:
            if os.path.exists(partial):
                os.unlink(partial)

    # -- lifecycle ----------------------------------------------------------------------------
    def reset(self) -> None:
        # meta: reset_connection / wait_for_connection: reconnect and re-learn ids and sudo.
        for cache in (_ID_CACHE, _SUDO_NOPASSWD):
            for key in [k for k in cache if k[2] == self._box]:
                del cache[key]
        self._resumed_checked = False
        self.close()

    def close(self) -> None:
        # The provider stays cached for the next task; nothing to tear down per task.
        self._connected = False
