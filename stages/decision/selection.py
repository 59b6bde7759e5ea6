"""The decision of the ``select`` stage, as pure functions: candidates and their results in, a selection out.

Each candidate gets an operating point for the objective (a batch size, or a load level of the benchmark's
``load`` sweep), constraints exclude candidates, and the candidates that do not lose to the best one with
confidence (`decision.ties`: the 95% interval of their ratio to the best lies beyond the tie tolerance) are tied
within noise and ordered by the tie-breakers. Every candidate gets a reason: why it won, lost or was excluded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from pydantic import Field, model_validator

from trtflow.digits import decimals_apart, distinct
from trtflow.stage import StageParams
from trtflow.summaries import CandidateAccuracy, CandidatePerformance, SelectionSummary

from ..measure.statistics.unpaired import RUN_TO_RUN_PERCENT, latency_figure, throughput_figure, unmeasurable
from .generation import GOAL as GENERATION_GOAL
from .generation import first_token_text, levels_of, pick_level, point_source
from .ties import loses, objective_figure, paired_ties, ratio_text, row_ratio, worse_by

Goal = Literal["min_latency", "max_throughput", "min_size", "max_throughput_under_latency", "min_time_per_token"]
Statistic = Literal["p50", "p90", "p95", "p99", "mean"]
TieBreaker = Literal["accuracy", "size", "latency", "throughput"]

GOAL_TEXT = {
    "min_latency": "lowest {stat} latency",
    "max_throughput": "highest throughput",
    "min_size": "smallest size",
    "max_throughput_under_latency": "highest throughput with {stat} latency <= {budget:g} ms",
    "min_time_per_token": "lowest {stat} time per output token",
}
#: Goals judged on a time (lower is better, in ms).
TIME_GOALS = ("min_latency", "min_time_per_token")


class Objective(StageParams):
    """What the best candidate is best at."""

    goal: Goal = Field(
        "min_latency",
        description="'min_latency': the lowest latency (statistic `percentile`) at `batch_size`; "
        "'max_throughput': the highest throughput (at `batch_size`, or the best over every measured batch "
        "size and load level); 'min_size': the smallest artifact; 'max_throughput_under_latency': the highest "
        "throughput among the operating points (load levels of the benchmark's `load` sweep when present, "
        "else batch sizes) whose latency stays within `latency_budget_ms`; 'min_time_per_token': the lowest time "
        "per output token of greedy generation (benchmark params: generation) at `concurrency`, among candidates "
        "whose time to first token (same statistic) is within `max_ttft_ms`.",
    )
    percentile: Statistic = Field("p50", description="The latency statistic judged: p50, p90, p95, p99 or mean.")
    batch_size: int | None = Field(
        None, ge=1, description="The benchmarked batch size to judge. Default: for latency, the smallest batch "
        "size every candidate was benchmarked at; for throughput, the best over all measured points.",
    )
    latency_budget_ms: float | None = Field(
        None, gt=0, description="For max_throughput_under_latency: the latency (at `percentile`) no operating "
        "point may exceed, e.g. a p99 service-level objective.",
    )
    max_ttft_ms: float | None = Field(
        None, gt=0, description="For min_time_per_token: the time to first token (at `percentile`) a candidate may "
        "take at most.")
    concurrency: int | None = Field(
        None, ge=1, description="For min_time_per_token: the generation benchmark's concurrency level to judge "
        "(default: the lowest measured).")

    @model_validator(mode="after")
    def _budget_for_its_goal(self) -> Objective:
        if self.goal == "max_throughput_under_latency" and self.latency_budget_ms is None:
            raise ValueError("goal max_throughput_under_latency needs latency_budget_ms")
        if self.goal != "max_throughput_under_latency" and self.latency_budget_ms is not None:
            raise ValueError(f"latency_budget_ms is only used by goal max_throughput_under_latency; for goal "
                             f"{self.goal} limit latency with constraints.max_latency_ms")
        if self.goal != GENERATION_GOAL and (self.max_ttft_ms is not None or self.concurrency is not None):
            raise ValueError(f"max_ttft_ms and concurrency are used by goal {GENERATION_GOAL}, not {self.goal}")
        return self

    def describe(self) -> str:
        text = GOAL_TEXT[self.goal].format(stat=self.percentile, budget=self.latency_budget_ms or 0)
        if self.goal == GENERATION_GOAL:
            budget = f" with {self.percentile} time to first token <= {self.max_ttft_ms:g} ms" if self.max_ttft_ms \
                else ""
            return text + budget + (f" at concurrency {self.concurrency}" if self.concurrency else "")
        if self.batch_size is not None and self.goal != "min_size":
            text += f" at batch {self.batch_size}"
        return text


class Constraints(StageParams):
    """What a candidate must meet to be eligible at all."""

    validation: Literal["passed", "not_required"] = Field(
        "passed", description="'passed': a candidate needs a validation result that passed; 'not_required': "
        "candidates without one stay eligible (a failed validation still excludes).",
    )
    max_latency_ms: float | None = Field(
        None, gt=0, description="Highest latency (statistic `objective.percentile`) at the operating point.")
    min_throughput_qps: float | None = Field(
        None, gt=0, description="Lowest throughput (inferences per second) at the operating point.")
    max_size_mb: float | None = Field(
        None, gt=0, description="Largest artifact, in MB (10^6 bytes), external weights included.")

    def describe(self, stat: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.validation == "passed":
            out.append({"name": "validation", "limit": "passed", "text": "validation passed"})
        if self.max_latency_ms is not None:
            out.append({"name": "max_latency_ms", "limit": self.max_latency_ms,
                        "text": f"{stat} latency <= {self.max_latency_ms:g} ms"})
        if self.min_throughput_qps is not None:
            out.append({"name": "min_throughput_qps", "limit": self.min_throughput_qps,
                        "text": f"throughput >= {self.min_throughput_qps:g} qps"})
        if self.max_size_mb is not None:
            out.append({"name": "max_size_mb", "limit": self.max_size_mb,
                        "text": f"size <= {self.max_size_mb:g} MB"})
        return out


class TieBreakers(StageParams):
    """How near-equal candidates are told apart (benchmarks are noisy: 1% is not a real difference)."""

    tolerance_percent: float = Field(
        5.0, ge=0, le=100, description="A preference band, not a noise allowance: how much of the objective you "
        "give up for the tie-breakers. A candidate loses to the best one only when it is worse by more than this "
        "many percent with confidence (measured side by side with it, `finalists`); within the band, or when that "
        "cannot be told, the tie-breakers decide. 0: the objective alone decides whatever can be told apart.")
    run_to_run_percent: float = Field(
        RUN_TO_RUN_PERCENT, ge=0, le=100, description="For candidates compared on their stored benchmark figures "
        "only (finalists timed together cancel it): how much faster or slower the host itself may run between two "
        "benchmarks, which neither one's interval sees; a candidate loses on stored figures only beyond "
        "tolerance_percent and this too. 0 on a dedicated, quiet machine.")
    order: list[TieBreaker] = Field(
        default_factory=lambda: ["accuracy", "size"],
        description="Criteria applied in turn to tied candidates: accuracy (higher cosine similarity to the "
        "reference), size (smaller), latency (lower), throughput (higher).",
    )


class Finalists(StageParams):
    """Timing the candidates that are not clearly beaten side by side, before choosing among them."""

    measure: bool = Field(
        True, description="Time the finalists (eligible candidates not clearly beaten on their stored benchmark "
        "figures) again together at the operating point, one window each per round in a random order, until each "
        "one's ratio to the leader is decided against tolerance_percent or the cap. It needs their runtime here: "
        "ONNX models benchmarked on ONNX Runtime (CPU, or CUDA with a GPU given to this node); otherwise, and for "
        "objectives on load levels, the stored figures decide and the selection says so.")
    max_duration_s: float | None = Field(
        None, gt=0, description="Timed seconds per finalist at most (default: its benchmark's max_duration_s).")


class Params(StageParams):
    objective: Objective = Field(default_factory=Objective, description="What the chosen candidate is best at.")
    constraints: Constraints = Field(default_factory=Constraints, description="What every candidate must meet.")
    tie_breakers: TieBreakers = Field(default_factory=TieBreakers, description="How ties are broken.")
    finalists: Finalists = Field(default_factory=Finalists, description="Timing the finalists side by side.")
    baseline: str | None = Field(
        None, description="A candidate (node name) that speed-ups are computed against, e.g. the fp32 model; "
        "exclusive with the `baseline` input (a benchmark.json of something that is not a candidate).",
    )
    evaluated_slots: list[str] = Field(
        default_factory=lambda: ["candidate", "model"],
        description="Input slots through which a validation or benchmark node takes the model it evaluates "
        "(validate: candidate, benchmark: model); used when such a node consumed several candidates (e.g. "
        "one as its reference).",
    )


# ---------------------------------------------------------------------------------------------------------
# What each candidate brings


@dataclass
class Candidate:
    """One candidate with the results gathered for it (plain JSON-ready data)."""

    name: str
    kind: str  # "onnx" or "engine"
    size_bytes: int
    precision: str | None = None
    profiles: list[str] = field(default_factory=list)
    matrix: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] | None = None
    benchmark: dict[str, Any] | None = None


def accuracy_of(validate_json: Mapping[str, Any], node: str) -> CandidateAccuracy:
    """The accuracy figures a decision needs from a validate.json (worst output wins)."""
    outputs = validate_json.get("outputs") or {}
    cosines = [o["cosine_similarity"] for o in outputs.values() if _number(o.get("cosine_similarity"))]
    mean_errors = [o["mean_abs_error"] for o in outputs.values() if _number(o.get("mean_abs_error"))]
    max_errors = [o["max_abs_error"] for o in outputs.values() if _number(o.get("max_abs_error"))]
    return {
        "node": node,
        "passed": bool(validate_json.get("passed")),
        "cosine_similarity": min(cosines) if cosines else None,
        "mean_abs_error": max(mean_errors) if mean_errors else None,
        "max_abs_error": max(max_errors) if max_errors else None,
        "task_metrics": {k: (v.get("value") if isinstance(v, dict) else v)
                         for k, v in (validate_json.get("task_metrics") or {}).items()},
        "failures": list(validate_json.get("failures") or []),
        "uncalibrated_data": bool(validate_json.get("uncalibrated_data")),
    }


#: What selection keeps of each benchmark point's uncertainty.
UNCERTAINTY = ("queries", "latency_ci_ms", "throughput_ci_qps", "converged", "open_intervals",
               "cpu_wait_ms_per_query")


def performance_of(benchmark_json: Mapping[str, Any], node: str) -> CandidatePerformance:
    """Per batch size the latency statistics and throughput, and the `load` sweep when there is one."""
    points = []
    for point in benchmark_json.get("points") or []:
        report = point.get("report") or {}
        latency = report.get("latency_ms") or {}
        points.append({
            "batch_size": point.get("batch_size"), "shapes": point.get("shapes"),
            "latency_ms": {k: latency[k] for k in ("p50", "p90", "p95", "p99", "mean") if _number(latency.get(k))},
            "throughput_qps": report.get("throughput_qps"),
            "flags": list(report.get("flags") or []),
            **{key: report[key] for key in UNCERTAINTY if key in report},
        })
    load = []
    for level in benchmark_json.get("load") or []:
        latency = level.get("latency_ms") or {}
        load.append({
            "concurrency": level.get("concurrency"),
            "batch_size": level.get("batch_size"),
            "latency_ms": {k: latency[k] for k in ("p50", "p90", "p95", "p99", "mean") if _number(latency.get(k))},
            "throughput_qps": level.get("throughput_qps"),
            **{key: level[key] for key in ("queries", "latency_ci_ms") if key in level},
        })
    return {"node": node, "backend": benchmark_json.get("backend"), "device": benchmark_json.get("device"),
            "method": benchmark_json.get("method") or {}, "points": points, "load": load,
            "generation": levels_of(benchmark_json)}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------------------------------------------
# The decision (pure: candidates in, selection out)


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
    if goal == GENERATION_GOAL:
        level, problem = pick_level(candidate.benchmark.get("generation") or [], stat, objective.concurrency,
                                    objective.max_ttft_ms)
        if level is None:
            return None, problem
        source = point_source(level, stat)
        return OperatingPoint(None, source["concurrency"], source["latency_ms"][stat], source["throughput_qps"],
                              source["latency_ci_ms"].get(stat), None, source), ""
    if goal == "max_throughput_under_latency":
        points = [p for p in _points(candidate, stat, with_load=True) if _number(p.throughput_qps)]
        within = [p for p in points if _number(p.latency_ms) and p.latency_ms <= (objective.latency_budget_ms or 0)]
        if not within:
            measured = [p for p in points if _number(p.latency_ms)]
            best = min(measured, key=lambda p: p.latency_ms) if measured else None  # type: ignore[arg-type,return-value]
            lowest = f"; its lowest {stat} is {best.latency_ms:.4g} ms at {best.describe()}" if best else ""
            return None, f"no operating point meets {stat} latency <= {objective.latency_budget_ms:g} ms{lowest}"
        return max(within, key=lambda p: p.throughput_qps), ""  # type: ignore[arg-type,return-value]
    if goal == "max_throughput" and objective.batch_size is None:
        points = [p for p in _points(candidate, stat, with_load=True) if _number(p.throughput_qps)]
        if not points:
            return None, "the benchmark has no throughput figure"
        return max(points, key=lambda p: p.throughput_qps), ""  # type: ignore[arg-type,return-value]
    points = {p.batch_size: p for p in _points(candidate, stat, with_load=False)}
    if batch is None:
        return None, "the candidates share no benchmarked batch size (set objective.batch_size)"
    if batch not in points:
        measured = ", ".join(str(b) for b in sorted(b for b in points if b is not None)) or "none"
        return None, f"not benchmarked at batch {batch} (measured: {measured})"
    return points[batch], ""


def _objective_value(candidate: Candidate, point: OperatingPoint | None,
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


def _lower_is_better(goal: str) -> bool:
    return goal in (*TIME_GOALS, "min_size")


def _violations(candidate: Candidate, point: OperatingPoint | None, point_problem: str,
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
            if not _number(point.latency_ms):
                problems.append(f"no {stat} latency at {where}")
            elif point.latency_ms > constraints.max_latency_ms:  # type: ignore[operator]
                problems.append(f"{stat} latency {point.latency_ms:.4g} ms at {where} > max_latency_ms "
                                f"{constraints.max_latency_ms:g}")
        if constraints.min_throughput_qps is not None:
            if not _number(point.throughput_qps):
                problems.append(f"no throughput at {where}")
            elif point.throughput_qps < constraints.min_throughput_qps:  # type: ignore[operator]
                problems.append(f"throughput {point.throughput_qps:.4g} qps at {where} < min_throughput_qps "
                                f"{constraints.min_throughput_qps:g}")
    if constraints.max_size_mb is not None and candidate.size_bytes > constraints.max_size_mb * 1e6:
        problems.append(f"size {candidate.size_bytes / 1e6:.3g} MB > max_size_mb {constraints.max_size_mb:g}")
    return problems


def _tie_key(row: Mapping[str, Any], criterion: str) -> float:
    """Sort key of a tie-breaker (smaller sorts first); a missing figure sorts last."""
    if criterion == "accuracy":
        value = (row.get("validation") or {}).get("cosine_similarity")
        return -value if _number(value) else math.inf
    if criterion == "size":
        return float(row["size_bytes"])
    point = row.get("operating_point") or {}
    if criterion == "latency":
        value = point.get("latency_ms")
        return value if _number(value) else math.inf
    value = point.get("throughput_qps")
    return -value if _number(value) else math.inf


CRITERION_TEXT = {"accuracy": "accuracy (cosine similarity)", "size": "size", "latency": "latency",
                  "throughput": "throughput"}


def _show(criterion: str, row: Mapping[str, Any], stat: str, against: Sequence[Mapping[str, Any]] = ()) -> str:
    """A candidate's figure for a tie-breaker; a cosine similarity with enough digits to tell it from those of the
    candidates in ``against`` (0.99999992 vs 1, not 1 vs 1)."""
    if criterion == "accuracy":
        value = (row.get("validation") or {}).get("cosine_similarity")
        theirs = [(other.get("validation") or {}).get("cosine_similarity") for other in against]
        return distinct(value, theirs, least=6) if _number(value) else "none"
    if criterion == "size":
        return f"{row['size_bytes'] / 1e6:.3g} MB"
    point = row.get("operating_point") or {}
    if criterion == "latency":
        return f"{stat} {point['latency_ms']:.4g} ms" if _number(point.get("latency_ms")) else "none"
    return f"{point['throughput_qps']:.4g} qps" if _number(point.get("throughput_qps")) else "none"


def _chosen_text(criterion: str, winner: Mapping[str, Any], others: Sequence[Mapping[str, Any]], stat: str) -> str:
    """How the tie-breaker that decided sets the winner apart from the candidates tied with it: "; chosen by
    accuracy: cosine similarity 1 vs 0.99999994 for fp16" (each figure named, none left bare)."""
    label = "cosine similarity " if criterion == "accuracy" else ""
    versus = ", ".join(f"{_show(criterion, other, stat, [winner])} for {other['name']}" for other in others)
    return f"; chosen by {criterion}: {label}{_show(criterion, winner, stat, others)} vs {versus}"


