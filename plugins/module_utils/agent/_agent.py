# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Coding agents in boxes, provider-neutral: credentials from the host, start, stop, resume, states.

The in-box half is `agentbox-agent` (roles/inbox_supervisor/files): one exec per operation, with a
JSON request on stdin (credentials, prompt and git identity never appear in an argv, an env of the
container's config, or a file outside the /run/agentbox tmpfs) and a JSON answer on stdout.

Host files are only ever read. Where credentials come from, first found wins per variable or file:
module options (`env`), the controller's environment (ANTHROPIC_*/CLAUDE_CODE_* for Claude Code,
OPENAI_* for Codex, both for OpenCode), the sign-in `playbooks/agent_login.yml` made for boxes
(~/.agentbox/agents/<agent>/), then the CLI's own sign-in files in the host user's home.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..core._box_tmpfs import TMPFS_DIR_FUNCTION
from ..core._provider import BOX_TEXT_LIMIT, BoxFacts, OutputTooLarge, Provider, ProviderError, too_large
from ..egress import _egress_credentials
from ..git import _git

AGENTS = ("claude", "codex", "opencode")
AGENT_PROGRAM = "agentbox-agent"
STATES = ("working", "idle", "waiting", "stopped")
# What the host shows besides the states an agent reports: `stalled` (judged, see judged()) and, in the
# inventory, `unknown` (the relay has not read the box lately).
SHOWN_STATES = (*STATES, "stalled")
BOX_HOME = "/home/vscode"
LOGIN_STORE = "~/.agentbox/agents"
ENV_PREFIXES = {
    "claude": ("ANTHROPIC_", "CLAUDE_CODE_"),
    "codex": ("OPENAI_",),
    "opencode": ("ANTHROPIC_", "OPENAI_"),
}
# The CLI's sign-in files, relative to the home directory (the same path in the box).
SIGN_IN_FILES = {
    "claude": (".claude/.credentials.json",),
    "codex": (".codex/auth.json",),
    "opencode": (".local/share/opencode/auth.json",),
}
IMAGE_ENTRY = {"claude": "claude", "codex": "codex", "opencode": "opencode"}
SESSION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}")
STATE_FILES = "/run/agentbox/agents"
# What of the state files the host reads: a state is one line of about 150 bytes.
STATE_FILE_LIMIT = 4096
MAX_SESSIONS = 64
# A state file's line, a progress line (under 100 bytes) per session, the activity line and the exec's stderr.
STATES_OUTPUT_LIMIT = MAX_SESSIONS * (STATE_FILE_LIMIT + 2 + 100) + 4096
SINCE_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
# `working` with no progress for this long is shown as `stalled` (an agent looping on a connection error
# never leaves `working`); the idle policy, the inventory and the modules take their own value.
STALLED_MINUTES = 10.0
# Progress is the session's state file or the CLI's transcript changing: after the state files, one line per
# session, `agentbox-progress <session> <seconds since the later of the two>`, by the box's own clock (a clock
# apart from the host's does not matter). Transcripts: Codex's ~/.codex/sessions/, OpenCode's storage (any
# write counts); a custom command has its state file only. Claude Code can write to its transcript
# (~/.claude/projects/*/*.jsonl) while it only retries an API it cannot reach, so for it only the
# conversation counts: the time of the last `user` or `assistant` entry (CONVERSATION_PY, on the newest
# transcript's last 256 KiB), the file's time when there is none.
CONVERSATION_PY = (
    "import calendar,json,sys,time\n"
    "f=open(sys.argv[1],\"rb\"); f.seek(0,2); f.seek(max(0,f.tell()-262144))\n"
    "for line in reversed(f.read().splitlines()):\n"
    "    try: e=json.loads(line)\n"
    "    except ValueError: continue\n"
    "    if isinstance(e,dict) and e.get(\"type\") in (\"user\",\"assistant\") and isinstance(e.get(\"timestamp\"),str):\n"
    "        print(calendar.timegm(time.strptime(e[\"timestamp\"][:19],\"%Y-%m-%dT%H:%M:%S\"))); break\n"
)
PROGRESS_SCRIPT = (
    r"""n=$(date +%s); k=0; c='@PY@'; for f in @DIR@/*.state.json; do [ -f "$f" ] || continue; k=$((k + 1)); """
    r"""[ "$k" -gt @MAX@ ] && break; s=${f##*/}; """
    r"""s=${s%.state.json}; t=$(stat -c %Y "$f" 2>/dev/null) || continue; """
    r"""case $(head -c @LIMIT@ -- "$f" | sed -n 's/.*"name": *"\([A-Za-z0-9_.-]*\)".*/\1/p') in """
    r"""claude) d=@HOME@/.claude/projects;; codex) d=@HOME@/.codex/sessions;; """
    r"""opencode) d=@HOME@/.local/share/opencode/storage;; *) d=;; esac; """
    r"""if [ -n "$d" ]; then u=$(find "$d" -type f -newer "$f" -printf '%T@ %p\n' 2>/dev/null | sort -rn | head -n 1); """
    r"""if [ -n "$u" ]; then w=${u%%.*}; if [ "$d" = @HOME@/.claude/projects ]; then """
    r"""v=$(python3 -c "$c" "${u#* }" 2>/dev/null) && [ -n "$v" ] && w=$v; fi; """
    r"""[ "$w" -gt "$t" ] 2>/dev/null && t=$w; fi; fi; echo "agentbox-progress $s $((n - t))"; done;"""
).replace("@DIR@", STATE_FILES).replace("@HOME@", BOX_HOME).replace("@PY@", CONVERSATION_PY).replace(
    "@MAX@", str(MAX_SESSIONS)
).replace("@LIMIT@", str(STATE_FILE_LIMIT + 1))  # a hostile box's 2 GiB state file is read no further
PROGRESS_LINE = re.compile(r"agentbox-progress ([A-Za-z0-9_][A-Za-z0-9_.-]{0,62}) (\d{1,10})")
ANSWER_LIMIT = 1 << 20  # agentbox-agent's JSON answer (and its stderr): a few hundred bytes
T = TypeVar("T")
# A prompt for a running session: on stdin (never an argv), pasted as one block (bracketed paste when the CLI
# asked for it, so a multi-line prompt is not sent line by line), then Enter on its own, as a person would.
# Exit 3: no such session.
_SEND_SCRIPT = (
    'tmux has-session -t "=$1" 2>/dev/null || exit 3; tmux load-buffer -b agentbox-prompt - && '
    'tmux paste-buffer -p -d -b agentbox-prompt -t "=$1:" && sleep 0.3 && tmux send-keys -t "=$1:" Enter'
)
# The session's screen and its scroll-back, lines joined where tmux wrapped them, each cut to $3 bytes; the last
# $2 lines before the empty rest of the screen. Exit 3: no such session.
_CAPTURE_SCRIPT = (
    'tmux has-session -t "=$1" 2>/dev/null || exit 3; tmux capture-pane -p -J -S "-$2" -t "=$1:" | cut -b "1-$3" | '
    """awk -v n="$2" '/[^[:space:]]/ { while (p > 0) { r[c++ % n] = ""; p-- } r[c++ % n] = $0; next } { p++ } """
    """END { for (i = (c > n ? c - n : 0); i < c; i++) print r[i % n] }'"""
)
MAX_TRANSCRIPT_LINES = 2000
TRANSCRIPT_LINE_BYTES = 4000  # in the box; a character is up to 4 bytes
TRANSCRIPT_LINE_CHARS = 1000  # on the host
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# As root, before the in-box half writes credentials and prompts to STATE_FILES: that directory on a
# tmpfs, which no checkpoint or snapshot keeps (_box_tmpfs, shared with _carry_env). What the disk held
# there is removed first: run-time files only (states, pids, keys of an older version); what a resume
# needs is kept under /var/lib/agentbox. Exit 3: no tmpfs, and nothing is written.
_RUN_TMPFS = TMPFS_DIR_FUNCTION + 'set -eu\ntmpfs_dir "$1" agentbox-agents 0755\n'


