"""The fleet page's layout in a real headless Chromium, from prepared rows (no boxes; issue 33 item 16).

At 1400 px: no header wraps, a branch (`agentbox/<box>`) is one line, never broken after its slash,
and the last commit gets the room it needs (the other cells keep their one-line width and it takes
what they leave); a branch or subject past any reasonable length ends in an ellipsis with the whole
in its title. Nothing needs a sideways scroll at 1400 px, just above the card breakpoint, or at 800 px.
The page comes from the playbook's own template (tests/integration/support/fleet_page.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.support.fleet_page import measure_page, render_page

pytestmark = pytest.mark.integration

# Names, engines and subjects of the usual sizes: a box name over 24 characters (its branch 35), an SSH
# engine, Daytona's API URL, a base branch with a slash, subjects of 23 to 46 characters.
USUAL = [
    {"box": "webshop-fix-login-redirect", "state": "running", "branch": "agentbox/webshop-fix-login-redirect",
     "base": "main", "provider": "docker", "engine": "local", "web_url": "http://127.0.0.1:49213/",
     "agent": "working", "ahead": 3, "behind": 2, "files": 4, "insertions": 120, "deletions": 14,
     "uncommitted": 2, "uncommitted_keys": ["a.py:1", "b.py:2"],
     "subject": "Rework the login redirect for expired sessions", "age_seconds": 240},
    {"box": "webshop-3fa2c1", "state": "paused", "branch": "agentbox/webshop-3fa2c1", "base": "feature/checkout-v2",
     "provider": "docker_ssh", "engine": "root@127.0.0.1:2201", "web_url": "", "agent": "idle", "ahead": 1,
     "behind": 0, "files": 1, "insertions": 3, "deletions": 0, "uncommitted": None,
     "subject": "Try the new payment SDK", "age_seconds": 7200},
    {"box": "api-migrate-db", "state": "stopped", "branch": "agentbox/api-migrate-db", "base": "main",
     "provider": "daytona", "engine": "https://app.daytona.io/api", "web_url": "", "agent": None, "ahead": 0,
     "behind": 5, "files": 0, "insertions": 0, "deletions": 0, "uncommitted": 0,
     "subject": "Add the migration for the orders table", "age_seconds": 400000},
]  # fmt: skip
LONG_BOX = "payments-service-refactor-ledger-v2-9f3a1c"
LONG_SUBJECT = ("Move the ledger to the new double-entry schema and migrate the historic balances in batches of "
                "ten thousand rows per transaction")  # fmt: skip
# Past every cap: a 42-character box name (branch of 51), a long subject and a long preview URL.
LONG = {"box": LONG_BOX, "state": "running", "branch": f"agentbox/{LONG_BOX}", "base": "release/2025.01-hotfixes",
        "provider": "daytona", "engine": "https://app.daytona.io/api", "agent": "waiting",
        "web_url": "https://6080-3f1e2d4c-5b6a-7980-a1b2-c3d4e5f60718.proxy.daytona.works/", "ahead": 567,
        "behind": 1234, "files": 1234, "insertions": 123456, "deletions": 65432, "uncommitted": 1234,
        "subject": LONG_SUBJECT, "age_seconds": 60}  # fmt: skip
# The card layout starts at 1250 px and below; the table is measured just above it too.
JUST_ABOVE_CARDS = 1251


def assert_no_sideways_scroll(measured: dict, width: int) -> None:
    assert measured["scrollWidth"] <= measured["clientWidth"], (width, measured["wide"])
    assert measured["wide"] == [], (width, measured["wide"])


def one_line_headers(measured: dict) -> list[str]:
    """The headers that take more than one line (none should)."""
    assert measured["headers"] and all(header["visible"] for header in measured["headers"])
    return [header["text"] for header in measured["headers"] if header["lines"] != 1]


def test_fleet_page_at_1400_px_keeps_headers_and_branches_on_one_line_and_the_last_commit_whole(tmp_path: Path):
    measured = measure_page(render_page(USUAL, tmp_path / "usual.html"), 1400)
    assert_no_sideways_scroll(measured, 1400)
    assert one_line_headers(measured) == []
    rows = {row["box"]: row for row in measured["rows"]}
    assert sorted(rows) == sorted(row["box"] for row in USUAL)
    for row in USUAL:
        shown = rows[row["box"]]
        # The branch and the base branch each on one line and shown whole; the last commit whole.
        assert shown["branch_shown"] == {"text": row["branch"], "title": row["branch"], "lines": 1, "cut": False}
        assert shown["base_shown"] == {"text": row["base"], "title": row["base"], "lines": 1, "cut": False}
        assert shown["subject_shown"] == {"text": row["subject"], "title": row["subject"], "lines": 1, "cut": False}
    assert measured["broken"] == []


def test_fleet_page_at_1400_px_shortens_what_is_past_its_cap_with_the_whole_in_the_title(tmp_path: Path):
    page = render_page([*USUAL, LONG], tmp_path / "fleet.html")
    measured = measure_page(page, 1400)
    assert_no_sideways_scroll(measured, 1400)
    assert one_line_headers(measured) == []
    assert measured["broken"] == []
    long = next(row for row in measured["rows"] if row["box"] == LONG_BOX)
    # Still one line, shortened with an ellipsis; the whole in the title (and in the text, for copying).
    branch = f"agentbox/{LONG_BOX}"
    assert long["branch_shown"] == {"text": branch, "title": branch, "lines": 1, "cut": True}
    assert long["subject_shown"]["title"] == LONG_SUBJECT and long["subject_shown"]["cut"]
    assert long["web"] and long["web_href"] == LONG["web_url"]


def test_fleet_page_has_no_sideways_scroll_above_and_below_the_card_breakpoint(tmp_path: Path):
    usual = render_page(USUAL, tmp_path / "usual.html")
    every = render_page([*USUAL, LONG], tmp_path / "every.html")
    for page, width in ((usual, JUST_ABOVE_CARDS), (every, JUST_ABOVE_CARDS), (usual, 800), (every, 800), (every, 600)):
        measured = measure_page(page, width)
        assert_no_sideways_scroll(measured, width)
        assert measured["broken"] == [], (width, measured["broken"])
        for row in measured["rows"]:
            assert row["right"] <= measured["clientWidth"], (width, row["box"])
        if width == JUST_ABOVE_CARDS:
            assert one_line_headers(measured) == []
        else:  # cards: each field labelled, no table header
            assert not any(header["visible"] for header in measured["headers"]), width
