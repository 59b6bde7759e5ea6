"""The ``benchmark`` stage: latency and throughput measured the way trtexec measures them.

Backends:
- ``tensorrt`` / ``tensorrt-rtx``: an engine through `_trt_runtime` (execute_async_v3 on device buffers),
  timed by the cuda-python harness `_cuda_timing` (CUDA events around each enqueue, time-based warm-up,
  at least ``min_iterations`` AND ``min_duration_s``, optional CUDA graph with fallback, spin-wait, with or
  without host transfers through pinned buffers, several streams for throughput);
- ``onnxruntime``: an ONNX model with ONNX Runtime (CPU, or the CUDA execution provider where installed),
  timed on the host clock around each ``run`` with the same warm-up and iteration rules;
- ``torch``: an eager PyTorch model from a factory, timed with CUDA events on a GPU or the host clock on CPU.

Statistics follow trtexec (`_stats`): p50/p90/p95/p99, mean, coefficient of variation, throughput, and the
'enqueue-bound', 'h2d-bound'/'d2h-bound' and 'unstable' warnings. Writes benchmark.json; latency and
throughput gates raise `GateFailed`.
"""

from __future__ import annotations

import json
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
    GateFailed,
    Input,
    Output,
    ProfileSpec,
    RecipeError,
    Stage,
    StageContext,
    StageFailed,
    StageParams,
    StageSkipped,
)

from ._data import DataSource, InputSpec, RandomData, data_files, load_arrays, onnx_input_specs
from ._tensorrt import FLAVOURS as TRT_FLAVOURS

Backend = Literal["auto", "tensorrt", "tensorrt-rtx", "onnxruntime", "torch"]


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
        "its opt shapes are run."
    )
    batch_sizes: list[int] = Field(
        default_factory=list, description="A batch sweep: run each batch size in turn (dimension 0 of every "
        "input replaced). Empty: the shapes as given."
    )
    streams: int = Field(1, ge=1, le=16, description="Execution contexts on their own CUDA streams run "
                         "concurrently for throughput (tensorrt backends only).")
    warmup_ms: float = Field(200.0, ge=0, description="Warm-up time before timing (trtexec: 200 ms).")
    min_iterations: int = Field(10, ge=1, description="At least this many timed queries (trtexec: 10).")
    min_duration_s: float = Field(3.0, ge=0, description="And at least this long (trtexec: 3 s).")
    use_cuda_graph: bool = Field(
        True, description="Capture the enqueue into a CUDA graph (tensorrt); falls back to plain enqueues "
        "when the engine cannot be captured, and says so."
    )
    spin_wait: bool = Field(True, description="Wait for the GPU by spinning (stabler) instead of blocking.")
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
    max_latency_ms_p50: float | None = Field(None, gt=0, description="Gate: median latency at most this.")
    max_latency_ms_p90: float | None = Field(None, gt=0, description="Gate: p90 latency at most this.")
    max_latency_ms_p95: float | None = Field(None, gt=0, description="Gate: p95 latency at most this.")
    max_latency_ms_p99: float | None = Field(None, gt=0, description="Gate: p99 latency at most this.")
    max_latency_ms_mean: float | None = Field(None, gt=0, description="Gate: mean latency at most this.")
    max_regression_percent: float | None = Field(
        None, gt=0,
        description="Gate: fail when the median latency of a batch size is more than this many percent above "
        "the last successful run of this node (e.g. after a TensorRT upgrade or a model change). The first run "
        "sets the baseline.")
    min_throughput_qps: float | None = Field(None, gt=0, description="Gate: throughput (samples/s) at least "
                                             "this.")

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, sizes: list[int]) -> list[int]:
        if any(b < 1 for b in sizes):
            raise ValueError(f"batch sizes must be >= 1, got {sizes}")
        return sizes

    @model_validator(mode="after")
    def _consistent(self) -> Params:
        if self.backend == "torch" and not self.torch_model:
            raise ValueError("backend torch needs torch_model: 'python:package.module:factory' or "
                             "'python:path/to/file.py:factory'")
        if self.torch_model and self.backend != "torch":
            raise ValueError(f"torch_model is only used by backend torch, not {self.backend}")
        if self.streams > 1 and self.backend not in (*TRT_FLAVOURS, "auto"):
            raise ValueError(f"streams > 1 needs a tensorrt backend, not {self.backend}")
        return self


GATES = {"max_latency_ms_p50": "p50", "max_latency_ms_p90": "p90", "max_latency_ms_p95": "p95",
         "max_latency_ms_p99": "p99", "max_latency_ms_mean": "mean"}