class AgentError(ProviderError):
    pass


@dataclasses.dataclass
class Credentials:
    env: dict[str, str]
    files: dict[str, str]
    claude_account: dict[str, Any] | None
    looked: list[str]  # where they were looked for, for the "none found" warning

    @property
    def found(self) -> list[str]:
        """Names of what was found (never values): env variable names and ~/ paths."""
        keys = [k for k in self.env if _is_secret_name(k)]
        return sorted(keys) + [f"~/{path}" for path in sorted(self.files)]

    def request(self) -> dict[str, Any]:
        return {"env": self.env, "files": self.files, "claude_account": self.claude_account}


def _is_secret_name(name: str) -> bool:
    return any(word in name for word in ("KEY", "TOKEN", "SECRET", "PASSWORD"))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def collect_credentials(
    agent: str,
    options_env: dict[str, str] | None = None,
    environ: dict[str, str] | None = None,
    home: str | None = None,
) -> Credentials:
    """What the agent needs from the host user, read only; see the module docstring for the order."""
    environ = dict(os.environ if environ is None else environ)
    home = os.path.expanduser("~") if home is None else home
    prefixes = ENV_PREFIXES.get(agent, ())
    env = {k: v for k, v in environ.items() if k.startswith(prefixes) and v}
    env.update({str(k): str(v) for k, v in (options_env or {}).items() if v is not None})
    looked = [f"environment {'/'.join(p + '*' for p in prefixes)}"] if prefixes else []
    files: dict[str, str] = {}
    store = os.path.join(home, LOGIN_STORE.removeprefix("~/"))
    for relative in SIGN_IN_FILES.get(agent, ()):
        for base in (os.path.join(store, agent), home):
            path = os.path.join(base, relative)
            looked.append(path)
            content = _read(path)
            if content and content.strip():
                files[relative] = content
                break
    account = None
    if agent == "claude":
        looked.append(os.path.join(home, ".claude.json") + " (oauthAccount)")
        for path in (os.path.join(store, "claude", ".claude.json"), os.path.join(home, ".claude.json")):
            try:
                data = json.loads(_read(path) or "null")
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("oauthAccount"), dict):
                account = data["oauthAccount"]  # who signed in: an account, not a credential
                break
    return Credentials(env=env, files=files, claude_account=account, looked=looked)


