"""The ``validate`` stage: measure how a candidate model's outputs differ from a reference's.

The reference is an ONNX model run with ONNX Runtime on the CPU (or outputs saved in a ``.npz``); the
candidate is another ONNX model (ONNX Runtime) or a TensorRT engine (through `_trt_runtime`). Each model runs
over the data in its own pass through a Polygraphy runner (one session alive at a time), reading the inputs
one batch at a time; only the outputs are kept. Each output's batches are joined and compared once with
Polygraphy's ``SimpleCompareFunc`` and ``CosineSimilarityCompareFunc``, so every statistic covers the whole
data set. A user ``task_metric`` (e.g. top-1 agreement) adds measurements of its own.

Failed gates are results: ``run`` always writes validate.json with every measurement and returns it as the
summary; the engine applies `gate` to it (tolerances by the precision the candidate was built in, ``expect``,
overridable per output; NaN/Inf; cosine similarity; task metric bounds). The gate params are left out of the
node key, so a changed tolerance re-judges the cached measurements without running the models again. An
elementwise gate is re-judged from each output's error front (`error_front`), which says exactly whether any
element exceeds both tolerances.

An ONNX candidate is first checked for known ONNX Runtime CPU numerics bugs (`_ort_fixes`) and rewritten to
compute what the ONNX spec and TensorRT compute; validate.json lists such rewrites.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from trtflow.stage import (
    ENGINE,
    METRICS,
    ONNX,
    CodeReference,
    GateContext,
    Input,
    Output,
    RecipeError,
    Stage,
    StageContext,
    StageFailed,
    StageParams,
    StageSkipped,
)

from ._data import DataSource, batch_rows, data_files, onnx_input_specs, open_dataset
from ._ort import OrtOptions
from ._tensorrt import FLAVOURS as TRT_FLAVOURS

Precision = Literal["fp32", "tf32", "fp16", "bf16", "int8", "fp8", "int4", "fp4"]
ErrorStat = Literal["elemwise", "max", "mean", "median"]
BackendName = Literal["auto", "onnxruntime", "tensorrt", "tensorrt-rtx"]

# Default gates per precision the candidate was built in: (atol, rtol, check_error_stat, min cosine).
# An element (elemwise) or a statistic passes when its absolute error <= atol OR its relative error <= rtol
# (Polygraphy's rule).
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


class Params(StageParams):
    data: DataSource = Field(
        ..., description="The inputs both models run on (a .npz/.npy file or directory, a callable, or "
        "random data with a seed and per-input ranges)."
    )
    batch_size: int | None = Field(
        None, ge=1, description="Rows of the data per model call. Default: the model's static batch "
        "dimension, or 1 when it is dynamic."
    )
    expect: Precision = Field(
        "fp32", description="The precision the candidate was built in; it picks the default tolerances: "
        + "; ".join(f"{p}: atol {a:g}, rtol {r:g}, {s}, cosine >= {c:g}"
                    for p, (a, r, s, c) in DEFAULT_TOLERANCES.items()) + ".",
    )
    tolerances: Tolerance = Field(
        default_factory=Tolerance, description="Overrides of the default gates for every output."
    )
    output_tolerances: dict[str, Tolerance] = Field(
        default_factory=dict, description="Per output name, overrides of the gates for that output only."
    )
    reference_outputs: str | None = Field(
        None, description="A .npz of reference outputs (one array per output name, rows stacked along axis "
        "0 in the order of the data) used instead of a reference model. Relative to the recipe."
    )
    task_metric: CodeReference | None = Field(
        None, description="A function (reference_outputs, candidate_outputs) -> {metric name: float}, each "
        "argument a dict {output name: array of all rows}: 'python:package.module:function' or "
        "'python:path/to/file.py:function'. THIS RUNS YOUR CODE."
    )
    task_thresholds: dict[str, Bound] = Field(
        default_factory=dict, description="Gates on task metrics, e.g. {top1_agreement: {min: 0.99}}."
    )
    onnxruntime: OrtOptions = Field(
        default_factory=OrtOptions, description="ONNX Runtime session options for the ONNX models compared "
        "(reference and ONNX candidate), e.g. {disabled_optimizers: [NchwcTransformer]} to step around an "
        "optimiser that crashes or mis-computes on a model."
    )
    backend: BackendName = Field(
        "auto", description="How the candidate runs: 'onnxruntime' (an ONNX candidate, CPU), 'tensorrt' or "
        "'tensorrt-rtx' (an engine candidate, GPU; checked before the stage starts), or 'auto': from the "
        "candidate's kind, an engine with the flavour that built it (engine.json).",
    )

    @model_validator(mode="after")
    def _thresholds_need_metric(self) -> Params:
        if self.task_thresholds and self.task_metric is None:
            raise ValueError("task_thresholds are set but no task_metric computes them")
        return self


def resolved_tolerance(params: Params, output: str) -> dict[str, Any]:
    """The gates for ``output``: per-output override, then the all-outputs override, then the default."""
    atol, rtol, stat, cosine = DEFAULT_TOLERANCES[params.expect]
    chosen = {"atol": atol, "rtol": rtol, "check_error_stat": stat, "min_cosine_similarity": cosine}
    for override in (params.tolerances, params.output_tolerances.get(output)):
        if override is not None:
            chosen.update({k: v for k, v in override.model_dump().items() if v is not None})
    return chosen


# -- user code ----------------------------------------------------------------------------------------------
def load_user_function(reference: str, resolve: Callable[[str], Path], what: str) -> Callable[..., Any]:
    """Import ``python:package.module:function`` or ``python:path/to/file.py:function`` (path via ``resolve``)."""
    from trtflow.callables import load_callable

    return load_callable(reference, resolve, what)


# -- declarations ---------------------------------------------------------------------------------------------
def _check(params: Params) -> None:
    """An engine candidate named by its flavour must be runnable here; with 'auto' `run` checks it first."""
    if params.backend in TRT_FLAVOURS:
        from ._trt_runtime import runtime_available, runtime_needs

        reason = runtime_available(params.backend)
        if reason:
            raise StageSkipped(f"cannot run the engine candidate: {reason}", needs=runtime_needs(params.backend))


def _resources(params: Params) -> frozenset[str]:
    return frozenset({"gpu"}) if params.backend in TRT_FLAVOURS else frozenset({"cpu"})


def _files(params: Params) -> list[str]:
    files = data_files(params.data)
    if params.reference_outputs:
        files.append(params.reference_outputs)
    for reference in (params.task_metric,):
        if reference and reference.startswith("python:"):
            files.append(reference[len("python:"):].rpartition(":")[0])
    return files


def _environment(params: Params) -> list[str]:
    return ["onnxruntime", "polygraphy", "numpy", "tensorrt", "tensorrt_rtx", "gpu"]


# -- running the models ---------------------------------------------------------------------------------------
def _onnx_runner(path: Path, name: str, options: OrtOptions) -> Any:
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from ._ort import create_session

    return OnnxrtRunner(lambda: create_session(path, options), name=name)


def engine_session_runner(session: Any, name: str) -> Any:
    """A Polygraphy runner over an `EngineSession` (engines run through the same loop as ONNX models)."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    class EngineSessionRunner(BaseRunner):
        def __init__(self) -> None:
            super().__init__(name=name, prefix="trtflow-engine")

        def activate_impl(self) -> None:
            session.__enter__()

        def get_input_metadata_impl(self) -> Any:
            meta = TensorMetadata()
            for spec in session.input_specs():
                meta.add(spec.name, spec.dtype, spec.shape)
            return meta

        def infer_impl(self, feed_dict: dict) -> dict:
            start = time.perf_counter()
            outputs = session.infer(feed_dict)
            self.inference_time = time.perf_counter() - start
            return outputs

        def deactivate_impl(self) -> None:
            session.__exit__(None, None, None)

    return EngineSessionRunner()


