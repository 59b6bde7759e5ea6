"""The benchmark's gates, judged with the uncertainty of every figure (`measure.compare`).

- thresholds (``max_latency_ms_p50`` ... ``min_throughput_qps``): a point fails when its whole 95% interval is
  beyond the limit, passes when the whole interval is within it, and is inconclusive in between;
- regression (``max_regression_percent``) against the pinned baseline (``baseline``) or else the previous
  successful run of the node on the same hardware: the ratio of the median latencies (and of the throughputs)
  gets the interval that holds when both sides' intervals do; it fails when that interval is entirely beyond
  the allowed change and beyond the host's run-to-run variation (``run_to_run_percent``), passes when entirely
  within the allowed change, and is inconclusive otherwise.

Every comparison gives a verdict record ``{"gate", "where", "verdict", "message"}``; the engine fails the node on
the ``fail`` ones (`failures`), and the stage keeps all of them in its summary (``verdicts``) so the reports show
the inconclusive ones, which fail nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .baseline import differences, timing_facts, timing_verdicts
from .compare import (
    NOISY_HINT,
    Figure,
    at_least,
    at_most,
    latency_figure,
    record,
    regression_verdicts,
    throughput_figure,
    where,
)
from .settings import GateFields

LATENCY_GATES = {"max_latency_ms_p50": "p50", "max_latency_ms_p90": "p90", "max_latency_ms_p95": "p95",
                 "max_latency_ms_p99": "p99", "max_latency_ms_mean": "mean"}
DEFAULT_BASELINE_REGRESSION_PERCENT = 10.0


def _interval(figure: Figure) -> str:
    return "" if figure.low == figure.high else f" (95% interval {figure.low:.4g}-{figure.high:.4g})"


def _open_note(point: Mapping[str, Any], statistic: str) -> str:
    if statistic in (point.get("open_intervals") or []):
        return (f"; {point.get('queries', 'too few')} queries are too few to bound {statistic} from above "
                "(p99 needs 368)")
    return ""


def threshold_verdicts(point: Mapping[str, Any], params: GateFields) -> list[dict[str, str]]:
    found = []
    place = where(point)
    for field, statistic in LATENCY_GATES.items():
        limit = getattr(params, field)
        figure = latency_figure(point, statistic)
        if limit is None or figure is None:
            continue
        verdict = at_most(figure, limit)
        shown = f"{statistic} latency {figure.value:.4g} ms{_interval(figure)}"
        if verdict == "fail":
            message = f"{place}: {shown} > {field} {limit:g} ms ({figure.value / limit:.2f}x)"
        elif verdict == "inconclusive":
            message = (f"{place}: inconclusive: {shown} against {field} {limit:g} ms: the interval straddles the "
                       f"limit{_open_note(point, statistic)}; {NOISY_HINT}")
        else:
            message = f"{place}: {shown} <= {field} {limit:g} ms"
        found.append(record(field, place, verdict, message))
    qps = throughput_figure(point)
    if params.min_throughput_qps is not None and qps is not None:
        limit = params.min_throughput_qps
        verdict = at_least(qps, limit)
        shown = f"throughput {qps.value:.4g} qps{_interval(qps)}"
        if verdict == "fail":
            message = f"{place}: {shown} < min_throughput_qps {limit:g} ({qps.value / limit:.2f}x)"
        elif verdict == "inconclusive":
            message = (f"{place}: inconclusive: {shown} against min_throughput_qps {limit:g}: the interval straddles "
                       f"the limit; {NOISY_HINT}")
        else:
            message = f"{place}: {shown} >= min_throughput_qps {limit:g}"
        found.append(record("min_throughput_qps", place, verdict, message))
    return found


def previous_run_verdicts(summary: Mapping[str, Any], params: GateFields,
                          previous: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """Against the last successful run of this node, when that ran on the same hardware (another GPU's timings
    say nothing about a regression)."""
    if params.max_regression_percent is None or not previous or not previous.get("points"):
        return []
    keys = timing_facts(summary.get("backend"), summary.get("device"))
    hardware = tuple(k for k in keys if k in ("gpu", "cpu"))
    if differences(previous.get("hardware") or {}, summary.get("hardware") or {}, hardware):
        return []
    return regression_verdicts(previous["points"], summary, params.max_regression_percent,
                               "the previous run's", "regression (previous run)",
                               run_to_run_percent=params.run_to_run_percent)


def verdicts(params: GateFields, summary: Mapping[str, Any], gate_ctx: Any) -> list[dict[str, str]]:
    """Every gate's verdicts: thresholds, then regression against a pinned baseline or the previous run."""
    found = [item for point in summary.get("points", []) for item in threshold_verdicts(point, params)]
    if params.baseline is not None:
        threshold = params.max_regression_percent or DEFAULT_BASELINE_REGRESSION_PERCENT
        found += timing_verdicts(params.baseline, params.baseline_node, summary, gate_ctx, threshold,
                                 params.run_to_run_percent)
    else:
        found += previous_run_verdicts(summary, params, gate_ctx.previous)
    return found


def failures(found: Sequence[Mapping[str, str]]) -> list[str]:
    return [item["message"] for item in found if item["verdict"] == "fail"]