def git_identity(workspace: str) -> dict[str, str]:
    """user.name and user.email as the workspace's effective git config gives them; nothing else."""
    identity = {}
    for key in ("name", "email"):
        try:
            done = _git.git(workspace, "config", "--get", f"user.{key}", check=False)
        except _git.GitError:
            return {}
        value = done.stdout.decode("utf-8", "replace").strip()
        if done.returncode == 0 and value:
            identity[key] = value
    return identity


def validate(agent: str | None, command: str | None, session: str | None) -> tuple[str, str]:
    """(agent, session) or ValueError before any side effect."""
    name = agent or "claude"
    if not command and name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}: use one of {', '.join(AGENTS)}, or 'command' for any other program")
    if command is not None and not command.strip():
        raise ValueError("'command' is empty: give the command line to run, or leave it out for the agent's CLI")
    if command and not re.fullmatch(r"[A-Za-z0-9_.-]{1,63}", name):
        raise ValueError(f"agent name {name!r} must be 1-63 characters from A-Z, a-z, 0-9, '_', '.', '-'")
    chosen = session or name
    if not SESSION_RE.fullmatch(chosen):
        raise ValueError(f"session name {chosen!r} must match {SESSION_RE.pattern}")
    return name, chosen


def _run_dir_on_tmpfs(provider: Provider, box: str, what: str) -> None:
    run = provider.exec(box, ["sh", "-c", _RUN_TMPFS, "run-tmpfs", STATE_FILES], user="root")
    if run.rc != 0:
        detail = (run.stderr or run.stdout).decode("utf-8", "replace").strip()[-2000:]
        raise AgentError(
            f"no tmpfs for the agent's credentials in the box (exit {run.rc}): {detail}", box=box, operation=what
        )


