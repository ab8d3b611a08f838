"""Every end-to-end journey named in tests/integration/journeys.py is a test function that exists, so
`pytest -m journey` never silently runs fewer journeys than the list says."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.integration.journeys import JOURNEYS

INTEGRATION = Path(__file__).resolve().parents[2] / "integration"


def test_every_journey_names_an_existing_test() -> None:
    missing = []
    for journey in JOURNEYS:
        path, name = journey.split("::", 1)
        source = INTEGRATION / path
        tests = {node.name for node in ast.parse(source.read_text()).body
                 if isinstance(node, ast.FunctionDef)} if source.is_file() else set()  # fmt: skip
        if name not in tests:
            missing.append(journey)
    assert not missing, f"journeys.py names tests that do not exist (renamed or removed?): {missing}"
    assert len(set(JOURNEYS)) == len(JOURNEYS), "a journey is listed twice"
    assert len(JOURNEYS) >= 35
