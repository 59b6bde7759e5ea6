"""The ``benchmark`` stage: latency and throughput the way trtexec measures them, and under serving load.

Fixed-batch points (trtexec's method), per batch size (`measure.timing.fixed`):
- ``tensorrt`` / ``tensorrt-rtx``: an engine through `runtimes.trt_runtime` (execute_async_v3 on device buffers),
  timed by the cuda-python harness `measure.timing.cuda_timing` (CUDA events around each enqueue, time-based warm-up,
  optional CUDA graph with fallback, spin-wait, with or without host transfers through pinned buffers, several
  streams for throughput);
- ``onnxruntime``: an ONNX model with ONNX Runtime (CPU, or the CUDA execution provider where installed),
  timed on the host clock around each ``run``;
- ``torch``: an eager PyTorch model from a factory, timed with CUDA events on a GPU or the host clock on CPU.
Each point is timed in ``repeats`` windows or more (`measure.timing.windows`): at least ``min_iterations`` queries and
``min_duration_s``, then more windows until the 95% interval of its median is within ``precision_percent`` (and
p99's within ``tail_precision_percent`` if set) or ``max_duration_s`` is spent; a point that stopped at the cap is
flagged ``not-converged``. Statistics follow trtexec (`measure.statistics.stats`), over all timed queries; every figure
has its interval (`measure.statistics.intervals`: ``queries``, ``latency_ci_ms``, ``throughput_ci_qps``), and each point
records what else ran on the host meanwhile (`measure.timing.interference`).

Serving load (`measure.serving.traffic`, `measure.serving.instances`, `measure.serving.replicas`): closed-loop
``concurrency`` levels, open-loop Poisson ``arrival_rate_qps`` levels with an optional dynamic batcher, ``streams``
model instances, and ``gpus`` (one replica process per GPU, aggregate throughput and scaling efficiency against one
GPU). Latency counts from each request's arrival, so queueing is included.

Gates (latency, throughput, regression against the previous run or a pinned baseline; `measure.judging.gates`) compare
with the uncertainty of both sides: pass, fail or inconclusive. The engine judges them on the summary `run`
returns (`gate`, which fails the node on ``fail`` verdicts only), so changing a threshold re-judges cached
measurements; the summary also keeps the verdicts judged when the node ran (``verdicts``), which the reports
show, inconclusive ones included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import Field, field_validator, model_validator

from trtflow.stage import (
    ENGINE,
    METRICS,
    ONNX,
    CodeReference,
    Figures,
    GateContext,
    GateVerdict,
    Input,
    Output,
    ProfileSpec,
    RecipeError,
    Resources,
    Stage,
    StageContext,
    StageFailed,
    StageSkipped,
)
from trtflow.summaries import BenchmarkSummary

from .data import DataSource, InputSpec, data_files
from .measure.serving.generation import GenerationBench
from .measure.serving.traffic import steady_interpreter
from .measure.settings import GateFields, LoadFields, TimingFields
from .measure.timing.feeds import batch_limits, batch_of, make_feed, resolve_shapes, with_batch
from .measure.timing.fixed import PointSettings
from .runtimes.ort import OrtOptions
from .runtimes.tensorrt import FLAVOURS as TRT_FLAVOURS

Backend = Literal["auto", "tensorrt", "tensorrt-rtx", "onnxruntime", "torch"]
TOP_LAYERS = 10


class Params(TimingFields, LoadFields, GateFields):
    backend: Backend = Field(
        "auto", description="What runs the model: 'tensorrt'/'tensorrt-rtx' (an engine, on the GPU), "
        "'onnxruntime' (an ONNX model), 'torch' (eager PyTorch from torch_model), or 'auto': an engine with "
        "the flavour that built it (engine.json), an ONNX model with ONNX Runtime.",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Device for onnxruntime (CPU or CUDA execution provider) and torch backends."
    )
    torch_model: CodeReference | None = Field(
        None, description="For backend torch: a factory returning a torch.nn.Module, "
        "'python:package.module:factory' or 'python:path/to/file.py:factory'. THIS RUNS YOUR CODE."
    )
    torch_cuda_graphs: bool = Field(
        False, description="For backend torch on CUDA, under serving load: each instance replays its forward as "
        "one CUDA graph per batch size (captured while it warms up), instead of launching every kernel from "
        "Python. Eager launches make a small model's latency tail depend on the host (see bench/serving_load.md)."
    )
    onnxruntime: OrtOptions = Field(
        default_factory=OrtOptions, description="ONNX Runtime session options (optimisation level, disabled "
        "optimisers, threads) for backend onnxruntime.",
    )
    shapes: dict[str, list[int]] = Field(
        default_factory=dict, description="Per input name, the concrete shape to run (batch included). "
        "Needed for dynamic dimensions unless a profile or the data fixes them."
    )
    input_dtypes: dict[str, str] = Field(
        default_factory=dict, description="For backend torch without an ONNX model: per input, its numpy "
        "dtype (default float32)."
    )
    profile: ProfileSpec | None = Field(
        None, description="An optimization profile (a name from the recipe's profiles: or an inline spec); "
        "its opt shapes are run, and its batch limits bound dynamic batching."
    )
    batch_sizes: list[int] = Field(
        default_factory=list, description="A batch sweep: run each batch size in turn (dimension 0 of every "
        "input replaced). Empty: the shapes as given."
    )
    streams: int | list[int] = Field(
        1, description="Model instances running concurrently: execution contexts on their own CUDA streams "
        "for engines (also in the fixed-batch points, as trtexec --streams), ONNX Runtime sessions or PyTorch "
        "CUDA streams under load. A list makes it a load dimension: every load level runs at each count."
    )
    use_cuda_graph: bool = Field(
        True, description="Capture the enqueue into a CUDA graph (tensorrt); falls back to plain enqueues "
        "when the engine cannot be captured, and says so."
    )
    spin_wait: bool = Field(True, description="Wait for the GPU by spinning (stabler) instead of blocking "
                            "(tensorrt).")
    include_host_transfers: bool = Field(
        False, description="Time host-to-device and device-to-host copies (pinned buffers) with each query "
        "(tensorrt; for onnxruntime on cuda, false binds inputs and outputs on the device)."
    )
    data: DataSource | None = Field(
        None, description="Input values; default random (seed 0) in the shapes above. Values rarely change "
        "timings, except for data-dependent models."
    )
    unstable_cv_percent: float = Field(
        2.5, gt=0, description="Flag a result 'unstable' above this coefficient of variation (trtexec: 2.5%)."
    )
    # -- per-layer profiles ----------------------------------------------------------------------------------
    profile_layers: bool = Field(
        False, description="Engines: record the engine inspector's layer information and per-layer times "
        "(like trtexec --exportLayerInfo / --exportProfile) in layers.json, on a separate execution context. "
        "Layer names need the engine built with profiling_verbosity 'layer_names_only' or 'detailed'.",
    )
    profile_iterations: int = Field(50, ge=1, description="Inferences profiled per layer profile.")
    profile_kernels: bool = Field(
        False, description="Record the CUDA kernels of the timed work (the first batch size), like Nsight Systems' "
        "kernel summary: name, instances, total/average/median/min/max time, share of GPU time, in kernels.json "
        "(PyTorch profiler, CUPTI; engines and device cuda). The summary keeps the top 5.",
    )
    kernel_iterations: int = Field(20, ge=1, description="Inferences whose kernels profile_kernels records.")
    # -- generation -------------------------------------------------------------------------------------------
    generation: GenerationBench | None = Field(
        None, description="Time greedy generation of a causal LM exported with its KV cache (task "
        "text-generation-with-past) instead of fixed batches: time to first token and time per output token per "
        "request, at context_length prompt tokens and each concurrency, timed in windows like any point (repeats, "
        "min_iterations requests, min_duration_s, precision_percent, max_duration_s); backend onnxruntime.",
    )

    @field_validator("batch_sizes")
    @classmethod
    def _positive_batches(cls, sizes: list[int]) -> list[int]:
        if any(b < 1 for b in sizes):
            raise ValueError(f"values must be >= 1, got {sizes}")
        return sizes

    @field_validator("streams")
    @classmethod
    def _streams(cls, streams: int | list[int]) -> int | list[int]:
        counts = [streams] if isinstance(streams, int) else streams
        if not counts or any(not 1 <= count <= 16 for count in counts):
            raise ValueError(f"streams must be between 1 and 16, got {streams}")
        return streams

    @property
    def stream_counts(self) -> list[int]:
        return [self.streams] if isinstance(self.streams, int) else list(self.streams)

    @model_validator(mode="after")
    def _consistent(self) -> Params:
        if self.torch_model and self.backend != "torch":
            raise ValueError(f"torch_model is only used by backend torch, not {self.backend}")
        engine = self.backend in (*TRT_FLAVOURS, "auto")
        if self.torch_cuda_graphs and not (self.backend == "torch" and self.device == "cuda" and self.has_load):
            raise ValueError("torch_cuda_graphs applies to backend torch on device cuda under serving load "
                             "(concurrency, arrival_rate_qps or scenarios)")
        if max(self.stream_counts) > 1 and not engine and not self.has_load:
            raise ValueError(f"streams > 1 for backend {self.backend} applies to serving load only: give "
                             "concurrency or arrival_rate_qps")
        if self.gpus != 1 and not (engine or self.device == "cuda"):
            raise ValueError("gpus applies to GPU backends: a tensorrt backend, or device cuda")
        if self.gpus != 1 and not self.has_load:
            raise ValueError("gpus applies to serving load: give concurrency or arrival_rate_qps")
        if (self.dynamic_batching or self.latency_budget_ms) and not self.has_load:
            raise ValueError("dynamic_batching and latency_budget_ms apply to serving load: give concurrency "
                             "or arrival_rate_qps")
        if self.rate_search_probes and not (self.latency_budget_ms and self.arrival_rate_qps):
            raise ValueError("rate_search_probes needs latency_budget_ms and at least one arrival_rate_qps to "
                             "start from")
        if self.dynamic_batching and self.request_size and self.request_size > self.dynamic_batching.max_batch_size:
            raise ValueError(f"request_size {self.request_size} exceeds dynamic_batching.max_batch_size "
                             f"{self.dynamic_batching.max_batch_size}")
        if self.profile_layers and self.backend not in (*TRT_FLAVOURS, "auto"):
            raise ValueError("profile_layers needs an engine (a tensorrt backend)")
        if self.profile_kernels and self.backend not in (*TRT_FLAVOURS, "auto") and self.device != "cuda":
            raise ValueError("profile_kernels records CUDA kernels: an engine, or device cuda")
        if self.scenarios and self.load_generator == "trtflow":
            raise ValueError(f"scenarios {self.scenarios} are run by MLPerf LoadGen: set load_generator to auto "
                             "or loadgen")
        if self.generation is not None and (self.backend not in ("auto", "onnxruntime") or self.has_load or
                                            self.batch_sizes or self.profile_layers or self.profile_kernels):
            raise ValueError("generation times an ONNX model with its KV cache on ONNX Runtime; backend, serving "
                             "load, batch_sizes and profiles do not apply (generation.concurrency sets the load)")
        if self.max_duration_s is not None and self.max_duration_s < self.min_duration_s:
            raise ValueError(f"max_duration_s {self.max_duration_s:g} is below min_duration_s {self.min_duration_s:g}")
        return self


GATE_PARAMS = tuple(GateFields.model_fields)  # judged on the summary, left out of the node key


# -- declarations -------------------------------------------------------------------------------------------
def _check(params: Params) -> None:
    if params.backend in TRT_FLAVOURS:
        from .runtimes.trt_runtime import runtime_available, runtime_needs

        reason = runtime_available(params.backend, need_cuda_python=True)
        if reason:
            raise StageSkipped(f"cannot benchmark on {params.backend}: {reason}",
                               needs=runtime_needs(params.backend) + " and cuda-python")
    if params.device == "cuda" and params.backend in ("onnxruntime", "torch"):
        from trtflow.environment import gpus

        if not gpus():
            raise StageSkipped(f"device cuda for {params.backend} but no NVIDIA GPU is visible here",
                               needs="an NVIDIA GPU, or device: cpu")
    if isinstance(params.gpus, int) and params.gpus > 1:
        from trtflow.environment import gpus

        visible = len(gpus())
        if visible < params.gpus:
            raise StageSkipped(f"gpus: {params.gpus} but {visible} GPU(s) are visible here",
                               needs=f"a machine with {params.gpus} GPUs, or gpus: all")


def _gpu_count(params: Params) -> int:
    if params.backend not in TRT_FLAVOURS and params.device != "cuda":
        return 0
    if params.gpus == "all":
        from trtflow.environment import gpus

        return max(len(gpus()), 1)
    return int(params.gpus)


def _resources(params: Params) -> Resources:
    """Benchmarks run alone (exclusive): other work on the host or GPU would disturb their timings."""
    return Resources(cpu=1.0, gpu=_gpu_count(params), exclusive=True)


def _environment(params: Params) -> list[str]:
    facts = ["gpu", "driver", "cpu", "numpy"]
    if params.backend in (*TRT_FLAVOURS, "auto"):
        facts += ["tensorrt", "tensorrt_rtx", "cuda_python"]
    if params.backend in ("onnxruntime", "auto"):
        facts.append("onnxruntime")
    if params.backend == "torch":
        facts.append("torch")
    return facts


def _files(params: Params) -> list[str]:
    from trtflow.callables import callable_files

    files = data_files(params.data)
    if params.torch_model:
        files += callable_files(params.torch_model)
    return files


# -- shapes and data ------------------------------------------------------------------------------------------


# -- backends -------------------------------------------------------------------------------------------------
def _cuda_timer() -> Any:
    from .measure.timing.cuda_timing import CudaTimer

    return CudaTimer(device=0)  # the runner narrows CUDA_VISIBLE_DEVICES to the node's GPU


# -- gates (applied by the engine to the summary) -------------------------------------------------------------
def gate(params: Params, summary: Mapping[str, Any], gate_ctx: GateContext) -> list[GateVerdict]:
    """Latency and throughput limits, then regression against a pinned baseline or the last accepted result
    (`measure.judging.gates`): typed verdicts; the engine fails the node on the blocking ones."""
    from .measure.judging.gates import verdicts

    return verdicts(params, summary, gate_ctx)


def figures(params: Params, summary: Mapping[str, Any]) -> Figures:
    """What the recipe's history keeps of a result (`measure.judging.figures`): per point its median and p99 latency and
    throughput with their intervals, the serving capacity, the scenarios' figures; the gated ones primary."""
    from .measure.judging.figures import history_figures

    return history_figures(params, summary)


