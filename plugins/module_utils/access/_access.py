# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`ssh agentbox-<box>`: one SSH alias per box, kept in ~/.agentbox/ssh_config.

How a connection gets in: the alias's ProxyCommand runs the box's own sshd in inetd mode
(`sshd -i`) through `docker exec` (the local engine; DOCKER_HOST as it was when the entry was
written), or through `ssh <engine> docker exec ...` with the destination, key and known_hosts
the collection itself uses for that engine (remote engines), or through Daytona's SSH gateway with
an SSH access token (Daytona boxes, see _daytona_ssh), or through boxd's streaming exec (boxd
boxes, see _boxd_ssh). No port is published, no daemon has to run
in the box, and stop/start changes nothing in the entry (a Daytona box's token is renewed).

What the box gets (box_ready, on create, start and restore, as root through the provider; on create
in the boot's own exec, see folded_setup): its
ed25519 host key (once per box; the only HostKey its sshd uses), the user's public keys in
/run/agentbox/ssh/authorized_keys (a tmpfs: gone when the box stops, written again at start;
never a private key), an sshd drop-in that reads only that file and lets only vscode in with a
key, and a ForceCommand wrapper: every session (login, command, scp/sftp, rsync) starts in
/workspace through vscode's login shell.

The host trusts nothing the box writes: the box's host key is read through the engine (the
same channel `docker exec` uses) and checked for shape before it enters
~/.agentbox/known_hosts; the entry turns agent and X11 forwarding off.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
from typing import Any

from ..core import _host_files
from ..core._naming import BOX_USER
from ..core._provider import BOX_TEXT_LIMIT, BoxFacts, Provider, ProviderError
from ..relay._relay_state import write_module_launcher
from ..ssh._ssh_proxy import alias, engine_proxy_argv, local_proxy_argv

WAKE_MODULE = "ansible_collections.agentbox.box.plugins.module_utils.tasks._wake"
KEY_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")
KEY_ENV = "AGENTBOX_SSH_KEY"  # a private key file to use instead of ~/.ssh/id_*
NO_KEY_HELP = (
    "no SSH key for `ssh agentbox-{box}`: {why}. Then run "
    "ansible-playbook playbooks/attach.yml -e box={box} -e ide=ssh to authorise it in the box"
)
BEGIN = "# >>> agentbox box "
END = "# <<< agentbox box "
_HOST_KEY = re.compile(
    r"^(ssh-ed25519|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521|ssh-rsa) ([A-Za-z0-9+/=]{40,4096})$"
)
_PUBLIC_KEY = re.compile(
    r"^(?:[a-z0-9-]+@openssh\.com|ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+) [A-Za-z0-9+/=]+(?: [^\n]*)?$"
)

# Starts the line folded_setup prints for box_ready, in the output of an exec that did other work too.
FOLDED_MARK = "agentbox-ssh-access: "
SETUP_OUTPUT_LIMIT = 64 * 1024  # what of the set-up's output the host reads: its host key, sshd's complaints
# Run as root in the box; the user's public keys arrive on stdin. Prints the box's ed25519 host key.
BOX_SETUP = r"""
set -eu
# Editor volumes are made by the engine owned by root: the box user's (see _editor_volumes).
for dir in @EDITOR_DIRS@; do
  if [ -d "$dir" ] && [ "$(stat -c %u "$dir")" != 1000 ]; then chown 1000:1000 "$dir"; fi
done
sshd=/usr/sbin/sshd
[ -x "$sshd" ] || { echo "no OpenSSH server in the box ($sshd)" >&2; exit 4; }
# Only the ed25519 host key, once per box (the alias pins it): `ssh-keygen -A` also made RSA, 1-2 s of every create.
key=/etc/ssh/ssh_host_ed25519_key
[ -s "$key.pub" ] || { rm -f "$key" "$key.pub"; ssh-keygen -q -t ed25519 -N '' -C "" -f "$key"; }
mkdir -p /run/sshd /etc/ssh/sshd_config.d /usr/local/libexec
install -d -m 0755 -o root -g root /run/agentbox/ssh
umask 022
cat > /run/agentbox/ssh/authorized_keys.new
mv -f /run/agentbox/ssh/authorized_keys.new /run/agentbox/ssh/authorized_keys
cat > /etc/ssh/sshd_config.d/agentbox-access.conf <<'EOF'
# Written by agentbox.box (ssh agentbox-<box>): the host user's keys, for vscode only.
AuthorizedKeysFile /run/agentbox/ssh/authorized_keys .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers vscode
HostKey /etc/ssh/ssh_host_ed25519_key
ForceCommand /usr/local/libexec/agentbox-ssh-session
EOF
cat > /usr/local/libexec/agentbox-ssh-session.new <<'EOF'
#!/bin/sh
# Written by agentbox.box: every SSH session (a login, `ssh agentbox-<box> COMMAND`, scp, sftp, rsync)
# starts in /workspace through the box user's login shell; sshd's ForceCommand runs it, the client's
# command (a subsystem's program for sftp) is in SSH_ORIGINAL_COMMAND.
cd /workspace 2>/dev/null || cd
if [ -n "${SSH_ORIGINAL_COMMAND:-}" ]; then exec "${SHELL:-/bin/sh}" -l -c "$SSH_ORIGINAL_COMMAND"; fi
exec "${SHELL:-/bin/sh}" -l
EOF
chmod 0755 /usr/local/libexec/agentbox-ssh-session.new
mv -f /usr/local/libexec/agentbox-ssh-session.new /usr/local/libexec/agentbox-ssh-session
rm -f /etc/profile.d/agentbox-workspace.sh  # what boxes made before the session wrapper had
cat /etc/ssh/ssh_host_ed25519_key.pub
"""


@dataclasses.dataclass
class Access:
    """What a task reports about the way into one box."""

    alias: str
    ssh_config: str
    keys: list[str] = dataclasses.field(default_factory=list)  # the host key files authorised
    warnings: list[str] = dataclasses.field(default_factory=list)
    expires_at: str | None = None  # when the alias's Daytona SSH access token runs out (Daytona boxes)
    included: bool = False  # whether ~/.ssh/config includes the aliases (plain `ssh agentbox-<box>`)
    key_made: str | None = None  # the boxes' own key, when this call made it (the user had none)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def ssh_config_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), "ssh_config")


def known_hosts_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), "known_hosts")


