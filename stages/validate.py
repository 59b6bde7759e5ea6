"""The ``validate`` stage: measure how a candidate model's outputs differ from a reference's.

The reference is an ONNX model run with ONNX Runtime on the CPU (or outputs saved in a ``.npz``); the
candidate is another ONNX model (ONNX Runtime) or a TensorRT engine (through `runtimes.trt_runtime`). Each model runs
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

An ONNX candidate is first checked for known ONNX Runtime CPU numerics bugs (`accuracy.ort_fixes`) and rewritten to
compute what the ONNX spec and TensorRT compute; validate.json lists such rewrites.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

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
from trtflow.summaries import ValidateSummary

from .accuracy.compare import (
    DEFAULT_TOLERANCES,
    Bound,
    Precision,
    Tolerance,
    compare_outputs,
    expected_precision,
    judge_output,
    judge_task_metrics,
    likely_cause,
    measure_task_metric,
    resolved_tolerance,
)
from .accuracy.generation import GenerationCheck, judge_generation
from .data import DataSource, data_files, onnx_input_specs
from .formats.onnx_model import candidate_kind
from .runtimes.ort import OrtOptions
from .runtimes.tensorrt import FLAVOURS as TRT_FLAVOURS

if TYPE_CHECKING:
    from .runtimes.records import EngineRecord

BackendName = Literal["auto", "onnxruntime", "tensorrt", "tensorrt-rtx", "fake-quant"]

# Default gates per precision the candidate was built in: (atol, rtol, check_error_stat, min cosine).
# An element (elemwise) or a statistic passes when its absolute error <= atol OR its relative error <= rtol
# (Polygraphy's rule).


class Params(StageParams):
    data: DataSource | None = Field(
        None, description="The inputs both models run on (a .npz/.npy file or directory, a callable, or "
        "random data with a seed and per-input ranges). Required unless `generation` is given."
    )
    generation: GenerationCheck | None = Field(
        None, description="Validate a causal LM exported with its KV cache (task text-generation-with-past) by "
        "greedy generation instead of `data`: from each prompt the reference generates new_tokens tokens; the "
        "candidate, fed the same tokens, must choose the same ones (the first min_tokens_matched of every prompt) "
        "and its logits at every step are gated as the output 'logits' (tolerances by `expect`). validate.json "
        "says how many tokens matched per prompt."
    )
    batch_size: int | None = Field(
        None, ge=1, description="Rows of the data per model call. Default: the model's static batch "
        "dimension, or 1 when it is dynamic."
    )
    expect: Precision | None = Field(
        None, description="The precision the candidate was built in; it picks the default tolerances: "
        + "; ".join(f"{p}: atol {a:g}, rtol {r:g}, {s}, cosine >= {c:g}"
                    for p, (a, r, s, c) in DEFAULT_TOLERANCES.items())
        + ". Default: the precision the candidate's producer recorded (quantize's mode, convert's precision, an "
        "engine's precision), else fp32.",
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
        "'tensorrt-rtx' (an engine candidate, GPU; checked before the stage starts), 'fake-quant' (an nvfp4/mxfp8 "
        "quantize node's model: its fake-quantized PyTorch model on a CUDA GPU), or 'auto': from the "
        "candidate's kind, an engine with the flavour that built it (engine.json).",
    )

    @model_validator(mode="after")
    def _thresholds_need_metric(self) -> Params:
        if self.task_thresholds and self.task_metric is None:
            raise ValueError("task_thresholds are set but no task_metric computes them")
        if (self.data is None) == (self.generation is None):
            raise ValueError("give either 'data' (inputs both models run on) or 'generation' (greedy generation "
                             "from prompts, for a model exported with its KV cache)" if self.data is None else
                             "'data' and 'generation' exclude each other: generation feeds the models prompts")
        if self.generation is not None and (self.reference_outputs or self.task_metric or self.backend not in
                                            ("auto", "onnxruntime")):
            raise ValueError("generation validates an ONNX candidate against an ONNX reference with ONNX Runtime; "
                             "reference_outputs, task_metric and other backends do not apply")
        return self





# -- declarations ---------------------------------------------------------------------------------------------
def _check(params: Params) -> None:
    """An engine candidate named by its flavour must be runnable here; with 'auto' `run` checks it first."""
    if params.backend in TRT_FLAVOURS:
        from .runtimes.trt_runtime import runtime_available, runtime_needs

        reason = runtime_available(params.backend)
        if reason:
            raise StageSkipped(f"cannot run the engine candidate: {reason}", needs=runtime_needs(params.backend))
    if params.backend == "fake-quant":
        from .accuracy.fake_quant import check_available

        check_available()


def _resources(params: Params) -> frozenset[str]:
    return frozenset({"gpu"}) if params.backend in (*TRT_FLAVOURS, "fake-quant") else frozenset({"cpu"})


def _files(params: Params) -> list[str]:
    files = data_files(params.data) + (params.generation.prompts.files() if params.generation else [])
    if params.reference_outputs:
        files.append(params.reference_outputs)
    for reference in (params.task_metric,):
        if reference and reference.startswith("python:"):
            files.append(reference[len("python:"):].rpartition(":")[0])
    return files


def _environment(params: Params) -> list[str]:
    return ["onnxruntime", "polygraphy", "numpy", "tensorrt", "tensorrt_rtx", "gpu",
            *(["torch", "modelopt"] if params.backend == "fake-quant" else [])]


# -- running the models ---------------------------------------------------------------------------------------


#: What validate keeps from the summary its candidate's producer wrote beside it, to explain a failed gate.
_ORIGIN_FIELDS = {
    "quantize.json": ("mode", "calibration_method", "calibrated", "calibration_data", "calibration_samples",
                      "quantize_ops", "high_precision_dtype", "quantized_nodes"),
    "convert.json": ("precision", "reference_data", "data_max", "fp32_nodes", "converted_nodes"),
    "engine.json": ("backend",),  # and the precision it was built in (`_engine_precision`)
}


def candidate_origin(candidate: Path) -> dict[str, Any] | None:
    """What the stage that made the candidate recorded about it (its summary file travels beside it)."""
    from .runtimes.records import BESIDE_A_MODEL, read_record

    for filename, fields in _ORIGIN_FIELDS.items():
        path = candidate.parent / filename
        if path.is_file():
            try:
                summary = read_record(path, BESIDE_A_MODEL[filename])  # checked against its declared type
            except StageFailed:
                return None
            origin: dict[str, Any] = {"stage": filename.removesuffix(".json")}
            origin.update({key: summary[key] for key in fields if key in summary})
            if filename == "engine.json":
                origin["precision"] = _engine_precision(summary)
            return origin
    return None


def _engine_precision(record: EngineRecord) -> str | None:
    """The precision an engine was built in: the one its precision audit says was requested (engine.json's
    ``precision`` is that audit, not a name), else its builder's."""
    audit = record.get("precision")
    return audit["requested"] if audit is not None else record.get("builder", {}).get("precision")