def _reference(params: Params, resolve: Any, node: str) -> str | Mapping[str, Any] | None:
    from .measure.judging.reference import reference_request

    return reference_request(params, resolve, node)


def _compares(params: Params) -> bool:
    from .measure.judging.reference import compares

    return compares(params)


def _method(params: Params, backend: str, device: str, runs_on: str) -> dict[str, Any]:
    plan = params.window_plan()
    method: dict[str, Any] = {"warmup_ms": params.warmup_ms, "min_iterations": params.min_iterations,
                              "min_duration_s": params.min_duration_s, "repeats": params.repeats,
                              "max_duration_s": plan.max_duration_s, "precision_percent": params.precision_percent,
                              "tail_precision_percent": params.tail_precision_percent, "confidence": 0.95,
                              "intervals": "order statistics (percentiles), bootstrap of batch means (mean), "
                              "widened by a Student t interval over the windows' own figures", "runs_on": runs_on,
                              "data": params.data.model_dump(mode="json") if params.data is not None else None}
    if backend in TRT_FLAVOURS:
        method.update(timing="CUDA events (cuda-python harness)", spin_wait=params.spin_wait,
                      use_cuda_graph=params.use_cuda_graph, include_host_transfers=params.include_host_transfers,
                      streams=params.stream_counts)
    elif backend == "onnxruntime":
        method.update(timing="host clock around session.run", onnxruntime=params.onnxruntime.model_dump(),
                      device_resident_io=device == "cuda" and not params.include_host_transfers)
    else:
        method.update(timing="CUDA events" if device == "cuda" else "host clock", device=device)
    if backend not in TRT_FLAVOURS:
        with steady_interpreter() as interpreter:  # what the timing loops ran under
            method["interpreter"] = interpreter
    return method


