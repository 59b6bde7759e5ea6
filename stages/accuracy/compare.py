"""How a candidate's outputs are compared with a reference's, and judged.

Measurements (`measure_outputs`: Polygraphy's ``SimpleCompareFunc`` and ``CosineSimilarityCompareFunc`` over each
output joined across the data set, an error front per output, and what each figure can tell apart: its numerical
resolution and its spread over the rows, `accuracy.resolution`; `measure_task_metric`: a user's metric) are kept
apart from verdicts (`judge_output`, `judge_task_metrics`: tolerances by the precision the candidate was built in,
overridable per output), so a changed tolerance re-judges stored measurements. An elementwise gate is re-judged
from each output's error front (`error_front`), which says exactly whether any element exceeds both tolerances.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from trtflow.digits import distinct
from trtflow.stage import StageFailed, StageParams

from .resolution import figure_uncertainty

Precision = Literal["fp32", "tf32", "fp16", "bf16", "int8", "fp8", "int4", "fp4"]


ErrorStat = Literal["elemwise", "max", "mean", "median"]


DEFAULT_TOLERANCES: dict[str, tuple[float, float, str, float]] = {
    "fp32": (1e-5, 1e-5, "elemwise", 0.99999),
    "tf32": (1e-3, 1e-3, "elemwise", 0.9999),
    "fp16": (1e-2, 1e-2, "elemwise", 0.999),
    "bf16": (5e-2, 5e-2, "elemwise", 0.995),
    "int8": (5e-2, 5e-2, "mean", 0.99),
    "fp8": (5e-2, 5e-2, "mean", 0.99),
    "int4": (1e-1, 1e-1, "mean", 0.98),
    "fp4": (1e-1, 1e-1, "mean", 0.98),
}


class Tolerance(StageParams):
    """Accuracy gates for one or all outputs; unset fields fall back to the defaults of ``expect``."""

    atol: float | None = Field(None, ge=0, description="Absolute tolerance.")
    rtol: float | None = Field(None, ge=0, description="Relative tolerance (a fraction of the reference value).")
    check_error_stat: ErrorStat | None = Field(
        None,
        description="What is checked against atol/rtol: 'elemwise' (every element within atol or rtol), or "
        "the 'max', 'mean' or 'median' absolute and relative error over the output (passes when either "
        "is within its tolerance).",
    )
    min_cosine_similarity: float | None = Field(
        None, ge=-1, le=1, description="Lowest cosine similarity between candidate and reference outputs."
    )


class Bound(StageParams):
    """Limits of a task metric's value."""

    min: float | None = Field(None, description="The metric must be >= this.")
    max: float | None = Field(None, description="The metric must be <= this.")

    @model_validator(mode="after")
    def _one_bound(self) -> Bound:
        if self.min is None and self.max is None:
            raise ValueError("give 'min', 'max' or both")
        return self


class AccuracyParams(Protocol):
    """What the comparison reads of a validate node's params (the validate stage's ``Params``)."""

    @property
    def expect(self) -> str | None: ...

    @property
    def tolerances(self) -> Tolerance: ...

    @property
    def output_tolerances(self) -> Mapping[str, Tolerance]: ...

    @property
    def task_metric(self) -> str | None: ...

    @property
    def task_thresholds(self) -> Mapping[str, Bound]: ...


#: The precision a producer records (quantize's mode, convert's precision, an engine's) -> DEFAULT_TOLERANCES' key.
_PRODUCED = {"int8": "int8", "fp8": "fp8", "int4": "int4", "nvfp4": "fp4", "mxfp8": "fp8", "fp16": "fp16",
             "bf16": "bf16", "fp32": "fp32", "tf32": "tf32", "best": "int8"}


def expected_precision(expect: str | None, origin: Mapping[str, Any] | None) -> str:
    """The precision whose default gates apply: ``expect`` when the recipe sets it, else the one the candidate's
    producer recorded (quantize's ``mode``, convert's or an engine's ``precision``), else fp32."""
    if expect is not None:
        return expect
    origin = origin or {}
    for key in ("mode", "precision"):
        value = origin.get(key)
        if isinstance(value, str) and value in _PRODUCED:
            return _PRODUCED[value]
    return "fp32"


