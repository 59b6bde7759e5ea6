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
p99's within ``tail_precision_percent`` if set) or ``max_duration_s`` is spent, or the host is too busy (its threads
waited for a CPU 20% of the time); a point that stopped at the cap or on a busy host is flagged ``not-converged``,
and its report says why it stopped (``stopped``). Statistics follow trtexec (`measure.statistics.stats`), over all
timed queries; every figure has its interval (`measure.statistics.intervals`: ``queries``, ``latency_ci_ms``,
``throughput_ci_qps``), and each point records what else ran on the host meanwhile (`measure.timing.interference`).

Serving load (`measure.serving.traffic`, `measure.serving.instances`, `measure.serving.replicas`): closed-loop
``concurrency`` levels, open-loop Poisson ``arrival_rate_qps`` levels with an optional dynamic batcher, ``streams``
model instances, and ``gpus`` (one replica process per GPU, aggregate throughput and scaling efficiency against one
GPU). Latency counts from each request's arrival, so queueing is included.

Generation (``generation:``, `measure.serving.generation`): time to first token and per output token of greedy
requests, on an ONNX model exported with its KV cache (ONNX Runtime) or on a Hugging Face causal LM itself (backend
``torch``: `runtimes.torch_generation`, a static cache and each decode step replayed as a CUDA graph on a GPU).

The recipe's parameters are `measure.params`; the fixed-batch points and the gate point's pairs with the reference,
`measure.points`.

Gates (latency, throughput, regression against the previous run or a pinned baseline; `measure.judging.gates`) compare
with the uncertainty of both sides: pass, fail or inconclusive. The engine judges them on the summary `run`
returns (`gate`, which fails the node on ``fail`` verdicts only), so changing a threshold re-judges cached
measurements; the summary also keeps the verdicts judged when the node ran (``verdicts``), which the reports
show, inconclusive ones included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from trtflow.stage import (
    ENGINE,
    METRICS,
    ONNX,
    Figures,
    GateContext,
    GateVerdict,
    Input,
    Output,
    RecipeError,
    Resources,
    Stage,
    StageContext,
    StageFailed,
    StageSkipped,
)
from trtflow.summaries import BenchmarkSummary

from .data import InputSpec, data_files
from .measure.params import GATE_PARAMS, Params
from .measure.points import fixed_points, open_host_model
from .measure.serving.traffic import steady_interpreter
from .measure.timing.feeds import batch_limits, resolve_shapes
from .runtimes.tensorrt import FLAVOURS as TRT_FLAVOURS

TOP_LAYERS = 10


def _cuda_timer() -> Any:
    from .measure.timing.cuda_timing import CudaTimer

    return CudaTimer(device=0)  # the runner narrows CUDA_VISIBLE_DEVICES to the node's GPU


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
        if params.generation is not None:
            facts.append("transformers")
    return facts


def _files(params: Params) -> list[str]:
    from trtflow.callables import callable_files

    files = data_files(params.data)
    if params.hf_model:
        files.append(params.hf_model)
    if params.torch_model:
        files += callable_files(params.torch_model)
    return files


# -- shapes and data ------------------------------------------------------------------------------------------


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



def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> BenchmarkSummary:
    from .measure.judging.reference import planned as planned_reference
    from .measure.timing.interference import HostWatch

    model = inputs.get("model")
    candidate = _open_candidate(ctx, params, model, inputs)
    backend, provenance = candidate.backend, candidate.provenance
    device = "cuda" if backend in TRT_FLAVOURS else params.device
    watch = HostWatch()
    if params.generation is not None:
        return _generation(ctx, params, model, device, watch, inputs.get("encoder"))

    specs = _input_specs(params, candidate)
    host_model = open_host_model(ctx, params, backend, model)
    reference = planned_reference(params, ctx.reference, ctx.resolve, ctx.node)
    base_shapes = resolve_shapes(specs, params)
    with candidate:
        points, layers, kernels, paired = fixed_points(ctx, params, backend, device, candidate.engine, host_model,
                                                        specs, base_shapes, reference, _cuda_timer)
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