# -- run ------------------------------------------------------------------------------------------------------
def _open_candidate(ctx: StageContext, params: Params, model: Path | None, inputs: Mapping[str, Path]) -> Any:
    """The model input, opened (`runtimes.candidate`): an engine deserialised; its backend checked against it."""
    from .runtimes.candidate import open_candidate

    candidate = open_candidate(ctx, model, params.backend, slot="model", provenance=inputs.get("provenance"),
                               need_cuda_python=True)
    if params.profile_layers and candidate.backend not in TRT_FLAVOURS:
        raise RecipeError(f"profile_layers needs an engine; this node runs {candidate.backend}",
                          field="profile_layers")
    return candidate


def _input_specs(params: Params, candidate: Any) -> list[InputSpec]:
    """The model's inputs; a PyTorch module without an ONNX model takes them from ``shapes`` (any batch)."""
    specs = candidate.input_specs()
    if specs is not None:
        return specs
    if not params.shapes:
        raise RecipeError("backend torch without an ONNX model needs shapes: {input name: shape}", field="shapes")
    # the module takes any batch: dimension 0 stays dynamic (for batch sweeps and dynamic batching)
    return [InputSpec(name, params.input_dtypes.get(name, "float32"), (None, *shape[1:]))
            for name, shape in params.shapes.items()]


