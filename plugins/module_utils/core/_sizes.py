# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sizes given by users ("512m", "2g", "1.5gb"): one parser for a box's memory limit and the pool's budget.

Note that this module_utils is PRIVATE to the collection: it can change at any time.
"""

from __future__ import annotations

import re

# Units a memory limit may carry, as the docker CLI and SDK read them ("512m", "2g", "1.5g").
_BYTE_UNITS = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
# Plain digits (a decimal point allowed), a unit, an optional trailing b: never a sign, an exponent, inf or nan.
_SIZE = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,9})?)([bkmgBKMG])?[bB]?")


class BadValue(ValueError):
    """A size that is not a number with a unit."""


def memory_bytes(value: str | int | float) -> int:
    """A memory size in bytes: a number of bytes, or digits with a b/k/m/g unit (a trailing 'b'
    after the unit allowed: '2gb')."""
    if isinstance(value, (int, float)):
        return int(value)
    text = value.strip()
    if not text:
        return 0
    found = _SIZE.fullmatch(text)
    if found is None:
        unit = text.rstrip("bB")[-1:].lower() or "b"
        if not unit.isdigit() and unit not in _BYTE_UNITS:
            raise BadValue(f"memory {value!r} should end in one of the units b, k, m, g")
        raise BadValue(f"memory {value!r} is not a number with a unit")
    return int(float(found.group(1)) * _BYTE_UNITS[(found.group(2) or "b").lower()])