def run_over(runner: Any, batches: Callable[[], Iterator[dict[str, Any]]], total: int,
             progress: Callable[[int, int], None]) -> dict[str, Any]:
    """Every output of ``runner`` over the batches, joined along axis 0; inputs are read one batch at a time."""
    import numpy as np

    parts: dict[str, list[Any]] = {}
    with runner:
        for index, batch in enumerate(batches(), 1):
            for name, value in runner.infer(batch).items():
                parts.setdefault(name, []).append(np.array(value, copy=True))
            progress(index, total)
    return _join(parts)


def _join(parts: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """One array per output over all batches: joined along axis 0 (flattened if batch shapes differ)."""
    import numpy as np

    joined = {}
    for name, arrays in parts.items():
        try:
            joined[name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        except ValueError:
            joined[name] = np.concatenate([a.ravel() for a in arrays])
    return joined


def candidate_kind(path: Path) -> str:
    """'onnx' or 'engine': by file name (the runner keeps producers' file names), else by content."""
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix in (".engine", ".plan", ".trt"):
        return "engine"
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a protobuf ONNX model
        return "engine"
    return "onnx" if model.ir_version > 0 and len(model.graph.node) > 0 else "engine"


#: What validate keeps from the summary its candidate's producer wrote beside it, to explain a failed gate.
_ORIGIN_FIELDS = {
    "quantize.json": ("mode", "calibration_method", "calibrated", "calibration_data", "calibration_samples",
                      "quantize_ops", "high_precision_dtype", "quantized_nodes"),
    "convert.json": ("precision", "reference_data", "data_max", "fp32_nodes", "converted_nodes"),
    "engine.json": ("backend", "precision", "flavour"),
}


def candidate_origin(candidate: Path) -> dict[str, Any] | None:
    """What the stage that made the candidate recorded about it (its summary file travels beside it)."""
    for filename, fields in _ORIGIN_FIELDS.items():
        path = candidate.parent / filename
        if path.is_file():
            try:
                summary = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            origin = {"stage": filename.removesuffix(".json")}
            origin.update({key: summary[key] for key in fields if key in summary})
            return origin
    return None


def _ort_hint(path: Path, options: OrtOptions) -> str | None:
    """A known ONNX Runtime crash this model and these options may hit, and the setting that avoids it."""
    import onnx

    if options.graph_optimization_level not in ("all", "layout") or "NchwcTransformer" in options.disabled_optimizers:
        return None
    model = onnx.load(str(path), load_external_data=False)
    if any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer):
        return ("ONNX Runtime's CPU layout optimiser (NchwcTransformer) is known to crash on some fp16 models: set "
                "onnxruntime: {disabled_optimizers: [NchwcTransformer]} (or graph_optimization_level: extended) "
                "in this node's params")
    return None


def _ort_repro(options: OrtOptions, which: str) -> str:
    level = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
             "layout": "ORT_ENABLE_ALL", "all": "ORT_ENABLE_ALL"}[options.graph_optimization_level]
    disabled = f", disabled_optimizers={options.disabled_optimizers!r}" if options.disabled_optimizers else ""
    return (f"python -c \"import onnxruntime as o; s = o.SessionOptions(); s.graph_optimization_level = "
            f"o.GraphOptimizationLevel.{level}; o.InferenceSession('MODEL.onnx', s, "
            f"providers=['CPUExecutionProvider']{disabled})\"  (MODEL.onnx: the {which} model)")