def _host_model(ctx: StageContext, params: Params, backend: str, model: Path | None) -> Any:
    """What runs the model on the host clock: an ONNX Runtime session (backend onnxruntime) or a PyTorch module
    (backend torch); None for an engine (the candidate's)."""
    from trtflow.callables import load_callable

    if backend == "torch" and params.torch_model is None:
        from .accuracy.fake_quant import fake_quant_module

        if model is None:
            raise RecipeError("backend torch needs torch_model (a factory) or, as model, an nvfp4/mxfp8 quantize "
                              "node's model (its fake-quantized PyTorch model)", field="torch_model")
        module = fake_quant_module(model, ctx.load_callable)[0]
    elif backend == "torch":
        module = load_callable(params.torch_model, ctx.resolve, "torch_model")()
    if backend == "torch":
        if params.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise StageSkipped("device cuda for backend torch but this PyTorch sees no CUDA device",
                                   needs="a CUDA build of PyTorch on a GPU machine, or device: cpu")
        return module
    if backend == "onnxruntime":
        from .accuracy.recovery import runtime_options
        from .measure.timing.calls import ort_providers
        from .runtimes.ort import create_session

        assert model is not None
        providers = ort_providers(params.device)
        with ctx.native_step("onnxruntime", f"creating a session for {model.name}",
                             repro=f"python -c \"import onnxruntime as ort; ort.InferenceSession('{model}', "
                             f"providers={providers})\"",
                             hint="lower onnxruntime.graph_optimization_level or add the failing optimiser to "
                             "onnxruntime.disabled_optimizers"):
            return create_session(model, runtime_options(model, params.onnxruntime, ctx.log).options, providers)
    return None