# -- declarations -------------------------------------------------------------------------------------------
def _check(params: Params) -> None:
    if params.backend in TRT_FLAVOURS:
        from ._trt_runtime import runtime_available, runtime_needs

        reason = runtime_available(params.backend, need_cuda_python=True)
        if reason:
            raise StageSkipped(f"cannot benchmark on {params.backend}: {reason}",
                               needs=runtime_needs(params.backend) + " and cuda-python")
    if params.device == "cuda" and params.backend in ("onnxruntime", "torch"):
        from trtflow.environment import gpus

        if not gpus():
            raise StageSkipped(f"device cuda for {params.backend} but no NVIDIA GPU is visible here",
                               needs="an NVIDIA GPU, or device: cpu")


def _resources(params: Params) -> frozenset[str]:
    if params.backend in TRT_FLAVOURS or params.device == "cuda":
        return frozenset({"gpu"})
    return frozenset({"cpu"})


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
def resolve_shapes(specs: Sequence[InputSpec], params: Params) -> dict[str, list[int]]:
    """A concrete shape per input: ``shapes``, else the profile's opt shapes, else the static shape."""
    known = {s.name for s in specs}
    named = dict(params.profile.shapes) if params.profile else {}
    unknown = sorted((set(params.shapes) | set(named)) - known)
    if unknown:
        raise RecipeError(f"shapes/profile name input(s) {unknown} the model does not have; model inputs: "
                          f"{sorted(known)}", field="shapes")
    shapes: dict[str, list[int]] = {}
    for spec in specs:
        if spec.name in params.shapes:
            shape = list(params.shapes[spec.name])
        elif spec.name in named:
            shape = list(named[spec.name].opt)
        elif not spec.is_dynamic:
            shape = [int(d) for d in spec.shape]  # type: ignore[arg-type]
        else:
            raise RecipeError(f"input {spec.describe()} has dynamic dimensions and no shape to run",
                              field="shapes", hint=f"set shapes: {{{spec.name}: [...]}} or a profile")
        if len(shape) != spec.rank:
            raise RecipeError(f"input {spec.name!r}: shape {shape} has rank {len(shape)}, the model expects "
                              f"{spec.describe()}", field="shapes")
        for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
            if isinstance(want, int) and want > 0 and want != got:
                raise RecipeError(f"input {spec.name!r}: dimension {axis} is fixed at {want} in the model but "
                                  f"the shape to run is {shape}", field="shapes")
        shapes[spec.name] = shape
    return shapes