# --------------------------------------------------------------------------------------------
# The host user's keys


def box_key_path() -> str:
    """The key made for the boxes when the user has none of their own (never one in ~/.ssh)."""
    return os.path.join(_host_files.agentbox_dir(), "ssh", "id_ed25519")


def _usable_key(path: str) -> tuple[str, str] | None:
    """(path, public key line) when `path` is a private key file with a public key next to it."""
    try:
        line = (_host_files.read_text(path + ".pub") or "").strip()
    except (OSError, ValueError):  # unreadable, or not text: no key to authorise (never a failed create)
        return None
    return (path, line) if os.path.exists(path) and _PUBLIC_KEY.match(line) else None


def identity_files() -> list[tuple[str, str]]:
    """(private key path, public key line) of the keys to authorise as they are now: the one
    AGENTBOX_SSH_KEY names, else the user's ~/.ssh/id_* with a .pub, else the boxes' own key when
    it was made (box_identities makes it)."""
    override = os.environ.get(KEY_ENV)
    if override:
        found = _usable_key(os.path.expanduser(override))
        return [found] if found else []
    found = [key for key in (_usable_key(os.path.join(_host_files.home(), ".ssh", name)) for name in KEY_NAMES) if key]
    own = None if found else _usable_key(box_key_path())
    return [own] if own else found


@dataclasses.dataclass
class Identities:
    """The host keys a box authorises, and why there are none when there are none."""

    keys: list[tuple[str, str]]  # (private key path, public key line)
    problem: str = ""
    made: str | None = None  # the boxes' own key, when this call made it

    def public_lines(self) -> list[str]:
        return [line for _path, line in self.keys]


def box_identities() -> Identities:
    """identity_files(); when the user has no key and names none, the boxes' own key, made now (once)."""
    keys = identity_files()
    if keys:
        return Identities(keys)
    override = os.environ.get(KEY_ENV)
    if override:
        return Identities([], problem=(
            f"{KEY_ENV}={override} is not a private key with its public key ({override}.pub) next to it: "
            f"fix that (`ssh-keygen -y -f {override} > {override}.pub`), or unset it and the boxes get a key of their own"
        ))  # fmt: skip
    try:
        key, made = make_box_key()
    except (OSError, subprocess.SubprocessError) as exc:
        return Identities([], problem=(
            f"none of ~/.ssh/id_ed25519, id_ecdsa, id_rsa has a .pub next to it, and the boxes' own key "
            f"{box_key_path()} could not be made ({exc}). Make one with `ssh-keygen -t ed25519`, or point {KEY_ENV} "
            "at a private key"
        ))  # fmt: skip
    return Identities([key], made=key[0] if made else None)