def _settings(params: Params, device: str) -> PointSettings:
    return PointSettings(params.window_plan(), params.warmup_ms, params.unstable_cv_percent, device,
                         params.spin_wait, params.use_cuda_graph, params.include_host_transfers)


def _open_reference(ctx: StageContext, params: Params, backend: str, specs: Sequence[InputSpec],
                    feed: Mapping[str, Any], planned: Any) -> Any:
    """The reference's call at the gate point, opened with the candidate's runtime and settings (a pinned
    ``python:`` factory from the reference's copy of its file); raises what keeps it from running here."""
    from trtflow.callables import load_callable
    from trtflow.fsutil import project_root

    from .formats.onnx_model import candidate_kind
    from .measure.judging.reference import torch_factory
    from .measure.timing.calls import torch_call

    reference = ctx.reference
    model = reference.inputs.get("model")
    if backend == "torch" and model is None:
        spec = planned.params.get("torch_model") or params.torch_model
        copy = torch_factory(spec, reference, ctx.resolve, project_root(ctx.recipe_dir) or ctx.recipe_dir) \
            if spec else None
        if copy is None:
            raise RecipeError(f"the reference pins no copy of its model factory {spec!r}")
        module = load_callable(copy, Path, "reference torch_model")()
        return torch_call(module, specs, feed, params.device)
    kind = candidate_kind(model) if model is not None else None
    if kind is None or (backend == "onnxruntime") != (kind == "onnx") or backend == "torch":
        raise RecipeError(f"the reference is {'no model' if kind is None else 'an ' + kind}, which this node's "
                          f"backend {backend} does not time beside its candidate")
    from .measure.timing.calls import onnxruntime_call

    session = _host_model(ctx, params, backend, model)
    return onnxruntime_call(session, feed, params.device, params.include_host_transfers)[0]


def _pairings(ctx: StageContext, params: Params, backend: str, device: str, specs: Sequence[InputSpec],
              feeds: Sequence[tuple[int, Any, Any]], planned: Any) -> dict[int, Any]:
    """The gate point timed in pairs with the reference (`measure.timing.ab`), or nothing (``planned.why`` says why)."""
    from .measure.judging.reference import gate_batch, pair_plan
    from .measure.timing.ab import Pairing
    from .measure.timing.fixed import host_timer

    if planned is None or planned.why is not None:
        return {}
    batches = [batch for batch, _, _ in feeds]
    batch = gate_batch(params, batches)
    if batch is None:
        planned.why = f"the gate point (batch {params.gate_batch_size}) is not among the measured {batches}"
        return {}
    index = batches.index(batch)
    try:
        with ctx.native_step(backend, f"opening the reference at batch {batch}"):
            call = _open_reference(ctx, params, backend, specs, feeds[index][2], planned)
    except (RecipeError, StageSkipped, StageFailed, OSError) as error:
        planned.why = f"the reference does not run here: {getattr(error, 'message', None) or error}"
        return {}
    settings = _settings(params, device)
    plan = pair_plan(params, settings.plan.window_s, settings.plan.min_duration_s, settings.plan.max_duration_s,
                     ctx.gate_family, batch, seed=params.seed)
    return {index: Pairing(plan, host_timer(call, settings, backend == "torch" and device == "cuda"))}


