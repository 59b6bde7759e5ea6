"""Figures that carry their uncertainty, and comparisons of figures measured apart.

Each figure comes with a 95% interval (`measure.statistics.intervals`). The ratio of two figures measured independently
(a run against figures stored from another run, two candidates' benchmark nodes) gets the interval computed for the
ratio: on the log scale, each side's interval half-width is its error at 95% (1.96 standard errors), and the two
errors add in quadrature (the lower bound of a / b combines a's lower half with b's upper half). That interval is
about 1/sqrt(2) as wide as the one from both sides' extremes, which would assume both errors reach their extremes
at once.

Two figures measured at different times also differ by what neither one's intervals can see: the host runs
faster or slower from one minute to the next. A comparison of stored figures allows for that
(``run_to_run_percent``); a paired A/B comparison (`measure.statistics.paired`) cancels it instead.

A figure measured while the benchmark's threads waited for a CPU most of the time (another program held the
cores) measured the host, not the model: `unmeasurable` says so ("unmeasurable: the benchmark waited for a CPU
92% of the time"), and verdicts built on such a figure are inconclusive with that reason, never a tie or a pass
by a widened interval. Figures without an interval (results recorded before intervals existed) count as exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal, TypeGuard

Verdict = Literal["pass", "fail", "inconclusive"]
NOISY_HINT = "measure longer (max_duration_s, repeats) or on a quieter host to decide"
Z95 = NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class Figure:
    """An estimate and its 95% interval."""

    value: float
    low: float
    high: float

    @classmethod
    def exact(cls, value: float) -> Figure:
        return cls(value, value, value)

    def __str__(self) -> str:
        if self.low == self.high == self.value:
            return f"{self.value:.4g}"
        return f"{self.value:.4g} [{self.low:.4g}, {self.high:.4g}]"

    @property
    def exact_value(self) -> bool:
        return self.low == self.high

    def log_halves(self) -> tuple[float, float]:
        """The interval's lower and upper half-widths on the log scale (inf when a bound is not positive)."""
        if self.value <= 0:
            return math.inf, math.inf
        lower = math.log(self.value / self.low) if self.low > 0 else math.inf
        upper = math.log(self.high / self.value) if self.high > 0 else math.inf
        return max(lower, 0.0), max(upper, 0.0)

    def ratio(self, other: Figure) -> Figure:
        """``self / other`` with the 95% interval of the ratio (errors added in quadrature on the log scale)."""
        if other.value <= 0 or self.value <= 0:
            return Figure(math.inf, math.inf, math.inf)
        value = self.value / other.value
        a_low, a_high = self.log_halves()
        b_low, b_high = other.log_halves()
        down, up = math.hypot(a_low, b_high), math.hypot(a_high, b_low)
        return Figure(value, value * math.exp(-down) if math.isfinite(down) else 0.0,
                      value * math.exp(up) if math.isfinite(up) else math.inf)

    def at_confidence(self, lower: float, upper: float) -> Figure:
        """The interval rescaled from 95% to one-sided confidences ``lower`` (for the lower bound) and ``upper``
        (for the upper bound), on the log scale (a normal approximation of each side's error)."""
        if self.value <= 0:
            return self
        normal = NormalDist()
        down, up = self.log_halves()
        down *= normal.inv_cdf(lower) / Z95
        up *= normal.inv_cdf(upper) / Z95
        return Figure(self.value, self.value * math.exp(-down) if math.isfinite(down) else 0.0,
                      self.value * math.exp(up) if math.isfinite(up) else math.inf)


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: How much two measurements taken at different times may differ for the host's sake alone, in percent: one
#: run's intervals see the noise within it, not the host running slower for minutes (other virtual machines, a
#: busy sibling hyperthread, clocks). Measured: unchanged builds on a shared 2-core machine with a CPU-bound
#: neighbour moved by up to 22% between runs, each with a tight interval (bench/results/reproducibility); an
#: H100's speed moved by -10% to +8% from one round to the next (bench/serving_load.md). Paired A/B comparisons
#: do not need it (the drift cancels in each pair).
RUN_TO_RUN_PERCENT = 15.0


def worse_beyond(worse: Figure, limit: float, run_to_run_percent: float) -> bool:
    """Is ``worse`` (a ratio, > 1 is worse) beyond ``limit`` with confidence, even allowing that the host ran
    ``run_to_run_percent`` slower for one of the two measurements?"""
    return worse.low > limit * (1.0 + run_to_run_percent / 100.0)


#: A measurement whose threads waited for a CPU at least this share of their time measured the host, not the model.
UNMEASURABLE_WAIT = 0.5


def cpu_wait_share(point: Mapping[str, Any]) -> float | None:
    """The share of each query's time the benchmark's threads waited for a CPU (run-queue wait per query / mean
    latency, from ``cpu_wait_ms_per_query``); None when that was not measured."""
    waited = point.get("cpu_wait_ms_per_query")
    latency = point.get("latency_ms") or {}
    mean = latency.get("mean", latency.get("p50"))
    if not (_number(waited) and _number(mean) and mean > 0):
        return None
    return min(max(waited / mean, 0.0), 1.0)


def unmeasurable(point: Mapping[str, Any]) -> str | None:
    """Why a point's timings say nothing about the model (the benchmark waited for a CPU most of the time), or
    None when they do."""
    share = cpu_wait_share(point)
    if share is None or share < UNMEASURABLE_WAIT:
        return None
    return f"unmeasurable: the benchmark waited for a CPU {share * 100:.0f}% of the time"


def _figure(value: float, interval: Any) -> Figure:
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and all(_number(v) for v in interval):
        return Figure(float(value), min(float(interval[0]), value), max(float(interval[1]), value))
    return Figure.exact(float(value))


def latency_figure(point: Mapping[str, Any], statistic: str) -> Figure | None:
    """A point's latency ``statistic`` (p50, p99, ...) with its 95% interval, from a benchmark summary point."""
    latency = point.get("latency_ms") or {}
    value = latency.get(statistic)
    if not _number(value) and statistic == "p50":
        value = latency.get("median", point.get("median_ms"))
    if not _number(value):
        return None
    return _figure(value, (point.get("latency_ci_ms") or {}).get(statistic))


def throughput_figure(point: Mapping[str, Any]) -> Figure | None:
    """A point's throughput with its 95% interval."""
    value = point.get("throughput_qps")
    if not _number(value):
        return None
    return _figure(value, point.get("throughput_ci_qps"))


def point_figure(point: Mapping[str, Any], figure: str) -> Figure | None:
    """``figure`` (p50, p90, p95, p99, mean, or throughput) of a summary point."""
    return throughput_figure(point) if figure == "throughput" else latency_figure(point, figure)


def at_most(figure: Figure, limit: float) -> Verdict:
    """Is ``figure`` at most ``limit``? pass when its interval is, fail when its interval is entirely above."""
    if figure.low > limit:
        return "fail"
    if figure.high <= limit:
        return "pass"
    return "inconclusive"


def at_least(figure: Figure, limit: float) -> Verdict:
    if figure.high < limit:
        return "fail"
    if figure.low >= limit:
        return "pass"
    return "inconclusive"


def where(point: Mapping[str, Any]) -> str:
    return f"batch {point.get('batch_size')}" + (f", {point['streams']} streams" if point.get("streams", 1) != 1
                                                 else "")


def point_key(point: Mapping[str, Any]) -> tuple[Any, Any]:
    return point.get("batch_size"), point.get("streams", 1)
