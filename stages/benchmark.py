"""The ``benchmark`` stage: latency and throughput the way trtexec measures them, and under serving load.

Fixed-batch points (trtexec's method), per batch size:
- ``tensorrt`` / ``tensorrt-rtx``: an engine through `runtimes.trt_runtime` (execute_async_v3 on device buffers),
  timed by the cuda-python harness `measure.cuda_timing` (CUDA events around each enqueue, time-based warm-up,
  at least ``min_iterations`` AND ``min_duration_s``, optional CUDA graph with fallback, spin-wait, with or
  without host transfers through pinned buffers, several streams for throughput);
- ``onnxruntime``: an ONNX model with ONNX Runtime (CPU, or the CUDA execution provider where installed),
  timed on the host clock around each ``run`` with the same warm-up and iteration rules;
- ``torch``: an eager PyTorch model from a factory, timed with CUDA events on a GPU or the host clock on CPU.
Statistics follow trtexec (`measure.stats`); ``repeats`` > 1 measures each point that many times and reports the
median of each statistic, which is what the regression and baseline gates compare.

Serving load (`measure.load`, `measure.instances`, `measure.replicas`): closed-loop ``concurrency`` levels,
open-loop Poisson ``arrival_rate_qps`` levels with an optional dynamic batcher, ``streams`` model instances, and
``gpus`` (one replica process per GPU, aggregate throughput and scaling efficiency against one GPU). Latency counts
from each request's arrival, so queueing is included.

Gates (latency, throughput, regression against the previous run or a pinned baseline) are judged by the engine
on the summary `run` returns (`gate`), so changing a threshold re-judges cached measurements.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.stage import (
    ENGINE,
    METRICS,
    ONNX,
    CodeReference,
    GateContext,
    Input,
    Output,
    ProfileSpec,
    RecipeError,
    Resources,
    Stage,
    StageContext,
    StageParams,
    StageSkipped,
)

from .data import DataSource, InputSpec, data_files, onnx_input_specs
from .measure.feeds import batch_limits, batch_of, make_feed, resolve_shapes, with_batch
from .measure.load import DynamicBatching, steady_interpreter
from .runtimes.ort import OrtOptions
from .runtimes.tensorrt import FLAVOURS as TRT_FLAVOURS

Backend = Literal["auto", "tensorrt", "tensorrt-rtx", "onnxruntime", "torch"]
TOP_LAYERS = 10


class Params(StageParams):
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
    repeats: int = Field(1, ge=1, le=50, description="Measure each fixed-batch point this many times and report "
                         "the median of each statistic (what regression and baseline gates compare).")
    warmup_ms: float = Field(200.0, ge=0, description="Warm-up time before timing (trtexec: 200 ms).")
    min_iterations: int = Field(10, ge=1, description="At least this many timed queries (trtexec: 10).")
    min_duration_s: float = Field(3.0, ge=0, description="And at least this long (trtexec: 3 s).")
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
    # -- serving load ------------------------------------------------------------------------------------------
    concurrency: list[int] = Field(
        default_factory=list, description="Closed-loop load: per level, this many requests in flight (each "
        "client sends its next request when its previous one completes); benchmark.json gets a 'load' entry "
        "per level with throughput and latency p50/p90/p95/p99, queueing included.",
    )
    request_size: int | None = Field(
        None, ge=1, description="Samples per closed-loop request (default: the batch of the shapes "
        "benchmarked; 1 with dynamic_batching). Open-loop requests are single samples.",
    )
    arrival_rate_qps: list[float] = Field(
        default_factory=list, description="Open-loop load: per level, single-sample requests arriving as a "
        "Poisson process at this many per second, whatever the model's pace.",
    )
    dynamic_batching: DynamicBatching | None = Field(
        None, description="Merge queued requests into batches (Triton's dynamic batcher): max_batch_size "
        "(within the profile's limits), max_queue_delay_ms, preferred_batch_sizes.",
    )
    latency_budget_ms: float | None = Field(
        None, gt=0, description="Open-loop p99 latency budget: requests over it are counted late, and the "
        "highest arrival rate whose p99 meets it is reported.",
    )
    rate_search_probes: int = Field(
        0, ge=0, le=20, description="With latency_budget_ms and arrival_rate_qps: this many more open-loop levels "
        "searching for the highest rate whose p99 meets the budget (doubling the best listed rate until one "
        "misses, then bisecting).",
    )
    load_duration_s: float = Field(3.0, gt=0, description="Measured time per load level.")
    load_warmup_s: float = Field(0.5, ge=0, description="Unmeasured time at the start of each load level.")
    gpus: Literal["all"] | int = Field(
        1, description="GPUs to serve from under load: N or 'all', one replica process per GPU; reports the "
        "aggregate throughput and the scaling efficiency against one GPU (tensorrt, or device cuda).",
    )
    seed: int = Field(0, description="Seed of the open-loop arrival times.")
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
    # -- gates (judged by the engine; changing them re-judges cached measurements) ----------------------------
    max_latency_ms_p50: float | None = Field(None, gt=0, description="Gate: median latency at most this.")
    max_latency_ms_p90: float | None = Field(None, gt=0, description="Gate: p90 latency at most this.")
    max_latency_ms_p95: float | None = Field(None, gt=0, description="Gate: p95 latency at most this.")
    max_latency_ms_p99: float | None = Field(None, gt=0, description="Gate: p99 latency at most this.")
    max_latency_ms_mean: float | None = Field(None, gt=0, description="Gate: mean latency at most this.")
    min_throughput_qps: float | None = Field(None, gt=0, description="Gate: throughput (samples/s) at least "
                                             "this.")
    max_regression_percent: float | None = Field(
        None, gt=0,
        description="Gate: fail when a point's median latency is more than this many percent above, or its "
        "throughput this many percent below, the pinned baseline (with baseline; default 10) or else the last "
        "successful run of this node (compared only when that ran on the same GPU/CPU).")
    baseline: str | None = Field(
        None, description="A pinned baseline file (`trtflow baseline save`), relative to the recipe: points are "
        "compared with it; a baseline from another GPU or TensorRT version is refused, saying so.",
    )
    baseline_node: str | None = Field(
        None, description="The node's name in the baseline file (default: the file's only benchmark node).",
    )

    @field_validator("batch_sizes", "concurrency")
    @classmethod
    def _positive(cls, sizes: list[int]) -> list[int]:
        if any(b < 1 for b in sizes):
            raise ValueError(f"values must be >= 1, got {sizes}")
        return sizes

    @field_validator("arrival_rate_qps")
    @classmethod
    def _positive_rates(cls, rates: list[float]) -> list[float]:
        if any(rate <= 0 for rate in rates):
            raise ValueError(f"arrival rates must be > 0, got {rates}")
        return sorted(rates)

    @field_validator("streams")
    @classmethod
    def _streams(cls, streams: int | list[int]) -> int | list[int]:
        counts = [streams] if isinstance(streams, int) else streams
        if not counts or any(not 1 <= count <= 16 for count in counts):
            raise ValueError(f"streams must be between 1 and 16, got {streams}")
        return streams

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, gpus: str | int) -> str | int:
        if isinstance(gpus, int) and gpus < 1:
            raise ValueError(f"gpus must be >= 1 or 'all', got {gpus}")
        return gpus

    @property
    def stream_counts(self) -> list[int]:
        return [self.streams] if isinstance(self.streams, int) else list(self.streams)

    @property
    def has_load(self) -> bool:
        return bool(self.concurrency or self.arrival_rate_qps)

    @model_validator(mode="after")
    def _consistent(self) -> Params:
        if self.torch_model and self.backend != "torch":
            raise ValueError(f"torch_model is only used by backend torch, not {self.backend}")
        engine = self.backend in (*TRT_FLAVOURS, "auto")
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
        return self


GATE_PARAMS = ("max_latency_ms_p50", "max_latency_ms_p90", "max_latency_ms_p95", "max_latency_ms_p99",
               "max_latency_ms_mean", "min_throughput_qps", "max_regression_percent", "baseline", "baseline_node")
LATENCY_GATES = {"max_latency_ms_p50": "p50", "max_latency_ms_p90": "p90", "max_latency_ms_p95": "p95",
                 "max_latency_ms_p99": "p99", "max_latency_ms_mean": "mean"}
DEFAULT_BASELINE_REGRESSION_PERCENT = 10.0


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


# -- timing loops on the host ---------------------------------------------------------------------------------
def host_timing(call: Callable[[], Any], warmup_ms: float, min_iterations: int,
                min_duration_s: float) -> tuple[list[float], float]:
    """Time ``call`` on the host clock: warm up for ``warmup_ms``, then at least ``min_iterations`` calls
    AND ``min_duration_s``. Returns (latencies in ms, wall time in ms)."""
    start = time.perf_counter_ns()
    while (time.perf_counter_ns() - start) / 1e6 < warmup_ms:
        call()
    latencies: list[float] = []
    begin = time.perf_counter_ns()
    now = begin
    while len(latencies) < min_iterations or (now - begin) / 1e9 < min_duration_s:
        before = time.perf_counter_ns()
        call()
        now = time.perf_counter_ns()
        latencies.append((now - before) / 1e6)
    return latencies, (now - begin) / 1e6


def cuda_event_timing(call: Callable[[], Any], warmup_ms: float, min_iterations: int,
                      min_duration_s: float) -> tuple[list[float], float]:
    """As `host_timing`, with torch.cuda events around each call (GPU time of each query)."""
    import torch

    start_ns = time.perf_counter_ns()
    while (time.perf_counter_ns() - start_ns) / 1e6 < warmup_ms:
        call()
    torch.cuda.synchronize()
    latencies: list[float] = []
    begin = time.perf_counter_ns()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while len(latencies) < min_iterations or (time.perf_counter_ns() - begin) / 1e9 < min_duration_s:
        start.record()
        call()
        end.record()
        end.synchronize()
        latencies.append(start.elapsed_time(end))
    return latencies, (time.perf_counter_ns() - begin) / 1e6


# -- backends -------------------------------------------------------------------------------------------------
def _ort_providers(params: Params) -> list[str]:
    if params.device != "cuda":
        return ["CPUExecutionProvider"]
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise StageSkipped("this ONNX Runtime has no CUDA execution provider",
                           needs="pip install onnxruntime-gpu, or device: cpu")
    return ["CUDAExecutionProvider"]


def _onnxruntime_call(session: Any, feed: Mapping[str, Any], params: Params) -> tuple[Callable[[], Any], str]:
    import onnxruntime as ort

    if params.device == "cuda" and not params.include_host_transfers:
        binding = session.io_binding()
        for name, array in feed.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
        for output in session.get_outputs():
            binding.bind_output(output.name, "cuda")
        return (lambda: session.run_with_iobinding(binding)), "onnxruntime CUDA EP, device-resident I/O"
    return (lambda: session.run(None, dict(feed))), f"onnxruntime {session.get_providers()[0]}"


def _torch_call(module: Any, specs: Sequence[InputSpec], feed: Mapping[str, Any],
                device: str) -> Callable[[], Any]:
    import torch

    module = module.to(device).eval()
    tensors = [torch.from_numpy(feed[spec.name]).to(device) for spec in specs]

    def call() -> Any:
        with torch.inference_mode():
            return module(*tensors)

    return call


def _engine_run(session: Any, feed: Mapping[str, Any], params: Params, batch: int, streams: int,
                timer_factory: Callable[[], Any]) -> dict[str, Any]:
    """Time an engine with the cuda-python harness: one execution context and stream per ``streams``."""
    import numpy as np

    from .measure.cuda_timing import Copy, StreamWork, TimingOptions
    from .measure.stats import report_trace

    sessions = [session] + [session.fork().__enter__() for _ in range(streams - 1)]
    try:
        with timer_factory() as timer:
            work = []
            for each in sessions:
                tensors = each.prepare(feed)
                h2d, d2h = [], []
                if params.include_host_transfers:
                    for tensor in tensors:
                        host = timer.pinned_array((tensor.nbytes,), "uint8")
                        if tensor.is_input:
                            host[...] = np.frombuffer(np.ascontiguousarray(feed[tensor.name]).tobytes(),
                                                      dtype=np.uint8)
                            h2d.append(Copy(tensor.device_ptr, int(host.ctypes.data), tensor.nbytes))
                        else:
                            d2h.append(Copy(int(host.ctypes.data), tensor.device_ptr, tensor.nbytes))
                work.append(StreamWork(timer.new_stream(), each.enqueue, h2d, d2h))
            options = TimingOptions(warmup_ms=params.warmup_ms, min_iterations=params.min_iterations,
                                    min_duration_s=params.min_duration_s, spin_wait=params.spin_wait,
                                    use_cuda_graph=params.use_cuda_graph,
                                    include_host_transfers=params.include_host_transfers)
            run = timer.time(work, options)
    finally:
        for extra in sessions[1:]:
            extra.__exit__(None, None, None)
    report = report_trace(run.trace, params.warmup_ms, batch, streams,
                          unstable_cv_percent=params.unstable_cv_percent)
    report["cuda_graph"] = all(run.cuda_graph)
    report["cuda_graph_failures"] = run.graph_failures
    for failure in run.graph_failures:
        report["warnings"].append({"flag": "no-cuda-graph", "message": failure})
    return report


def _cuda_timer() -> Any:
    from .measure.cuda_timing import CudaTimer

    return CudaTimer(device=0)  # the runner narrows CUDA_VISIBLE_DEVICES to the node's GPU


def _layer_profile(session: Any, feed: Mapping[str, Any], params: Params,
                   timer_factory: Callable[[], Any]) -> dict[str, Any]:
    """Layer information and per-layer times on a separate execution context (a profiler slows inference)."""
    from .measure.stats import summarize_layer_times

    with session.fork() as profiled, timer_factory() as timer:
        profiled.prepare(feed)
        stream = timer.new_stream()
        information = profiled.layer_information()
        times = profiled.profile_layers(stream, params.profile_iterations, timer.synchronize)
    return {"layer_information": information, "profile": summarize_layer_times(times)}


def _kernel_profile(session: Any, module: Any, specs: Sequence[InputSpec], feed: Mapping[str, Any],
                    params: Params) -> dict[str, Any]:
    """The CUDA kernels of the timed call (an engine's enqueue, or the PyTorch module), like nsys' kernel summary."""
    from .measure.kernels import cuda_profiler_unavailable, nsys_status, profile_kernels

    reason = cuda_profiler_unavailable()
    if reason:
        return {"recorded": False, "reason": reason, "nsys": nsys_status()}
    if session is not None:
        with session.fork() as profiled, _cuda_timer() as timer:
            profiled.prepare(feed)
            stream = timer.new_stream()
            record = profile_kernels(lambda: profiled.enqueue(stream), lambda: timer.synchronize(stream),
                                     params.kernel_iterations)
    else:
        import torch

        call = _torch_call(module, specs, feed, "cuda")
        call()
        record = profile_kernels(call, torch.cuda.synchronize, params.kernel_iterations)
    return {"recorded": True, **record, "nsys": nsys_status()}


# -- repeats --------------------------------------------------------------------------------------------------
def median_of_repeats(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report for several repeats of a point: the repeat with the median median latency (its warnings and
    details), with each latency statistic and the throughput replaced by their medians over the repeats."""
    ordered = sorted(reports, key=lambda r: r["latency_ms"]["median"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    if len(reports) == 1:
        return chosen
    chosen["latency_ms"] = {key: statistics.median(r["latency_ms"][key] for r in reports)
                            for key in chosen["latency_ms"]}
    chosen["throughput_qps"] = statistics.median(r["throughput_qps"] for r in reports)
    chosen["repeats"] = [{"median_ms": r["latency_ms"]["median"], "p99_ms": r["latency_ms"]["p99"],
                          "throughput_qps": r["throughput_qps"]} for r in reports]
    return chosen


# -- gates (applied by the engine to the summary) -------------------------------------------------------------
def threshold_gates(point: Mapping[str, Any], params: Params) -> list[str]:
    failures = []
    latency = point.get("latency_ms") or {}
    where = f"batch {point.get('batch_size')}" + (f", {point['streams']} streams"
                                                  if point.get("streams", 1) != 1 else "")
    for field, key in LATENCY_GATES.items():
        limit = getattr(params, field)
        value = latency.get(key)
        if limit is not None and isinstance(value, (int, float)) and value > limit:
            failures.append(f"{where}: {key} latency {value:.4g} ms > {field} {limit:g} ms "
                            f"({value / limit:.2f}x)")
    qps = point.get("throughput_qps")
    if params.min_throughput_qps is not None and isinstance(qps, (int, float)) and qps < params.min_throughput_qps:
        failures.append(f"{where}: throughput {qps:.4g} qps < min_throughput_qps {params.min_throughput_qps:g} "
                        f"({qps / params.min_throughput_qps:.2f}x)")
    return failures


def regression_gates(summary: Mapping[str, Any], params: Params, previous: Mapping[str, Any] | None) -> list[str]:
    """Each point's median latency and throughput against the last successful run of this node, when that run
    was on the same hardware (another GPU's timings say nothing about a regression)."""
    from .measure.baseline import differences, timing_facts

    if params.max_regression_percent is None or not previous or not previous.get("points"):
        return []
    keys = timing_facts(summary.get("backend"), summary.get("device"))
    hardware = tuple(k for k in keys if k in ("gpu", "cpu"))
    if differences(previous.get("hardware") or {}, summary.get("hardware") or {}, hardware):
        return []
    from .measure.baseline import compare_timings

    failures = compare_timings({"points": previous["points"], "facts": {}}, summary, {},
                               params.max_regression_percent, Path("(the previous run)"))
    return [f.replace("the baseline's", "the previous run's") for f in failures if "has no such point" not in f]


def gate(params: Params, summary: Mapping[str, Any], gate_ctx: GateContext) -> list[str]:
    """Latency and throughput thresholds, then regression against a pinned baseline or the previous run."""
    failures = [message for point in summary.get("points", []) for message in threshold_gates(point, params)]
    if params.baseline is not None:
        from .measure.baseline import timing_gate

        threshold = params.max_regression_percent or DEFAULT_BASELINE_REGRESSION_PERCENT
        failures += timing_gate(params.baseline, params.baseline_node, summary, gate_ctx, threshold)
    else:
        failures += regression_gates(summary, params, gate_ctx.previous)
    return failures


# -- the host -------------------------------------------------------------------------------------------------
def _load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def host_record(before: list[float] | None, after: list[float] | None, ctx: StageContext,
                device: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Whether the benchmark ran alone: the engine's word where it gives it, and the 1-minute load average
    before and after as a sanity signal (a busy host disturbs CPU timings and GPU launch times alike)."""
    from .measure.instances import available_cpus

    cpus = available_cpus()
    record = {"ran_alone": getattr(ctx, "ran_alone", None), "cpus": cpus, "load_average_before": before,
              "load_average_after": after}
    warnings = []
    busiest = max((values[0] for values in (before, after) if values), default=0.0)
    if busiest > max(1.0, 0.5 * cpus):
        advice = ("CPU timings are disturbed: run benchmarks alone (`trtflow run -j 1`) on an idle machine"
                  if device == "cpu" else "the host's CPUs feed the GPU: stop other work on the machine")
        warnings.append({"flag": "busy-host", "message": f"the host was busy (1-minute load average up to "
                         f"{busiest:g} on {cpus} CPUs); {advice}"})
    return record, warnings


def _method(params: Params, backend: str, device: str, runs_on: str) -> dict[str, Any]:
    method: dict[str, Any] = {"warmup_ms": params.warmup_ms, "min_iterations": params.min_iterations,
                              "min_duration_s": params.min_duration_s, "repeats": params.repeats,
                              "runs_on": runs_on}
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
def _engine_provenance(kind: str | None, model: Path | None, inputs: Mapping[str, Path]) -> Path | None:
    from .runtimes.trt_runtime import provenance_for

    return provenance_for(model, inputs.get("provenance")) if kind == "engine" and model is not None else None


def _choose_backend(params: Params, kind: str | None, provenance: Path | None) -> str:
    from .runtimes.trt_runtime import engine_backend, read_provenance

    backend = params.backend
    if backend == "auto":
        if kind is None:
            raise RecipeError("backend auto needs a model input (an ONNX model or an engine)", field="backend")
        backend = engine_backend("auto", read_provenance(provenance)) if kind == "engine" else "onnxruntime"
    if backend in TRT_FLAVOURS and kind != "engine":
        raise RecipeError(f"backend {backend} needs an engine as the model input, got "
                          f"{'nothing' if kind is None else 'an ONNX model'}", field="backend",
                          hint="wire it in the recipe: `inputs: {model: <build node>}`")
    if backend == "onnxruntime" and kind != "onnx":
        raise RecipeError(f"backend onnxruntime needs an ONNX model as the model input, got "
                          f"{'nothing' if kind is None else 'an engine'}", field="backend",
                          hint="wire it in the recipe: `inputs: {model: <node with an ONNX output>}`")
    if params.profile_layers and backend not in TRT_FLAVOURS:
        raise RecipeError(f"profile_layers needs an engine; this node runs {backend}", field="profile_layers")
    return backend


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    from trtflow.callables import load_callable

    from .formats.onnx_model import candidate_kind
    from .measure.stats import report_host_latencies
    from .runtimes.trt_runtime import open_engine, read_provenance, runtime_available, runtime_needs

    model = inputs.get("model")
    kind = candidate_kind(model) if model is not None else None
    provenance = _engine_provenance(kind, model, inputs)
    backend = _choose_backend(params, kind, provenance)
    device = "cuda" if backend in TRT_FLAVOURS else params.device
    load_before = _load_average()

    session = None
    if backend in TRT_FLAVOURS:
        assert model is not None
        reason = runtime_available(backend, ctx.gpu, need_cuda_python=True)
        if reason:
            raise StageSkipped(f"cannot benchmark on {backend}: {reason}", needs=runtime_needs(backend))
        with ctx.native_step(backend, f"deserialising {model.name}"):
            session = open_engine(model, provenance, backend, ctx.gpu)
        specs = session.input_specs()
    elif model is not None and kind == "onnx":
        specs = onnx_input_specs(model)
    else:
        if not params.shapes:
            raise RecipeError("backend torch without an ONNX model needs shapes: {input name: shape}",
                              field="shapes")
        # the module takes any batch: dimension 0 stays dynamic (for batch sweeps and dynamic batching)
        specs = [InputSpec(name, params.input_dtypes.get(name, "float32"), (None, *shape[1:]))
                 for name, shape in params.shapes.items()]
    base_shapes = resolve_shapes(specs, params)
    torch_module = None
    if backend == "torch" and params.torch_model is None:
        from .accuracy.fake_quant import fake_quant_module

        if model is None:
            raise RecipeError("backend torch needs torch_model (a factory) or, as model, an nvfp4/mxfp8 quantize "
                              "node's model (its fake-quantized PyTorch model)", field="torch_model")
        torch_module = fake_quant_module(model, ctx.load_callable)[0]
    elif backend == "torch":
        factory = load_callable(params.torch_model, ctx.resolve, "torch_model")
        torch_module = factory()
        if params.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise StageSkipped("device cuda for backend torch but this PyTorch sees no CUDA device",
                                   needs="a CUDA build of PyTorch on a GPU machine, or device: cpu")
    ort_session = None
    if backend == "onnxruntime":
        from .runtimes.ort import create_session

        assert model is not None
        providers = _ort_providers(params)
        with ctx.native_step("onnxruntime", f"creating a session for {model.name}",
                             repro=f"python -c \"import onnxruntime as ort; ort.InferenceSession('{model}', "
                             f"providers={providers})\"",
                             hint="lower onnxruntime.graph_optimization_level or add the failing optimiser to "
                             "onnxruntime.disabled_optimizers"):
            ort_session = create_session(model, params.onnxruntime, providers)

    points, layers, kernels = [], None, None
    batches: list[int | None] = list(params.batch_sizes) or [None]
    stream_counts = params.stream_counts if session is not None else [1]
    total = len(batches) * len(stream_counts) * params.repeats
    done = 0
    if session is not None:
        session.__enter__()
    try:
        for batch in batches:
            shapes = with_batch(base_shapes, batch)
            batch_size = batch if batch is not None else batch_of(shapes)
            feed = make_feed(specs, shapes, params, ctx.resolve, ctx.log)
            for streams in stream_counts:
                reports = []
                for repeat in range(params.repeats):
                    ctx.progress(0.5 * done / total if params.has_load else done / total,
                                 f"batch {batch_size}, {streams} stream(s), repeat {repeat + 1}/{params.repeats}: "
                                 f"timing on {backend}")
                    if session is not None:
                        with ctx.native_step(backend, f"timing batch {batch_size} on {streams} stream(s)"):
                            report = _engine_run(session, feed, params, batch_size, streams, _cuda_timer)
                        how = f"{backend} engine, {streams} stream(s)"
                    else:
                        if ort_session is not None:
                            call, how = _onnxruntime_call(ort_session, feed, params)
                        else:
                            call, how = _torch_call(torch_module, specs, feed, params.device), \
                                f"torch {params.device}"
                        timing = cuda_event_timing if backend == "torch" and device == "cuda" else host_timing
                        with ctx.native_step(backend, f"timing batch {batch_size}"), steady_interpreter():
                            latencies, wall_ms = timing(call, params.warmup_ms, params.min_iterations,
                                                        params.min_duration_s)
                        report = report_host_latencies(latencies, wall_ms, batch_size,
                                                       unstable_cv_percent=params.unstable_cv_percent, device=device)
                    reports.append(report)
                    done += 1
                report = median_of_repeats(reports)
                points.append({"batch_size": batch_size, "streams": streams, "shapes": shapes, "runs_on": how,
                               "report": report})
                ctx.log.info("batch %d, %d stream(s): median %.4g ms, p99 %.4g ms, %.1f qps, flags %s", batch_size,
                             streams, report["latency_ms"]["median"], report["latency_ms"]["p99"],
                             report["throughput_qps"], report["flags"])
            if params.profile_kernels and kernels is None:
                with ctx.native_step(backend, f"recording CUDA kernels at batch {batch_size}"):
                    kernels = dict(_kernel_profile(session, torch_module, specs, feed, params), batch_size=batch_size)
            if params.profile_layers and session is not None and layers is None:
                with ctx.native_step(backend, f"profiling layers at batch {batch_size}"):
                    layers = dict(_layer_profile(session, feed, params, _cuda_timer), batch_size=batch_size)
    finally:
        if session is not None:
            session.__exit__(None, None, None)
    del ort_session, torch_module

    load_result: dict[str, Any] = {}
    if params.has_load:
        from .measure.serving import measure_load

        limits = batch_limits(specs, params.profile.model_dump() if params.profile is not None else
                              _first_profile(read_provenance(provenance)) if provenance else None)
        load_result = measure_load(ctx, params, backend, device, model, provenance, specs, base_shapes, limits,
                                   _cuda_timer)

    host, host_warnings = host_record(load_before, _load_average(), ctx, device)
    for point in points:
        point["report"]["warnings"] = point["report"]["warnings"] + host_warnings
        point["report"]["flags"] = sorted({w["flag"] for w in point["report"]["warnings"]})
    metrics = {
        "backend": backend,
        "device": device,
        "method": _method(params, backend, device, points[0]["runs_on"] if points else backend),
        "host": host,
        "points": points,
        **load_result,
    }
    if kernels is not None:
        from .measure.kernels import top_kernels

        ctx.output("kernels").write_text(json.dumps(kernels, indent=2) + "\n", encoding="utf-8")
        metrics.update(top_kernels=top_kernels(kernels),
                       kernel_time_per_iteration_ms=kernels.get("kernel_time_per_iteration_ms"))
    if layers is not None:
        ctx.output("layers").write_text(json.dumps(layers, indent=2) + "\n", encoding="utf-8")
        metrics["top_layers"] = layers["profile"]["layers"][:TOP_LAYERS]
    ctx.output("metrics").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    ctx.progress(1.0, "done")
    return summary_of(metrics, ctx.facts, params)


def _first_profile(manifest: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    profiles = (manifest or {}).get("profiles") or []
    return profiles[0] if profiles and isinstance(profiles[0], Mapping) else None


SUMMARY_LATENCY = ("p50", "p90", "p95", "p99", "mean")


def summary_of(metrics: Mapping[str, Any], facts: Mapping[str, str], params: Params) -> dict[str, Any]:
    """What the node's manifest keeps: enough for gates, baselines, reports and selection."""
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
        } for p in metrics["points"]],
        "host": {key: metrics["host"][key] for key in ("ran_alone", "load_average_before", "load_average_after")},
    }
    for key in ("load", "open_loop", "max_rate_meeting_budget", "scaling"):
        if key in metrics:
            summary[key] = metrics[key]
    for key in ("top_kernels", "kernel_time_per_iteration_ms"):
        if key in metrics:
            summary[key] = metrics[key]
    if "top_layers" in metrics:
        summary["top_layers"] = [{k: layer[k] for k in ("name", "average_ms", "percent")}
                                 for layer in metrics["top_layers"][:5]]
    return summary


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
)