def make_box_key() -> tuple[tuple[str, str], bool]:
    """Make ~/.agentbox/ssh/id_ed25519 (0600, no passphrase: it opens only the boxes) unless it is there:
    (path, public key line), and whether this call made it.

    Under a lock (parallel creates make one key), written in a private temporary directory and
    renamed into place, the public half first: a reader never sees a private key without its .pub."""
    path = box_key_path()
    directory = _host_files.ensure_private_dir(os.path.dirname(path))
    with _host_files.locked(path):
        found = _usable_key(path)
        if found:
            return found, False
        keygen = shutil.which("ssh-keygen")
        if keygen is None:
            raise OSError("ssh-keygen, of the OpenSSH client, is not installed")
        with tempfile.TemporaryDirectory(prefix=".new-", dir=directory) as temp:
            new = os.path.join(temp, "id_ed25519")
            comment = f"agentbox.box: ssh into boxes only ({socket.gethostname()})"
            made = subprocess.run(
                [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", new],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, timeout=60,
            )  # fmt: skip
            if made.returncode != 0:
                raise OSError(f"ssh-keygen exited {made.returncode}: {made.stderr.strip()[:500]}")
            os.chmod(new, 0o600)
            os.replace(new + ".pub", path + ".pub")
            os.replace(new, path)
        found = _usable_key(path)
        if found is None:
            raise OSError(f"ssh-keygen wrote no usable public key at {path}.pub")
        return found, True


# --------------------------------------------------------------------------------------------
# The box side


def _setup_script() -> str:
    from . import _editor_volumes

    return BOX_SETUP.replace("@EDITOR_DIRS@", " ".join(_editor_volumes.mount_dirs()))


def prepare_box(provider: Provider, name: str, public_keys: list[str]) -> str:
    """Authorise public_keys in the box and make its sshd usable; its host key as `type base64`."""
    run = provider.exec(
        name, ["sh", "-c", _setup_script()], user="root", stdin=("".join(key + "\n" for key in public_keys)).encode(),
        limit=SETUP_OUTPUT_LIMIT, what="answer to the SSH access set-up",
    )
    run.check("preparing SSH access in the box", name)
    return _host_key_in(run.stdout.decode("utf-8", "replace"), name)


def _host_key_in(output: str, name: str) -> str:
    """The host key on the last line of what the box's setup printed (`type base64`), checked for shape."""
    lines = output.strip().splitlines()
    host_key = " ".join(lines[-1].split()[:2]) if lines else ""
    if not _HOST_KEY.match(host_key):
        raise ProviderError("the box did not give a usable SSH host key", box=name, operation="SSH access")
    return host_key


def folded_setup(public_keys: list[str]) -> str:
    """prepare_box's work as root shell lines for another exec (a create's boot: one exec less). They
    never fail that exec; one stdout line after FOLDED_MARK says how it went (read by box_ready)."""
    keys = "".join(key + "\n" for key in public_keys)
    return (
        f"if access_out=$(printf %s {shlex.quote(keys)} | sh -c {shlex.quote(_setup_script())} 2>&1); then\n"
        f"  printf '{FOLDED_MARK}ok %s\\n' \"$(printf '%s\\n' \"$access_out\" | tail -n 1)\"\n"
        f"else\n"
        f"  printf '{FOLDED_MARK}failed %s\\n' \"$(printf '%s' \"$access_out\" | tr '\\n' ' ' | head -c 2000)\"\n"
        f"fi"
    )


def _folded_host_key(output: str, name: str) -> str | None:
    """The host key a folded_setup reported in an exec's `output`; None when it did not run there."""
    reports = [line[len(FOLDED_MARK):] for line in output.splitlines() if line.startswith(FOLDED_MARK)]
    if not reports:
        return None
    status, _space, rest = reports[-1].partition(" ")
    if status != "ok":
        # The box wrote this line: bounded before it reaches the host's warnings.
        reason = rest.strip()[:BOX_TEXT_LIMIT]
        raise ProviderError(f"preparing SSH access in the box failed: {reason}", box=name, operation="SSH access")
    return _host_key_in(rest, name)


# --------------------------------------------------------------------------------------------
# The entry


def _config_quote(value: str) -> str:
    """A ProxyCommand word: shell-quoted, with % doubled (ssh expands %-tokens in it)."""
    return shlex.quote(value).replace("%", "%%")


def local_proxy_command(box: str, docker_host: str | None = None) -> str:
    return " ".join(_config_quote(word) for word in local_proxy_argv(box, docker_host))


def engine_proxy_command(box: str, engine: str, ssh_options: dict[str, Any]) -> str:
    return " ".join(_config_quote(word) for word in engine_proxy_argv(box, engine, ssh_options))


def wake_launcher_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), "bin", "agentbox-wake")


