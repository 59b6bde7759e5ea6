"""The ``validate`` stage: compare a candidate model's outputs with a reference, with Polygraphy's Comparator.

The reference is an ONNX model run with ONNX Runtime on the CPU (or outputs saved in a ``.npz``); the
candidate is another ONNX model (ONNX Runtime) or a TensorRT engine (through `_trt_runtime`). Both run on
the same data batches through ``Comparator.run``; each output's batches are joined and compared once with
``SimpleCompareFunc`` (absolute/relative tolerances on a chosen error statistic) and
``CosineSimilarityCompareFunc``, so every statistic covers the whole data set. Tolerances default by the
precision the candidate was built in (``expect``) and can be overridden for all or single outputs. A user
``task_metric`` (e.g. top-1 agreement) can add gates of its own.

Writes validate.json (per-output errors, cosine similarity, NaN/Inf counts, pass/fail and by how much)
and raises `GateFailed` naming the output, statistic, measured value, tolerance and ratio when a gate fails.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from trtflow.stage import (
    ENGINE,
    METRICS,
    ONNX,
    CodeReference,
    GateFailed,
    Input,
    Output,
    RecipeError,
    Stage,
    StageContext,
    StageFailed,
    StageParams,
    StageSkipped,
)

from ._data import DataSource, InputSpec, data_files, iter_batches, load_arrays, onnx_input_specs
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
def _onnx_runner(path: Path, name: str) -> Any:
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    return OnnxrtRunner(SessionFromOnnx(str(path), providers=["CPUExecutionProvider"]), name=name)


def engine_session_runner(session: Any, name: str) -> Any:
    """A Polygraphy runner over an `EngineSession` (so engines run through ``Comparator.run`` too)."""
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


def _join(iterations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One array per output over all batches: joined along axis 0 (flattened if batch shapes differ)."""
    import numpy as np

    joined = {}
    for name in iterations[0]:
        parts = [np.asarray(iteration[name]) for iteration in iterations]
        try:
            joined[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        except ValueError:
            joined[name] = np.concatenate([p.ravel() for p in parts])
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


def _batch_size(params: Params, specs: Sequence[InputSpec]) -> tuple[int, bool]:
    """(rows per call, drop a short last batch): a static batch dimension fixes both."""
    static = {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0}
    if static:
        batch = static.pop()
        if params.batch_size is not None and params.batch_size != batch:
            raise RecipeError(f"batch_size {params.batch_size} but the model's batch dimension is fixed at "
                              f"{batch}", field="batch_size", hint=f"set batch_size: {batch} or leave it out")
        return batch, True
    return params.batch_size or 1, False


# -- comparing ------------------------------------------------------------------------------------------------
def _ratio(value: float, limit: float) -> float:
    if math.isnan(value):
        return math.inf
    return value / limit if limit > 0 else (math.inf if value > 0 else 0.0)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def compare_outputs(reference: Mapping[str, Any], candidate: Mapping[str, Any],
                    params: Params) -> dict[str, dict[str, Any]]:
    """Per output: error statistics, cosine similarity, NaN/Inf counts, verdict and failure messages."""
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
    gates = {name: resolved_tolerance(params, name) for name in names}
    results = RunResults()
    results.append(("reference", [IterationResult({n: reference[n] for n in names}, runner_name="reference")]))
    results.append(("candidate", [IterationResult({n: candidate[n] for n in names}, runner_name="candidate")]))
    simple = SimpleCompareFunc(
        atol={n: g["atol"] for n, g in gates.items()},
        rtol={n: g["rtol"] for n, g in gates.items()},
        check_error_stat={n: g["check_error_stat"] for n, g in gates.items()},
    )
    cosine = CosineSimilarityCompareFunc(
        cosine_similarity_threshold={n: g["min_cosine_similarity"] for n, g in gates.items()}
    )
    # Polygraphy compares the candidate (runner 1) relative to the reference's values (runner 1 is the
    # denominator of the relative error), so the candidate goes first.
    accuracy = Comparator.compare_accuracy(results, compare_func=[simple, cosine],
                                           comparisons=[(1, 0)])
    simple_results = accuracy[0][("candidate", "reference")][0]
    cosine_results = accuracy[1][("candidate", "reference")][0]

    report: dict[str, dict[str, Any]] = {}
    for name in names:
        gate = gates[name]
        stats = simple_results[name]
        ref = np.asarray(reference[name]).astype(np.float64)
        cand = np.asarray(candidate[name]).astype(np.float64)
        similarity = float(cosine_results[name].cosine_similarity)
        entry: dict[str, Any] = {
            "elements": int(cand.size),
            "max_abs_error": stats.max_absdiff,
            "mean_abs_error": stats.mean_absdiff,
            "median_abs_error": stats.median_absdiff,
            "max_rel_error": stats.max_reldiff,
            "mean_rel_error": stats.mean_reldiff,
            "median_rel_error": stats.median_reldiff,
            "cosine_similarity": similarity,
            "nan_count": int(np.isnan(cand).sum()),
            "inf_count": int(np.isinf(cand).sum()),
            "reference_nan_count": int(np.isnan(ref).sum()),
            "reference_inf_count": int(np.isinf(ref).sum()),
            "tolerance": gate,
        }
        failures: list[str] = []
        ratios: list[float] = []
        atol, rtol, stat = gate["atol"], gate["rtol"], gate["check_error_stat"]
        new_nan = entry["nan_count"] - entry["reference_nan_count"]
        new_inf = entry["inf_count"] - entry["reference_inf_count"]
        if new_nan > 0 or new_inf > 0:
            failures.append(f"{name}: the candidate has {entry['nan_count']} NaN and {entry['inf_count']} Inf "
                            f"values (reference: {entry['reference_nan_count']} NaN, "
                            f"{entry['reference_inf_count']} Inf)")
            ratios.append(math.inf)
        if stat == "elemwise":
            abs_err = np.abs(cand - ref)
            rel_err = abs_err / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
            with np.errstate(invalid="ignore", divide="ignore"):
                excess = np.fmin(abs_err / atol if atol else np.where(abs_err > 0, np.inf, 0.0),
                                 rel_err / rtol if rtol else np.where(rel_err > 0, np.inf, 0.0))
            excess = np.where(np.isnan(abs_err), np.inf, excess)
            mismatched = int((excess > 1).sum())
            entry["mismatched_elements"] = mismatched
            worst = float(excess.max()) if excess.size else 0.0
            if not bool(stats) and mismatched == 0:
                mismatched = 1  # Polygraphy failed it (e.g. a NaN in both): report it all the same
            if mismatched:
                index = int(np.argmax(excess)) if excess.size else 0
                failures.append(
                    f"{name}: {mismatched} of {cand.size} elements exceed both atol {atol:g} and rtol "
                    f"{rtol:g}; worst abs error {_fmt(float(abs_err.flat[index]))} > atol {atol:g} "
                    f"({_ratio(float(abs_err.flat[index]), atol):.3g}x) and rel error "
                    f"{_fmt(float(rel_err.flat[index]))} > rtol {rtol:g} "
                    f"({_ratio(float(rel_err.flat[index]), rtol):.3g}x)"
                )
                ratios.append(worst)
        elif not bool(stats):
            abs_value = getattr(stats, f"{stat}_absdiff")
            rel_value = getattr(stats, f"{stat}_reldiff")
            failures.append(
                f"{name}: {stat} abs error {_fmt(abs_value)} > atol {atol:g} ({_ratio(abs_value, atol):.3g}x) "
                f"and {stat} rel error {_fmt(rel_value)} > rtol {rtol:g} ({_ratio(rel_value, rtol):.3g}x)"
            )
            ratios.append(min(_ratio(abs_value, atol), _ratio(rel_value, rtol)))
        min_cos = gate["min_cosine_similarity"]
        if math.isnan(similarity) or similarity < min_cos:
            failures.append(f"{name}: cosine similarity {_fmt(similarity)} < min {min_cos:g} "
                            f"(short by {_fmt(min_cos - similarity)})")
        entry["passed"] = not failures
        entry["failures"] = failures
        entry["worst_ratio"] = max(ratios) if ratios else None
        report[name] = entry
    return report


def evaluate_task_metric(function: Callable[..., Any], reference: Mapping[str, Any],
                         candidate: Mapping[str, Any], params: Params) -> tuple[dict[str, Any], list[str]]:
    try:
        values = function(dict(reference), dict(candidate))
    except Exception as error:
        raise StageFailed(f"task metric {params.task_metric} raised {type(error).__name__}: {error}",
                          hint="run the function by hand on saved outputs to debug it") from error
    if not isinstance(values, Mapping):
        raise StageFailed(f"task metric {params.task_metric} returned {type(values).__name__}; expected a dict "
                          "{metric name: number}")
    metrics: dict[str, Any] = {}
    failures: list[str] = []
    for key, value in values.items():
        try:
            metrics[str(key)] = {"value": float(value)}
        except (TypeError, ValueError):
            raise StageFailed(f"task metric {params.task_metric}: {key!r} is {value!r}, not a number") from None
    unknown = [k for k in params.task_thresholds if k not in metrics]
    if unknown:
        raise StageFailed(f"task_thresholds name metric(s) {unknown} that {params.task_metric} did not return; "
                          f"it returned {sorted(metrics)}")
    for key, bound in params.task_thresholds.items():
        value = metrics[key]["value"]
        metrics[key].update({"min": bound.min, "max": bound.max})
        if bound.min is not None and not value >= bound.min:
            failures.append(f"task metric {key} {_fmt(value)} < min {bound.min:g} (short by "
                            f"{_fmt(bound.min - value)})")
        if bound.max is not None and not value <= bound.max:
            failures.append(f"task metric {key} {_fmt(value)} > max {bound.max:g} (over by "
                            f"{_fmt(value - bound.max)})")
        metrics[key]["passed"] = not any(f.startswith(f"task metric {key} ") for f in failures)
    return metrics, failures


# -- the stage ---------------------------------------------------------------------------------------------------
def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    import numpy as np
    from polygraphy.comparator import Comparator

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
    batch_size, drop_last = _batch_size(params, specs)
    arrays = load_arrays(params.data, specs, ctx.resolve, ctx.log)
    batches = list(iter_batches(arrays, batch_size, drop_last=drop_last))
    if not batches:
        raise StageFailed(f"the data has fewer rows than one batch of {batch_size}",
                          hint="give more samples or a smaller batch_size")
    rows = sum(int(next(iter(b.values())).shape[0]) for b in batches)
    ctx.progress(0.1, f"{rows} rows in {len(batches)} batches of up to {batch_size}")

    runners = []
    if has_reference:
        runners.append(_onnx_runner(inputs["reference"], "reference"))
    runners.append(_onnx_runner(candidate_path, "candidate") if session is None
                   else engine_session_runner(session, "candidate"))
    run_results = Comparator.run(runners, data_loader=batches)
    ctx.progress(0.7, "models ran; comparing")
    candidate = _join([dict(it) for it in run_results["candidate"]])
    if has_reference:
        reference = _join([dict(it) for it in run_results["reference"]])
    else:
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

    outputs = compare_outputs(reference, candidate, params)
    failures = [message for entry in outputs.values() for message in entry["failures"]]
    task_metrics: dict[str, Any] = {}
    if params.task_metric:
        function = load_user_function(params.task_metric, ctx.resolve, "task metric")
        task_metrics, task_failures = evaluate_task_metric(function, reference, candidate, params)
        failures += task_failures

    metrics = {
        "passed": not failures,
        "expect": params.expect,
        "reference": "onnxruntime (CPU)" if has_reference else f"saved outputs {params.reference_outputs}",
        "candidate": candidate_desc,
        "data": params.data.describe(),
        "uncalibrated_data": params.data.uncalibrated,
        "rows": rows,
        "batches": len(batches),
        "batch_size": batch_size,
        "outputs": outputs,
        "task_metrics": task_metrics,
        "failures": failures,
    }
    ctx.output("metrics").write_text(json.dumps(metrics, indent=2, default=float) + "\n", encoding="utf-8")
    ctx.progress(1.0, "passed" if not failures else f"{len(failures)} gate(s) failed")
    if failures:
        raise GateFailed("accuracy gate failed:\n  " + "\n  ".join(failures), metrics,
                         hint="inspect validate.json; loosen tolerances only if the task metric allows it")
    summary_outputs = {
        name: {k: entry[k] for k in ("max_abs_error", "mean_abs_error", "cosine_similarity", "passed")}
        for name, entry in outputs.items()
    }
    return {"passed": True, "expect": params.expect, "rows": rows, "outputs": summary_outputs,
            "task_metrics": {k: v["value"] for k, v in task_metrics.items()}}


stage = Stage(
    name="validate",
    version="1",
    description="Compare a candidate (ONNX model or TensorRT engine) with a reference ONNX model (ONNX "
    "Runtime) on the same data through Polygraphy's Comparator; gate on per-output tolerances, cosine "
    "similarity, NaN/Inf and optional task metrics.",
    params=Params,
    run=run,
    inputs={
        "reference": Input(ONNX, "the reference model, run with ONNX Runtime on the CPU", optional=True),
        "candidate": Input((ONNX, ENGINE), "the model to check: an ONNX model or a TensorRT engine"),
        "provenance": Input(METRICS, "engine.json of an engine candidate (from the build stage)", optional=True),
    },
    outputs={"metrics": Output(METRICS, "validate.json", "per-output errors, cosine similarity, verdicts")},
    resources=_resources,
    environment=_environment,
    files=_files,
    check=_check,
    preload=("polygraphy", "onnxruntime", "numpy", "torch"),
)