def _engine_reference(ctx: StageContext, params: Params, backend: str, feeds: Sequence[tuple[int, Any, Any]],
                      planned: Any, stack: ExitStack) -> tuple[Any, tuple[int, int] | None, Any]:
    """The reference engine, opened inside ``stack``, the gate point (batch, streams) it is paired at, and what
    makes its pairing; (None, None, None) when it cannot be (``planned.why`` says why)."""
    from .formats.onnx_model import candidate_kind
    from .measure.judging.reference import gate_batch, pair_plan
    from .measure.timing.ab import Pairing
    from .runtimes.candidate import open_candidate

    if planned is None or planned.why is not None:
        return None, None, None
    model = ctx.reference.inputs.get("model")
    if model is None or candidate_kind(model) != "engine":
        planned.why = "the reference is not an engine, which this node's backend times"
        return None, None, None
    batches = [batch for batch, _, _ in feeds]
    batch = gate_batch(params, batches)
    if batch is None:
        planned.why = f"the gate point (batch {params.gate_batch_size}) is not among the measured {batches}"
        return None, None, None
    try:
        reference = stack.enter_context(open_candidate(ctx, model, backend, slot="reference")).engine
    except (RecipeError, StageSkipped, StageFailed, OSError) as error:
        planned.why = f"the reference does not run here: {getattr(error, 'message', None) or error}"
        return None, None, None
    settings = _settings(params, "cuda")
    streams = min(params.stream_counts)
    plan = pair_plan(params, settings.plan.window_s, settings.plan.min_duration_s, settings.plan.max_duration_s,
                     ctx.gate_family, batch, streams, seed=params.seed)
    return reference, (batch, streams), lambda window: Pairing(plan, window)


