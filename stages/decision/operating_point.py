"""Where each candidate is judged: its operating point for the objective (a batch size, a load level or a
generation level), its figure there with the interval it is compared with, and the constraints it violates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtflow.digits import finite

from ..measure.statistics.unpaired import latency_figure, throughput_figure
from .candidates import Candidate
from .generation import GOALS as GENERATION_GOALS
from .generation import TTFT_GOAL, pick_level, point_source
from .params import TIME_GOALS, Objective, Params


@dataclass
class OperatingPoint:
    batch_size: int | None
    concurrency: int | None
    latency_ms: float | None
    throughput_qps: float | None
    latency_ci_ms: list[float] | None = None  # the 95% interval of latency_ms
    throughput_ci_qps: list[float] | None = None
    source: Mapping[str, Any] = field(default_factory=dict)  # the benchmark's point or load level

    def describe(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}" + (f" x batch {self.batch_size}" if self.batch_size else "")
        return f"batch {self.batch_size}" if self.batch_size is not None else "-"


def _points(candidate: Candidate, stat: str, with_load: bool) -> list[OperatingPoint]:
    bench = candidate.benchmark or {}
    if with_load and bench.get("load"):
        return [OperatingPoint(p.get("batch_size"), p.get("concurrency"), p["latency_ms"].get(stat),
                               p.get("throughput_qps"), (p.get("latency_ci_ms") or {}).get(stat),
                               p.get("throughput_ci_qps"), p) for p in bench["load"]]
    return [OperatingPoint(p.get("batch_size"), None, p["latency_ms"].get(stat), p.get("throughput_qps"),
                           (p.get("latency_ci_ms") or {}).get(stat), p.get("throughput_ci_qps"), p)
            for p in bench.get("points", [])]


def default_batch(candidates: Sequence[Candidate], objective: Objective) -> int | None:
    """The batch size to judge latency at when the objective names none: the smallest every candidate has."""
    if objective.batch_size is not None:
        return objective.batch_size
    measured = [{p["batch_size"] for p in (c.benchmark or {}).get("points", [])} for c in candidates if c.benchmark]
    common = set.intersection(*measured) if measured else set()
    return min(common) if common else None


def operating_point(candidate: Candidate, objective: Objective, batch: int | None) -> tuple[OperatingPoint | None, str]:
    """The point a candidate is judged at, or None with the reason it has none."""
    stat = objective.percentile
    if candidate.benchmark is None:
        return None, "no benchmark result"
    goal = objective.goal
    if goal in GENERATION_GOALS:
        judged = "ttft_ms" if goal == TTFT_GOAL else "tpot_ms"
        level, problem = pick_level(candidate.benchmark.get("generation") or [], stat, objective.concurrency,
                                    objective.max_ttft_ms, judged)
        if level is None:
            return None, problem
        source = point_source(level, stat, judged)
        return OperatingPoint(None, source["concurrency"], source["latency_ms"][stat], source["throughput_qps"],
                              source["latency_ci_ms"].get(stat), None, source), ""
    if goal == "max_throughput_under_latency":
        points = [p for p in _points(candidate, stat, with_load=True) if finite(p.throughput_qps)]
        within = [p for p in points if finite(p.latency_ms) and p.latency_ms <= (objective.latency_budget_ms or 0)]
        if not within:
            measured = [p for p in points if finite(p.latency_ms)]
            best = min(measured, key=lambda p: p.latency_ms) if measured else None  # type: ignore[arg-type,return-value]
            lowest = f"; its lowest {stat} is {best.latency_ms:.4g} ms at {best.describe()}" if best else ""
            return None, f"no operating point meets {stat} latency <= {objective.latency_budget_ms:g} ms{lowest}"
        return max(within, key=lambda p: p.throughput_qps), ""  # type: ignore[arg-type,return-value]
    if goal == "max_throughput" and objective.batch_size is None:
        points = [p for p in _points(candidate, stat, with_load=True) if finite(p.throughput_qps)]
        if not points:
            return None, "the benchmark has no throughput figure"
        return max(points, key=lambda p: p.throughput_qps), ""  # type: ignore[arg-type,return-value]
    by_batch = {p.batch_size: p for p in _points(candidate, stat, with_load=False)}
    if batch is None:
        return None, "the candidates share no benchmarked batch size (set objective.batch_size)"
    if batch not in by_batch:
        seen = ", ".join(str(b) for b in sorted(b for b in by_batch if b is not None)) or "none"
        return None, f"not benchmarked at batch {batch} (measured: {seen})"
    return by_batch[batch], ""


def objective_value(candidate: Candidate, point: OperatingPoint | None,
                     objective: Objective) -> tuple[float | None, list[float] | None, list[float] | None]:
    """The candidate's figure for the objective, its 95% interval, and the interval it is compared with: the
    95% interval reaching as far as the time its benchmark waited for a CPU allows (`measure.statistics.unpaired`). None
    where there is none."""
    if objective.goal == "min_size":
        return float(candidate.size_bytes), None, None
    if point is None:
        return None, None, None
    if objective.goal in TIME_GOALS:
        value, measured = point.latency_ms, point.latency_ci_ms
        figure = latency_figure({**point.source, "latency_ms": {objective.percentile: value},
                                 "latency_ci_ms": {objective.percentile: measured}},
                                objective.percentile)
    else:
        value, measured = point.throughput_qps, point.throughput_ci_qps
        figure = throughput_figure({**point.source, "throughput_qps": value, "throughput_ci_qps": measured})
    if figure is None:
        return None, None, None
    return figure.value, measured, None if figure.low == figure.high else [figure.low, figure.high]


def lower_is_better(goal: str) -> bool:
    return goal in (*TIME_GOALS, "min_size")


def constraint_violations(candidate: Candidate, point: OperatingPoint | None, point_problem: str,
                params: Params) -> list[str]:
    constraints, stat = params.constraints, params.objective.percentile
    problems: list[str] = []
    validation = candidate.validation
    if validation is None:
        if constraints.validation == "passed":
            problems.append("no validation result")
    elif not validation["passed"]:
        detail = "; ".join(validation["failures"][:2])
        problems.append(f"validation failed ({validation['node']})" + (f": {detail}" if detail else ""))
    needs_point = params.objective.goal != "min_size" or constraints.max_latency_ms or constraints.min_throughput_qps
    if point is None and needs_point:
        problems.append(point_problem)
    if point is not None:
        where = point.describe()
        if constraints.max_latency_ms is not None:
            if not finite(point.latency_ms):
                problems.append(f"no {stat} latency at {where}")
            elif point.latency_ms > constraints.max_latency_ms:
                problems.append(f"{stat} latency {point.latency_ms:.4g} ms at {where} > max_latency_ms "
                                f"{constraints.max_latency_ms:g}")
        if constraints.min_throughput_qps is not None:
            if not finite(point.throughput_qps):
                problems.append(f"no throughput at {where}")
            elif point.throughput_qps < constraints.min_throughput_qps:
                problems.append(f"throughput {point.throughput_qps:.4g} qps at {where} < min_throughput_qps "
                                f"{constraints.min_throughput_qps:g}")
    if constraints.max_size_mb is not None and candidate.size_bytes > constraints.max_size_mb * 1e6:
        problems.append(f"size {candidate.size_bytes / 1e6:.3g} MB > max_size_mb {constraints.max_size_mb:g}")
    return problems

