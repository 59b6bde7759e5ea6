"""How sure a measurement is: 95% confidence intervals of latency percentiles and throughput, and when to stop.

A benchmark point is timed in several *windows* (repeats): runs of back-to-back queries, one after the other.
Its figures are computed over all timed queries pooled, and each gets an interval that covers two sources of
error:

- sampling error: for a percentile, the distribution-free interval from order statistics (the ranks a binomial
  distribution gives, `scipy.stats.quantile_test`), no normal approximation; it exists only with enough queries
  (p99 needs 368 for a two-sided 95% interval; with fewer its upper bound is open: the largest latency seen, and
  the percentile is listed in ``open``). For the mean (and throughput): a bootstrap interval of the mean of
  batch means (consecutive queries grouped, so that correlated neighbours do not pass for independent ones);
- drift between windows (the host got busier, clocks changed) and correlated neighbours within a window (a slow
  spell lasts several queries): with three windows or more, the windows are independent batches of the point, so
  the spread of their own estimates says how far the pooled estimate can be off: a Student t interval around it,
  t(w - 1) x the standard deviation of the w windows' estimates / sqrt(w) (batch means, as in simulation output
  analysis; a percentile bootstrap over five values covers only ~85%).

The reported interval is the hull of the two (and always contains the estimate). On latencies with AR(1)
correlation 0.5 and 5% drift from window to window, 5 windows of 200 queries, the intervals of p50, p99 and
throughput cover the true figure at least 92% of the time (tests/stages/test_intervals.py, seeded).

A point has *converged* when the interval of its median is within ``precision_percent`` of the estimate (and
p99's within ``tail_precision_percent`` where that is asked for); the throughput's interval is reported, not
waited for (it follows the mean, which one stall can move).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .stats import Values, median, percentile

CONFIDENCE = 0.95
#: Statistics of a point that get an interval (keys of ``latency_ms``), with the quantile each one is.
QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
BATCHES = 32  # batch means for the interval of the mean
RESAMPLES = 2000
SEED = 0  # bootstrap resampling is seeded: the same timings give the same intervals


def min_queries(quantile: float, confidence: float = CONFIDENCE) -> int:
    """The fewest queries for which the order-statistic interval of ``quantile`` has both bounds
    (368 for p99 at 95%, 72 for p95, 36 for p90, 6 for the median)."""
    alpha = 1.0 - confidence
    low_tail = math.log(alpha / 2) / math.log(max(quantile, 1.0 - quantile))
    return math.floor(low_tail) + 1


def quantile_interval(values: Values, quantile: float,
                      confidence: float = CONFIDENCE) -> tuple[float, float, bool]:
    """``(low, high, bounded)``: the distribution-free interval of the ``quantile`` of ``values`` from order
    statistics. A bound that does not exist with this few values is replaced by the extreme value seen and
    ``bounded`` is False."""
    import numpy as np
    from scipy import stats

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values")
    if data.size == 1:
        return float(data[0]), float(data[0]), False
    result = stats.quantile_test(data, q=float(np.median(data)), p=quantile)
    interval = result.confidence_interval(confidence_level=confidence)
    low, high = float(interval.low), float(interval.high)
    bounded = not (math.isnan(low) or math.isnan(high))
    return (float(data.min()) if math.isnan(low) else low), (float(data.max()) if math.isnan(high) else high), \
        bounded


def _bootstrap_mean(values: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``values`` (None with fewer than 3 or all equal)."""
    import numpy as np
    from scipy import stats

    data = np.asarray(values, dtype=float)
    if data.size < 3 or float(data.max()) == float(data.min()):
        return None
    result = stats.bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES,
                             method="percentile", random_state=np.random.default_rng(SEED), vectorized=True)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def batch_means(values: Sequence[float], batches: int = BATCHES) -> list[float]:
    """Means of ``batches`` runs of consecutive values (fewer when there are fewer values)."""
    count = min(batches, len(values))
    if count == 0:
        return []
    size = len(values) / count
    return [sum(values[int(i * size):int((i + 1) * size)]) / max(int((i + 1) * size) - int(i * size), 1)
            for i in range(count)]


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of the mean of a series of timings: bootstrap of its batch means (the mean itself when the
    series is too short or constant)."""
    mean = sum(values) / len(values)
    found = _bootstrap_mean(batch_means(values), confidence)
    return found if found is not None else (mean, mean)


def window_interval(estimates: Sequence[float], center: float,
                    confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The interval of ``center`` (the pooled estimate) from the spread of the windows' own estimates: Student t
    with w - 1 degrees of freedom over w windows; None under 3 windows. Times and rates are positive and vary by
    factors (a slower spell of the host scales them), so when every estimate is positive the interval is taken on
    their logarithms: never below zero, however few and scattered the windows."""
    from scipy import stats

    count = len(estimates)
    if count < 3:
        return None
    positive = center > 0 and all(e > 0 for e in estimates)
    values = [math.log(e) for e in estimates] if positive else list(estimates)
    mean = sum(values) / count
    deviation = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2.0, count - 1)) * deviation / math.sqrt(count)
    if positive:
        return center * math.exp(-half), center * math.exp(half)
    return center - half, center + half


def _hull(value: float, *intervals: Sequence[float] | None) -> list[float]:
    lows = [value] + [i[0] for i in intervals if i is not None]
    highs = [value] + [i[1] for i in intervals if i is not None]
    return [min(lows), max(highs)]


