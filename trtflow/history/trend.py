"""A recipe file's history as series (one per node and figure), their change points, and the nightly check.

`series_of` groups the journal's history rows of a recipe file; `find_changes` adds each series' change points
(`changes.change_points`), each labelled a regression or an improvement by the figure's direction; `check` is the
gate of a nightly CI job: it fails when a regression beyond ``threshold_percent`` starts among the ``latest`` runs
of a primary figure (the figures the node's gates judge).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtflow.history.changes import MAX_PVALUE, change_points
from trtflow.history.record import parse

LATEST = 5  # the check judges changes that start among this many latest runs
RUNS_AFTER = 2  # ... and that this many runs show (one bad night is an outlier, not yet a step)
#: The runs a figure needs before the check can pass on it: a step among the latest LATEST runs is told from the
#: runs before it, so with fewer the check cannot say there was none (it is undecided, exit 5, never "passed").
MIN_RUNS = LATEST + 3


@dataclass(frozen=True)
class Point:
    """One measurement of a figure: its value, 95% interval and sample count, and where it came from."""

    run_id: str
    recorded: float
    value: float
    low: float | None
    high: float | None
    n: int | None
    key: str | None
    facts: Mapping[str, Any] = field(default_factory=dict)
    context: Mapping[str, Any] = field(default_factory=dict)

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.recorded))


@dataclass(frozen=True)
class Change:
    """A change point of a series: from ``points[index]`` on, the mean moved by ``percent``."""

    index: int
    run_id: str
    recorded: float
    mean_before: float
    mean_after: float
    percent: float
    pvalue: float
    regression: bool  # the figure got worse (latency up, throughput down)

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.recorded))

    @property
    def kind(self) -> str:
        return "regression" if self.regression else "improvement"


@dataclass
class Series:
    """The figure ``figure`` of node ``node`` over the runs that measured it, oldest first."""

    node: str
    stage: str
    figure: str
    unit: str
    better: str
    primary: bool
    points: list[Point]
    changes: list[Change] | None = None  # None: not computed (the detector is not installed)

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]

    def describe(self, value: float) -> str:
        return f"{value:.4g} {self.unit}"


def series_of(rows: Iterable[Mapping[str, Any]], last: int | None = None) -> list[Series]:
    """The journal's history rows (oldest first) as series per node and figure, in the order they first appear;
    ``last``: keep only each series' latest runs."""
    found: dict[tuple[str, str], Series] = {}
    for row in rows:
        name = (row["node"], row["figure"])
        series = found.get(name)
        if series is None:
            series = found[name] = Series(row["node"], row["stage"] or "", row["figure"], row["unit"] or "",
                                          row["better"] or "lower", bool(row["is_primary"]), [])
        series.primary = bool(row["is_primary"])  # as the latest run declared it
        series.points.append(Point(row["run_id"], row["recorded"], row["value"], row["low"], row["high"], row["n"],
                                   row["key"], parse(row, "facts"), parse(row, "context")))
    result = list(found.values())
    if last is not None:
        for series in result:
            series.points = series.points[-last:]
    return result


def find_changes(series: Sequence[Series], max_pvalue: float = MAX_PVALUE) -> None:
    """Fill in each series' change points; raises `EnvironmentUnavailable` when the detector is not installed."""
    for one in series:
        found = change_points(one.values, max_pvalue)
        one.changes = [Change(cp.index, one.points[cp.index].run_id, one.points[cp.index].recorded, cp.mean_before,
                              cp.mean_after, cp.percent, cp.pvalue,
                              regression=cp.percent > 0 if one.better == "lower" else cp.percent < 0)
                       for cp in found]


@dataclass(frozen=True)
class Finding:
    """A regression the check fails on."""

    series: Series
    change: Change
    threshold_percent: float

    @property
    def message(self) -> str:
        s, c = self.series, self.change
        runs_after = len(s.points) - c.index
        return (f"{s.node}: {s.figure}: {c.percent:+.1f}% ({s.describe(c.mean_before)} -> {s.describe(c.mean_after)}) "
                f"from run {c.run_id} ({c.when}; {runs_after} run(s) since), p {c.pvalue:.2g}: a regression beyond "
                f"the threshold {self.threshold_percent:g}%")


def worse_percent(series: Series, value: float, reference: float) -> float:
    """How much worse ``value`` is than ``reference``, in percent, by the figure's direction (negative: better)."""
    if not reference:
        return 0.0
    change = (value / reference - 1.0) * 100.0
    return change if series.better == "lower" else -change


def too_short(series: Sequence[Series], min_runs: int = MIN_RUNS, all_figures: bool = False) -> list[Series]:
    """The judged series (primary ones, every one with ``all_figures``) with fewer than ``min_runs`` runs: the
    check cannot pass on them."""
    return [one for one in series if (one.primary or all_figures) and len(one.points) < min_runs]


def check(series: Sequence[Series], threshold_percent: float, latest: int = LATEST,
          all_figures: bool = False, runs_after: int = RUNS_AFTER) -> list[Finding]:
    """Regressions beyond ``threshold_percent`` (the change of the mean, by the figure's direction) that start among
    the ``latest`` runs of each primary figure (every figure with ``all_figures``), that at least ``runs_after`` runs
    show, and that every run since shows (each worse than the mean before the change by half the threshold or more:
    a step, not one slow night beside normal ones). Needs `find_changes` first."""
    findings = []
    for one in series:
        if not (one.primary or all_figures):
            continue
        if one.changes is None:
            raise ValueError(f"the change points of {one.node}: {one.figure} were not computed")
        for change in one.changes:
            since = len(one.points) - change.index
            if not (runs_after <= since <= latest and change.regression and abs(change.percent) >= threshold_percent):
                continue
            if all(worse_percent(one, v, change.mean_before) >= threshold_percent / 2
                   for v in one.values[change.index:]):
                findings.append(Finding(one, change, threshold_percent))
    return findings
