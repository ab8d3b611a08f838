# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Best of N, the pure part: the plan checked before any box is made, test counts read from a check's
output, the winner, and the result as a table and a page.

Everything that comes from a box (check output, diffs, file names) is text written by an agent we do
not trust: it is only counted, matched with bounded regular expressions, and escaped on the page.
"""

from __future__ import annotations

import html
import os
import re
import shlex
from typing import Any

KNOWN_AGENTS = ("claude", "codex", "opencode")
MAX_RUNS = 8
# States a run ends in; only `done` runs can win.
FINISHED = ("done", "waiting", "timeout", "failed")

_PYTEST = re.compile(
    r"^=+ (?P<body>[^=\n]*\b(?:passed|failed|error|errors|skipped|no tests ran)\b[^=\n]*) =+\s*$", re.M
)
_JEST = re.compile(r"^Tests:\s+(?P<body>[^\n]*\btotal)\s*$", re.M)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?)\b")
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s\s*\n\s*\n(OK|FAILED \((?P<why>[^)\n]*)\))", re.M)
_UNITTEST_BAD = re.compile(r"(?:failures|errors|unexpected successes)=(\d+)")
_GO_PASS = re.compile(r"^\s*--- PASS: ", re.M)
_GO_FAIL = re.compile(r"^\s*--- FAIL: ", re.M)
_GO_OK_PKG = re.compile(r"^ok\s+\S+", re.M)
_GO_FAIL_PKG = re.compile(r"^FAIL\s+\S+\s", re.M)


def plan(params: dict[str, Any], default_check: str | None, max_runs: int = MAX_RUNS) -> list[dict[str, Any]]:
    """The runs asked for: [{index, agent, command, env}]. Raises ValueError, saying what to do, for an empty
    task, no check, an unknown agent, or a count below 1 or above the cap."""
    if not (params.get("task") or "").strip():
        raise ValueError("the task is empty: give it with -e task='...' or -e task_file=PATH")
    agents = params.get("agents")
    n = params.get("n")
    if agents is None or agents == []:
        agents = ["claude"]
    if isinstance(agents, (str, dict)):
        agents = [agents]
    if n is not None:
        if len(agents) != 1:
            raise ValueError(f"n={n} repeats one agent: give a single agent with it, not {len(agents)}")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be 1 or more, not {n!r}")
        agents = agents * n
    if not 1 <= len(agents) <= max_runs:
        raise ValueError(f"{len(agents)} runs asked for: between 1 and {max_runs} (-e max_runs=N raises the cap)")
    runs = []
    for index, entry in enumerate(agents, start=1):
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ValueError(f"agent {index} must be a name ({', '.join(KNOWN_AGENTS)}) or a mapping {{name, command}}")
        command = entry.get("command")
        if command is not None and (not isinstance(command, str) or not command.strip()):
            raise ValueError(f"agent {index} ({entry['name']}): its command is empty")
        if command is None and entry["name"] not in KNOWN_AGENTS:
            raise ValueError(
                f"unknown agent {entry['name']!r}: use one of {', '.join(KNOWN_AGENTS)}, or a custom command as "
                f"{{name: {entry['name']}, command: '...'}}"
            )
        env = entry.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError(f"agent {index} ({entry['name']}): env must be a mapping")
        timeout = entry.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"agent {index} ({entry['name']}): its timeout must be a number of seconds above 0")
        runs.append({"index": index, "agent": entry["name"], "command": command,
                     "env": {str(k): str(v) for k, v in env.items()}, "timeout": timeout})  # fmt: skip
    check = (params.get("check") or default_check or "").strip()
    if not check:
        raise ValueError(
            "no check to judge the runs: pass -e check='COMMAND' (run in /workspace of each box), or give the "
            "project a test task in agentbox.yaml (tasks: test: command: ...)"
        )
    return runs


ENGINE_KEYS = ("engine", "ssh_private_key_file", "ssh_strict_host_key_checking", "isolation")


def spread(runs: list[dict[str, Any]], engines: Any) -> None:
    """Each run's engine, the engines taken in turn as fleet_create.yml takes them (run 1 on the first): its
    provider options under `where` ({} without engines). An entry is an engine (`user@host[:port]`, an
    ~/.ssh/config alias) or a mapping of ENGINE_KEYS, as fleet_engines.yml makes them from an inventory."""
    if not engines:
        for run in runs:
            run["where"] = {}
        return
    if not isinstance(engines, list):
        raise ValueError("engines must be a list of engines (user@host[:port], or {engine: ..., ...})")
    places = []
    for number, entry in enumerate(engines, start=1):
        place = {"engine": entry} if isinstance(entry, str) else entry
        if not isinstance(place, dict) or not isinstance(place.get("engine"), str) or not place["engine"].strip():
            raise ValueError(f"engine {number} of engines names no engine: give user@host[:port] or {{engine: ...}}")
        unknown = set(place) - set(ENGINE_KEYS)
        if unknown:
            raise ValueError(f"engine {number} ({place['engine']}): unknown keys {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(ENGINE_KEYS)})")  # fmt: skip
        places.append({key: value for key, value in place.items() if value not in (None, "")})
    for run in runs:
        run["where"] = places[(run["index"] - 1) % len(places)]
        run["engine"] = run["where"]["engine"]


# Words of a shell line that are not a program (the next word is), or that open a construct not read here.
_PREFIX_WORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "time", "exec", "command", "nohup"}
_END_WORDS = {"fi", "done", "esac", "}", "]]"}
_OPAQUE_WORDS = {"for", "case", "select", "function", "coproc", "[[", "(("}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def check_programs(check: str) -> list[tuple[str, str | None]]:
    """The programs a check's shell line starts, in order: (program, directory relative to /workspace as far
    as the line's own `cd` says, None when it cannot be told). A word the shell would expand ($, `, globs) is
    not a program name known before the run, so it is left out, as is whatever this plain reading cannot
    follow (loops, `case`, subshells' own cd); those the box finds when the check runs."""
    lexer = shlex.shlex(check, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: bash says so when the check runs
        return []
    found: list[tuple[str, str | None]] = []
    cwd: str | None = ""
    words: list[str] = []
    skip_next = False
    for token in [*tokens, ";"]:
        if skip_next:
            skip_next = False
            continue
        if token and set(token) <= set("<>&"):
            if "<" in token or ">" in token:
                skip_next = True  # a redirection's file
                continue
        if token and set(token) <= set(";&|()"):
            cwd = _note(words, found, cwd)
            words = []
            continue
        words.append(token)
    return found


def _note(words: list[str], found: list[tuple[str, str | None]], cwd: str | None) -> str | None:
    """One simple command's program into `found`; the directory after it (a `cd` moves it)."""
    while words and (words[0] in _PREFIX_WORDS or _ASSIGNMENT.match(words[0])):
        words = words[1:]
    if not words or words[0] in _END_WORDS:
        return cwd
    program = words[0]
    if program in _OPAQUE_WORDS or re.search(r"[$`*?\[\]{}~]", program):
        return None if program in _OPAQUE_WORDS else cwd
    if program == "cd":
        target = words[1] if len(words) > 1 else ""
        if len(words) != 2 or re.search(r"[$`*?~]", target) or target.startswith("-"):
            return None
        if target.startswith("/"):
            inside = os.path.relpath(target, "/workspace")
            return None if inside.startswith("..") else ("" if inside == "." else inside)
        moved = None if cwd is None else os.path.normpath(os.path.join(cwd or ".", target))
        return None if moved is None or moved.startswith("..") else ("" if moved == "." else moved)
    found.append((program, cwd))
    return cwd


def default_check(project: Any) -> str | None:
    """agentbox.yaml's test task as one shell line (with its cwd), or None."""
    tasks = project.get("tasks") if isinstance(project, dict) else None
    test = tasks.get("test") if isinstance(tasks, dict) else None
    command = test.get("command") if isinstance(test, dict) else test
    if isinstance(command, list):
        command = " ".join(shlex.quote(str(part)) for part in command)
    if not isinstance(command, str) or not command.strip():
        return None
    cwd = test.get("cwd") if isinstance(test, dict) else None
    if isinstance(cwd, str) and cwd:
        return f"cd {shlex.quote(cwd)} && {command.strip()}"
    return command.strip()


def test_counts(output: str) -> tuple[int | None, int | None]:
    """(passed, failed) as pytest, jest, go test or Python's unittest printed them; None where the output
    does not say."""
    text = output[-200_000:]
    ran = list(_UNITTEST_RAN.finditer(text))
    if ran:
        failed = sum(int(n) for n in _UNITTEST_BAD.findall(ran[-1].group("why") or ""))
        return int(ran[-1].group(1)) - failed, failed
    for pattern in (_PYTEST, _JEST):
        found = list(pattern.finditer(text))
        if found:
            counts = {"passed": 0, "failed": 0}
            for number, word in _COUNT.findall(found[-1].group("body")):
                counts["passed" if word == "passed" else "failed"] += int(number)
            return counts["passed"], counts["failed"]
    passed, failed = len(_GO_PASS.findall(text)), len(_GO_FAIL.findall(text))
    if passed or failed:
        return passed, failed
    passed, failed = len(_GO_OK_PKG.findall(text)), len(_GO_FAIL_PKG.findall(text))
    if passed or failed:
        return passed, failed
    return None, None


def _churn(run: dict[str, Any]) -> int:
    stat = run.get("diff_stat") or {}
    return int(stat.get("insertions") or 0) + int(stat.get("deletions") or 0)


def pick(runs: list[dict[str, Any]], adopt: str | None) -> dict[str, Any] | None:
    """The run to adopt. `auto`: of the finished runs whose check passed, the fewest failed tests, the most
    passed, then the smallest diff, then the quickest; None when none passed. Otherwise the run named by its
    number, box or (unique) agent name; ValueError when it names none or several."""
    if not adopt:
        return None
    if adopt == "auto":
        good = [r for r in runs if r.get("state") == "done" and r.get("check_rc") == 0]
        good.sort(
            key=lambda r: (r.get("tests_failed") or 0, -(r.get("tests_passed") or 0), _churn(r), r.get("seconds") or 0)
        )
        return good[0] if good else None
    named = [r for r in runs if adopt in (str(r.get("index")), r.get("box"), r.get("agent"))]
    if len(named) != 1:
        which = "no run" if not named else f"{len(named)} runs ({', '.join(r['box'] for r in named)})"
        raise ValueError(f"adopt={adopt!r} names {which}: use a run's number, its box, or an agent name used once")
    return named[0]


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def table(runs: list[dict[str, Any]], winner: dict[str, Any] | None) -> str:
    """The terminal table, one line per run."""
    header = ["#", "agent", "box", "state", "check", "passed", "failed", "diff", "files", "seconds", "tokens", "note"]
    rows = [header]
    for run in runs:
        stat = run.get("diff_stat") or {}
        diff = f"+{stat.get('insertions', 0)} -{stat.get('deletions', 0)}" if stat else "-"
        mark = "*" if winner is not None and run.get("box") == winner.get("box") else ""
        rows.append([f"{run.get('index')}{mark}", _cell(run.get("agent")), _cell(run.get("box")), _cell(run.get("state")),
                     _cell(run.get("check_rc")), _cell(run.get("tests_passed")), _cell(run.get("tests_failed")), diff,
                     _cell(len(run.get("files") or [])), _cell(run.get("seconds")), _cell(run.get("tokens")),
                     _cell(run.get("reason"))[:80]])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


_CSS = """
  :root { --fg: #1d2330; --muted: #6b7385; --line: #e3e6ed; --bg: #f6f7fb; --card: #fff;
          --add: #2da44e; --del: #cf222e; --run: #1a7f37; --pause: #9a6700; --stop: #6e7781; }
  * { box-sizing: border-box; }
  body { margin: 0; padding: 24px; background: var(--bg); color: var(--fg);
         font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  .sub { color: var(--muted); margin: 0 0 20px; }
  table { width: 100%; border-collapse: separate; border-spacing: 0; background: var(--card);
          border: 1px solid var(--line); border-radius: 10px; margin-bottom: 20px; }
  th, td { padding: 8px; text-align: left; border-bottom: 1px solid var(--line); vertical-align: middle; }
  th { font-size: 11px; text-transform: uppercase; letter-spacing: .02em; color: var(--muted); background: #fafbfd; }
  tr:last-child td { border-bottom: 0; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  tr.winner td { background: #eefbf1; }
  .state { display: inline-block; padding: 2px 9px; border-radius: 999px; font-size: 12px; font-weight: 600; color: #fff;
           background: var(--stop); }
  .state.done { background: var(--run); } .state.waiting, .state.timeout { background: var(--pause); }
  .state.failed { background: var(--del); }
  .ok { color: var(--add); font-weight: 600; } .bad { color: var(--del); font-weight: 600; }
  code { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
  .diffs { display: grid; grid-auto-flow: column; grid-auto-columns: minmax(360px, 1fr); gap: 12px; overflow-x: auto; }
  .diff { background: var(--card); border: 1px solid var(--line); border-radius: 10px; min-width: 0; }
  .diff h2 { font-size: 14px; margin: 0; padding: 8px 10px; border-bottom: 1px solid var(--line); }
  .diff pre { margin: 0; padding: 8px 10px; overflow-x: auto; font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
  .diff .a { color: var(--add); display: block; background: #eefbf1; } .diff .d { color: var(--del); display: block; background: #fff0f0; }
  .diff .h { color: var(--muted); display: block; }
"""


def _diff_lines(diff: str) -> str:
    out = []
    for line in diff.splitlines():
        cls = (
            "a"
            if line.startswith("+") and not line.startswith("+++")
            else "d"
            if line.startswith("-") and not line.startswith("---")
            else "h"
            if line.startswith(("diff ", "@@", "index ", "+++", "---"))
            else ""
        )
        text = html.escape(line)
        out.append(f'<span class="{cls}">{text}</span>' if cls else text + "\n")
    return "".join(out)


def page(result: dict[str, Any]) -> str:
    """best_of.html: self-contained (no script, font or image from anywhere), every value escaped."""
    esc = html.escape
    runs, winner = result.get("runs") or [], result.get("winner_box")
    rows = []
    for run in runs:
        stat = run.get("diff_stat") or {}
        rc = run.get("check_rc")
        diff = f"+{stat.get('insertions', 0)} -{stat.get('deletions', 0)}" if stat else "-"
        check = "-" if rc is None else f'<span class="{"ok" if rc == 0 else "bad"}">{esc(str(rc))}</span>'
        rows.append(
            f'<tr class="run{" winner" if run.get("box") == winner else ""}" data-box="{esc(str(run.get("box")))}">'
            f'<td class="num" data-field="index">{esc(str(run.get("index")))}{" ★" if run.get("box") == winner else ""}</td>'
            f'<td data-field="agent">{esc(str(run.get("agent")))}</td>'
            f'<td data-field="box"><code>{esc(str(run.get("box")))}</code></td>'
            f'<td data-field="state"><span class="state {esc(str(run.get("state")))}">{esc(str(run.get("state")))}</span></td>'
            f'<td class="num" data-field="check">{check}</td>'
            f'<td class="num" data-field="passed">{esc(_cell(run.get("tests_passed")))}</td>'
            f'<td class="num" data-field="failed">{esc(_cell(run.get("tests_failed")))}</td>'
            f'<td class="num" data-field="diff">{esc(diff)}</td>'
            f'<td class="num" data-field="files">{len(run.get("files") or [])}</td>'
            f'<td class="num" data-field="seconds">{esc(_cell(run.get("seconds")))}</td>'
            f'<td class="num" data-field="tokens">{esc(_cell(run.get("tokens")))}</td>'
            f'<td data-field="reason">{esc(_cell(run.get("reason")))}</td></tr>'
        )
    diffs = "".join(
        f'<section class="diff" data-box="{esc(str(run.get("box")))}"><h2>{esc(str(run.get("index")))}. '
        f"{esc(str(run.get('agent')))} <code>{esc(str(run.get('branch') or ''))}</code></h2>"
        f"<pre>{_diff_lines(run.get('diff') or '') or '(no change)'}</pre></section>"
        for run in runs
    )
    winner_line = f"winner: {esc(winner)}" if winner else "no run adopted"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>agentbox best of {len(runs)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>Best of {len(runs)}</h1>\n"
        f'<p class="sub">run {esc(str(result.get("id")))} · check <code>{esc(str(result.get("check")))}</code> · '
        f'<span data-field="winner">{winner_line}</span></p>\n'
        "<table><thead><tr><th>#</th><th>agent</th><th>box</th><th>state</th><th>check</th><th>passed</th>"
        "<th>failed</th><th>diff</th><th>files</th><th>seconds</th><th>tokens</th><th>note</th></tr></thead>\n"
        f"<tbody>{''.join(rows)}</tbody></table>\n"
        f'<div class="diffs">{diffs}</div>\n</body>\n</html>\n'
    )