def resolved_tolerance(params: AccuracyParams, output: str, expect: str | None = None) -> dict[str, Any]:
    """The gates for ``output``: per-output override, then the all-outputs override, then the default of
    ``expect`` (default: ``params.expect``, else fp32)."""
    atol, rtol, stat, cosine = DEFAULT_TOLERANCES[expect or params.expect or "fp32"]
    chosen = {"atol": atol, "rtol": rtol, "check_error_stat": stat, "min_cosine_similarity": cosine}
    for override in (params.tolerances, params.output_tolerances.get(output)):
        if override is not None:
            chosen.update({k: v for k, v in override.model_dump().items() if v is not None})
    return chosen


#: Most points of an output's error front kept in the summary (beyond it the front is thinned conservatively).
MAX_FRONT_POINTS = 64


_EPSILON = 2.220446049250313e-16  # what Polygraphy adds to zero reference values for relative errors


def error_front(candidate: Any, reference: Any) -> tuple[list[list[float]], bool, int]:
    """The (abs error, rel error) pairs of the elements no other element exceeds in both, and NaN errors.

    An element fails an elementwise gate when its abs error > atol AND its rel error > rtol (Polygraphy's
    rule); some element fails exactly when a point of this front does, so the front lets a changed tolerance be
    re-judged without the outputs. Returns (front sorted by abs error descending, exact, NaN error count).
    """
    import numpy as np

    cand = np.asarray(candidate, dtype=np.float64).ravel()
    ref = np.asarray(reference, dtype=np.float64).ravel()
    abs_err = np.abs(cand - ref)
    both_inf = np.isinf(ref) & (ref == cand)
    abs_err[both_inf] = 0.0
    denominator = np.abs(ref)
    denominator[denominator == 0] = _EPSILON
    rel_err = abs_err / denominator
    nan_errors = np.isnan(abs_err) | np.isnan(rel_err)
    abs_err, rel_err = abs_err[~nan_errors], rel_err[~nan_errors]
    if abs_err.size == 0:
        return [], True, int(nan_errors.sum())
    order = np.lexsort((-rel_err, -abs_err))
    abs_sorted, rel_sorted = abs_err[order], rel_err[order]
    best_before = np.concatenate([[-np.inf], np.maximum.accumulate(rel_sorted)[:-1]])
    keep = rel_sorted > best_before
    front = np.stack([abs_sorted[keep], rel_sorted[keep]], axis=1)
    exact = len(front) <= MAX_FRONT_POINTS
    if not exact:  # each group of consecutive points becomes its upper corner: never misses a failure
        groups = np.array_split(np.arange(len(front)), MAX_FRONT_POINTS)
        front = np.array([[front[g[0], 0], front[g[-1], 1]] for g in groups])
    return [[float(a), float(r)] for a, r in front], exact, int(nan_errors.sum())