def _call(provider: Provider, box: str, argv: list[str], request: dict[str, Any] | None, what: str) -> dict[str, Any]:
    script = f'command -v {AGENT_PROGRAM} >/dev/null 2>&1 || exit 3; exec {AGENT_PROGRAM} "$@"'
    stdin = json.dumps(request).encode("utf-8") if request is not None else None
    run = provider.exec(box, ["sh", "-c", script, AGENT_PROGRAM, *argv], stdin=stdin, limit=ANSWER_LIMIT,
                        what=f"answer of {AGENT_PROGRAM} {argv[0]}")
    if run.rc == 3:
        raise AgentError(
            f"the box's image has no {AGENT_PROGRAM}: rebuild the image (ansible-playbook playbooks/build_image.yml) "
            "and re-create the box",
            box=box,
            operation=what,
        )
    lines = [line for line in run.text.splitlines() if line.startswith("{")]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        detail = (run.stderr or run.stdout).decode("utf-8", "replace").strip()[-2000:]
        raise AgentError(f"{AGENT_PROGRAM} {argv[0]} exited {run.rc}: {detail}", box=box, operation=what)
    if not answer.get("ok"):
        message = str(answer.get("error"))
        if answer.get("missing"):
            entry = IMAGE_ENTRY.get(str(answer["missing"]), str(answer["missing"]))
            message += (
                f": add {entry!r} to box_image_agents and rebuild (ansible-playbook playbooks/build_image.yml "
                f'-e \'{{"box_image_agents": ["claude", "{entry}"]}}\'), then re-create the box'
            )
        raise AgentError(message, box=box, operation=what)
    return answer


def boxed_credentials(facts: BoxFacts, agent: str, credentials: Credentials) -> tuple[dict[str, Any], str]:
    """What of the credentials goes into the box: all of them (on its tmpfs), or, in a box with an egress
    policy, none: the host keeps them for the gateway, the agent gets its base URL at the gateway's in-box
    endpoint and a placeholder key (docs/egress.md). Also which credential the gateway will use ("" when
    it uses none). The request names that credential (`gateway_credential`, for `agentbox-ctl status`),
    never its value."""
    request = credentials.request()
    gateway = bool(facts.labels.get("egress"))
    kind = ""
    if gateway and agent in _egress_credentials.AGENT_APIS:
        env, files, kind = _egress_credentials.keep_on_host(facts.id, agent, credentials.env, credentials.files)
        request = {**request, "env": env, "files": files}
    return {**request, "gateway_credential": _egress_credentials.describe(facts.id, agent, gateway)}, kind


def start(
    provider: Provider,
    facts: BoxFacts,
    *,
    agent: str,
    session: str,
    command: str | None,
    prompt: str | None,
    args: list[str],
    skip_permissions: bool,
    credentials: Credentials,
) -> dict[str, Any]:
    request = {
        "agent": agent,
        "session": session,
        "command": command,
        "prompt": prompt,
        "args": args,
        "skip_permissions": skip_permissions,
        "git": git_identity(facts.workspace) if os.path.isdir(facts.workspace or "") else {},
        **boxed_credentials(facts, agent, credentials)[0],
    }
    _run_dir_on_tmpfs(provider, facts.name, "starting the agent")
    return _call(provider, facts.name, ["start"], request, "starting the agent")


def stop(provider: Provider, facts: BoxFacts, session: str) -> dict[str, Any]:
    return _call(provider, facts.name, ["stop", "--session", session], None, "stopping the agent")


def resume(provider: Provider, facts: BoxFacts) -> dict[str, Any] | None:
    """After a box start or a restore: the sessions that were started run again, resuming."""
    request = {"credentials": {agent: {**boxed_credentials(facts, agent, collect_credentials(agent))[0], "git": {}}
                               for agent in AGENTS}}
    if facts.workspace and os.path.isdir(facts.workspace):
        identity = git_identity(facts.workspace)
        for entry in request["credentials"].values():
            entry["git"] = identity
    try:
        _run_dir_on_tmpfs(provider, facts.name, "resuming the agent")
        return _call(provider, facts.name, ["resume"], request, "resuming the agent")
    except AgentError as exc:
        if "has no agentbox-agent" in str(exc):
            return None  # an image from before agents: nothing to resume
        # The box itself started (or was restored) fine: an agent that cannot come back must not undo
        # that; agent.yml starts it again and reports why.
        return {"ok": False, "error": str(exc)}