def write_wake_launcher() -> bool:
    """~/.agentbox/bin/agentbox-wake: runs _wake (see write_module_launcher)."""
    return write_module_launcher(
        wake_launcher_path(), WAKE_MODULE, "wakes a paused or stopped box for `ssh agentbox-<box>` (docs/access.md)."
    )


# What Docker answers an exec into a box the wake deals with: `Container <id> is paused, unpause the
# container before exec`, `container <id> is not running`, `No such container: agentbox-<box>`.
ENGINE_REFUSALS = "-e ' is paused' -e ' is not running' -e 'No such container'"


def waking_proxy_command(
    direct: list[str], facts: BoxFacts, options: dict[str, Any], environment: dict[str, str] | None = None
) -> str:
    """The ProxyCommand: `direct` (the box's sshd through the engine), and only when it fails, the wake
    launcher, which resumes or starts the box and runs `direct` again. A running box pays one `sh`.
    `options` and `environment` are the provider's reopen_options and reopen_environment."""
    line = " ".join(shlex.quote(word) for word in direct)
    wake = [wake_launcher_path(), facts.provider, facts.engine, facts.name, json.dumps(options, sort_keys=True), "--"]
    if environment:  # ssh runs the proxy with the user's login environment, which may lack it (a DOCKER_HOST)
        wake = ["env", *(f"{key}={value}" for key, value in sorted(environment.items())), *wake]
    # The direct path's stderr is held until it exits (fd 3 keeps the SSH stream on stdout): the engine's
    # refusal of a paused, stopped or missing box is the wake's to say, in its own words, so those lines
    # are dropped and anything else is passed on to ssh. (An SSH engine's ControlPersist master does not
    # keep stderr open: OpenSSH points it at /dev/null.)
    held = f"exec 3>&1; err=$({line} 2>&1 >&3 3>&-) && exit 0; exec 3>&-"
    shown = f"[ -z \"$err\" ] || printf '%s\\n' \"$err\" | grep -v {ENGINE_REFUSALS} >&2"
    inner = f"{held}; {shown}; exec {' '.join(shlex.quote(word) for word in wake)} {line}"
    return " ".join(_config_quote(word) for word in ["sh", "-c", inner])


def entry_text(facts: BoxFacts, proxy_command: str, keys: list[str]) -> str:
    name = alias(facts.name)
    lines = [
        f"{BEGIN}{facts.name} provider={facts.provider} engine={facts.engine}",
        f"Host {name}",
        f"  HostName {name}",
        f"  User {BOX_USER}",
        f"  ProxyCommand {proxy_command}",
        f"  HostKeyAlias {name}",
        f"  UserKnownHostsFile {known_hosts_path()}",
        "  StrictHostKeyChecking yes",
        # The host key is ours to record (box_ready); no rotation proofs mid-login.
        "  UpdateHostKeys no",
        # The session runs inside docker exec's pipe (or the engine's own SSH session), never on a
        # network: skip the post-quantum hybrid, whose key generation is half the login time here.
        "  KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org",
        "  GSSAPIAuthentication no",
        "  PreferredAuthentications publickey",
        *(f"  IdentityFile {path}" for path in keys),
        # Only those keys: an agent holding many others would spend the server's MaxAuthTries on them.
        *(["  IdentitiesOnly yes"] if keys else []),
        "  ForwardAgent no",
        "  ForwardX11 no",
        "  PermitLocalCommand no",
        "  LogLevel ERROR",
        f"{END}{facts.name}",
    ]
    return "\n".join(lines) + "\n"