# -- measuring ------------------------------------------------------------------------------------------------


# -- gates ----------------------------------------------------------------------------------------------------


#: Params that only configure gates: left out of the node key, so changing them re-judges cached measurements.
GATE_PARAMS = ("expect", "tolerances", "output_tolerances", "task_thresholds")


def gate(params: Params, summary: Mapping[str, Any], gate_ctx: GateContext) -> list[str]:
    """The accuracy gates: per-output tolerances (by ``expect``), NaN/Inf, cosine similarity, task metrics."""
    failures: list[str] = []
    expect = expected_precision(params.expect, summary.get("candidate_origin"))
    for name, entry in (summary.get("outputs") or {}).items():
        failures += judge_output(name, entry, resolved_tolerance(params, name, expect))
    if params.generation is not None:
        failures += judge_generation(summary.get("generation"), params.generation)
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
    from .precision.modelopt import model_memory

    largest = max((size for slot, size in input_sizes.items() if slot in ("reference", "candidate")), default=0)
    return model_memory(largest, copies=3.0)


# -- the stage ---------------------------------------------------------------------------------------------------
def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> ValidateSummary:
    from .accuracy.passes import candidate_pass, data_passes, reference_pass, saved_reference
    from .runtimes.candidate import open_candidate

    if params.generation is not None:
        return _finish(ctx, params, _validate_generation(ctx, inputs, params))
    assert params.data is not None  # the params' validator: data or generation
    has_reference = "reference" in inputs
    if has_reference == (params.reference_outputs is not None):
        raise RecipeError("give exactly one reference: the 'reference' input (an ONNX model) or the "
                          "'reference_outputs' param (a .npz of saved outputs)",
                          field="reference_outputs")
    candidate_path = inputs["candidate"]
    opened = open_candidate(ctx, candidate_path, params.backend, provenance=inputs.get("provenance"))
    # The inputs: from the reference model when there is one, else from the candidate.
    specs = onnx_input_specs(inputs["reference"]) if has_reference else opened.input_specs()
    assert specs is not None  # the candidate input is required
    passes = data_passes(ctx, params.data, specs, params.batch_size)

    settings: dict[str, Any] = {}
    if has_reference:
        reference = reference_pass(ctx, inputs["reference"], params.onnxruntime, passes, settings)
    ran = candidate_pass(ctx, opened, params.onnxruntime, passes, settings)
    if not has_reference:
        assert params.reference_outputs is not None
        reference = saved_reference(ctx.resolve(params.reference_outputs), params.reference_outputs, ran.outputs,
                                    passes.rows)

    ctx.progress(0.92, "comparing")
    origin = candidate_origin(candidate_path)
    expect = expected_precision(params.expect, origin)
    outputs = compare_outputs(reference, ran.outputs, params, expect)
    task_metrics: dict[str, float] = {}
    if params.task_metric:
        from trtflow.callables import load_callable

        function = load_callable(params.task_metric, ctx.resolve, "task metric")
        task_metrics = measure_task_metric(function, reference, ran.outputs, params)

    measured: dict[str, Any] = {
        "node": ctx.node,
        "reference": "onnxruntime (CPU)" if has_reference else f"saved outputs {params.reference_outputs}",
        "candidate": ran.described,
        "candidate_origin": origin,
        "expect": expect,
        "data": params.data.describe(),
        "uncalibrated_data": params.data.uncalibrated,
        "rows": passes.rows,
        "batches": passes.total,
        "batch_size": passes.batch_size,
        "onnxruntime": params.onnxruntime.model_dump(),
        "runtime_settings": settings,
        "notes": _notes(settings),
        "onnxruntime_rewrites": ran.rewrites,
        "outputs": outputs,
        "task_metrics": task_metrics,
    }
    metrics = _finish(ctx, params, measured)
    worst = min((entry["cosine_similarity"] for entry in outputs.values()), default=math.nan)
    ctx.progress(1.0, f"measured {len(outputs)} output(s) on {passes.rows} rows; lowest cosine similarity {worst:.4f}")
    return metrics