def _generation(ctx: StageContext, params: Params, model: Path | None, device: str, watch: Any,
                encoder_path: Path | None = None) -> BenchmarkSummary:
    """Time to first token and per output token at each concurrency (`measure.serving.generation`): an ONNX model
    with its cache on ONNX Runtime (an encoder-decoder's encoder runs in each request's first step: time to
    first token includes it), or a Hugging Face causal LM on PyTorch (`runtimes.torch_generation`)."""
    from .measure.judging.reference import planned as planned_reference
    from .measure.serving.generation import level_line, measure_generation

    assert params.generation is not None
    backend = params.backend if params.backend == "torch" else "onnxruntime"
    decoder, runs_on = (_torch_decoder(ctx, params, device) if backend == "torch" else
                        _ort_decoder(ctx, params, model, device, encoder_path))
    reference = planned_reference(params, ctx.reference, ctx.resolve, ctx.node)
    pairing = _generation_pairing(ctx, params, decoder, device, reference)
    try:
        with ctx.native_step(backend, "timing greedy generation"):
            levels = measure_generation(decoder, params.generation, params.window_plan(),
                                        progress=lambda text: ctx.progress(0.5, text), device=device,
                                        pairing=pairing)
    finally:
        if pairing is not None:
            pairing.reference.close()  # the reference's clients: their threads end
    for level in levels:
        ctx.log.info("%s", level_line(level))
    method = _method(params, backend, device, runs_on)
    method.update(timing="host clock from a request's start to each token on the host",
                  generation=params.generation.model_dump())
    if backend == "torch":
        method["torch"] = decoder.describe()
        ctx.log.info("PyTorch generation: %s", method["torch"])
    metrics: dict[str, Any] = {"backend": backend, "device": device, "method": method,
                               "host": watch.report(), "points": [], "generation": levels}
    if reference is not None:
        paired = None
        if pairing is not None:
            from .measure.serving.generation import gate_level

            paired = dict(pairing.summary(), concurrency=gate_level(params.generation))
        metrics["reference"] = reference.summary(paired)
    summary = summary_of(metrics, ctx.facts, params)
    summary["generation"] = levels
    ctx.output("metrics").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    ctx.progress(1.0, "done")
    return summary


def _ort_decoder(ctx: StageContext, params: Params, model: Path | None, device: str,
                 encoder_path: Path | None) -> tuple[Any, str]:
    from .accuracy.recovery import runtime_options
    from .measure.timing.calls import ort_providers
    from .runtimes.ort import create_session
    from .runtimes.seq2seq import open_decoder

    assert model is not None
    with ctx.native_step("onnxruntime", f"creating a session for {model.name}"):
        session = create_session(model, runtime_options(model, params.onnxruntime, ctx.log).options,
                                 ort_providers(device))
        encoder = create_session(encoder_path, runtime_options(encoder_path, params.onnxruntime, ctx.log).options,
                                 ort_providers(device)) if encoder_path is not None else None
    return open_decoder(session, encoder), f"onnxruntime {session.get_providers()[0]}"


