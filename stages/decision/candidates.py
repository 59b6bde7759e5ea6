"""What each of select's candidates brings: its artifact's facts and what selection keeps of its validation and
benchmark results (plain JSON-ready data)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from trtflow.digits import finite
from trtflow.summaries import CandidateAccuracy, CandidatePerformance

from ..accuracy.resolution import cosine_resolution, half_width
from .generation import levels_of


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


#: Per accuracy figure: which output is the worst (min for the cosine, max for the errors).
_WORST = {"cosine_similarity": min, "mean_abs_error": max, "max_abs_error": max}


def _uncertainty(output: Mapping[str, Any], figure: str) -> dict[str, float]:
    """An output's numerical resolution and 95% spread of ``figure`` (`accuracy.resolution`); a validate.json
    written before they were recorded: the cosine's float32 resolution over its elements, the errors exact."""
    recorded = output.get("resolution")
    if isinstance(recorded, Mapping):
        return {"resolution": float(recorded.get(figure) or 0.0),
                "spread": float((output.get("spread") or {}).get(figure) or 0.0)}
    if figure == "cosine_similarity":
        return {"resolution": cosine_resolution(int(output.get("elements") or 2)), "spread": 0.0}
    return {"resolution": 0.0, "spread": 0.0}


def accuracy_of(validate_json: Mapping[str, Any], node: str) -> CandidateAccuracy:
    """The accuracy figures a decision needs from a validate.json: per figure the worst output's value, with what
    it can tell apart (``uncertainty``: its numerical resolution and its spread over the rows); for a generation
    check, the mean tokens matched per prompt and its spread over the prompts."""
    outputs = validate_json.get("outputs") or {}
    found: dict[str, Any] = {}
    uncertainty: dict[str, dict[str, float]] = {}
    for figure, worst in _WORST.items():
        measured = [o for o in outputs.values() if finite(o.get(figure))]
        if not measured:
            found[figure] = None
            continue
        chosen = worst(measured, key=operator.itemgetter(figure))
        found[figure] = chosen[figure]
        uncertainty[figure] = _uncertainty(chosen, figure)
    accuracy: CandidateAccuracy = {
        "node": node,
        "passed": bool(validate_json.get("passed")),
        "cosine_similarity": found["cosine_similarity"],
        "mean_abs_error": found["mean_abs_error"],
        "max_abs_error": found["max_abs_error"],
    }
    generation = validate_json.get("generation") or {}
    matched = [m for m in generation.get("tokens_matched") or [] if finite(m)]
    if matched:
        accuracy["tokens_matched"] = sum(matched) / len(matched)
        uncertainty["tokens_matched"] = {"resolution": 0.0, "spread": half_width(matched)}
    until = [m for m in (generation.get("free_running") or {}).get("tokens_until_difference") or [] if finite(m)]
    if until:  # reported, not judged here
        accuracy["tokens_until_difference"] = sum(until) / len(until)
    accuracy["uncertainty"] = uncertainty
    accuracy["task_metrics"] = {k: (v.get("value") if isinstance(v, dict) else v)
                                for k, v in (validate_json.get("task_metrics") or {}).items()}
    accuracy["failures"] = list(validate_json.get("failures") or [])
    accuracy["uncalibrated_data"] = bool(validate_json.get("uncalibrated_data"))
    return accuracy


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
            "latency_ms": {k: latency[k] for k in ("p50", "p90", "p95", "p99", "mean") if finite(latency.get(k))},
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
            "latency_ms": {k: latency[k] for k in ("p50", "p90", "p95", "p99", "mean") if finite(latency.get(k))},
            "throughput_qps": level.get("throughput_qps"),
            **{key: level[key] for key in ("queries", "latency_ci_ms") if key in level},
        })
    # the points and levels keep benchmark.json's keys by name (UNCERTAINTY), which a TypedDict literal cannot
    # spell; tests/stages/test_summaries.py checks real summaries against CandidatePerformance (`problems`)
    return cast(CandidatePerformance, {
        "node": node, "backend": benchmark_json.get("backend"), "device": benchmark_json.get("device"),
        "method": benchmark_json.get("method") or {}, "points": points, "load": load,
        "generation": levels_of(benchmark_json)})

