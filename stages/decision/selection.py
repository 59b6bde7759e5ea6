"""The decision of the ``select`` stage, as pure functions: candidates and their results in, a selection out.

Each candidate gets an operating point for the objective (a batch size, or a load level of the benchmark's
``load`` sweep), constraints exclude candidates, and the candidates that do not lose to the best one with
confidence (`decision.ties`: the 95% interval of their ratio to the best lies beyond the tie tolerance) are tied
within noise and ordered by the tie-breakers. Every candidate gets a reason: why it won, lost or was excluded.
"""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from trtflow.digits import finite
from trtflow.summaries import SelectionSummary

from ..measure.statistics.unpaired import unmeasurable
from .candidates import Candidate
from .generation import GOAL as GENERATION_GOAL
from .generation import first_token_text
from .operating_point import constraint_violations, default_batch, lower_is_better, objective_value, operating_point
from .params import Params
from .reasons import reason
from .tie_breakers import accuracy_fronts, compare_accuracy, more_accurate, tie_key
from .ties import loses, objective_figure, paired_ties, worse_by


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """Candidates no other beats on both latency (operating point) and accuracy: no other is as fast or faster and
    at least as accurate (not less accurate beyond the figures' resolution and spread, `tie_breakers`), and faster
    or more accurate."""
    measured = [(row, latency) for row in rows
                if compare_accuracy(row.get("validation"), row.get("validation"))
                and finite(latency := (row.get("operating_point") or {}).get("latency_ms"))]
    front = set()
    for row, latency in measured:
        ours = row["validation"]
        dominated = any(lat <= latency and compare_accuracy(ours, other["validation"])
                        and not more_accurate(ours, other["validation"])
                        and (lat < latency or more_accurate(other["validation"], ours))
                        for other, lat in measured if other is not row)
        if not dominated:
            front.add(row["name"])
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
        value, interval, compared = objective_value(candidate, point, objective)
        violations = constraint_violations(candidate, point, problem, params)
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
    sign = 1.0 if lower_is_better(goal) else -1.0
    selected: str | None = None
    tolerance = params.tie_breakers.tolerance_percent
    run_to_run = params.tie_breakers.run_to_run_percent
    if eligible:
        busy = {r["name"]: None if goal == "min_size" else _unmeasurable(r) for r in eligible}
        # the best is the best measurable one: figures that timed the host rank nobody
        best = min(eligible, key=lambda r: (busy[r["name"]] is not None, sign * r["objective_value"], r["name"]))
        best_figure = objective_figure(goal, best["objective_value"], best["compared_ci"])
        for row in eligible:
            ratio = worse_by(objective_figure(goal, row["objective_value"], row["compared_ci"]),  # type: ignore[arg-type]
                             best_figure, lower_is_better(goal))  # type: ignore[arg-type]
            row["ratio_to_best"] = [ratio.value, ratio.low, ratio.high]
            row["tie"] = not loses(ratio, tolerance, 0.0 if goal == "min_size" else run_to_run)
            row["basis"] = "size" if goal == "min_size" else "stored figures"
            if busy[row["name"]] and row is not best:
                row["unmeasurable"], row["tie"] = busy[row["name"]], True
        if finalists and finalists.get("rounds"):
            best = _paired(eligible, finalists)
        tied = [r for r in eligible if r["tie"]]
        fronts = accuracy_fronts(tied)
        for row in tied:
            row["accuracy_front"] = fronts[row["name"]]
        order = params.tie_breakers.order

        def rank_key(row: Mapping[str, Any]) -> tuple:
            return (not row["tie"], *(tie_key(row, c) if row["tie"] else 0.0 for c in order),
                    sign * row["objective_value"], row["name"])

        ranked = sorted(eligible, key=rank_key)
        winner = ranked[0]
        selected = winner["name"]
        allowance = f"the {tolerance:g}% preference band" + (
            "" if goal == "min_size" or not run_to_run or best.get("basis") == "paired A/B" else
            f" and the host's {run_to_run:g}% run-to-run variation (stored figures)")
        for position, row in enumerate(ranked, start=1):
            row["rank"] = position
            row["reason"] = reason(row, winner, best, tied, order, objective_text, goal, stat, allowance,
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


def _unmeasurable(row: Mapping[str, Any]) -> str | None:
    """Why a row's figure timed the host rather than the candidate (`measure.statistics.unpaired.unmeasurable`; a
    generation level says so itself), or None."""
    source = (row.get("operating_point") or {}).get("source") or {}
    return source.get("unmeasurable") or unmeasurable(source)


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
            "batch_size": finalists["batch_size"], "ended": finalists["ended"],
            **{key: finalists[key] for key in ("seed", "window_s", "orders", "runtime", "which", "load_rule")
               if key in finalists}}


def _add_speedups(rows: list[dict[str, Any]], params: Params, baseline: Mapping[str, Any] | None,
                  stat: str) -> None:
    """Latency speed-up over the baseline at each candidate's batch size (>1: faster than the baseline)."""
    points: dict[int | None, float] = {}
    if baseline is not None:
        for p in baseline.get("points", []):
            if finite(p["latency_ms"].get(stat)):
                points[p["batch_size"]] = p["latency_ms"][stat]
    for row in rows:
        point = row["operating_point"] or {}
        reference = points.get(point.get("batch_size"))
        latency = point.get("latency_ms")
        row["speedup"] = reference / latency if finite(reference) and finite(latency) and latency else None

