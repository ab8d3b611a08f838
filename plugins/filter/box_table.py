# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: box_table
short_description: Format box facts as an aligned text table
version_added: 0.1.0
description:
  - Turns a list of box facts (as returned by M(agentbox.box.agentbox_box_info)) into the table that
    C(playbooks/list_boxes.yml) prints - box, state, branch, workspace, ports, age, agent (name:state).
  - The ports column lists the published ports (C(127.0.0.1:49153->80)), then the box's forwards on this machine
    (C(127.0.0.1:41235=>5173(pid=4242)), the C(forwards) of M(agentbox.box.agentbox_box_info)).
positional: _input
options:
  _input:
    description: A list of box facts.
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Print every box
  ansible.builtin.debug:
    msg: "{{ found.boxes | agentbox.box.box_table }}"
"""

RETURN = r"""
_value:
  description: The table, one line per box under a header line.
  type: str
"""

import calendar
import time

COLUMNS = ("BOX", "STATE", "PROVIDER", "BRANCH", "WORKSPACE", "PORTS", "AGE", "AGENT")


def _age(created: str, now: float) -> str:
    try:
        seconds = max(0, int(now - calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ"))))
    except (TypeError, ValueError):
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _ports(ports: dict, forwards: list | None = None) -> str:
    # In container port order, numerically (80 before 6080), in the form create_box.yml prints too
    # (and `docker ps`): engine address -> box port; then agentbox_forward's forwards on this machine (=>), no
    # space in a cell (the table is read by splitting on spaces).
    ordered = sorted((ports or {}).items(), key=lambda item: (len(str(item[0])), str(item[0])))
    published = [f"127.0.0.1:{host}->{container}" for container, host in ordered]
    forwarded = [f"127.0.0.1:{item.get('local_port')}=>{item.get('port')}(pid={item.get('pid')})"
                 for item in forwards or [] if isinstance(item, dict)]  # fmt: skip
    return ",".join(published + forwarded) or "-"


def _agent(agent: dict | None) -> str:
    if not isinstance(agent, dict) or not agent.get("state"):
        return "-"
    return f"{agent.get('name')}:{agent['state']}"


def box_table(boxes: list[dict], now: float | None = None) -> str:
    now = time.time() if now is None else now
    rows = [COLUMNS] + [
        (
            box.get("name", ""),
            box.get("state", ""),
            box.get("provider", "") + ("" if box.get("engine") in (None, "", "local") else f"@{box['engine']}")
            # Root in such a box is root on its engine's host (io.agentbox.isolation=none).
            + (" (unisolated)" if (box.get("labels") or {}).get("isolation") == "none" else ""),
            box.get("branch") or "-",
            box.get("workspace") or "-",
            _ports(box.get("ports"), box.get("forwards")),
            _age(box.get("created", ""), now),
            _agent(box.get("agent")),
        )
        for box in boxes
    ]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    if not boxes:
        lines.append("(no boxes)")
    return "\n".join(lines)


class FilterModule:
    def filters(self) -> dict:
        return {"box_table": box_table}