def _blocks(text: str) -> list[tuple[str | None, str]]:
    """The config as (box or None, text) pieces: our marked blocks and whatever else is there."""
    pieces: list[tuple[str | None, str]] = []
    current: list[str] = []
    box: str | None = None
    for line in text.splitlines(keepends=True):
        if box is None and line.startswith(BEGIN):
            if current:
                pieces.append((None, "".join(current)))
            current, box = [line], line[len(BEGIN) :].split()[0]
        elif box is not None and line.startswith(END):
            current.append(line)
            pieces.append((box, "".join(current)))
            current, box = [], None
        else:
            current.append(line)
    if current:
        pieces.append((box, "".join(current)))
    return pieces


HEADER = "# Written by agentbox.box: one Host entry per box (ssh agentbox-<box>). Edits here are overwritten.\n"


def entry_engine(box: str) -> str | None:
    """The engine the box's entry points at, or None when there is no entry."""
    for piece_box, text in _blocks(_host_files.read_text(ssh_config_path()) or ""):
        if piece_box == box:
            match = re.search(r" engine=(\S+)", text.splitlines()[0])
            return match.group(1) if match else ""
    return None


def write_entry(box: str, text: str | None) -> bool:
    """Put (or with text None remove) the box's block in ~/.agentbox/ssh_config."""
    _host_files.ensure_private_dir(_host_files.agentbox_dir())

    def change(old: str | None) -> str | None:
        pieces = [(b, t) for b, t in _blocks(old or HEADER) if b != box]
        if text is not None:
            pieces.append((box, text))
        return "".join(t for _b, t in pieces)

    if text is None and not os.path.exists(ssh_config_path()):
        return False
    return _host_files.update(ssh_config_path(), change)


def write_known_host(box: str, host_key: str | None) -> bool:
    name = alias(box)

    def change(old: str | None) -> str | None:
        lines = [line for line in (old or "").splitlines() if line.split(" ", 1)[0] != name]
        if host_key is not None:
            lines.append(f"{name} {host_key}")
        return "".join(line + "\n" for line in lines)

    if host_key is None and not os.path.exists(known_hosts_path()):
        return False
    _host_files.ensure_private_dir(_host_files.agentbox_dir())
    return _host_files.update(known_hosts_path(), change)


# --------------------------------------------------------------------------------------------
# The lifecycle hooks (called by _box on create, start, restore and destroy)


def box_ready(
    provider: Provider,
    facts: BoxFacts,
    folded_output: str = "",
    keys: Identities | None = None,
) -> Access:
    """Make `ssh agentbox-<box>` work for a running box: keys in, host key and entry written, and the
    Include line the user agreed to kept. `folded_output`: the stdout of an exec that ran folded_setup
    with `keys` (box_identities()), "" when none did."""
    access = Access(alias=alias(facts.name), ssh_config=ssh_config_path())
    keys = box_identities() if keys is None else keys
    if not keys.keys:
        access.warnings.append(NO_KEY_HELP.format(box=facts.name, why=keys.problem))
    access.key_made = keys.made
    host_key = _folded_host_key(folded_output, facts.name) if folded_output else None
    if host_key is None:
        host_key = prepare_box(provider, facts.name, keys.public_lines())
    route = provider.ssh_proxy(facts.name)  # the provider's way to the box's sshd (a Daytona token is fresh)
    access.warnings += route.warnings
    access.expires_at = route.expires_at
    write_wake_launcher()
    proxy = waking_proxy_command(route.argv, facts, provider.reopen_options(), provider.reopen_environment())
    write_known_host(facts.name, host_key)
    paths = [path for path, _line in keys.keys]
    write_entry(facts.name, entry_text(facts, proxy, paths))
    access.keys = paths
    try:
        access.included = keep_include()
    except OSError as exc:  # the alias works with -F: a warning, not a failed access
        access.warnings.append(f"the Include line you agreed to could not be kept in {user_ssh_config()}: {exc}")
    return access


def box_removed(box: str, engine: str) -> bool:
    """Drop the box's entry and host key, unless the entry now belongs to a box on another engine."""
    recorded = entry_engine(box)
    if recorded is None or (recorded and recorded != engine):
        return False
    write_entry(box, None)
    write_known_host(box, None)
    from ..providers import _registry

    _registry.forget_access(box)  # what a provider keeps for the alias (a Daytona gateway token) goes with it
    return True