def make_feed(specs: Sequence[InputSpec], shapes: Mapping[str, list[int]], params: Params,
              resolve: Callable[[str], Path], log: Any) -> dict[str, Any]:
    """One batch of inputs in exactly ``shapes``: random (default) or the first rows of the data."""
    import numpy as np

    if params.data is None or params.data.random is not None:
        random = params.data.random if params.data is not None else None
        source = DataSource(random=RandomData(
            seed=random.seed if random else 0, num_samples=1,
            ranges=random.ranges if random else {}, shapes=dict(shapes)))
        return load_arrays(source, specs, resolve, log)
    arrays = load_arrays(params.data, specs, resolve, log)
    feed = {}
    for name, shape in shapes.items():
        array = arrays[name]
        if list(array.shape[1:]) != list(shape[1:]):
            raise StageFailed(f"input {name!r}: the data rows have shape {list(array.shape[1:])} but the "
                              f"benchmark runs {shape}", hint="give data in the shapes benchmarked, or none")
        repeats = -(-shape[0] // array.shape[0])
        feed[name] = np.ascontiguousarray(np.concatenate([array] * repeats)[: shape[0]])
    return feed


def _with_batch(shapes: Mapping[str, list[int]], batch: int | None) -> dict[str, list[int]]:
    if batch is None:
        return {name: list(shape) for name, shape in shapes.items()}
    return {name: [batch, *shape[1:]] for name, shape in shapes.items()}


def _batch_of(shapes: Mapping[str, list[int]]) -> int:
    firsts = {shape[0] for shape in shapes.values() if shape}
    return firsts.pop() if len(firsts) == 1 else 1


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
def _onnxruntime_call(model: Path, feed: Mapping[str, Any], params: Params) -> tuple[Callable[[], Any], str]:
    import onnxruntime as ort

    if params.device == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise StageSkipped("this ONNX Runtime has no CUDA execution provider",
                               needs="pip install onnxruntime-gpu, or device: cpu")
        providers = ["CUDAExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(model), providers=providers)
    if params.device == "cuda" and not params.include_host_transfers:
        binding = session.io_binding()
        for name, array in feed.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
        for output in session.get_outputs():
            binding.bind_output(output.name, "cuda")
        return (lambda: session.run_with_iobinding(binding)), "onnxruntime CUDA EP, device-resident I/O"
    return (lambda: session.run(None, dict(feed))), f"onnxruntime {providers[0]}"


def _torch_call(module: Any, specs: Sequence[InputSpec], feed: Mapping[str, Any],
                device: str) -> Callable[[], Any]:
    import torch

    module = module.to(device).eval()
    tensors = [torch.from_numpy(feed[spec.name]).to(device) for spec in specs]

    def call() -> Any:
        with torch.inference_mode():
            return module(*tensors)

    return call


def _engine_run(session: Any, feed: Mapping[str, Any], params: Params, batch: int,
                timer_factory: Callable[[], Any]) -> dict[str, Any]:
    """Time an engine with the cuda-python harness: one execution context and stream per ``streams``."""
    import numpy as np

    from ._cuda_timing import Copy, StreamWork, TimingOptions
    from ._stats import report_trace

    sessions = [session] + [session.fork().__enter__() for _ in range(params.streams - 1)]
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
    report = report_trace(run.trace, params.warmup_ms, batch, params.streams,
                          unstable_cv_percent=params.unstable_cv_percent)
    report["cuda_graph"] = all(run.cuda_graph)
    report["cuda_graph_failures"] = run.graph_failures
    for failure in run.graph_failures:
        report["warnings"].append({"flag": "no-cuda-graph", "message": failure})
    return report


def _cuda_timer() -> Any:
    from ._cuda_timing import CudaTimer

    return CudaTimer(device=0)  # the runner narrows CUDA_VISIBLE_DEVICES to the node's GPU


def regression_gates(points: list[Mapping[str, Any]], params: Params,
                     previous: Mapping[str, Any] | None) -> list[str]:
    """Compare each batch size's median latency with the last successful run of this node."""
    if params.max_regression_percent is None or not previous:
        return []
    before = {p.get("batch_size"): p.get("median_ms") for p in previous.get("points", []) if isinstance(p, dict)}
    failures = []
    for point in points:
        old = before.get(point["batch_size"])
        new = point["report"]["latency_ms"]["median"]
        if isinstance(old, (int, float)) and old > 0:
            change = (new / old - 1.0) * 100.0
            if change > params.max_regression_percent:
                failures.append(f"batch {point['batch_size']}: median latency {new:.4g} ms is {change:.1f}% above "
                                f"the previous run's {old:.4g} ms (max_regression_percent "
                                f"{params.max_regression_percent:g})")
    return failures


def latency_gates(point: Mapping[str, Any], params: Params) -> list[str]:
    failures = []
    latency = point["report"]["latency_ms"]
    where = f"batch {point['batch_size']}"
    for field, key in GATES.items():
        limit = getattr(params, field)
        if limit is not None and latency[key] > limit:
            failures.append(f"{where}: {key} latency {latency[key]:.4g} ms > {field} {limit:g} ms "
                            f"({latency[key] / limit:.2f}x)")
    qps = point["report"]["throughput_qps"]
    if params.min_throughput_qps is not None and qps < params.min_throughput_qps:
        failures.append(f"{where}: throughput {qps:.4g} qps < min_throughput_qps {params.min_throughput_qps:g} "
                        f"({qps / params.min_throughput_qps:.2f}x)")
    return failures


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    from ._stats import report_host_latencies
    from ._trt_runtime import (
        engine_backend,
        open_engine,
        provenance_for,
        read_provenance,
        runtime_available,
        runtime_needs,
    )
    from .validate import candidate_kind, load_user_function

    model = inputs.get("model")
    kind = candidate_kind(model) if model is not None else None
    provenance = provenance_for(model, inputs.get("provenance")) if kind == "engine" else None
    backend = params.backend
    if backend == "auto":
        if kind is None:
            raise RecipeError("backend auto needs a model input (an ONNX model or an engine)", field="backend")
        backend = engine_backend("auto", read_provenance(provenance)) if kind == "engine" \
            else "onnxruntime"
    if backend in TRT_FLAVOURS and kind != "engine":
        raise RecipeError(f"backend {backend} needs an engine as the model input, got "
                          f"{'nothing' if kind is None else 'an ONNX model'}", field="backend",
                          hint="wire it in the recipe: `inputs: {model: <build node>}`")
    if backend == "onnxruntime" and kind != "onnx":
        raise RecipeError(f"backend onnxruntime needs an ONNX model as the model input, got "
                          f"{'nothing' if kind is None else 'an engine'}", field="backend",
                          hint="wire it in the recipe: `inputs: {model: <node with an ONNX output>}`")

    session = None
    if backend in TRT_FLAVOURS:
        assert model is not None
        reason = runtime_available(backend, ctx.gpu, need_cuda_python=True)
        if reason:
            raise StageSkipped(f"cannot benchmark on {backend}: {reason}", needs=runtime_needs(backend))
        session = open_engine(model, provenance, backend, ctx.gpu)
        specs = session.input_specs()
    elif model is not None and kind == "onnx":
        specs = onnx_input_specs(model)
    else:
        if not params.shapes:
            raise RecipeError("backend torch without an ONNX model needs shapes: {input name: shape}",
                              field="shapes")
        specs = [InputSpec(name, params.input_dtypes.get(name, "float32"), tuple(shape))
                 for name, shape in params.shapes.items()]
    base_shapes = resolve_shapes(specs, params)
    torch_module = None
    if backend == "torch":
        assert params.torch_model is not None
        factory = load_user_function(params.torch_model, ctx.resolve, "torch_model")
        torch_module = factory()
        if params.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise StageSkipped("device cuda for backend torch but this PyTorch sees no CUDA device",
                                   needs="a CUDA build of PyTorch on a GPU machine, or device: cpu")

    points = []
    batches: list[int | None] = list(params.batch_sizes) or [None]
    if session is not None:
        session.__enter__()
    try:
        for index, batch in enumerate(batches):
            shapes = _with_batch(base_shapes, batch)
            batch_size = batch if batch is not None else _batch_of(shapes)
            feed = make_feed(specs, shapes, params, ctx.resolve, ctx.log)
            ctx.progress(index / len(batches), f"batch {batch_size}: timing on {backend}")
            if session is not None:
                report = _engine_run(session, feed, params, batch_size, _cuda_timer)
                how = f"{backend} engine, {params.streams} stream(s)"
            else:
                if backend == "onnxruntime":
                    assert model is not None
                    call, how = _onnxruntime_call(model, feed, params)
                else:
                    call, how = _torch_call(torch_module, specs, feed, params.device), f"torch {params.device}"
                timing = cuda_event_timing if backend == "torch" and params.device == "cuda" else host_timing
                latencies, wall_ms = timing(call, params.warmup_ms, params.min_iterations, params.min_duration_s)
                report = report_host_latencies(latencies, wall_ms, batch_size,
                                               unstable_cv_percent=params.unstable_cv_percent)
            points.append({"batch_size": batch_size, "shapes": shapes, "runs_on": how, "report": report})
            ctx.log.info("batch %d: median %.4g ms, p99 %.4g ms, %.1f qps, flags %s", batch_size,
                         report["latency_ms"]["median"], report["latency_ms"]["p99"], report["throughput_qps"],
                         report["flags"])
    finally:
        if session is not None:
            session.__exit__(None, None, None)

    failures = [message for point in points for message in latency_gates(point, params)]
    failures += regression_gates(points, params, ctx.previous_summary)
    metrics = {
        "backend": backend,
        "device": "cuda" if backend in TRT_FLAVOURS else params.device,
        "method": {
            "warmup_ms": params.warmup_ms, "min_iterations": params.min_iterations,
            "min_duration_s": params.min_duration_s, "spin_wait": params.spin_wait,
            "use_cuda_graph": params.use_cuda_graph, "include_host_transfers": params.include_host_transfers,
            "streams": params.streams,
        },
        "points": points,
        "passed": not failures,
        "failures": failures,
    }
    ctx.output("metrics").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    ctx.progress(1.0, "done" if not failures else f"{len(failures)} gate(s) failed")
    if failures:
        raise GateFailed("latency gate failed:\n  " + "\n  ".join(failures), metrics,
                         hint="see benchmark.json; flags such as 'unstable' or 'enqueue-bound' explain noise")
    return {
        "backend": backend,
        "points": [{"batch_size": p["batch_size"], "median_ms": p["report"]["latency_ms"]["median"],
                    "p99_ms": p["report"]["latency_ms"]["p99"], "throughput_qps": p["report"]["throughput_qps"],
                    "flags": p["report"]["flags"]} for p in points],
    }


stage = Stage(
    name="benchmark",
    version="1",
    description="Measure latency percentiles and throughput like trtexec: a TensorRT engine through the "
    "cuda-python harness (CUDA events, CUDA graphs, spin-wait, optional host transfers, several streams), "
    "or an ONNX Runtime / eager PyTorch baseline; optional latency gates.",
    params=Params,
    run=run,
    inputs={
        "model": Input((ONNX, ENGINE), "the engine or ONNX model to time (optional for backend torch)",
                       optional=True),
        "provenance": Input(METRICS, "engine.json of an engine (from the build stage)", optional=True),
    },
    outputs={"metrics": Output(METRICS, "benchmark.json", "latency percentiles, throughput, flags per batch")},
    resources=_resources,
    environment=_environment,
    files=_files,
    check=_check,
    preload=("onnxruntime", "numpy"),
)
