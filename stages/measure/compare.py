"""Comparing measurements that carry their uncertainty: a ratio with its interval, and a verdict.

Each figure comes with a 95% interval (`measure.intervals`). The ratio of two figures gets the interval that
holds whenever both of theirs do: from the lowest the numerator can be over the highest the denominator can be,
to the highest over the lowest (a conservative interval: it ignores that both errors rarely reach their extremes
together, so it does not cry wolf). A comparison against a limit then has three outcomes, as criterion and
pyperf report them:

- ``fail``: the whole interval is beyond the limit: a significant regression (a real 2x slowdown lands here);
- ``pass``: the whole interval is within it: no regression beyond the limit, with confidence;
- ``inconclusive``: the interval straddles the limit: the measurements are too noisy to tell. Not a failure,
  and said plainly, with what would make it conclusive.

Comparisons of two measurements (a regression, one candidate against another) also allow for interference: a
figure measured while the host kept the benchmark waiting for a CPU may be that much better, and more
(`latency_figure`).
Two measurements taken at different times (a run and the baseline or the previous run, two candidates'
benchmark nodes) also differ by what neither one's intervals can see: the host itself runs faster or slower from
one minute to the next. A regression or a loss is declared only beyond that too (``run_to_run_percent``,
`RUN_TO_RUN_PERCENT`); a change within it is inconclusive, never a failure.
Figures without an interval (results recorded before intervals existed) count as exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Verdict = Literal["pass", "fail", "inconclusive"]
NOISY_HINT = "measure longer (max_duration_s, repeats) or on a quieter host to decide"


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

    def ratio(self, other: Figure) -> Figure:
        """``self / other`` with the interval that holds whenever both intervals do."""
        if other.value <= 0 or other.low <= 0:
            return Figure(math.inf, math.inf, math.inf)
        return Figure(self.value / other.value, self.low / other.high, self.high / other.low)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: How much two measurements taken at different times may differ for the host's sake alone, in percent: one
#: run's intervals see the noise within it, not the host running slower for minutes (other virtual machines, a
#: busy sibling hyperthread, clocks). Measured: unchanged builds on a shared 2-core machine with a CPU-bound
#: neighbour moved by up to 22% between runs, each with a tight interval (bench/results/reproducibility); an
#: H100's speed moved by -10% to +8% from one round to the next (bench/serving_load.md).
RUN_TO_RUN_PERCENT = 15.0


def worse_beyond(worse: Figure, limit: float, run_to_run_percent: float) -> bool:
    """Is ``worse`` (a ratio, > 1 is worse) beyond ``limit`` with confidence, even allowing that the host ran
    ``run_to_run_percent`` slower for one of the two measurements?"""
    return worse.low > limit * (1.0 + run_to_run_percent / 100.0)


#: The lowest CPU share a figure is corrected for (a benchmark that ran 10% of the time says little).
MIN_SHARE = 0.1


def cpu_share(point: Mapping[str, Any]) -> float:
    """The share of each query's time the benchmark's threads had a CPU: 1 - (run-queue wait per query / mean
    latency), from ``cpu_wait_ms_per_query``; 1 when that was not measured."""
    waited = point.get("cpu_wait_ms_per_query")
    mean = (point.get("latency_ms") or {}).get("mean", (point.get("latency_ms") or {}).get("p50"))
    if not (_number(waited) and waited > 0 and _number(mean) and mean > 0):
        return 1.0
    return max(1.0 - waited / mean, MIN_SHARE)


def _figure(value: float, interval: Any) -> Figure:
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and all(_number(v) for v in interval):
        return Figure(float(value), min(float(interval[0]), value), max(float(interval[1]), value))
    return Figure.exact(float(value))


def latency_figure(point: Mapping[str, Any], statistic: str, allow_wait: bool = False) -> Figure | None:
    """A point's latency ``statistic`` (p50, p99, ...) with its interval, from a benchmark summary point.

    ``allow_wait``: for comparing builds rather than judging a latency. A benchmark whose threads had a CPU only a
    share s of the time (the rest they waited on a run queue behind other programs) measured queries up to 1/s
    longer for the wait, and longer still for what sharing the core costs the running work (caches refilled after
    every switch, a busy sibling hyperthread), which nothing measures; that is bounded by 1/s as well, so the
    interval reaches down to low x s^2. A disturbed measurement cannot pass for a slower model, and an
    undisturbed one (s = 1) is compared as measured."""
    latency = point.get("latency_ms") or {}
    value = latency.get(statistic)
    if not _number(value) and statistic == "p50":
        value = latency.get("median", point.get("median_ms"))
    if not _number(value):
        return None
    figure = _figure(value, (point.get("latency_ci_ms") or {}).get(statistic))
    share = cpu_share(point) if allow_wait else 1.0
    return Figure(figure.value, figure.low * share * share, figure.high) if share < 1.0 else figure


def throughput_figure(point: Mapping[str, Any], allow_wait: bool = False) -> Figure | None:
    """A point's throughput with its interval; ``allow_wait`` as in `latency_figure` (the upper bound rises to
    high / s^2)."""
    value = point.get("throughput_qps")
    if not _number(value):
        return None
    figure = _figure(value, point.get("throughput_ci_qps"))
    share = cpu_share(point) if allow_wait else 1.0
    return Figure(figure.value, figure.low, figure.high / (share * share)) if share < 1.0 else figure


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


def record(gate: str, place: str, verdict: Verdict, message: str) -> dict[str, str]:
    return {"gate": gate, "where": place, "verdict": verdict, "message": message}


def refusal_record(gate: str, message: str) -> dict[str, str]:
    """A comparison refused (another machine, a missing file): it fails, as the gate cannot be judged at all."""
    return record(gate, "", "fail", message)


def _point_key(point: Mapping[str, Any]) -> tuple[Any, Any]:
    return point.get("batch_size"), point.get("streams", 1)


def regression_verdicts(old_points: Sequence[Mapping[str, Any]], summary: Mapping[str, Any],
                        max_regression_percent: float, against: str, gate: str, missing: str | None = None,
                        run_to_run_percent: float = RUN_TO_RUN_PERCENT) -> list[dict[str, str]]:
    """Per point of ``summary``: its median latency and throughput against the same point of ``old_points``.
    ``against`` names the other side in messages ("the baseline's"); ``missing`` (None: skip silently) is the
    advice for a point the other side lacks; a regression fails only beyond ``run_to_run_percent`` as well."""
    allowed = Allowance(max_regression_percent, run_to_run_percent)
    recorded = {_point_key(p): p for p in old_points}
    found = []
    for point in summary.get("points", []):
        place = where(point)
        old = recorded.get(_point_key(point))
        if old is None:
            if missing is not None:
                found.append(record(gate, place, "fail", f"{place}: {missing} (it has "
                                    f"{sorted(str(k) for k in recorded) or 'none'}); save the baseline again"))
            continue
        new_ms, old_ms = latency_figure(point, "p50", allow_wait=True), latency_figure(old, "p50", allow_wait=True)
        if new_ms is not None and old_ms is not None and old_ms.value > 0:
            found.append(_regression_verdict(gate, place, new_ms, old_ms, allowed, against, throughput=False))
        new_qps, old_qps = throughput_figure(point, allow_wait=True), throughput_figure(old, allow_wait=True)
        if new_qps is not None and old_qps is not None and old_qps.value > 0:
            found.append(_regression_verdict(gate, place, new_qps, old_qps, allowed, against, throughput=True))
    return found


@dataclass(frozen=True)
class Allowance:
    """How much slower a regression gate lets a point be (``percent``), and how much more the host's own
    run-to-run variation may explain (``run_to_run_percent``)."""

    percent: float
    run_to_run_percent: float

    def limit(self, throughput: bool) -> float:
        """The most ``worse`` may be: latency up by ``percent``, or throughput down by ``percent``."""
        return 1.0 / (1.0 - min(self.percent, 99.0) / 100.0) if throughput else 1.0 + self.percent / 100.0

    def judge(self, worse: Figure, throughput: bool = False) -> Verdict:
        """``worse``: new latency / old, or old throughput / new (> 1 is worse)."""
        limit = self.limit(throughput)
        if worse_beyond(worse, limit, self.run_to_run_percent):
            return "fail"
        return "pass" if worse.high <= limit else "inconclusive"

    def why_inconclusive(self, worse: Figure, throughput: bool = False) -> str:
        if worse.low > self.limit(throughput):
            return (f"beyond max_regression_percent {self.percent:g}, but not beyond what the host's run-to-run "
                    f"variation (run_to_run_percent {self.run_to_run_percent:g}) can explain: too close to tell")
        return f"straddles max_regression_percent {self.percent:g}: too noisy to tell"


def _ratio_text(ratio: Figure) -> str:
    if ratio.low == ratio.high:
        return ""
    return f"; ratio {ratio.value:.3f}, 95% interval {ratio.low:.3f}-{ratio.high:.3f}"


def _regression_verdict(gate: str, place: str, new: Figure, old: Figure, allowed: Allowance, against: str,
                        throughput: bool) -> dict[str, str]:
    """Median latency (``throughput`` False) or throughput, new against old, judged with ``allowed``."""
    ratio = new.ratio(old)
    worse = old.ratio(new) if throughput else ratio
    verdict = allowed.judge(worse, throughput)
    what, unit = ("throughput", "qps") if throughput else ("median latency", "ms")
    figures = f"{what} {new} {unit} vs {against} {old} {unit} ({(ratio.value - 1.0) * 100.0:+.1f}%)"
    spread = _ratio_text(ratio)
    if verdict == "fail":
        change = (f"{(1.0 - ratio.value) * 100.0:.1f}% below" if throughput else
                  f"{(ratio.value - 1.0) * 100.0:.1f}% above")
        message = (f"{place}: {what} {new} {unit} is {change} {against} {old} {unit} (max_regression_percent "
                   f"{allowed.percent:g}, run_to_run_percent {allowed.run_to_run_percent:g}{spread})")
    elif verdict == "inconclusive":
        message = (f"{place}: inconclusive: {figures}{spread}, which {allowed.why_inconclusive(worse, throughput)}; "
                   f"{NOISY_HINT}")
    else:
        message = f"{place}: {figures}, within max_regression_percent {allowed.percent:g}{spread}"
    return record(gate, place, verdict, message)