# --------------------------------------------------------------------------------------------
# ~/.ssh/config


def include_line() -> str:
    """`Include ~/.agentbox/ssh_config`; an absolute path when $HOME is not the passwd home
    (OpenSSH expands ~ from the passwd entry, not from $HOME)."""
    if _host_files.passwd_home() == _host_files.home():
        return "Include ~/.agentbox/ssh_config"
    return f"Include {ssh_config_path()}"


def user_ssh_config() -> str:
    return os.path.join(_host_files.home(), ".ssh", "config")


def include_present() -> bool:
    """Whether ~/.ssh/config already includes ~/.agentbox/ssh_config (in any spelling)."""
    text = _host_files.read_text(user_ssh_config()) or ""
    return any(_is_our_include(line) for line in text.splitlines())


def _is_our_include(line: str) -> bool:
    words = line.split()
    return (
        len(words) == 2
        and words[0].lower() == "include"
        and words[1]
        in (
            "~/.agentbox/ssh_config",
            ssh_config_path(),
        )
    )


def ensure_include() -> bool:
    """Put the Include line at the top of ~/.ssh/config once; every other byte stays as it was.

    At the top because OpenSSH applies an Include inside a Host block only to that block.
    """
    path = user_ssh_config()
    wanted = include_line()
    _host_files.ensure_private_dir(os.path.dirname(path))

    def change(old: str | None) -> str | None:
        text = old or ""
        if any(_is_our_include(line) for line in text.splitlines()):
            return None
        return f"{wanted}\n{text}" if text else f"{wanted}\n"

    return _host_files.update(path, change, _mode_of(path))


def remove_include() -> bool:
    """Take our Include line (any spelling of it) out of ~/.ssh/config; every other byte stays."""
    path = user_ssh_config()
    if not os.path.exists(path):
        return False

    def change(old: str | None) -> str | None:
        lines = (old or "").splitlines(keepends=True)
        kept = [line for line in lines if not _is_our_include(line)]
        return "".join(kept) if len(kept) != len(lines) else None

    return _host_files.update(path, change, _mode_of(path))


def _mode_of(path: str) -> int:
    return os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o600


# The user's answer about the Include line, asked once and kept: {"ssh_include": true|false,
# "include_hint_shown": true}.
def settings_path() -> str:
    return os.path.join(_host_files.agentbox_dir(), "access.json")


def _settings() -> dict[str, Any]:
    try:
        settings = json.loads(_host_files.read_text(settings_path()) or "{}")
    except (OSError, ValueError):  # unreadable or hand-broken: as if nothing was said
        return {}
    return settings if isinstance(settings, dict) else {}


def _remember(**values: Any) -> None:
    _host_files.ensure_private_dir(_host_files.agentbox_dir())

    def change(old: str | None) -> str:
        try:
            settings = json.loads(old or "{}")
        except ValueError:
            settings = {}
        settings = settings if isinstance(settings, dict) else {}
        return json.dumps({**settings, **values}, indent=2, sort_keys=True) + "\n"

    _host_files.update(settings_path(), change)


def include_answer() -> bool | None:
    """What the user said about the Include line (ssh_include), None when they never said."""
    answer = _settings().get("ssh_include")
    return answer if isinstance(answer, bool) else None


def answer_include(agree: bool) -> bool:
    """Record the user's answer and act on it: yes puts the Include line in (and every later alias write
    keeps it there, keep_include), no takes ours out. True when ~/.ssh/config changed."""
    _remember(ssh_include=agree)
    return ensure_include() if agree else remove_include()


def keep_include() -> bool:
    """The Include line the user agreed to is in ~/.ssh/config (put back if it went); without their yes
    the file is not touched. Whether plain `ssh` finds the aliases now."""
    if include_answer():
        ensure_include()
        return True
    return include_present()


def ssh_program() -> str:
    """`ssh` when ~/.ssh/config includes the aliases, else `ssh -F ~/.agentbox/ssh_config`: the one form
    every line the collection prints uses."""
    if include_present():
        return "ssh"
    config, home = ssh_config_path(), _host_files.home().rstrip("/")
    shown = "~/" + shlex.quote(config[len(home) + 1 :]) if config.startswith(home + "/") else shlex.quote(config)
    return f"ssh -F {shown}"