# -- measuring ------------------------------------------------------------------------------------------------
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
        }
    return report


def measure_task_metric(function: Callable[..., Any], reference: Mapping[str, Any],
                        candidate: Mapping[str, Any], params: Params) -> dict[str, float]:
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


# -- gates ----------------------------------------------------------------------------------------------------
def _ratio(value: float, limit: float) -> float:
    if math.isnan(value):
        return math.inf
    return value / limit if limit > 0 else (math.inf if value > 0 else 0.0)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


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
                f"{name}: {stat} abs error {_fmt(abs_value)} > atol {atol:g} ({_ratio(abs_value, atol):.3g}x) "
                f"and {stat} rel error {_fmt(rel_value)} > rtol {rtol:g} ({_ratio(rel_value, rtol):.3g}x)"
            )
    min_cos = tolerance["min_cosine_similarity"]
    similarity = entry["cosine_similarity"]
    if math.isnan(similarity) or similarity < min_cos:
        failures.append(f"{name}: cosine similarity {_fmt(similarity)} < min {min_cos:g} "
                        f"(short by {_fmt(min_cos - similarity)})")
    return failures


def judge_task_metrics(values: Mapping[str, float], thresholds: Mapping[str, Bound]) -> list[str]:
    failures = []
    for key, bound in thresholds.items():
        value = values.get(key, math.nan)
        if bound.min is not None and not value >= bound.min:
            failures.append(f"task metric {key} {_fmt(value)} < min {bound.min:g} (short by "
                            f"{_fmt(bound.min - value)})")
        if bound.max is not None and not value <= bound.max:
            failures.append(f"task metric {key} {_fmt(value)} > max {bound.max:g} (over by "
                            f"{_fmt(value - bound.max)})")
    return failures


