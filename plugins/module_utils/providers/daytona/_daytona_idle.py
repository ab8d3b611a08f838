# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The idle signal of a Daytona box: the probe run in it, and the keep-or-pause decision on its answer
(used by agentbox_reap; see docs/providers/daytona.md#idle-timeout)."""

from __future__ import annotations

from typing import Any

IDLE_LABEL = "idle_timeout"
DEFAULT_IDLE_MINUTES = 30

# Idle signal, printed as key=value lines (see docs/providers/daytona.md#idle-timeout).
IDLE_PROBE_SCRIPT = r"""
window=$1
now=$(date +%s)
echo "now=$now"
hb="$HOME/.agentbox/last-activity"
[ -e "$hb" ] && echo "heartbeat=$(stat -c %Y "$hb" 2>/dev/null)"
if command -v tmux >/dev/null 2>&1; then
  t=$(tmux list-windows -a -F '#{window_activity}' 2>/dev/null | sort -n | tail -n 1)
  [ -n "$t" ] && echo "tmux=$t"
fi
if [ -d /workspace ]; then
  ref=$(mktemp)
  touch -d "@$((now - window))" "$ref" 2>/dev/null && \
    echo "recent=$(find /workspace -xdev -mindepth 1 -newer "$ref" -print -quit 2>/dev/null)"
  rm -f "$ref"
fi
exit 0
"""


def idle_decision(probe: dict[str, str], timeout_minutes: float) -> tuple[str, str, float | None]:
    """(action, reason, idle seconds) from the idle probe: 'keep' or 'pause'.

    A box has an idle signal when its agent left one: the heartbeat file or a tmux window. Without
    one it is never paused. With one, the newest of heartbeat and tmux activity is the last activity,
    and any file under /workspace changed within the window counts as activity too.
    """
    now = int_or_none(probe.get("now"))
    marks = [value for value in (int_or_none(probe.get("heartbeat")), int_or_none(probe.get("tmux"))) if value]
    if now is None:
        return "keep", "the idle probe gave no time", None
    if not marks:
        return "keep", "no idle signal (no agent heartbeat file, no tmux window)", None
    idle = float(max(0, now - max(marks)))
    if probe.get("recent"):
        return "keep", f"busy: {probe['recent']} changed within the last {timeout_minutes:g} min", idle
    if idle <= timeout_minutes * 60:
        return "keep", f"busy: last agent activity {idle:.0f} s ago (timeout {timeout_minutes:g} min)", idle
    return "pause", f"idle for {idle:.0f} s, longer than its timeout of {timeout_minutes:g} min", idle


def int_or_none(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None