def ssh_command(box: str) -> str:
    return f"{ssh_program()} {alias(box)}"


def include_hint(box: str, record: bool = True) -> str:
    """How to turn the short form on: said once per user (`record`: remember it was said), and never once
    the user answered or the Include line is there; "" otherwise."""
    if include_answer() is not None or include_present() or _settings().get("include_hint_shown"):
        return ""
    if record:
        _remember(include_hint_shown=True)
    return (
        f"for plain `ssh {alias(box)}` add -e ssh_include=true once: it puts `{include_line()}` at the top of "
        "~/.ssh/config and every later create keeps it (-e ssh_include=false takes it out). "
        "Said once; docs/access.md"
    )


# --------------------------------------------------------------------------------------------
# Editors

EDITORS = {"vscode": "code", "cursor": "cursor"}


def dev_container_uri(facts: BoxFacts, folder: str = "/workspace", docker_host: str | None = None) -> str:
    """VS Code's Dev Containers "attach to running container" URI: hex of the container JSON."""
    import json

    target: dict[str, Any] = {"containerName": "/" + facts.container}
    docker_host = docker_host or os.environ.get("DOCKER_HOST")
    if docker_host:
        target["settings"] = {"host": docker_host}
    payload = json.dumps(target, separators=(",", ":")).encode().hex()
    return f"vscode-remote://attached-container+{payload}{folder}"


def remote_ssh_uri(box: str, folder: str = "/workspace") -> str:
    return f"vscode-remote://ssh-remote+{alias(box)}{folder}"


def attach_uri(provider: Provider, facts: BoxFacts, ide: str) -> str:
    """The Dev Containers URI for a box on this machine's engine in VS Code or Cursor; Remote-SSH otherwise."""
    if ide in EDITORS and provider.attaches_dev_containers:
        return dev_container_uri(facts, docker_host=provider.docker_host)
    return remote_ssh_uri(facts.name)


def editor_command(ide: str) -> str | None:
    """The editor's CLI when it is installed here (`code`, `cursor`), else None."""
    program = EDITORS.get(ide, "code" if ide == "ssh" else "")
    return shutil.which(program) if program else None


# --------------------------------------------------------------------------------------------
# Is anything behind a port's URL? (forward.yml)

# Run in the box with python3: exit 3 when no socket listens on the port (IPv4 or IPv6, any address);
# for the web port, whose listener is the supervisor's forwarder, exit 4 with its reason when it answers
# for no service (502/503, a body starting 'agentbox: '). Anything else, or no answer in 10 s: exit 0.
PORT_PROBE = r"""
import socket, sys
port, web = int(sys.argv[1]), sys.argv[2] == "web"
wanted = ":%04X" % port
def listens():
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                if any(f[1].endswith(wanted) and f[3] == "0A" for f in (l.split() for l in list(handle)[1:])):
                    return True
        except OSError:
            pass
    return False
if not listens():
    sys.exit(3)
if not web:
    sys.exit(0)
answer = b""
try:
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
except OSError:
    sys.exit(0)
with conn:
    try:
        conn.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        while len(answer) < 4096:
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    except OSError:
        pass  # a reset once it answered (the forwarder does not read the request): what came is the answer
head, _sep, body = answer.partition(b"\r\n\r\n")
if head.split(b" ")[1:2] in ([b"502"], [b"503"]) and body.startswith(b"agentbox: "):
    sys.stdout.write(body[len(b"agentbox: "):].decode("utf-8", "replace").strip()[:300])
    sys.exit(4)
"""


def nothing_listens(provider: Provider, box: str, port: int, web: bool) -> str:
    """Why the URL of the box's `port` would answer nothing useful ("nothing listens on port N in the box",
    with the web forwarder's reason for the web port), or "" when something listens there or the box
    cannot tell (no python3: a custom image). What the box prints is bounded, and only ever shown."""
    try:
        run = provider.exec(box, ["python3", "-c", PORT_PROBE, str(port), "web" if web else "port"],
                            limit=BOX_TEXT_LIMIT, what="the port probe")  # fmt: skip
    except ProviderError:
        return ""
    said = f"nothing listens on port {port} in the box"
    if run.rc == 3:
        return said
    if run.rc == 4:
        reason = "".join(ch for ch in run.stdout.decode("utf-8", "replace") if ch.isprintable())[:300]
        return f"{said}: {reason}" if reason else said
    return ""