def send_prompt(provider: Provider, facts: BoxFacts, session: str, prompt: str) -> None:
    """Type `prompt` into the running session as the user would, and submit it (the CLI's own input box)."""
    argv = ["sh", "-c", _SEND_SCRIPT, "send", session]
    run = provider.exec(facts.name, argv, stdin=prompt.encode("utf-8"), limit=BOX_TEXT_LIMIT, what="answer of tmux")
    if run.rc == 3:
        raise AgentError(f"no tmux session {session!r} runs in the box: start the agent first", box=facts.name,
                         operation="sending the prompt")  # fmt: skip
    run.check("tmux (taking the prompt)", facts.name)


def transcript(provider: Provider, facts: BoxFacts, session: str, lines: int) -> list[str] | None:
    """The last `lines` lines of the session's screen and scroll-back, as attaching would show them; None
    when no such session runs. The box prints this: cut in the box (TRANSCRIPT_LINE_BYTES a line) and
    read to a cap on the host (a box that replaced tmux or cut gets OutputTooLarge), control characters
    dropped, lines cut to TRANSCRIPT_LINE_CHARS."""
    lines = max(1, min(int(lines), MAX_TRANSCRIPT_LINES))
    argv = ["sh", "-c", _CAPTURE_SCRIPT, "capture", session, str(lines), str(TRANSCRIPT_LINE_BYTES)]
    run = provider.exec(facts.name, argv, limit=lines * (TRANSCRIPT_LINE_BYTES + 1) + BOX_TEXT_LIMIT,
                        what=f"screen of tmux session {session}")  # fmt: skip
    if run.rc == 3:
        return None
    run.check("tmux (showing the session)", facts.name)
    shown = [_CONTROL.sub("", line)[:TRANSCRIPT_LINE_CHARS] for line in run.text.splitlines()]
    while shown and not shown[-1].strip():
        shown.pop()  # the empty rest of the screen
    return shown[-lines:]


def read_states(provider: Provider, box: str, extra_script: str = "") -> list[dict[str, Any]]:
    """The box's agent sessions as their hooks last reported them; [] when none (or unreadable).

    The files are written in the box, so they are treated as untrusted: at most MAX_SESSIONS of them
    are read, each to one byte past STATE_FILE_LIMIT (in the exec itself, and the host reads no more
    than that), and only known keys and values of the expected shape come out. A file over its cap is
    refused (OutputTooLarge, logged on the host). Each session also gets `quiet_seconds`, how long ago
    the box last saw it make progress (PROGRESS_SCRIPT; None when it printed no such line).
    `extra_script` runs in the same exec after them (the idle policy's activity probe); its output
    lines come back in the list as {"line": text} entries, for the caller to validate.
    """
    script = (f'n=0; for f in {STATE_FILES}/*.state.json; do [ -e "$f" ] || continue; n=$((n + 1)); '
              f'[ "$n" -gt {MAX_SESSIONS} ] && break; head -c {STATE_FILE_LIMIT + 1} -- "$f" | tr "\\n" " "; echo; '
              f"done 2>/dev/null; echo; {PROGRESS_SCRIPT} {extra_script} true")
    try:
        run = provider.exec(box, ["sh", "-c", script], timeout=10, limit=STATES_OUTPUT_LIMIT,
                            what="agent states (/run/agentbox/agents)")
    except OutputTooLarge:
        raise
    except ProviderError:
        return []
    states: list[dict[str, Any]] = []
    quiet: dict[str, int] = {}
    # One line per file (its line breaks made spaces in the box): a line past the cap is a file past it.
    # Then one progress line per session, then the extra script's lines.
    for data in run.stdout.split(b"\n")[: 2 * MAX_SESSIONS + 8]:
        if len(data) > STATE_FILE_LIMIT:
            raise too_large(box, "agent state file (/run/agentbox/agents/*.state.json)", STATE_FILE_LIMIT)
        line = data.decode("utf-8", "replace")
        progress = PROGRESS_LINE.fullmatch(line)
        if progress:
            quiet[progress.group(1)] = int(progress.group(2))
            continue
        if not line:
            continue
        try:
            raw = json.loads(line)
        except ValueError:
            if extra_script and len(line) <= 256:
                states.append({"line": line})
            continue
        if isinstance(raw, dict):
            clean = sanitize_state(raw)
            if clean:
                states.append(clean)
    for entry in states:
        if "session" in entry:
            entry["quiet_seconds"] = quiet.get(entry["session"])
    return states