def measure_outputs(reference: Mapping[str, Any], candidate: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per output: error statistics (Polygraphy's definitions), cosine similarity, NaN/Inf counts, error front."""
    import numpy as np
    from polygraphy.comparator import (
        Comparator,
        CosineSimilarityCompareFunc,
        IterationResult,
        RunResults,
        SimpleCompareFunc,
    )

    missing = [name for name in reference if name not in candidate]
    if missing:
        raise StageFailed(f"the candidate has no output(s) {missing}; reference outputs: {list(reference)}, "
                          f"candidate outputs: {list(candidate)}",
                          hint="compare models with the same output names")
    names = list(reference)
    for name in names:
        if np.shape(reference[name]) != np.shape(candidate[name]):
            raise StageFailed(f"output {name!r}: candidate shape {list(np.shape(candidate[name]))} differs "
                              f"from reference shape {list(np.shape(reference[name]))}",
                              hint="check that both models ran on the same inputs and batch size")
    results = RunResults()
    results.append(("reference", [IterationResult({n: reference[n] for n in names}, runner_name="reference")]))
    results.append(("candidate", [IterationResult({n: candidate[n] for n in names}, runner_name="candidate")]))
    # Polygraphy's relative error divides by runner 1's values, so the candidate is runner 0. Its pass/fail
    # lines (at its default tolerances) are not our gates: they are kept out of the node's log.
    from polygraphy.logger import G_LOGGER

    with G_LOGGER.verbosity(G_LOGGER.ERROR + 1):
        accuracy = Comparator.compare_accuracy(results, compare_func=[SimpleCompareFunc(),
                                                                      CosineSimilarityCompareFunc()],
                                               comparisons=[(1, 0)])
    simple_results = accuracy[0][("candidate", "reference")][0]
    cosine_results = accuracy[1][("candidate", "reference")][0]
    report: dict[str, dict[str, Any]] = {}
    for name in names:
        stats = simple_results[name]
        ref, cand = np.asarray(reference[name]), np.asarray(candidate[name])
        front, exact, nan_errors = error_front(cand, ref)
        report[name] = {
            "elements": int(cand.size),
            "max_abs_error": stats.max_absdiff,
            "mean_abs_error": stats.mean_absdiff,
            "median_abs_error": stats.median_absdiff,
            "max_rel_error": stats.max_reldiff,
            "mean_rel_error": stats.mean_reldiff,
            "median_rel_error": stats.median_reldiff,
            "cosine_similarity": float(cosine_results[name].cosine_similarity),
            "nan_count": int(np.isnan(cand).sum()) if cand.dtype.kind == "f" else 0,
            "inf_count": int(np.isinf(cand).sum()) if cand.dtype.kind == "f" else 0,
            "reference_nan_count": int(np.isnan(ref).sum()) if ref.dtype.kind == "f" else 0,
            "reference_inf_count": int(np.isinf(ref).sum()) if ref.dtype.kind == "f" else 0,
            "nan_errors": nan_errors,
            "error_front": front,
            "error_front_exact": exact,
            **figure_uncertainty(ref, cand),
        }
    return report


def measure_task_metric(function: Callable[..., Any], reference: Mapping[str, Any],
                        candidate: Mapping[str, Any], params: AccuracyParams) -> dict[str, float]:
    try:
        values = function(dict(reference), dict(candidate))
    except Exception as error:
        raise StageFailed(f"task metric {params.task_metric} raised {type(error).__name__}: {error}",
                          hint="run the function by hand on saved outputs to debug it") from error
    if not isinstance(values, Mapping):
        raise StageFailed(f"task metric {params.task_metric} returned {type(values).__name__}; expected a dict "
                          "{metric name: number}")
    metrics: dict[str, float] = {}
    for key, value in values.items():
        try:
            metrics[str(key)] = float(value)
        except (TypeError, ValueError):
            raise StageFailed(f"task metric {params.task_metric}: {key!r} is {value!r}, not a number") from None
    unknown = [k for k in params.task_thresholds if k not in metrics]
    if unknown:
        raise StageFailed(f"task_thresholds name metric(s) {unknown} that {params.task_metric} did not return; "
                          f"it returned {sorted(metrics)}")
    return metrics


def _ratio(value: float, limit: float) -> float:
    if math.isnan(value):
        return math.inf
    return value / limit if limit > 0 else (math.inf if value > 0 else 0.0)


def _fmt(value: float, bound: float | None = None) -> str:
    """``value`` in 4 significant digits, or as many more as it takes to differ from ``bound`` when it does (a
    cosine similarity of 0.9999899 against a min of 0.99999 is not "1"): `trtflow.digits.distinct`."""
    return distinct(value, () if bound is None else (bound,), least=4)


def judge_output(name: str, entry: Mapping[str, Any], tolerance: Mapping[str, Any]) -> list[str]:
    """Failure messages of one output's measurements against its tolerances (empty: it passes)."""
    failures: list[str] = []
    atol, rtol, stat = tolerance["atol"], tolerance["rtol"], tolerance["check_error_stat"]
    new_nan = entry["nan_count"] - entry["reference_nan_count"]
    new_inf = entry["inf_count"] - entry["reference_inf_count"]
    if new_nan > 0 or new_inf > 0:
        failures.append(f"{name}: the candidate has {entry['nan_count']} NaN and {entry['inf_count']} Inf "
                        f"values (reference: {entry['reference_nan_count']} NaN, "
                        f"{entry['reference_inf_count']} Inf)")
    if stat == "elemwise":
        over = [(a, r) for a, r in entry["error_front"] if a > atol and r > rtol]
        if over:
            a, r = max(over, key=lambda p: min(_ratio(p[0], atol), _ratio(p[1], rtol)))
            failures.append(f"{name}: elements exceed both atol {atol:g} and rtol {rtol:g}; the worst has abs "
                            f"error {_fmt(a)} ({_ratio(a, atol):.3g}x atol) and rel error {_fmt(r)} "
                            f"({_ratio(r, rtol):.3g}x rtol)")
        elif entry["nan_errors"]:
            failures.append(f"{name}: {entry['nan_errors']} elements have a NaN error (NaN in the candidate or "
                            "the reference)")
    else:
        abs_value, rel_value = entry[f"{stat}_abs_error"], entry[f"{stat}_rel_error"]
        if not (abs_value <= atol or rel_value <= rtol):
            failures.append(
                f"{name}: {stat} abs error {_fmt(abs_value, atol)} > atol {atol:g} ({_ratio(abs_value, atol):.3g}x) "
                f"and {stat} rel error {_fmt(rel_value, rtol)} > rtol {rtol:g} ({_ratio(rel_value, rtol):.3g}x)"
            )
    min_cos = tolerance["min_cosine_similarity"]
    similarity = entry["cosine_similarity"]
    if math.isnan(similarity) or similarity < min_cos:
        failures.append(f"{name}: cosine similarity {_fmt(similarity, min_cos)} < min {min_cos:g} "
                        f"(short by {_fmt(min_cos - similarity)})")
    return failures


def judge_task_metrics(values: Mapping[str, float], thresholds: Mapping[str, Bound]) -> list[str]:
    failures = []
    for key, bound in thresholds.items():
        value = values.get(key, math.nan)
        if bound.min is not None and not value >= bound.min:
            failures.append(f"task metric {key} {_fmt(value, bound.min)} < min {bound.min:g} (short by "
                            f"{_fmt(bound.min - value)})")
        if bound.max is not None and not value <= bound.max:
            failures.append(f"task metric {key} {_fmt(value, bound.max)} > max {bound.max:g} (over by "
                            f"{_fmt(value - bound.max)})")
    return failures


def likely_cause(params: AccuracyParams, summary: Mapping[str, Any], node: str = "") -> str:
    """What most likely made the candidate differ, and what to do next, from what its producer recorded."""
    origin = summary.get("candidate_origin") or {}
    expect = expected_precision(params.expect, origin)
    causes: list[str] = []
    if summary.get("uncalibrated_data"):
        causes.append("the validation data is random, which may exercise ranges real inputs never reach")
    if expect in ("int8", "fp8", "int4", "fp4"):
        if origin.get("calibrated") is False:
            causes.append("the model was calibrated on random data: calibrate it on real inputs")
        if origin.get("quantize_ops") in ("modelopt", "custom") and expect == "int8":
            causes.append(f"its Q/DQ placement ({origin['quantize_ops']}) may quantize attention probabilities or "
                          "the residual stream, which int8 represents poorly: try quantize_ops: weighted")
        if not causes:
            causes.append("quantization error accumulates through the network: keep the most sensitive layers "
                          "in high precision with nodes_to_exclude, or try the other calibration_method")
    elif expect in ("fp16", "bf16"):
        kept = origin.get("fp32_nodes")
        where = f" (the conversion kept {kept} node(s) in fp32 with data_max {origin.get('data_max')})" \
            if kept is not None else ""
        causes.append(f"values beyond {expect}'s range or precision{where}: lower data_max or keep the "
                      "offending nodes in fp32 with nodes_to_exclude")
    else:
        causes.append(f"the candidate should compute what the reference computes in {expect}: a conversion "
                      "or runtime changed the computation")
    node = node or summary.get("node") or "NODE"
    return (f"likely cause: {'; '.join(causes)}. Next: find the first layer that diverges with "
            f"`trtflow debug precision RECIPE {node}`; the measurements are in {node}'s validate.json")


def compare_outputs(reference: Mapping[str, Any], candidate: Mapping[str, Any],
                    params: AccuracyParams, expect: str | None = None) -> dict[str, dict[str, Any]]:
    """`measure_outputs`, each output with its tolerance and verdict under ``params`` (for callers that judge
    in-process, e.g. precision debugging)."""
    outputs = measure_outputs(reference, candidate)
    for name, entry in outputs.items():
        tolerance = resolved_tolerance(params, name, expect)
        failures = judge_output(name, entry, tolerance)
        entry.update(tolerance=tolerance, passed=not failures, failures=failures)
    return outputs


def evaluate_task_metric(function: Callable[..., Any], reference: Mapping[str, Any], candidate: Mapping[str, Any],
                         params: AccuracyParams) -> tuple[dict[str, Any], list[str]]:
    """The task metric's values with their bounds and verdicts under ``params``, and the failure messages."""
    values = measure_task_metric(function, reference, candidate, params)
    failures = judge_task_metrics(values, params.task_thresholds)
    metrics: dict[str, Any] = {key: {"value": value} for key, value in values.items()}
    for key, bound in params.task_thresholds.items():
        metrics[key].update(min=bound.min, max=bound.max,
                            passed=not any(f.startswith(f"task metric {key} ") for f in failures))
    return metrics, failures