def _fixed_points(ctx: StageContext, params: Params, backend: str, device: str, session: Any, host_model: Any,
                  specs: Sequence[InputSpec], base_shapes: Mapping[str, list[int]],
                  planned: Any = None) -> tuple[list, Any, Any, Any]:
    """Every fixed-batch point (batch sizes x streams), and the layer and kernel profiles where asked for. Engine
    points are timed one after another (each holds its contexts); host-timed ones take turns, a window each, the
    gate point in pairs with the reference when there is one (``planned``, `measure.judging.reference`). ``session``:
    the candidate's engine, active; else ``host_model``: an ONNX Runtime session or a PyTorch module."""
    from .measure.timing.calls import layer_profile, onnxruntime_call, torch_call
    from .measure.timing.fixed import engine_point, host_points

    settings = _settings(params, device)
    points: list[dict[str, Any]] = []
    layers = kernels = paired = None
    feeds = []
    for batch in list(params.batch_sizes) or [None]:
        shapes = with_batch(base_shapes, batch)
        feeds.append((batch if batch is not None else batch_of(shapes), shapes, make_feed(specs, shapes, params,
                                                                                        ctx.resolve, ctx.log)))
    if session is not None:
        with ExitStack() as stack:
            reference, gate_at, pair = _engine_reference(ctx, params, backend, feeds, planned, stack)
            total = len(feeds) * len(params.stream_counts)
            for batch_size, shapes, feed in feeds:
                for streams in params.stream_counts:
                    paired_here = (batch_size, streams) == gate_at
                    ctx.progress(0.5 * len(points) / total if params.has_load else len(points) / total,
                                 f"batch {batch_size}, {streams} stream(s): timing on {backend}"
                                 + (" in A/B pairs with the reference" if paired_here else ""))
                    with ctx.native_step(backend, f"timing batch {batch_size} on {streams} stream(s)"):
                        report = engine_point(session, feed, batch_size, streams, settings, _cuda_timer,
                                              reference if paired_here else None, pair if paired_here else None)
                    paired = report.pop("paired", paired)
                    points.append({"batch_size": batch_size, "streams": streams, "shapes": shapes,
                                   "runs_on": f"{backend} engine, {streams} stream(s)", "report": report})
    else:
        if backend == "onnxruntime":
            calls = [onnxruntime_call(host_model, feed, params.device, params.include_host_transfers)
                     for _, _, feed in feeds]
        else:
            calls = [(torch_call(host_model, specs, feed, params.device), f"torch {params.device}")
                     for _, _, feed in feeds]
        pairings = _pairings(ctx, params, backend, device, specs, feeds, planned)
        ctx.progress(0.0, f"batch {', '.join(str(b) for b, _, _ in feeds)}: timing on {backend}, in turns"
                     + (" (the gate point in A/B pairs with the reference)" if pairings else ""))
        with ctx.native_step(backend, f"timing batch {', '.join(str(b) for b, _, _ in feeds)}"), steady_interpreter():
            reports = host_points([call for call, _ in calls], [b for b, _, _ in feeds], settings,
                                  cuda_events=backend == "torch" and device == "cuda", pairings=pairings)
        paired = next((pairing.summary() for pairing in pairings.values()), None)
        points = [{"batch_size": batch_size, "streams": 1, "shapes": shapes, "runs_on": how, "report": report}
                  for (batch_size, shapes, _), (_, how), report in zip(feeds, calls, reports, strict=True)]
    for point in points:
        report, ci = point["report"], point["report"]["latency_ci_ms"]
        ctx.log.info("batch %d, %d stream(s): median %.4g ms [%.4g, %.4g], p99 %.4g ms, %.1f qps, %d queries in %d "
                     "windows%s, flags %s", point["batch_size"], point["streams"], report["latency_ms"]["median"],
                     *ci["p50"], report["latency_ms"]["p99"], report["throughput_qps"], report["queries"],
                     len(report["repeats"]), "" if report["converged"] else " (not converged)", report["flags"])
    batch_size, _, feed = feeds[0]
    if params.profile_kernels:
        from .measure.timing.kernel_profile import timed_call_kernels

        module_call = None if session is not None else torch_call(host_model, specs, feed, "cuda")
        with ctx.native_step(backend, f"recording CUDA kernels at batch {batch_size}"):
            kernels = dict(timed_call_kernels(session, module_call, feed, params.kernel_iterations, _cuda_timer),
                           batch_size=batch_size)
    if params.profile_layers and session is not None:
        with ctx.native_step(backend, f"profiling layers at batch {batch_size}"):
            layers = dict(layer_profile(session, feed, params.profile_iterations, _cuda_timer), batch_size=batch_size)
    return points, layers, kernels, paired


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    from .measure.judging.reference import planned as planned_reference
    from .measure.timing.interference import HostWatch

    model = inputs.get("model")
    candidate = _open_candidate(ctx, params, model, inputs)
    backend, provenance = candidate.backend, candidate.provenance
    device = "cuda" if backend in TRT_FLAVOURS else params.device
    watch = HostWatch()
    if params.generation is not None:
        return _generation(ctx, params, model, device, watch)

    specs = _input_specs(params, candidate)
    host_model = _host_model(ctx, params, backend, model)
    reference = planned_reference(params, ctx.reference, ctx.resolve, ctx.node)
    base_shapes = resolve_shapes(specs, params)
    with candidate:
        points, layers, kernels, paired = _fixed_points(ctx, params, backend, device, candidate.engine, host_model,
                                                        specs, base_shapes, reference)
    del host_model

    load_result: dict[str, Any] = {}
    if params.has_load:
        from .measure.serving.measurements import measure_load

        limits = batch_limits(specs, params.profile.model_dump() if params.profile is not None else
                              _first_profile(candidate.manifest) if provenance else None)
        load_result = measure_load(ctx, params, backend, device, model, provenance, specs, base_shapes, limits,
                                   _cuda_timer)

    metrics = {
        "backend": backend,
        "device": device,
        "method": _method(params, backend, device, points[0]["runs_on"] if points else backend),
        "host": watch.report(),
        "points": points,
        **load_result,
    }
    if reference is not None:
        metrics["reference"] = reference.summary(paired)
    if kernels is not None:
        from .measure.timing.kernel_profile import top_kernels

        ctx.output("kernels").write_text(json.dumps(kernels, indent=2) + "\n", encoding="utf-8")
        metrics.update(top_kernels=top_kernels(kernels),
                       kernel_time_per_iteration_ms=kernels.get("kernel_time_per_iteration_ms"))
    if layers is not None:
        ctx.output("layers").write_text(json.dumps(layers, indent=2) + "\n", encoding="utf-8")
        metrics["top_layers"] = layers["profile"]["layers"][:TOP_LAYERS]
    summary = summary_of(metrics, ctx.facts, params)
    ctx.output("metrics").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    ctx.progress(1.0, "done")
    return summary