def sanitize_state(raw: dict[str, Any]) -> dict[str, Any] | None:
    state, session = raw.get("state"), raw.get("session")
    since, name = raw.get("since"), raw.get("name")
    if state not in STATES or not isinstance(session, str) or not SESSION_RE.fullmatch(session):
        return None
    if not isinstance(since, str) or not SINCE_RE.fullmatch(since):
        since = None
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,63}", name):
        name = session
    return {"name": name, "session": session, "state": state, "since": since}


def checked(raw: Any) -> dict[str, Any] | None:
    """An agent entry as read_states gives it (a state and its `quiet_seconds`), checked again where it was
    kept on the host (the relay's record): None when it is not of that shape."""
    clean = sanitize_state(raw) if isinstance(raw, dict) else None
    if clean is not None:
        quiet = raw.get("quiet_seconds")
        clean["quiet_seconds"] = quiet if isinstance(quiet, int) and not isinstance(quiet, bool) and 0 <= quiet < 10**10 else None
    return clean


def judged(agent: dict[str, Any] | None, stalled_minutes: float, now: float, elapsed: float = 0.0) -> dict[str, Any] | None:
    """The agent as shown: `working` with no progress for `stalled_minutes` is `stalled`, since its last progress.

    `quiet_seconds` was measured `elapsed` seconds before `now` (the relay's record is read later than it
    was written). Only `working` can stall: `idle` and `waiting` are the agent's own word that it waits.
    """
    if not agent or agent.get("state") != "working" or not isinstance(agent.get("quiet_seconds"), int):
        return agent
    quiet = agent["quiet_seconds"] + max(0.0, elapsed)
    if quiet < stalled_minutes * 60:
        return agent
    last = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - quiet))
    return {**agent, "state": "stalled", "since": last}


def current(states: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The box's agent: the session whose state changed last (sessions are usually one)."""
    sessions = [entry for entry in states if "state" in entry]
    if not sessions:
        return None
    return max(sessions, key=lambda entry: entry.get("since") or "")


def attach_command(provider: Provider, facts: BoxFacts, session: str) -> str:
    """The line a user types on this machine to watch the agent's tmux session."""
    from ..access import _access

    return provider.terminal_command(facts, f"tmux attach -t {shlex.quote(session)}", _access.ssh_program())


def agents_of(provider: Provider, names: list[str]) -> dict[str, dict[str, Any] | None]:
    """{box: its current agent or None} for running boxes (one exec each, see each_box). A box whose
    states are refused (over their cap, logged on the host) is listed without an agent."""

    def probe(box: str) -> dict[str, Any] | None:
        try:
            return current(read_states(provider, box))
        except OutputTooLarge:
            return None

    return each_box(provider, names, probe)


def each_box(provider: Provider, names: list[str], probe: Callable[[str], T]) -> dict[str, T]:
    """{box: probe(box)}: side by side on an engine whose client is thread-safe (the local engine);
    other providers are asked in turn."""
    if not names:
        return {}
    # getattr: a stand-in outside the interface (test_inventory_boxes.py has one) is asked in turn.
    if getattr(provider, "thread_safe_client", False) and len(names) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
            found = list(pool.map(probe, names))
        return dict(zip(names, found, strict=True))
    return {box: probe(box) for box in names}
