"""The in-sandbox daemon ("toolbox"): exec, sessions and files, done with docker exec and archives.

Served under {toolboxProxyUrl}/{sandboxId}/..., the way the SDK addresses it.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import re
import shlex
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .docker_backend import SESSION_MARKER, BackendError, PathIsDirectory, PathNotFound
from .errors import SOURCE_DAEMON, SOURCE_PROXY, ApiError, Reply
from .multipart import boundary_from_content_type, build_download, parse_form

if TYPE_CHECKING:
    from .core import Emulator
    from .records import SandboxRecord

LOG = logging.getLogger("daytona_emulator.toolbox")
SESSION_ROOT = "/tmp/.daytona-emulator/sessions"

# One line per entry: type|size|octal perms|symbolic mode|owner|group|mtime|path (path last: it may hold '|').
STAT_FORMAT = "%F|%s|%a|%A|%U|%G|%Y|%n"
LIST_SCRIPT = (
    '[ -e "$1" ] || exit 44; [ -d "$1" ] || exit 45; '
    f'find "$1" -mindepth 1 -maxdepth "$2" -exec stat -c \'{STAT_FORMAT}\' {{}} +'
)
INFO_SCRIPT = f'[ -e "$1" ] || [ -L "$1" ] || exit 44; stat -c \'{STAT_FORMAT}\' "$1"'
DELETE_SCRIPT = (
    '[ -e "$1" ] || [ -L "$1" ] || exit 44; '
    'if [ -d "$1" ] && [ ! -L "$1" ] && [ "$2" != true ]; then exit 45; fi; rm -rf -- "$1"'
)
MISSING, WRONG_KIND = 44, 45


def daemon_error(status: int, message: str, code: str | None = None) -> ApiError:
    return ApiError(status, message, code=code, source=SOURCE_DAEMON)


@dataclass
class SessionCommand:
    id: str
    command: str
    directory: str
    exit_code: int | None = None


@dataclass
class ShellSession:
    sandbox_id: str
    session_id: str
    container_id: str
    exec_id: str
    sock: Any
    directory: str
    commands: dict[str, SessionCommand] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    alive: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_json(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "commands": [{"id": c.id, "command": c.command, "exitCode": c.exit_code}
                         for c in (self.commands[cid] for cid in self.order)],
        }


class Toolbox:
    def __init__(self, emulator: Emulator) -> None:
        self.emu = emulator
        self.backend = emulator.backend
        self.sessions: dict[tuple[str, str], ShellSession] = {}
        self.lock = threading.Lock()

    # ---- which sandbox answers ----------------------------------------------------------------------------
    def sandbox_for_call(self, sandbox_id: str) -> SandboxRecord:
        try:
            sb = self.emu.find(sandbox_id)
        except ApiError as exc:
            raise ApiError(404, f"Sandbox {sandbox_id} not found", source=SOURCE_PROXY) from exc
        with self.emu.lock:
            # An archived sandbox answers a misleading 404, as the real proxy does.
            if sb.state == "archived":
                raise ApiError(404, f"Sandbox {sandbox_id} not found", source=SOURCE_PROXY)
            if sb.state in ("started", "snapshotting") and sb.container_id:
                sb.mark_activity()  # toolbox calls count as activity for auto-stop
                return sb
            if sb.state == "stopped":
                raise ApiError(400, f"Sandbox {sandbox_id} is not running. Is the Sandbox started?",
                               source=SOURCE_PROXY)
            raise ApiError(502, f"Sandbox {sandbox_id} is {sb.state}", source=SOURCE_PROXY)

    def handle(self, method: str, sandbox_id: str, route: str, query: dict[str, list[str]], body: bytes,
               headers: dict[str, str]) -> Reply:
        sb = self.sandbox_for_call(sandbox_id)
        json_body = _json(body) if method in ("POST", "PUT") and not route.startswith("/files/bulk-upload") else None
        segments = [part for part in route.split("/") if part]
        if route == "/process/execute" and method == "POST":
            return self.execute(sb, json_body)
        if segments[:2] == ["process", "session"]:
            return self.session_route(sb, method, segments[2:], query, json_body)
        if route == "/files/bulk-upload" and method == "POST":
            return self.bulk_upload(sb, body, headers.get("content-type", ""))
        if route == "/files/bulk-download" and method == "POST":
            return self.bulk_download(sb, json_body)
        if route == "/files" and method == "GET":
            return self.list_files(sb, _q(query, "path") or ".", _q(query, "depth"))
        if route == "/files" and method == "DELETE":
            return self.delete_file(sb, _required(query, "path"), _q(query, "recursive") == "true")
        if route == "/files/info" and method == "GET":
            return Reply(200, self.file_info(sb, _required(query, "path")))
        if route == "/files/folder" and method == "POST":
            return self.create_folder(sb, _required(query, "path"), _q(query, "mode") or "0755")
        if route == "/files/move" and method == "POST":
            return self.move(sb, _required(query, "source"), _required(query, "destination"))
        if route == "/files/download" and method == "GET":
            return self.download_one(sb, _required(query, "path"))
        if route == "/files/permissions" and method == "POST":
            return self.permissions(sb, _required(query, "path"), query)
        if route == "/user-home-dir" and method == "GET":
            return Reply(200, {"dir": self.home_dir(sb)})
        if route == "/work-dir" and method == "GET":
            return Reply(200, {"dir": self.work_dir(sb)})
        if route == "/version" and method == "GET":
            return Reply(200, {"version": "daytona-emulator"})
        raise daemon_error(404, f"the emulator does not implement {method} {route}")

    # ---- process/execute ----------------------------------------------------------------------------------
    def execute(self, sb: SandboxRecord, body: Any) -> Reply:
        if not isinstance(body, dict) or not isinstance(body.get("command"), str) or not body["command"].strip():
            raise daemon_error(400, "command is required")
        cwd = body.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise daemon_error(400, "cwd must be a string")
        envs = body.get("envs") or {}
        if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
            raise daemon_error(400, "envs must map names to strings")
        timeout = body.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0):
            raise daemon_error(400, "timeout must be a non-negative integer")
        assert sb.container_id
        result = self.backend.run_command(sb.container_id, body["command"], _runs_as(sb), cwd or None, envs,
                                          timeout or None, uuid.uuid4().hex)
        if result.timed_out:
            raise daemon_error(
                408, f"Command execution timed out after {timeout} seconds. The timeout can be increased by "
                     "adjusting the timeout parameter in the request.", code="PROCESS_EXECUTION_TIMEOUT")
        exit_code = result.exit_code
        if exit_code == 126 and result.output.startswith(b"OCI runtime exec failed"):
            exit_code = -1  # the process never started (a missing cwd, say): the daemon answers -1
        return Reply(200, {"exitCode": exit_code, "result": result.output.decode("utf-8", "replace")})

    # ---- sessions -----------------------------------------------------------------------------------------
    def session_route(self, sb: SandboxRecord, method: str, rest: list[str], query: dict[str, list[str]],
                      body: Any) -> Reply:
        if not rest:
            if method == "POST":
                return self.create_session(sb, body)
            if method == "GET":
                with self.lock:
                    return Reply(200, [s.to_json() for (sid, _sid), s in self.sessions.items() if sid == sb.id])
        elif len(rest) == 1 and rest[0] != "entrypoint":
            if method == "GET":
                return Reply(200, self._session(sb, rest[0]).to_json())
            if method == "DELETE":
                self.delete_session(sb, rest[0])
                return Reply(204)
        elif len(rest) == 2 and rest[1] == "exec" and method == "POST":
            return self.session_exec(sb, rest[0], body)
        elif len(rest) == 3 and rest[1] == "command" and method == "GET":
            session = self._session(sb, rest[0])
            command = self._refresh(session, self._command(session, rest[2]))[0]
            return Reply(200, {"id": command.id, "command": command.command, "exitCode": command.exit_code})
        elif len(rest) == 4 and rest[1] == "command" and rest[3] == "logs" and method == "GET":
            if _q(query, "follow") == "true":
                raise daemon_error(400, "following logs needs a websocket, which the emulator does not serve; "
                                        "poll the logs instead")
            session = self._session(sb, rest[0])
            _command, stdout, stderr = self._refresh(session, self._command(session, rest[2]))
            return Reply(200, _logs(stdout, stderr))
        raise daemon_error(404, f"the emulator does not implement {method} /process/session/{'/'.join(rest)}")

    def create_session(self, sb: SandboxRecord, body: Any) -> Reply:
        if not isinstance(body, dict) or not isinstance(body.get("sessionId"), str) or not body["sessionId"]:
            raise daemon_error(400, "sessionId is required")
        session_id = body["sessionId"]
        key = (sb.id, session_id)
        with self.lock:
            if key in self.sessions:
                raise daemon_error(409, f"session {session_id} already exists")
        assert sb.container_id
        marker = f"{sb.id}/{session_id}"
        exec_id, sock = self.backend.shell(sb.container_id, _runs_as(sb), None, {SESSION_MARKER: marker})
        directory = f"{SESSION_ROOT}/{hashlib.sha1(session_id.encode()).hexdigest()[:16]}"
        session = ShellSession(sb.id, session_id, sb.container_id, exec_id, sock, directory)
        with self.lock:
            self.sessions[key] = session
        threading.Thread(target=self._drain, args=(session,), name=f"session-{session_id[:12]}", daemon=True).start()
        return Reply(201)

    def _drain(self, session: ShellSession) -> None:
        """Read (and drop) what the shell prints outside commands; notice when it ends."""
        try:
            while session.sock.recv(65536):
                pass
        except OSError:
            pass
        exit_code = None
        for _attempt in range(50):
            exit_code = self.backend.exec_exit_code(session.exec_id)
            if exit_code is not None:
                break
            time.sleep(0.1)
        with session.lock:
            session.alive = False
            pending = [session.commands[cid] for cid in session.order if session.commands[cid].exit_code is None]
        # The command that was running when the shell ended (e.g. `exit 3`) gets the shell's exit code.
        first = True
        for command in pending:
            try:
                files = self.backend.read_dir_files(session.container_id, command.directory)
            except BackendError:
                files = {}
            with session.lock:
                if "exit_code" in files:
                    command.exit_code = _int(files["exit_code"])
                else:
                    command.exit_code = (exit_code if exit_code is not None else -1) if first else -1
                    first = False

    def _session(self, sb: SandboxRecord, session_id: str) -> ShellSession:
        with self.lock:
            session = self.sessions.get((sb.id, session_id))
        if session is None:
            raise daemon_error(404, f"session {session_id} not found")
        return session

    @staticmethod
    def _command(session: ShellSession, command_id: str) -> SessionCommand:
        with session.lock:
            command = session.commands.get(command_id)
        if command is None:
            raise daemon_error(404, f"command {command_id} not found")
        return command

    def _refresh(self, session: ShellSession, command: SessionCommand) -> tuple[SessionCommand, bytes, bytes]:
        files = self.backend.read_dir_files(session.container_id, command.directory)
        with session.lock:
            if command.exit_code is None and "exit_code" in files:
                command.exit_code = _int(files["exit_code"])
        return command, files.get("stdout", b""), files.get("stderr", b"")

    def session_exec(self, sb: SandboxRecord, session_id: str, body: Any) -> Reply:
        if not isinstance(body, dict) or not isinstance(body.get("command"), str) or not body["command"].strip():
            raise daemon_error(400, "command cannot be empty")
        run_async = bool(body.get("runAsync") or body.get("async"))
        session = self._session(sb, session_id)
        command_id = str(uuid.uuid4())
        directory = f"{session.directory}/{command_id}"
        quoted = shlex.quote(directory)
        # The command runs in the session's own shell, so cd and exports carry over to later commands.
        script = (f"mkdir -p {quoted} && {{ {body['command']}\n}} < /dev/null > {quoted}/stdout 2> {quoted}/stderr; "
                  f"echo $? > {quoted}/exit_code.tmp; mv {quoted}/exit_code.tmp {quoted}/exit_code\n")
        with session.lock:
            if not session.alive:
                raise self._ended(session_id, "broken pipe")
            session.commands[command_id] = SessionCommand(command_id, body["command"], directory)
            session.order.append(command_id)
            try:
                session.sock.sendall(script.encode())
            except OSError as exc:
                raise self._ended(session_id, str(exc)) from exc
        if run_async:
            return Reply(202, {"cmdId": command_id})
        command = session.commands[command_id]
        while True:
            command, stdout, stderr = self._refresh(session, command)
            if command.exit_code is not None:
                logs = _logs(stdout, stderr)
                return Reply(200, {"cmdId": command_id, "exitCode": command.exit_code, **logs})
            time.sleep(0.1)

    def _ended(self, session_id: str, why: str) -> ApiError:
        """A command sent to a session whose shell is gone: 410 SESSION_ENDED, or (ended_session_answer "400")
        what a daemon that writes the command into the dead shell's stdin answers (session/execute.go)."""
        if self.emu.config.ended_session_answer == "400":
            return daemon_error(400, f"failed to write command: write |1: {why}")
        return daemon_error(410, f"session {session_id} has ended", code="SESSION_ENDED")

    def delete_session(self, sb: SandboxRecord, session_id: str) -> None:
        session = self._session(sb, session_id)
        # Deleting a session kills what it started, as on Daytona.
        self.backend.kill_marked(session.container_id, f"{SESSION_MARKER}={sb.id}/{session_id}")
        self._close(session)
        with self.lock:
            self.sessions.pop((sb.id, session_id), None)

    @staticmethod
    def _close(session: ShellSession) -> None:
        try:
            session.sock.close()
        except OSError:
            pass

    def forget_sandbox(self, sandbox_id: str) -> None:
        """A stop, restart or delete ends the sandbox's sessions (the daemon restarts with the sandbox)."""
        with self.lock:
            keys = [key for key in self.sessions if key[0] == sandbox_id]
            sessions = [self.sessions.pop(key) for key in keys]
        for session in sessions:
            self._close(session)

    def close_all(self) -> None:
        with self.lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        for session in sessions:
            self._close(session)

    def describe(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"sandboxId": s.sandbox_id, "alive": s.alive, **s.to_json()} for s in self.sessions.values()]

    # ---- files --------------------------------------------------------------------------------------------
    def _abs(self, sb: SandboxRecord, path: str) -> str:
        if path.startswith("/"):
            return posixpath.normpath(path)
        return posixpath.normpath(posixpath.join(self.work_dir(sb), path))

    def bulk_upload(self, sb: SandboxRecord, body: bytes, content_type: str) -> Reply:
        boundary = boundary_from_content_type(content_type)
        if not content_type.startswith("multipart/form-data") or boundary is None:
            return Reply(400, {"errors": ["expected multipart/form-data with a boundary"]})
        paths: dict[str, str] = {}
        datas: dict[str, tuple[str | None, bytes]] = {}
        for part in parse_form(body, boundary):
            match = re.fullmatch(r"files\[(\d+)\]\.(path|file)", part.name)
            if not match:
                continue
            if match.group(2) == "path":
                paths[match.group(1)] = part.data.decode("utf-8", "replace")
            else:
                datas[match.group(1)] = (part.filename, part.data)
        errors: list[str] = []
        written: list[dict[str, Any]] = []
        assert sb.container_id
        for index in sorted(datas, key=int):
            filename, data = datas[index]
            target = paths.get(index) or filename
            if not target:
                errors.append(f"files[{index}]: no destination path")
                continue
            target = self._abs(sb, target)
            try:
                self.backend.write_file(sb.container_id, target, data, sb.uid, sb.gid, _runs_as(sb))
                written.append({"path": target, "bytes": len(data)})
            except BackendError as exc:
                errors.append(f"{target}: {exc}")
        if errors:
            return Reply(400, {"errors": errors, "files": written})
        return Reply(200, {"files": written})

    def bulk_download(self, sb: SandboxRecord, body: Any) -> Reply:
        if not isinstance(body, dict) or not isinstance(body.get("paths"), list):
            raise daemon_error(400, "paths is required")
        assert sb.container_id
        results: list[tuple[str, bytes | None, dict | None]] = []
        for path in body["paths"]:
            if not isinstance(path, str):
                raise daemon_error(400, "paths must be strings")
            try:
                results.append((path, self.backend.read_file(sb.container_id, self._abs(sb, path)), None))
            except PathNotFound:
                results.append((path, None, _part_error(404, f"file not found: {path}", "FILE_NOT_FOUND")))
            except PathIsDirectory:
                results.append((path, None, _part_error(400, f"path is a directory: {path}", "INVALID_FILE_PATH")))
            except BackendError as exc:
                results.append((path, None, _part_error(500, str(exc), "FILE_READ_FAILED")))
        data, content_type = build_download(results)
        return Reply(200, data, content_type)

    def download_one(self, sb: SandboxRecord, path: str) -> Reply:
        assert sb.container_id
        try:
            return Reply(200, self.backend.read_file(sb.container_id, self._abs(sb, path)), "application/octet-stream")
        except PathNotFound as exc:
            raise daemon_error(404, f"file not found: {path}", "FILE_NOT_FOUND") from exc
        except PathIsDirectory as exc:
            raise daemon_error(400, f"path is a directory: {path}", "INVALID_FILE_PATH") from exc

    def _as_user(self, sb: SandboxRecord, script: str, *args: str, user: str | None = None) -> tuple[int, str]:
        assert sb.container_id
        result = self.backend.exec_argv(sb.container_id, ["/bin/sh", "-c", script, "daytona-fs", *args],
                                        user=user or _runs_as(sb))
        return result.exit_code, result.output.decode("utf-8", "replace")

    def list_files(self, sb: SandboxRecord, path: str, raw_depth: str | None) -> Reply:
        depth = 1
        if raw_depth:
            if not raw_depth.isdigit() or int(raw_depth) < 1:
                raise daemon_error(400, "depth must be at least 1")
            depth = int(raw_depth)
        target = self._abs(sb, path)
        code, output = self._as_user(sb, LIST_SCRIPT, target, str(depth))
        if code == MISSING:
            raise daemon_error(404, f"directory not found: {path}", "FILE_NOT_FOUND")
        if code == WRONG_KIND:
            raise daemon_error(400, f"not a directory: {path}", "INVALID_FILE_PATH")
        if code != 0 and not output.strip():
            raise daemon_error(403, f"cannot list {path}", "FILE_ACCESS_DENIED")
        entries = [_file_info(line) for line in output.splitlines() if line.count("|") >= 7]
        entries.sort(key=lambda entry: entry["path"])
        return Reply(200, entries)

    def file_info(self, sb: SandboxRecord, path: str) -> dict[str, Any]:
        code, output = self._as_user(sb, INFO_SCRIPT, self._abs(sb, path))
        if code == MISSING:
            raise daemon_error(404, f"file not found: {path}", "FILE_NOT_FOUND")
        if code != 0:
            raise daemon_error(403, f"cannot stat {path}: {output.strip()}", "FILE_ACCESS_DENIED")
        return _file_info(output.strip().splitlines()[0])

    def create_folder(self, sb: SandboxRecord, path: str, mode: str) -> Reply:
        if not re.fullmatch(r"[0-7]{3,4}", mode):
            raise daemon_error(400, "mode must be octal, like 0755")
        code, output = self._as_user(sb, 'mkdir -p -- "$1" && chmod "$2" -- "$1"', self._abs(sb, path), mode)
        if code != 0:
            raise daemon_error(403, f"cannot create {path}: {output.strip()}", "FILE_ACCESS_DENIED")
        return Reply(201)

    def delete_file(self, sb: SandboxRecord, path: str, recursive: bool) -> Reply:
        code, output = self._as_user(sb, DELETE_SCRIPT, self._abs(sb, path), "true" if recursive else "false")
        if code == MISSING:
            raise daemon_error(404, f"file not found: {path}", "FILE_NOT_FOUND")
        if code == WRONG_KIND:
            raise daemon_error(400, f"{path} is a directory; delete it with recursive=true")
        if code != 0:
            raise daemon_error(403, f"cannot delete {path}: {output.strip()}", "FILE_ACCESS_DENIED")
        return Reply(204)

    def move(self, sb: SandboxRecord, source: str, destination: str) -> Reply:
        code, output = self._as_user(sb, '[ -e "$1" ] || [ -L "$1" ] || exit 44; mv -- "$1" "$2"',
                                     self._abs(sb, source), self._abs(sb, destination))
        if code == MISSING:
            raise daemon_error(404, f"file not found: {source}", "FILE_NOT_FOUND")
        if code != 0:
            raise daemon_error(400, f"cannot move {source}: {output.strip()}")
        return Reply(200)

    def permissions(self, sb: SandboxRecord, path: str, query: dict[str, list[str]]) -> Reply:
        target = self._abs(sb, path)
        steps = []
        if _q(query, "mode"):
            steps.append(["chmod", _q(query, "mode") or "", target])
        owner, group = _q(query, "owner"), _q(query, "group")
        if owner or group:
            steps.append(["chown", f"{owner or ''}{':' + group if group else ''}", target])
        for argv in steps:
            code, output = self._as_user(sb, '"$@"', *argv, user="0")
            if code != 0:
                raise daemon_error(400, f"{argv[0]} failed: {output.strip()}")
        return Reply(200)

    def home_dir(self, sb: SandboxRecord) -> str:
        code, output = self._as_user(sb, 'printf %s "$HOME"')
        return output.strip() if code == 0 and output.strip() else ("/root" if _runs_as(sb) == "root" else "/")

    def work_dir(self, sb: SandboxRecord) -> str:
        assert sb.container_id
        return self.backend.container_workdir(sb.container_id) or self.home_dir(sb)