def _value_text(value: float, goal: str, interval: Sequence[float] | None = None) -> str:
    if goal == "min_size":
        return f"{value / 1e6:.3g} MB"
    unit = "ms" if goal in TIME_GOALS else "qps"
    if interval is not None and len(interval) == 2 and interval[0] != interval[1]:
        return f"{value:.4g} {unit} [{interval[0]:.4g}, {interval[1]:.4g}]"
    return f"{value:.4g} {unit}"


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """Candidates no other beats on both latency (operating point) and accuracy (cosine similarity)."""
    measured = []
    for row in rows:
        latency = (row.get("operating_point") or {}).get("latency_ms")
        cosine = (row.get("validation") or {}).get("cosine_similarity")
        if _number(latency) and _number(cosine):
            measured.append((row["name"], latency, cosine))
    front = set()
    for name, latency, cosine in measured:
        dominated = any(lat <= latency and cos >= cosine and (lat < latency or cos > cosine)
                        for other, lat, cos in measured if other != name)
        if not dominated:
            front.add(name)
    return front


def decide(candidates: Sequence[Candidate], params: Params, baseline: Mapping[str, Any] | None = None,
           finalists: Mapping[str, Any] | None = None) -> SelectionSummary:
    """The selection: every candidate with its operating point, eligibility, rank and reason. ``finalists``: the
    record of finalists timed together (`measure.timing.finalists`): their comparisons with the leader replace the
    stored figures'; or {"why": ...}: why they were not (said in the selection)."""
    objective = params.objective
    stat, goal = objective.percentile, objective.goal
    batch = default_batch(candidates, objective)
    if objective.batch_size is None and batch is not None and goal == "min_latency":
        objective_text = f"{objective.describe()} at batch {batch}"
    else:
        objective_text = objective.describe()
    rows: list[dict[str, Any]] = []
    for candidate in candidates:
        point, problem = operating_point(candidate, objective, batch)
        value, interval, compared = _objective_value(candidate, point, objective)
        violations = _violations(candidate, point, problem, params)
        if value is None and not violations:
            violations.append(problem or "no figure for the objective")
        rows.append({
            "name": candidate.name, "kind": candidate.kind, "precision": candidate.precision,
            "profiles": candidate.profiles, "matrix": candidate.matrix, "size_bytes": candidate.size_bytes,
            "validation": candidate.validation, "benchmark": candidate.benchmark,
            "operating_point": None if point is None else {
                "batch_size": point.batch_size, "concurrency": point.concurrency,
                "latency_ms": point.latency_ms, "throughput_qps": point.throughput_qps,
                "latency_ci_ms": point.latency_ci_ms, "throughput_ci_qps": point.throughput_ci_qps,
                "description": point.describe(), "source": point.source},
            "objective_value": value, "objective_ci": interval, "compared_ci": compared, "eligible": not violations,
            "violations": violations,
        })
        if goal == GENERATION_GOAL and point is not None:
            rows[-1]["first_token"] = first_token_text(point.source, stat, objective.max_ttft_ms)
    _add_speedups(rows, params, baseline, stat)
    front = pareto_front(rows)
    for row in rows:
        row["pareto"] = row["name"] in front

    eligible = [r for r in rows if r["eligible"]]
    sign = 1.0 if _lower_is_better(goal) else -1.0
    selected: str | None = None
    tolerance = params.tie_breakers.tolerance_percent
    run_to_run = params.tie_breakers.run_to_run_percent
    if eligible:
        best = min(eligible, key=lambda r: (sign * r["objective_value"], r["name"]))
        best_figure = objective_figure(goal, best["objective_value"], best["compared_ci"])
        for row in eligible:
            ratio = worse_by(objective_figure(goal, row["objective_value"], row["compared_ci"]),  # type: ignore[arg-type]
                             best_figure, _lower_is_better(goal))  # type: ignore[arg-type]
            row["ratio_to_best"] = [ratio.value, ratio.low, ratio.high]
            row["tie"] = not loses(ratio, tolerance, 0.0 if goal == "min_size" else run_to_run)
            row["basis"] = "size" if goal == "min_size" else "stored figures"
            busy = None if goal == "min_size" else unmeasurable((row.get("operating_point") or {}).get("source") or {})
            if busy and row is not best:
                row["unmeasurable"], row["tie"] = busy, True
        if finalists and finalists.get("rounds"):
            best = _paired(eligible, finalists)
        tied = [r for r in eligible if r["tie"]]
        order = params.tie_breakers.order

        def rank_key(row: Mapping[str, Any]) -> tuple:
            return (not row["tie"], *(_tie_key(row, c) if row["tie"] else 0.0 for c in order),
                    sign * row["objective_value"], row["name"])

        ranked = sorted(eligible, key=rank_key)
        winner = ranked[0]
        selected = winner["name"]
        allowance = f"the {tolerance:g}% preference band" + (
            "" if goal == "min_size" or not run_to_run or best.get("basis") == "paired A/B" else
            f" and the host's {run_to_run:g}% run-to-run variation (stored figures)")
        for position, row in enumerate(ranked, start=1):
            row["rank"] = position
            row["reason"] = _reason(row, winner, best, tied, order, objective_text, goal, stat, allowance,
                                    len(eligible))
            if row.get("first_token"):
                row["reason"] += f"; {row['first_token']}"
    for row in rows:
        if not row["eligible"]:
            row["rank"] = None
            row["reason"] = "excluded: " + "; ".join(row["violations"])
    tied_names = [r["name"] for r in rows if r.get("tie")]
    for row in rows:  # what decided needs no copy of the source point
        (row.get("operating_point") or {}).pop("source", None)
    return cast(SelectionSummary, {
        "selected": selected,
        "tie_within_noise": len(tied_names) > 1,
        "tied": tied_names if len(tied_names) > 1 else [],
        "unmeasurable": {r["name"]: r["unmeasurable"] for r in rows if r.get("unmeasurable")},
        "finalists": _finalists_note(finalists),
        "objective": {**objective.model_dump(), "batch_size": batch if goal == "min_latency" else
                      objective.batch_size, "description": objective_text},
        "constraints": params.constraints.describe(stat),
        "tie_breakers": params.tie_breakers.model_dump(),
        "baseline": (baseline or {}).get("name"),
        "candidates": rows,
    })