def _generation(ctx: StageContext, params: Params, model: Path | None, device: str, watch: Any) -> dict[str, Any]:
    """Time to first token and per output token at each concurrency (`measure.serving.generation`)."""
    from .accuracy.recovery import runtime_options
    from .measure.serving.generation import level_line, measure_generation
    from .measure.timing.calls import ort_providers
    from .runtimes.generation import OrtDecoder
    from .runtimes.ort import create_session

    assert model is not None and params.generation is not None
    with ctx.native_step("onnxruntime", f"creating a session for {model.name}"):
        session = create_session(model, runtime_options(model, params.onnxruntime, ctx.log).options,
                                 ort_providers(device))
    decoder = OrtDecoder(session)
    with ctx.native_step("onnxruntime", "timing greedy generation"):
        levels = measure_generation(decoder, params.generation, params.window_plan(),
                                    progress=lambda text: ctx.progress(0.5, text))
    for level in levels:
        ctx.log.info("%s", level_line(level))
    method = _method(params, "onnxruntime", device, f"onnxruntime {session.get_providers()[0]}")
    method.update(timing="host clock from a request's start to each token on the host",
                  generation=params.generation.model_dump())
    metrics: dict[str, Any] = {"backend": "onnxruntime", "device": device, "method": method,
                               "host": watch.report(), "points": [], "generation": levels}
    summary = summary_of(metrics, ctx.facts, params)
    summary["generation"] = levels
    ctx.output("metrics").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    ctx.progress(1.0, "done")
    return summary


def _first_profile(manifest: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    profiles = (manifest or {}).get("profiles") or []
    return profiles[0] if profiles and isinstance(profiles[0], Mapping) else None


#: What the summary (the node's manifest, gates, baselines, selection) keeps of each point.
SUMMARY_LATENCY = ("p50", "p90", "p95", "p99", "mean")
SUMMARY_UNCERTAINTY = ("queries", "latency_ci_ms", "throughput_ci_qps", "open_intervals", "converged",
                     "cpu_wait_ms_per_query")


def summary_of(metrics: Mapping[str, Any], facts: Mapping[str, str], params: Params) -> BenchmarkSummary:
    """What the node's manifest keeps: enough for gates, baselines, reports and selection (what others read of
    it is declared in `trtflow.summaries.BenchmarkSummary`)."""
    summary: dict[str, Any] = {
        "backend": metrics["backend"],
        "device": metrics["device"],
        "repeats": params.repeats,
        "hardware": {key: facts[key] for key in ("gpu", "cpu", "driver") if key in facts},
        "points": [{
            "batch_size": p["batch_size"], "streams": p["streams"],
            "median_ms": p["report"]["latency_ms"]["median"], "p99_ms": p["report"]["latency_ms"]["p99"],
            "latency_ms": {key: p["report"]["latency_ms"][key] for key in SUMMARY_LATENCY},
            "throughput_qps": p["report"]["throughput_qps"], "flags": p["report"]["flags"],
            **{key: p["report"][key] for key in SUMMARY_UNCERTAINTY if key in p["report"]},
        } for p in metrics["points"]],
        "host": {key: metrics["host"].get(key) for key in ("others_cpu_percent", "wait_percent", "steal_percent",
                                                          "load_average_before", "load_average_after")},
    }
    for key in ("load", "open_loop", "max_rate_meeting_budget", "scaling", "scenarios", "reference"):
        if key in metrics:
            summary[key] = metrics[key]
    for key in ("top_kernels", "kernel_time_per_iteration_ms"):
        if key in metrics:
            summary[key] = metrics[key]
    if "top_layers" in metrics:
        summary["top_layers"] = [{k: layer[k] for k in ("name", "average_ms", "percent")}
                                 for layer in metrics["top_layers"][:5]]
    return cast(BenchmarkSummary, summary)  # the promised keys are checked by tests/stages/test_summaries.py


stage = Stage(
    name="benchmark",
    version="2",
    description="Measure latency percentiles and throughput like trtexec (a TensorRT engine through the "
    "cuda-python harness, or an ONNX Runtime / eager PyTorch baseline) and under serving load: closed-loop "
    "concurrency, open-loop Poisson arrivals with a dynamic batcher, several streams and GPUs; per-layer "
    "profiles of engines; latency, throughput, regression and pinned-baseline gates.",
    params=Params,
    run=run,
    inputs={
        "model": Input((ONNX, ENGINE), "the engine or ONNX model to time (optional for backend torch)",
                       optional=True),
        "provenance": Input(METRICS, "engine.json of an engine (from the build stage)", optional=True),
    },
    outputs={
        "metrics": Output(METRICS, "benchmark.json", "latency percentiles, throughput, flags per batch; load "
                          "curves"),
        "kernels": Output(METRICS, "kernels.json", "CUDA kernel summary of the timed work (profile_kernels)",
                          optional=True),
        "layers": Output(METRICS, "layers.json", "engine layer information and per-layer times "
                         "(profile_layers)", optional=True),
    },
    resources=_resources,
    environment=_environment,
    files=_files,
    check=_check,
    preload=("onnxruntime", "numpy"),
    gate=gate,
    gate_params=GATE_PARAMS,
    compares=_compares,
    reference=_reference,
    figures=figures,
)