def relative_half_width(value: float, interval: Sequence[float]) -> float:
    """The larger distance from the estimate to a bound, as a fraction of the estimate (inf for 0)."""
    if not value:
        return math.inf
    return max(value - interval[0], interval[1] - value) / abs(value)


@dataclass
class Window:
    """One timed window: its latencies (ms, in order) and the host wall time it took (ms)."""

    latencies_ms: list[float]
    wall_ms: float
    wait_ms: float | None = None  # time this process's threads waited for a CPU meanwhile (None: unknown)
    #: a generation window's requests' times to first token (its latencies are their times per output token)
    first_tokens_ms: list[float] | None = None

    def throughput(self, batch_size: int) -> float:
        return len(self.latencies_ms) * batch_size / self.wall_ms * 1000.0 if self.wall_ms > 0 else math.inf


@dataclass
class Uncertainty:
    """The intervals of one point and what they say about convergence."""

    queries: int
    latency_ci_ms: dict[str, list[float]]
    throughput_ci_qps: list[float]
    open: list[str] = field(default_factory=list)  # percentiles whose interval has an open (unclaimed) bound
    precision_percent: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"queries": self.queries, "latency_ci_ms": self.latency_ci_ms,
                "throughput_ci_qps": self.throughput_ci_qps, "open_intervals": self.open,
                "precision_percent": self.precision_percent, "confidence": CONFIDENCE}


def uncertainty(windows: Sequence[Window], latency: Mapping[str, float], throughput: float, batch_size: int,
                confidence: float = CONFIDENCE, only: Sequence[str] | None = None) -> Uncertainty:
    """The intervals of a point measured in ``windows`` whose pooled figures are ``latency`` (``p50``...,
    ``mean``) and ``throughput``. ``only``: just these percentiles' intervals (what a stopping rule reads, e.g.
    ``Precision.keys``), computed exactly as in the full set; no mean or throughput interval."""
    import numpy as np

    ordered = [np.sort(np.asarray(w.latencies_ms, dtype=float)) for w in windows]
    pooled = np.sort(np.concatenate(ordered)) if ordered else np.empty(0)
    if pooled.size == 0:
        raise ValueError("no timed queries")
    several = len(windows) >= 3
    intervals: dict[str, list[float]] = {}
    open_bounds = []
    for key, quantile in QUANTILES.items():
        if key not in latency or (only is not None and key not in only):
            continue
        low, high, bounded = quantile_interval(pooled, quantile, confidence)
        if not bounded:
            open_bounds.append(key)
        spread = None
        if several:
            spread = window_interval([median(o) if key == "p50" else percentile(o, quantile * 100.0)
                                      for o in ordered], latency[key], confidence)
        intervals[key] = _hull(latency[key], (low, high), spread)
        if key == "p50" and "median" in latency:  # trtexec's p50 (a sample) and the median (a midpoint) alike
            intervals[key] = _hull(latency["median"], intervals[key])
    if only is not None:
        precision = {key: round(relative_half_width(latency[key], intervals[key]) * 100.0, 3) for key in intervals}
        return Uncertainty(int(pooled.size), intervals, [], open_bounds, precision)
    in_order = [value for w in windows for value in w.latencies_ms]
    mean = latency.get("mean", float(pooled.mean()))
    spread = window_interval([float(o.mean()) for o in ordered], mean, confidence) if several else None
    intervals["mean"] = _hull(mean, mean_interval(in_order, confidence), spread)
    # throughput moves inversely with the mean latency; scale the mean's relative interval onto it
    mean_low, mean_high = intervals["mean"]
    by_mean = (throughput * mean / mean_high, throughput * mean / mean_low) if mean_low > 0 else None
    by_windows = window_interval([w.throughput(batch_size) for w in windows], throughput, confidence) \
        if several else None
    throughput_ci = _hull(throughput, by_mean, by_windows)
    precision = {key: round(relative_half_width(latency[key], intervals[key]) * 100.0, 3)
                 for key in intervals if key in latency}
    precision["throughput"] = round(relative_half_width(throughput, throughput_ci) * 100.0, 3)
    return Uncertainty(int(pooled.size), intervals, throughput_ci, open_bounds, precision)


@dataclass(frozen=True)
class Precision:
    """When a point is measured precisely enough (relative 95% interval half-widths, in percent)."""

    central_percent: float = 5.0  # the median
    tail_percent: float | None = None  # p99; None: not part of the stopping rule

    @property
    def keys(self) -> tuple[str, ...]:
        """The percentiles whose intervals `unmet` reads."""
        return ("p50",) if self.tail_percent is None else ("p50", "p99")

    def unmet(self, found: Uncertainty) -> list[str]:
        """What is not yet precise enough (empty: converged)."""
        missing = []
        value = found.precision_percent.get("p50")
        if value is not None and value > self.central_percent:
            missing.append(f"p50 ±{value:.3g}% > ±{self.central_percent:g}%")
        if self.tail_percent is not None:
            value = found.precision_percent.get("p99")
            if "p99" in found.open:
                missing.append(f"p99 needs {min_queries(0.99)} queries for its interval, has {found.queries}")
            elif value is not None and value > self.tail_percent:
                missing.append(f"p99 ±{value:.3g}% > ±{self.tail_percent:g}%")
        return missing
