"""The benchmark's figures for the recipe's history (`trtflow history`): read from the summary the node returned.

Per fixed-batch point: median and p99 latency and throughput, each with its 95% interval and the number of timed
queries (and any other latency statistic a gate judges); per Server search: the serving capacity (the highest
arrival rate whose p99 met the budget, confirmed by a long run, with the level length it was searched with); per
MLPerf scenario: its figure. The figures the node's decisions use are its primary ones, which
`trtflow history --check` judges: each limit's statistic at every point, and the median latency and throughput at
the gate point (`gates.gate_point`: ``gate_batch_size``, else the largest measured batch, where regressions are
decided and where select judges throughput by default), also for a node without gates; and the serving capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trtflow.stage import Figure, Figures

from ..settings import GateFields
from ..statistics.unpaired import where
from .gates import gate_point

LATENCY_GATES = {"max_latency_ms_p50": "p50", "max_latency_ms_p90": "p90", "max_latency_ms_p95": "p95",
                 "max_latency_ms_p99": "p99", "max_latency_ms_mean": "mean"}
HOST_FACTS = ("others_cpu_percent", "wait_percent", "steal_percent", "load_average_before", "load_average_after")


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _bounds(interval: Any, open_high: bool = False) -> tuple[float | None, float | None]:
    if not (isinstance(interval, (list, tuple)) and len(interval) == 2):
        return None, None
    return _number(interval[0]), None if open_high else _number(interval[1])


def _primary_stats(params: GateFields) -> tuple[set[str], bool]:
    """(latency statistics judged at every point, whether throughput is judged at every point): the limits."""
    stats = {stat for field, stat in LATENCY_GATES.items() if getattr(params, field) is not None}
    return stats, params.min_throughput_qps is not None


def point_figures(point: Mapping[str, Any], primary_stats: set[str], primary_throughput: bool) -> list[Figure]:
    """Median and p99 latency (and any gated statistic) and throughput of one fixed-batch point."""
    place = where(point)
    latency = point.get("latency_ms") or {}
    intervals = point.get("latency_ci_ms") or {}
    opened = set(point.get("open_intervals") or [])
    queries = point.get("queries")
    n = int(queries) if isinstance(queries, int) else None
    figures = []
    for stat in ["p50", "p99", *sorted(primary_stats - {"p50", "p99"})]:
        value = _number(latency.get(stat, point.get("median_ms") if stat == "p50" else None))
        if value is None:
            continue
        low, high = _bounds(intervals.get(stat), open_high=stat in opened)
        figures.append(Figure(f"{stat} latency, {place}", value, "ms", "lower", low, high, n,
                              primary=stat in primary_stats))
    qps = _number(point.get("throughput_qps"))
    if qps is not None:
        low, high = _bounds(point.get("throughput_ci_qps"))
        figures.append(Figure(f"throughput, {place}", qps, "samples/s", "higher", low, high, n,
                              primary=primary_throughput))
    return figures


def capacity_figure(entry: Mapping[str, Any]) -> Figure | None:
    """The serving capacity of one Server search: where the confirmation's typical level meets the p99 budget
    (`measure.serving.capacity`), with its interval."""
    rate = _number(entry.get("arrival_rate_qps"))
    if rate is None:
        return None
    confirmation = entry.get("confirmation") or {}
    queries = confirmation.get("queries")
    context = {key: entry[key] for key in ("generator", "level_s", "bracket_qps") if key in entry}
    if confirmation:
        context["confirmation_s"] = confirmation.get("duration_s")
        context.update({key: confirmation[key] for key in ("levels", "settled", "step_percent", "visits",
                                                          "meets_qps", "miss_above_qps") if key in confirmation})
    name = (f"serving capacity (p99 <= {entry.get('latency_budget_ms'):g} ms), {entry.get('streams', 1)} stream(s), "
            f"{entry.get('gpus', 1)} GPU(s)")
    low, high = _bounds(entry.get("interval_qps"))
    return Figure(name, rate, "requests/s", "higher", low, high, n=int(queries) if isinstance(queries, int) else None,
                  primary=True, context=context)


def scenario_figure(entry: Mapping[str, Any]) -> Figure | None:
    """The figure of an MLPerf scenario run through LoadGen: Offline samples/s, SingleStream p90, MultiStream p99."""
    scenario = entry.get("scenario")
    queries = entry.get("queries")
    n = int(queries) if isinstance(queries, int) else None
    if scenario == "Offline":
        value = _number(entry.get("throughput_qps"))
        return None if value is None else Figure("Offline throughput", value, "samples/s", "higher", n=n)
    stat = {"SingleStream": "p90", "MultiStream": "p99"}.get(str(scenario))
    value = _number((entry.get("latency_ms") or {}).get(stat)) if stat else None
    if value is None:
        return None
    low, high = _bounds((entry.get("latency_ci_ms") or {}).get(stat))
    return Figure(f"{scenario} {stat} latency", value, "ms", "lower", low, high, n)


def history_figures(params: GateFields, summary: Mapping[str, Any]) -> Figures:
    """The figures of a benchmark summary for the recipe's history, and the facts of where they were measured."""
    stats, throughput = _primary_stats(params)
    figures: list[Figure] = []
    points = [point for point in summary.get("points") or [] if isinstance(point, Mapping)]
    decided = gate_point(params, points)
    for point in points:
        at_gate = point is decided
        figures += point_figures(point, stats | ({"p50"} if at_gate else set()), throughput or at_gate)
    for entry in summary.get("max_rate_meeting_budget") or []:
        figure = capacity_figure(entry)
        if figure is not None:
            figures.append(figure)
    for entry in summary.get("scenarios") or []:
        figure = scenario_figure(entry)
        if figure is not None:
            figures.append(figure)
    host = summary.get("host") or {}
    facts = {"backend": summary.get("backend"), "device": summary.get("device"),
             **dict(summary.get("hardware") or {}), **{key: host[key] for key in HOST_FACTS if key in host}}
    return Figures(tuple(figures), {key: value for key, value in facts.items() if value is not None})