def likely_cause(params: Params, summary: Mapping[str, Any], node: str = "") -> str:
    """What most likely made the candidate differ, and what to do next, from what its producer recorded."""
    origin = summary.get("candidate_origin") or {}
    causes: list[str] = []
    if summary.get("uncalibrated_data"):
        causes.append("the validation data is random, which may exercise ranges real inputs never reach")
    if params.expect in ("int8", "fp8", "int4", "fp4"):
        if origin.get("calibrated") is False:
            causes.append("the model was calibrated on random data: calibrate it on real inputs")
        if origin.get("quantize_ops") in ("modelopt", "custom") and params.expect == "int8":
            causes.append(f"its Q/DQ placement ({origin['quantize_ops']}) may quantize attention probabilities or "
                          "the residual stream, which int8 represents poorly: try quantize_ops: weighted")
        if not causes:
            causes.append("quantization error accumulates through the network: keep the most sensitive layers "
                          "in high precision with nodes_to_exclude, or try the other calibration_method")
    elif params.expect in ("fp16", "bf16"):
        kept = origin.get("fp32_nodes")
        where = f" (the conversion kept {kept} node(s) in fp32 with data_max {origin.get('data_max')})" \
            if kept is not None else ""
        causes.append(f"values beyond {params.expect}'s range or precision{where}: lower data_max or keep the "
                      "offending nodes in fp32 with nodes_to_exclude")
    else:
        causes.append(f"the candidate should compute what the reference computes in {params.expect}: a conversion "
                      "or runtime changed the computation")
    node = node or summary.get("node") or "NODE"
    return (f"likely cause: {'; '.join(causes)}. Next: find the first layer that diverges with "
            f"`trtflow debug precision RECIPE {node}`; the measurements are in {node}'s validate.json")


def compare_outputs(reference: Mapping[str, Any], candidate: Mapping[str, Any],
                    params: Params) -> dict[str, dict[str, Any]]:
    """`measure_outputs`, each output with its tolerance and verdict under ``params`` (for callers that judge
    in-process, e.g. precision debugging)."""
    outputs = measure_outputs(reference, candidate)
    for name, entry in outputs.items():
        tolerance = resolved_tolerance(params, name)
        failures = judge_output(name, entry, tolerance)
        entry.update(tolerance=tolerance, passed=not failures, failures=failures)
    return outputs


def evaluate_task_metric(function: Callable[..., Any], reference: Mapping[str, Any], candidate: Mapping[str, Any],
                         params: Params) -> tuple[dict[str, Any], list[str]]:
    """The task metric's values with their bounds and verdicts under ``params``, and the failure messages."""
    values = measure_task_metric(function, reference, candidate, params)
    failures = judge_task_metrics(values, params.task_thresholds)
    metrics: dict[str, Any] = {key: {"value": value} for key, value in values.items()}
    for key, bound in params.task_thresholds.items():
        metrics[key].update(min=bound.min, max=bound.max,
                            passed=not any(f.startswith(f"task metric {key} ") for f in failures))
    return metrics, failures


#: Params that only configure gates: left out of the node key, so changing them re-judges cached measurements.
GATE_PARAMS = ("expect", "tolerances", "output_tolerances", "task_thresholds")


def gate(params: Params, summary: Mapping[str, Any], gate_ctx: GateContext) -> list[str]:
    """The accuracy gates: per-output tolerances (by ``expect``), NaN/Inf, cosine similarity, task metrics."""
    failures: list[str] = []
    for name, entry in (summary.get("outputs") or {}).items():
        failures += judge_output(name, entry, resolved_tolerance(params, name))
    failures += judge_task_metrics(summary.get("task_metrics") or {}, params.task_thresholds)
    if failures:
        failures.append(likely_cause(params, summary, gate_ctx.node))
    return failures


