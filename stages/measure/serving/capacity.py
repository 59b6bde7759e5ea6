"""The serving capacity read off a confirmation's levels: where the typical long level's p99 crosses the budget.

Near the knee a long level's verdict is a lottery: late queries come in clusters (one excursion of the queue past
the budget makes dozens late in a row), so a 10 s level at a rate near capacity may have 0 late queries or 500,
and the rate that "meets" depends on which levels happened to be lucky, on how many levels were tried near the
knee (each one more chance of a lucky pass) and on where the walk started. A verdict per grid rate quantises that
luck into whole grid steps.

So the confirmation's levels (an up-and-down staircase on a grid, `measurements.confirm_capacity`) are read as
points of one curve rather than as verdicts: per level the upper end of its p99's 95% interval (LoadGen's "p99
within the budget with confidence", as a latency), per grid rate the median of its levels (robust to the
excursions), a non-decreasing fit over the rates (pool-adjacent-violators: more load never lowers the p99, so
what one rate's levels say is pooled with its neighbours' where they disagree), and the capacity where that fit
crosses the budget, interpolated on the log-log scale between the grid rate below (its fitted p99 meets the
budget) and the one above (misses): confirmed in both directions, not quantised to the grid, and with an interval
(levels resampled, `BOOTSTRAP_DRAWS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: A level's p99 is counted up to this many times the budget: past it the queue has run away and the figure says
#: only "much too slow" (it would otherwise pull the pooled fit of its neighbours).
SATURATED_FACTOR = 4.0
#: Resamples of the levels for the capacity's interval.
BOOTSTRAP_DRAWS = 400
#: The interval's coverage.
INTERVAL = 0.90

#: The confirmation's rule, as the summary states it.
CONFIRM_RULE = ("confirm_steps levels of confirm_duration_s on a geometric grid of confirm_step_percent "
                "(anchored at 1/s), an up-and-down staircase from the grid rate at or below the search's answer: "
                "one grid rate up after a level whose p99 (the upper end of its 95% interval) meets the budget, one "
                "down after one that misses (1, 2, then 4 while only one side has been seen). The capacity: per "
                "grid rate the median of its levels' p99, made non-decreasing in the rate (pool-adjacent-violators, "
                "levels as weights), interpolated (log-log) where it crosses the budget between the grid rate "
                "below, which meets, and the one above, which misses; its interval from the levels resampled. "
                "Settled: confirm_visits levels at or below the rate that meets and at or above the one that misses. "
                "Where the fit brackets nothing after those levels (every rate misses, or every one meets), up to "
                "confirm_steps more levels beyond the lowest (highest) rate visited, the stride doubling, until it "
                "does")


def level_p99_ms(level: Mapping[str, Any], budget_ms: float) -> float:
    """What one level says of the p99: the upper end of its 95% interval (its p99 where none), a level with
    unfinished requests or a p99 past `SATURATED_FACTOR` x the budget counted as that much."""
    ceiling = SATURATED_FACTOR * budget_ms
    if level.get("unfinished"):
        return ceiling
    interval = (level.get("latency_ci_ms") or {}).get("p99")
    value = interval[1] if isinstance(interval, (list, tuple)) and len(interval) == 2 else level["latency_ms"]["p99"]
    return min(float(value), ceiling)


def level_meets(level: Mapping[str, Any], budget_ms: float) -> bool:
    """The staircase's verdict on one level: its p99 (`level_p99_ms`) within the budget."""
    return level_p99_ms(level, budget_ms) <= budget_ms and not level.get("unfinished")


def fitted_p99(levels: Sequence[Mapping[str, Any]], budget_ms: float) -> list[tuple[float, int, float, float]]:
    """(rate, levels, median p99 ms, fitted p99 ms) per rate, rates ascending: the median of each rate's levels
    (`level_p99_ms`), made non-decreasing in the rate by pool-adjacent-violators weighted by the levels."""
    from scipy import optimize

    by_rate: dict[float, list[float]] = {}
    for level in levels:
        by_rate.setdefault(float(level["arrival_rate_qps"]), []).append(math.log(level_p99_ms(level, budget_ms)))
    rates = sorted(by_rate)
    if not rates:
        return []
    medians = [_median(by_rate[rate]) for rate in rates]
    fit = optimize.isotonic_regression(medians, weights=[float(len(by_rate[rate])) for rate in rates]).x
    return [(rate, len(by_rate[rate]), math.exp(m), math.exp(f))
            for rate, m, f in zip(rates, medians, fit, strict=True)]


def crossing(levels: Sequence[Mapping[str, Any]], budget_ms: float) -> tuple[float | None, float | None, float | None]:
    """(capacity, the rate below it that meets, the rate above it that misses) of `fitted_p99`: the capacity is
    interpolated on log rate and log p99 between the highest rate whose fit meets the budget and the next rate,
    which misses. (None, highest rate, None) when every rate meets; (None, None, lowest rate) when none does."""
    table = fitted_p99(levels, budget_ms)
    if not table:
        return None, None, None
    meeting = [row for row in table if row[3] <= budget_ms]
    if not meeting:
        return None, None, table[0][0]
    low = meeting[-1]
    above = [row for row in table if row[0] > low[0]]
    if not above:
        return None, low[0], None
    high = above[0]
    x0, x1 = math.log(low[0]), math.log(high[0])
    y0, y1 = math.log(low[3]), math.log(high[3])
    share = (math.log(budget_ms) - y0) / (y1 - y0)
    return math.exp(x0 + share * (x1 - x0)), low[0], high[0]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def capacity_interval(levels: Sequence[Mapping[str, Any]], budget_ms: float,
                      seed: int) -> tuple[list[float] | None, float]:
    """The capacity's `INTERVAL` interval over `BOOTSTRAP_DRAWS` resamples of the levels (with replacement,
    seeded), and the share of resamples with no crossing (the interval is then of those that have one)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    found: list[float] = []
    for _ in range(BOOTSTRAP_DRAWS):
        draw = [levels[i] for i in rng.integers(0, len(levels), len(levels))]
        value, _, _ = crossing(draw, budget_ms)
        if value is not None:
            found.append(value)
    missing = 1.0 - len(found) / BOOTSTRAP_DRAWS
    if not found:
        return None, missing
    tail = (1.0 - INTERVAL) / 2 * 100
    low, high = np.percentile(found, [tail, 100 - tail])
    return [round(float(low), 1), round(float(high), 1)], round(missing, 3)


def settled(levels: Sequence[Mapping[str, Any]], meets: float | None, misses: float | None, visits: int) -> bool:
    """Whether the crossing is confirmed from both sides: ``visits`` levels at or below the rate that meets and
    as many at or above the one that misses."""
    if meets is None or misses is None:
        return False
    rates = [float(level["arrival_rate_qps"]) for level in levels]
    return sum(rate <= meets for rate in rates) >= visits and sum(rate >= misses for rate in rates) >= visits