def _runs_as(sb: SandboxRecord) -> str:
    """The daemon's user: toolbox calls run as it (the image's USER on Daytona, not the create's os_user)."""
    return sb.process_user or sb.user


def _json(body: bytes) -> Any:
    if not body:
        return None
    import json

    try:
        return json.loads(body)
    except ValueError as exc:
        raise daemon_error(400, f"invalid JSON body: {exc}") from exc


def _q(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


def _required(query: dict[str, list[str]], key: str) -> str:
    value = _q(query, key)
    if not value:
        raise daemon_error(400, f"query parameter {key} is required")
    return value


def _int(raw: bytes) -> int:
    try:
        return int(raw.decode().strip())
    except ValueError:
        return -1


def _logs(stdout: bytes, stderr: bytes) -> dict[str, str]:
    out, err = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
    return {"output": out + err, "stdout": out, "stderr": err}


def _part_error(status: int, message: str, code: str) -> dict[str, Any]:
    return {"message": message, "statusCode": status, "code": code, "source": SOURCE_DAEMON}


def _file_info(line: str) -> dict[str, Any]:
    kind, size, octal, symbolic, owner, group, mtime, path = line.split("|", 7)
    moment = time.gmtime(int(mtime)) if mtime.isdigit() else time.gmtime(0)
    return {
        "name": posixpath.basename(path.rstrip("/")) or path,
        "path": path,
        "isDir": kind == "directory",
        "size": int(size) if size.isdigit() else 0,
        "mode": symbolic,
        "permissions": f"{int(octal, 8):04o}" if re.fullmatch(r"[0-7]+", octal) else octal,
        "owner": owner,
        "group": group,
        "modTime": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", moment),
        "modifiedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", moment),
    }
