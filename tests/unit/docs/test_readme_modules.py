"""README's module table and docs/modules.md list every module in plugins/modules, each with what it
is for (issue 33 item 16: the README listed 7 of 12). No engine: the files are read and compared."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def modules_in_the_collection() -> set[str]:
    return {path.stem for path in (REPO / "plugins" / "modules").glob("*.py") if path.stem != "__init__"}


def table_after(text: str, heading: str) -> dict[str, str]:
    """The first Markdown table after the line that starts with `heading`: first cell's `name` -> last cell."""
    lines = text[text.index(heading) :].splitlines()[1:]
    start = next(index for index, line in enumerate(lines) if line.startswith("|"))
    rows: dict[str, str] = {}
    for line in lines[start + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        name = re.fullmatch(r"`(?:agentbox\.box\.)?([a-z_]+)`(?: \(\w+\))?", cells[0])
        assert name, f"a row whose first cell is not a `name`: {line}"
        rows[name.group(1)] = cells[-1]
    return rows


def test_readme_module_table_lists_every_module_with_its_purpose():
    table = table_after((REPO / "README.md").read_text(encoding="utf-8"), "Modules (`ansible-doc")
    assert sorted(set(table) - modules_in_the_collection()) == []  # no row for a module that is gone
    assert sorted(modules_in_the_collection() - set(table)) == []  # every module has its row
    assert [name for name, purpose in table.items() if len(purpose.split()) < 4] == []


def test_modules_page_lists_every_module():
    table = table_after((REPO / "docs" / "modules.md").read_text(encoding="utf-8"), "Every one renders with")
    assert sorted(modules_in_the_collection() - set(table)) == []