def _paired(eligible: list[dict[str, Any]], finalists: Mapping[str, Any]) -> dict[str, Any]:
    """The finalists' comparisons with their leader, timed together, replace their stored-figure ones; returns the
    leader's row (the new best)."""
    by_name = {row["name"]: row for row in eligible}
    names = [name for name in finalists["names"] if name in by_name]
    leader, duels = paired_ties(finalists)
    for name in names:
        row = by_name[name]
        row.pop("unmeasurable", None)  # timed together, the host's interference cancels
        row["basis"] = "paired A/B"
        if name == leader:
            row["ratio_to_best"], row["tie"], row["paired"] = [1.0, 1.0, 1.0], True, None
            continue
        duel = duels[name]
        row["ratio_to_best"] = [duel["ratio"], duel["low"], duel["high"]]
        row["tie"] = duel["outcome"] != "loses"
        row["paired"] = duel
    return by_name[leader]


def _finalists_note(finalists: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the selection says about timing the finalists together: who, how long, or why not."""
    if not finalists:
        return None
    if not finalists.get("rounds"):
        return {"measured": False, "why": finalists.get("why")}
    return {"measured": True, "names": finalists["names"], "rounds": len(finalists["rounds"]),
            "seconds": finalists.get("seconds"), "figure": finalists["figure"],
            "batch_size": finalists["batch_size"], "ended": finalists["ended"]}


def _duel_text(row: Mapping[str, Any]) -> str:
    duel = row.get("paired") or {}
    return (f"timed together over {duel.get('rounds')} rounds: ratio {duel.get('ratio', 1):.3g}, bounds "
            f"{duel.get('low', 1):.3g}-{duel.get('high', 1):.3g}")


def _tie_text(row: Mapping[str, Any], winner: Mapping[str, Any], objective_text: str, versus: str,
              ratio: str) -> str:
    """How a tied candidate stands against the winner: within the band, not told apart, or unmeasurable."""
    if row.get("unmeasurable"):
        return f"{row['unmeasurable']}: not ranked against {winner['name']} on {objective_text} ({versus})"
    duel = row.get("paired")
    if duel:
        how = "within the preference band of" if duel["outcome"] == "within" else "not told apart (at the cap) from"
        return f"{how} {winner['name']} on {objective_text} ({versus}; {_duel_text(row)})"
    if row.get("basis") == "paired A/B" and winner.get("paired"):  # the leader, and the winner close enough to it
        how = "within the preference band" if winner["paired"]["outcome"] == "within" else "not told apart (at the cap)"
        return f"the leader timed together, with {winner['name']} {how} of it on {objective_text} ({versus}; " \
               f"{_duel_text(winner)})"
    return f"tie within noise with {winner['name']} on {objective_text} ({versus}; {ratio})"


def _reason(row: Mapping[str, Any], winner: Mapping[str, Any], best: Mapping[str, Any],
            tied: Sequence[Mapping[str, Any]], order: Sequence[str], objective_text: str, goal: str, stat: str,
            allowance: str, eligible_count: int) -> str:
    value = row["objective_value"]
    shown = _value_text(value, goal, row.get("objective_ci"))
    together = " (finalists timed together)" if row.get("basis") == "paired A/B" else ""
    if row["name"] == winner["name"]:
        if len(tied) == 1:
            return f"selected: {objective_text} ({shown}) among {eligible_count} eligible{together}"
        others = [r for r in tied if r["name"] != winner["name"]]
        decided_by = next((c for c in order if any(_tie_key(o, c) != _tie_key(winner, c) for o in others)), None)
        how = _chosen_text(decided_by, winner, others, stat) if decided_by else ""
        unmeasured = [r for r in tied if r.get("unmeasurable")]
        if unmeasured:
            return (f"selected: {objective_text} ({shown}); "
                    + "; ".join(f"{r['name']} {r['unmeasurable']}" for r in unmeasured)
                    + f": not ranked on it, so the tie-breakers decided among {', '.join(r['name'] for r in tied)}"
                    f"{how}")
        kind = "no difference beyond " + allowance + " with confidence" if not together else \
            "none worse beyond " + allowance + " with confidence, timed together"
        return (f"selected: tie within noise on {objective_text} ({shown}) with "
                f"{', '.join(r['name'] for r in others)} ({kind}){how}")
    versus = (f"{shown} vs {_value_text(winner['objective_value'], goal, winner.get('objective_ci'))} for "
              f"{winner['name']}")
    if row["tie"]:
        against = winner if winner["name"] == best["name"] else best
        ratio = ratio_text(row_ratio(row)) + (f" to {against['name']}" if against is not winner else "")
        standing = _tie_text(row, winner, objective_text, versus, ratio)
        criterion = next((c for c in order if _tie_key(row, c) != _tie_key(winner, c)), None)
        if criterion is None:
            return (f"{standing} and on every tie-breaker; {winner['name']} is better on the objective or first by "
                    "name")
        return (f"{standing}; lost the tie-break on {CRITERION_TEXT[criterion]}: "
                f"{_show(criterion, row, stat, [winner])} vs {_show(criterion, winner, stat, [row])} "
                f"for {winner['name']}")
    ratio = row_ratio(row)
    if _lower_is_better(goal):
        factor = f"{ratio.value:.3g}x {'slower' if goal in TIME_GOALS else 'larger'}"
    else:
        factor = f"{ratio.value:.3g}x lower"
    if row.get("paired"):
        beyond = f"; {_duel_text(row)}, beyond {allowance}"
    else:
        beyond = "" if ratio.low == ratio.high else f"; {ratio_text(ratio)}, beyond {allowance}"
    versus_best = (f"{shown} vs {_value_text(best['objective_value'], goal, best.get('objective_ci'))} for "
                   f"{best['name']}")
    chosen = "" if best["name"] == winner["name"] else \
        f"; {winner['name']} was chosen among the candidates tied within noise with {best['name']}"
    return f"{objective_text}: {versus_best} ({factor}{beyond}){chosen}"


def _add_speedups(rows: list[dict[str, Any]], params: Params, baseline: Mapping[str, Any] | None,
                  stat: str) -> None:
    """Latency speed-up over the baseline at each candidate's batch size (>1: faster than the baseline)."""
    points: dict[int | None, float] = {}
    if baseline is not None:
        for p in baseline.get("points", []):
            if _number(p["latency_ms"].get(stat)):
                points[p["batch_size"]] = p["latency_ms"][stat]
    for row in rows:
        point = row["operating_point"] or {}
        reference = points.get(point.get("batch_size"))
        latency = point.get("latency_ms")
        row["speedup"] = reference / latency if _number(reference) and _number(latency) and latency else None


def table(selection: Mapping[str, Any]) -> str:
    """The selection as an aligned text table (for the failure message and the log)."""
    stat = selection["objective"]["percentile"]
    header = ("candidate", "kind", "precision", "size MB", "cosine", "valid", f"{stat} ms", "qps", "at", "verdict")
    lines = [header]
    decimals = decimals_apart([(r.get("validation") or {}).get("cosine_similarity") for r in selection["candidates"]],
                              least=5)
    for row in selection["candidates"]:
        validation = row.get("validation") or {}
        point = row.get("operating_point") or {}
        cosine = validation.get("cosine_similarity")
        verdict = "SELECTED" if row["name"] == selection["selected"] else row["reason"]
        lines.append((
            row["name"], row["kind"], row.get("precision") or "-", f"{row['size_bytes'] / 1e6:.3g}",
            f"{cosine:.{decimals}f}" if _number(cosine) else "-",
            "-" if not validation else ("pass" if validation.get("passed") else "FAIL"),
            f"{point['latency_ms']:.4g}" if _number(point.get("latency_ms")) else "-",
            f"{point['throughput_qps']:.4g}" if _number(point.get("throughput_qps")) else "-",
            point.get("description") or "-", verdict,
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
                     for line in lines)