def _notes(settings: Mapping[str, Any]) -> list[str]:
    """A line per model whose ONNX Runtime options were recovered from a crash, and what it ran with."""
    return [f"{which} model: {entry['recovered_from']}; ran with {entry['onnxruntime']}"
            for which, entry in settings.items() if "recovered_from" in entry]


def _finish(ctx: StageContext, params: Params, metrics: dict[str, Any]) -> ValidateSummary:
    """validate.json with the verdict under this run's thresholds, for its readers; the engine re-judges the
    measurements with `gate` whenever the thresholds change, without running again."""
    failures = gate(params, metrics, GateContext(node=ctx.node))
    metrics.update(passed=not failures, failures=failures,
                   judged_with={name: getattr(params, name) for name in GATE_PARAMS})
    metrics = json.loads(json.dumps(metrics, default=_plain))
    ctx.output("metrics").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return cast(ValidateSummary, metrics)  # the promised keys are checked by tests/stages/test_summaries.py


def _validate_generation(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    """Greedy generation from prompts: the reference free, the candidate teacher-forced (`accuracy.generation`)."""
    from .accuracy.generation import (
        compare_generation,
        decoder_reference,
        forced_candidate,
        free_candidate,
        informative_reference,
    )
    from .accuracy.ort_fixes import fix_for_onnxruntime
    from .accuracy.passes import ort_hint, ort_repro, ort_settings
    from .accuracy.seq2seq import describe_sources, source_loader
    from .runtimes.ort import create_session
    from .runtimes.seq2seq import open_decoder

    assert params.generation is not None
    if "reference" not in inputs:
        raise RecipeError("generation needs the 'reference' input: the model exported with its KV cache",
                          field="generation", hint="wire `reference: <export node>`")
    candidate_path = inputs["candidate"]
    if candidate_kind(candidate_path) != "onnx":
        raise RecipeError("generation runs ONNX candidates with ONNX Runtime; this candidate is an engine",
                          field="generation", hint="validate the ONNX model the engine is built from")
    settings: dict[str, Any] = {}
    reference_options = ort_settings(ctx, inputs["reference"], params.onnxruntime, "reference", settings)
    fixed_path, fixes = fix_for_onnxruntime(candidate_path, ctx.scratch / "candidate")
    candidate_options = ort_settings(ctx, fixed_path, params.onnxruntime, "candidate", settings, candidate_path)
    check = params.generation
    with ctx.native_step("onnxruntime", "generating with the reference model",
                         repro=ort_repro(reference_options, "reference")):
        # an encoder-decoder's decoders share the exported encoder (`encoder` input): its cross-attention cache
        encoder = create_session(inputs["encoder"], reference_options) if "encoder" in inputs else None
        reference_decoder = open_decoder(create_session(inputs["reference"], reference_options), encoder)
        layout = reference_decoder.layout
        ctx.progress(0.1, f"reference: greedy generation from {check.prompts.describe()}")
        prompts, reference, informative = informative_reference(
            check.prompts, layout.vocab_size, check.new_tokens,
            lambda chosen, tokens: decoder_reference(reference_decoder, chosen, tokens), ctx.resolve,
            load=source_loader(layout, ctx.resolve) if getattr(layout, "seq2seq", False) else None)
    with ctx.native_step("onnxruntime", "running the candidate model on the reference's tokens",
                         repro=ort_repro(candidate_options, "candidate"), hint=ort_hint(candidate_path,
                                                                                      candidate_options)):
        ctx.progress(0.5, "candidate: fed the reference's tokens (teacher forcing)")
        decoder = open_decoder(create_session(fixed_path, candidate_options), encoder)
        candidate = forced_candidate(decoder, prompts, reference)
        ctx.progress(0.7, "candidate: generating freely (its own tokens fed back)")
        free = free_candidate(decoder, prompts, check.new_tokens)
    origin = candidate_origin(candidate_path)
    allowance = check.near_tie_margin if check.near_tie_margin is not None else \
        resolved_tolerance(params, "logits", expected_precision(params.expect, origin))["atol"]
    record, joined_reference, joined_candidate = compare_generation(prompts, reference, candidate, allowance, free)
    record["prompts_from"] = describe_sources(check.prompts, layout)
    record["reference_informative"] = informative
    ctx.progress(0.9, f"tokens matched per prompt: {record['tokens_matched']} of {check.new_tokens}")
    return {
        "node": ctx.node,
        "reference": "onnxruntime (CPU), greedy generation",
        "candidate": "onnxruntime (CPU), fed the reference's tokens",
        "candidate_origin": origin,
        "data": record["prompts_from"],
        "uncalibrated_data": check.prompts.path is None,
        "rows": sum(len(tokens) for tokens, _ in reference),
        "onnxruntime": params.onnxruntime.model_dump(),
        "runtime_settings": settings,
        "notes": _notes(settings) + ([informative["note"]] if "note" in informative else []),
        "onnxruntime_rewrites": [fix.reason for fix in fixes],
        "outputs": compare_outputs(joined_reference, joined_candidate, params),
        "task_metrics": {},
        "generation": record,
    }


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
        "encoder": Input(ONNX, "generation with an encoder-decoder: its exported encoder (the cross-attention cache "
                         "both decoders are fed)", optional=True),
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
    preload=("polygraphy", "polygraphy.backend.onnxrt", "polygraphy.comparator", "polygraphy.cuda", "onnxruntime",
             "numpy", "torch", "scipy.stats"),  # polygraphy.cuda loads libcudart only when first used, never here
)
