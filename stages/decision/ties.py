"""Who beats whom, with the noise of the measurements: the ratio of each candidate's figure to the best one's.

The best candidate is the one with the best estimate. Another candidate *loses* to it only when the whole 95%
interval of their ratio (the interval that holds when both candidates' intervals do, `measure.compare.Figure`)
lies beyond the tie tolerance and the host's run-to-run variation (their benchmarks ran at different times): it
is worse by more than ``tolerance_percent`` and ``run_to_run_percent``, with confidence. Every other
candidate is *tied within noise* with the best, and the declared tie-breakers (accuracy, size, ...) decide among the
tied ones, in a fixed order: the same measurements always give the same choice, and figures that differ only by
noise cannot flip it. A figure without an interval (an old benchmark, an artifact's size) counts as exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..measure.compare import Figure, worse_beyond


def objective_figure(goal: str, value: float | None, interval: Any) -> Figure | None:
    """The objective value of a candidate with its interval ([low, high]) when it has one."""
    if value is None:
        return None
    if goal != "min_size" and isinstance(interval, (list, tuple)) and len(interval) == 2 \
            and all(isinstance(v, (int, float)) for v in interval):
        return Figure(value, min(float(interval[0]), value), max(float(interval[1]), value))
    return Figure.exact(value)


def worse_by(figure: Figure, best: Figure, lower_is_better: bool) -> Figure:
    """How much worse ``figure`` is than ``best`` as a ratio >= 1 for worse (interval included): latency / best
    latency when lower is better, best throughput / throughput when higher is."""
    return figure.ratio(best) if lower_is_better else best.ratio(figure)


def loses(ratio: Figure, tolerance_percent: float, run_to_run_percent: float = 0.0) -> bool:
    """Worse beyond the tolerance with confidence, and beyond what the host's speed changing between the two
    measurements (``run_to_run_percent``, `measure.compare.RUN_TO_RUN_PERCENT`) can explain: the whole interval
    of the ratio is above (1 + tolerance) x (1 + run-to-run)."""
    return worse_beyond(ratio, 1.0 + tolerance_percent / 100.0, run_to_run_percent)


def ratio_text(ratio: Figure) -> str:
    if ratio.low == ratio.high:
        return f"ratio {ratio.value:.3g}"
    return f"ratio {ratio.value:.3g}, 95% interval {ratio.low:.3g}-{ratio.high:.3g}"


def row_ratio(row: Mapping[str, Any]) -> Figure:
    values = row["ratio_to_best"]
    return Figure(values[0], values[1], values[2])
