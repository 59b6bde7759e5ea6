"""Numbers printed so that figures that differ read differently: one definition for every table and message.

A cosine similarity of 0.99999994 printed as "1" beside another candidate's exact 1 makes a decision taken on
their difference look arbitrary ("lost the tie-break on accuracy: 1 vs 1"). These functions add digits until the
texts differ, up to what a float holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeGuard

MAX_DIGITS = 17  # a double's shortest round-trip text needs at most 17 significant digits


def finite(value: object) -> TypeGuard[float]:
    """A real number (not a bool) that is neither infinite nor nan (an int counts: typed as float, as PEP 484
    allows an int where a float is expected)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def distinct(value: float, others: Iterable[float | None] = (), least: int = 4) -> str:
    """``value`` with ``least`` significant digits, or as many more as it takes for its text to differ from the
    text of each other value it differs from (and not to read as that other value): 0.99999994 against 1 is
    "0.99999994", not "1"."""
    if not finite(value):
        return str(value)
    rivals = [float(o) for o in others if finite(o) and o != value]
    for digits in range(least, MAX_DIGITS + 1):
        text = f"{value:.{digits}g}"
        if all(text != f"{o:.{digits}g}" and float(text) != o for o in rivals):
            return text
    return repr(value)


def decimals_apart(values: Iterable[float | None], least: int = 6) -> int:
    """The fewest decimals (at least ``least``) with which the distinct finite ``values`` all print differently
    in fixed-point notation (a column of cosine similarities: 1.00000000 and 0.99999994)."""
    found = sorted({float(v) for v in values if finite(v)})
    for decimals in range(least, MAX_DIGITS + 1):
        texts = {f"{v:.{decimals}f}" for v in found}
        if len(texts) == len(found):
            return decimals
    return MAX_DIGITS
