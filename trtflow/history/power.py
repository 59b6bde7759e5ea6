"""Seeded synthetic series for measuring what the change-point detector and the nightly check can find.

A nightly figure is modelled as ``base x exp(N(0, noise))`` per run (log-normal run-to-run noise: ``noise`` 0.03 is
a 3% coefficient of variation), with a step of ``step`` (0.10: 10% slower) from run ``at`` on. `detection_rates` and
`check_rates` run the project's own functions (`changes.change_points`, `trend.check`) on many such series; the
test suite and ``bench/history_power.py`` report them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from trtflow.history.changes import change_points
from trtflow.history.trend import Point, Series, check, find_changes


def series(rng: random.Random, runs: int, noise: float, step: float = 0.0, at: int | None = None,
           base: float = 10.0) -> list[float]:
    at = runs if at is None else at
    return [base * (1.0 + (step if index >= at else 0.0)) * math.exp(rng.gauss(0.0, noise))
            for index in range(runs)]


@dataclass(frozen=True)
class Detection:
    trials: int
    found: float  # share of series with a change point within ``tolerance`` runs of the step
    any_change: float  # share of series with any change point (on unchanged series: the false-alarm rate)


def detection_rates(trials: int, runs: int, noise: float, step: float, at: int, tolerance: int = 2,
                    seed: int = 0) -> Detection:
    """How often a step at run ``at`` of ``runs`` is found within ``tolerance`` runs of it (step 0: how often an
    unchanged series shows any change point)."""
    rng = random.Random(seed)
    found = anything = 0
    for _ in range(trials):
        points = change_points(series(rng, runs, noise, step, at))
        anything += bool(points)
        found += any(abs(p.index - at) <= tolerance for p in points)
    return Detection(trials, found / trials, anything / trials)


def _as_series(values: Sequence[float]) -> Series:
    return Series("bench", "benchmark", "p99 latency, batch 1", "ms", "lower", True,
                  [Point(f"r{i}", float(i), v, None, None, None, None) for i, v in enumerate(values)])


@dataclass(frozen=True)
class CheckPower:
    trials: int
    failed_by_night: tuple[float, ...]  # share of trials the check had failed by the k-th run after the step


def check_rates(trials: int, history: int, noise: float, step: float, threshold_percent: float, nights: int = 5,
                latest: int = 5, runs_after: int = 2, seed: int = 0, outliers: float = 0.0,
                outlier_step: float = 0.25) -> CheckPower:
    """Run the nightly check after each of ``nights`` runs that follow ``history`` unchanged ones, the step (if
    any) starting with the first of them: the share of trials failed by each night (step 0: false alarms).
    ``outliers``: each run is, with this probability, ``outlier_step`` slower on its own (a busy night)."""
    rng = random.Random(seed)
    first_failure = [0] * nights
    for _ in range(trials):
        values = [v * (1.0 + outlier_step if rng.random() < outliers else 1.0)
                  for v in series(rng, history + nights, noise, step, history)]
        for night in range(1, nights + 1):
            one = _as_series(values[:history + night])
            find_changes([one])
            if check([one], threshold_percent, latest, runs_after=runs_after):
                first_failure[night - 1] += 1
                break
    cumulative, total = [], 0
    for count in first_failure:
        total += count
        cumulative.append(total / trials)
    return CheckPower(trials, tuple(cumulative))