def _torch_decoder(ctx: StageContext, params: Params, device: str) -> tuple[Any, str]:
    """The causal LM (hf_model, or torch_model's factory) in torch_dtype on ``device``, with a static cache of the
    benchmark's length and one slot per client, its decode steps captured as CUDA graphs on a GPU."""
    from trtflow.callables import load_callable

    from .runtimes.torch_generation import load_causal_lm, open_decoder, prepare_model

    assert params.generation is not None
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise StageSkipped("device cuda for backend torch but this PyTorch sees no CUDA device",
                               needs="a CUDA build of PyTorch on a GPU machine, or device: cpu")
    dtype = params.torch_dtype
    if params.hf_model is not None:
        with ctx.native_step("torch", f"loading {params.hf_model} in {dtype}"):
            model = load_causal_lm(ctx.resolve(params.hf_model), dtype, device, params.hf_model)
    else:
        assert params.torch_model is not None
        model = prepare_model(load_callable(params.torch_model, ctx.resolve, "torch_model")(), dtype, device)
    bench = params.generation
    with ctx.native_step("torch", "the static cache and the decode steps' CUDA graphs"):
        decoder = open_decoder(model, device, bench.context_length + bench.new_tokens,
                               params.generation_cuda_graphs, max(bench.concurrency))
    return decoder, f"torch {device} {dtype}"
def _generation_pairing(ctx: StageContext, params: Params, decoder: Any, device: str, planned: Any) -> Any:
    """The gate level's A/B rounds with the reference (`measure.timing.ab.Pairing` on
    `measure.serving.generation.request_window`): the reference model opened with its pinned settings, fed the same
    prompts, its stopping rule watching the time per output token and the time to first token at the gate
    statistic (``gate_figure``; throughput: p50); or None, ``planned.why`` saying why."""
    import dataclasses
    import math

    from .formats.onnx_model import candidate_kind
    from .measure.judging.gates import allowed_ratio
    from .measure.judging.reference import DEFAULT_PERCENT, pair_plan, pinned_params
    from .measure.serving.generation import bench_prompts, gate_level, request_window
    from .measure.timing.ab import Pairing

    if planned is None or planned.why is not None or ctx.reference is None or params.generation is None:
        return None
    if params.backend == "torch":
        planned.why = "generation on PyTorch is not paired with its reference yet: the stored figures decide"
        return None
    model = ctx.reference.inputs.get("model")
    if model is None or candidate_kind(model) != "onnx":
        planned.why = "the reference is not an ONNX model, which this generation benchmark times"
        return None
    pinned, planned.settings = pinned_params(params, planned.params)
    encoder = ctx.reference.inputs.get("encoder")
    try:
        theirs, _ = _ort_decoder(ctx, pinned, model, device, encoder)
    except (RecipeError, StageFailed, OSError) as error:
        planned.why = f"the reference does not run here: {getattr(error, 'message', None) or error}"
        return None
    bench = params.generation
    run = request_window(theirs, bench_prompts(decoder, bench), bench.new_tokens, gate_level(bench))
    window = params.window_plan()
    stat = params.gate_figure if params.gate_figure != "throughput" else "p50"
    plan = pair_plan(params, window.window_s, window.min_duration_s, ctx.gate_family, 1, gate_level(bench),
                     seed=params.ab_seed, cost_budget=params.gate_cost_budget)
    percent = params.max_regression_percent or DEFAULT_PERCENT
    plan = dataclasses.replace(plan, figure=f"tpot_{stat}", also=(f"ttft_{stat}",),
                               limit=math.log(allowed_ratio(percent, stat)))
    return Pairing(plan, run)


def _first_profile(manifest: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    profiles = (manifest or {}).get("profiles") or []
    return profiles[0] if profiles and isinstance(profiles[0], Mapping) else None


#: What the summary (the node's manifest, gates, baselines, selection) keeps of each point.
SUMMARY_LATENCY = ("p50", "p90", "p95", "p99", "mean")
SUMMARY_UNCERTAINTY = ("queries", "latency_ci_ms", "throughput_ci_qps", "open_intervals", "converged", "stopped",
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
        "encoder": Input(ONNX, "generation with an encoder-decoder: its exported encoder, run in each request's "
                         "first step", optional=True),
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
    preload=("onnxruntime", "numpy", "scipy.stats"),  # scipy: the intervals (measure.statistics)
    gate=gate,
    gate_params=GATE_PARAMS,
    compares=_compares,
    reference=_reference,
    figures=figures,
)