def _plain(value: Any) -> Any:
    """JSON form of params models (tolerances, bounds) and numpy scalars in the metrics."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return float(value)


# -- memory ---------------------------------------------------------------------------------------------------
def memory(params: Params, input_sizes: Mapping[str, int]) -> int:
    """Peak host memory: the larger model's ONNX Runtime session (the models run one after the other).

    Fitted to ViT runs (bench/vit_memory.py): 3 bytes per byte of the larger model (the parsed model, the
    session's initializers, constant-folded dequantized weights of an int8 model), on top of the libraries;
    measured 0.91 GiB (fp16 candidate) and 1.48 GiB (int8) against a 346 MB fp32 ViT-B.
    """
    from ._modelopt import model_memory

    largest = max((size for slot, size in input_sizes.items() if slot in ("reference", "candidate")), default=0)
    return model_memory(largest, copies=3.0)


# -- the stage ---------------------------------------------------------------------------------------------------
def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    import numpy as np

    from ._ort_fixes import fix_for_onnxruntime
    from ._trt_runtime import (
        engine_backend,
        open_engine,
        provenance_for,
        read_provenance,
        runtime_available,
        runtime_needs,
    )

    has_reference = "reference" in inputs
    if has_reference == (params.reference_outputs is not None):
        raise RecipeError("give exactly one reference: the 'reference' input (an ONNX model) or the "
                          "'reference_outputs' param (a .npz of saved outputs)",
                          field="reference_outputs")
    candidate_path = inputs["candidate"]
    kind = candidate_kind(candidate_path)
    if kind == "onnx" and params.backend in TRT_FLAVOURS:
        raise RecipeError(f"backend {params.backend} runs engines, but the candidate is an ONNX model",
                          field="backend", hint="connect the build stage's engine, or set backend: onnxruntime")
    if kind == "engine" and params.backend == "onnxruntime":
        raise RecipeError("backend onnxruntime runs ONNX models, but the candidate is an engine", field="backend",
                          hint="set backend: auto (or the engine's TensorRT flavour)")

    session = None
    candidate_desc = "onnxruntime (CPU)"
    if kind == "engine":
        provenance = provenance_for(candidate_path, inputs.get("provenance"))
        manifest = read_provenance(provenance)
        flavour = engine_backend("auto" if params.backend == "auto" else params.backend, manifest)
        reason = runtime_available(flavour, ctx.gpu)
        if reason:
            raise StageSkipped(f"cannot run the engine candidate: {reason}", needs=runtime_needs(flavour))
        if manifest is None:
            ctx.log.warning("no provenance (engine.json) for the engine: its flavour/version/GPU are not checked")
        session = open_engine(candidate_path, provenance, flavour, ctx.gpu)
        candidate_desc = f"{flavour} engine"

    # The inputs: from the reference model when there is one, else from the candidate.
    if has_reference:
        specs = onnx_input_specs(inputs["reference"])
    elif kind == "onnx":
        specs = onnx_input_specs(candidate_path)
    else:
        assert session is not None
        specs = session.input_specs()
    try:
        batch_size, drop_last = batch_rows(specs, params.batch_size)
    except ValueError as error:
        raise RecipeError(str(error), field="batch_size", hint="set batch_size to the model's batch or leave it "
                          "out") from None
    ctx.progress(0.05, f"reading {params.data.describe()}")
    dataset = open_dataset(params.data, specs, ctx.resolve, ctx.log)
    total = dataset.num_batches(batch_size, drop_last)
    if total == 0:
        raise StageFailed(f"the data has fewer rows than one batch of {batch_size}",
                          hint="give more samples or a smaller batch_size")
    rows = dataset.rows if not drop_last else total * batch_size

    def batches() -> Iterator[dict[str, Any]]:
        return dataset.batches(batch_size, drop_last)

    def reporter(start: float, label: str) -> Callable[[int, int], None]:
        return lambda done, count: ctx.progress(start + 0.4 * done / count, f"{label}: batch {done}/{count}")

    rewrites: list[str] = []
    reference: dict[str, Any]
    if has_reference:
        path = inputs["reference"]
        with ctx.native_step("onnxruntime", "running the reference model", repro=_ort_repro(params.onnxruntime,
                             "reference"), hint=_ort_hint(path, params.onnxruntime)):
            reference = run_over(_onnx_runner(path, "reference", params.onnxruntime), batches, total,
                                 reporter(0.1, "reference"))
    if session is None:
        fixed_path, fixes = fix_for_onnxruntime(candidate_path, ctx.scratch / "candidate")
        rewrites += [fix.reason for fix in fixes]
        for note in rewrites:
            ctx.log.info("candidate rewritten for ONNX Runtime: %s", note)
        with ctx.native_step("onnxruntime", "running the candidate model", repro=_ort_repro(params.onnxruntime,
                             "candidate"), hint=_ort_hint(candidate_path, params.onnxruntime)):
            candidate = run_over(_onnx_runner(fixed_path, "candidate", params.onnxruntime), batches, total,
                                 reporter(0.5, "candidate"))
    else:
        with ctx.native_step(candidate_desc, "running the engine candidate"):
            candidate = run_over(engine_session_runner(session, "candidate"), batches, total,
                                 reporter(0.5, "candidate"))
    if not has_reference:
        assert params.reference_outputs is not None
        path = ctx.resolve(params.reference_outputs)
        try:
            with np.load(path, allow_pickle=False) as saved:
                reference = {name: saved[name] for name in saved.files}
        except (OSError, ValueError) as error:
            raise StageFailed(f"cannot read reference outputs {params.reference_outputs}: {error}",
                              hint="save them with numpy.savez(path, output_name=array, ...)") from error
        for name, array in reference.items():
            if name in candidate and array.shape[0] != candidate[name].shape[0]:
                raise StageFailed(
                    f"reference_outputs {name!r} has {array.shape[0]} rows but the candidate produced "
                    f"{candidate[name].shape[0]} from {rows} data rows",
                    hint="save reference outputs for exactly the rows of the data (same order)")

    ctx.progress(0.92, "comparing")
    outputs = compare_outputs(reference, candidate, params)
    task_metrics: dict[str, float] = {}
    if params.task_metric:
        function = load_user_function(params.task_metric, ctx.resolve, "task metric")
        task_metrics = measure_task_metric(function, reference, candidate, params)

    metrics = {
        "node": ctx.node,
        "reference": "onnxruntime (CPU)" if has_reference else f"saved outputs {params.reference_outputs}",
        "candidate": candidate_desc,
        "candidate_origin": candidate_origin(candidate_path),
        "data": params.data.describe(),
        "uncalibrated_data": params.data.uncalibrated,
        "rows": rows,
        "batches": total,
        "batch_size": batch_size,
        "onnxruntime": params.onnxruntime.model_dump(),
        "onnxruntime_rewrites": rewrites,
        "outputs": outputs,
        "task_metrics": task_metrics,
    }
    # The verdict under this run's thresholds, for readers of validate.json; the engine re-judges the
    # measurements with `gate` whenever the thresholds change, without running again.
    failures = gate(params, metrics, GateContext(node=ctx.node))
    metrics.update(passed=not failures, failures=failures,
                   judged_with={name: getattr(params, name) for name in GATE_PARAMS})
    metrics = json.loads(json.dumps(metrics, default=_plain))
    ctx.output("metrics").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    worst = min((entry["cosine_similarity"] for entry in outputs.values()), default=math.nan)
    ctx.progress(1.0, f"measured {len(outputs)} output(s) on {rows} rows; lowest cosine similarity {worst:.4f}")
    return metrics


stage = Stage(
    name="validate",
    version="2",
    description="Compare a candidate (ONNX model or TensorRT engine) with a reference ONNX model (ONNX "
    "Runtime) on the same data, batch by batch; gate on per-output tolerances, cosine similarity, NaN/Inf and "
    "optional task metrics.",
    params=Params,
    run=run,
    inputs={
        "reference": Input(ONNX, "the reference model, run with ONNX Runtime on the CPU", optional=True),
        "candidate": Input((ONNX, ENGINE), "the model to check: an ONNX model or a TensorRT engine"),
        "provenance": Input(METRICS, "engine.json of an engine candidate (from the build stage)", optional=True),
    },
    outputs={"metrics": Output(METRICS, "validate.json", "per-output errors, cosine similarity, NaN/Inf counts, "
                               "task metrics")},
    resources=_resources,
    environment=_environment,
    files=_files,
    check=_check,
    gate=gate,
    gate_params=GATE_PARAMS,
    memory=memory,
    preload=("polygraphy", "onnxruntime", "numpy", "torch"),
)
