"""docs/egress.md lists the default allow list exactly as _egress_policy holds it: one place for the list,
and the page a user reads says the same."""

from __future__ import annotations

import re
from pathlib import Path

from ansible_collections.agentbox.box.plugins.module_utils.egress._egress_policy import DEFAULT_ALLOW_GROUPS

DOC = Path(__file__).resolve().parents[3] / "docs" / "egress.md"


def test_the_docs_list_the_default_allow_list_group_by_group() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## The default allow list", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    documented = [(row.split("|")[1].strip(), tuple(re.findall(r"`([^`]+)`", row.split("|")[2]))) for row in rows]
    assert documented == list(DEFAULT_ALLOW_GROUPS)
