"""The benchmark stage's serving-load measurements: closed- and open-loop levels over streams and GPUs.

`measure_load` prepares the inputs at the largest batch the load needs (checked against the model's and the
profile's batch limits), builds the model instances (`measure.instances`) in this process, or one replica process per
GPU (`measure.replicas`) when ``gpus`` > 1, drives each level through a `measure.load.Server` and turns the request
records into benchmark.json's ``load``, ``open_loop``, ``max_rate_meeting_budget`` and ``scaling`` sections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.stage import RecipeError, StageContext, StageSkipped

from ..data import InputSpec
from .instances import ExecutorSpec, available_cpus, open_executor
from .load import (
    DynamicBatching,
    Level,
    LoadRun,
    Server,
    highest_rate_meeting_budget,
    merge_runs,
    next_rate_to_try,
    run_level,
    steady_interpreter,
    summarize_run,
    warm_up,
)

if TYPE_CHECKING:
    from ..benchmark import Params

ISSUE_LATENCY_KEYS = ("p50", "p90", "p95", "p99")


def _visible_gpus(wanted: int | str) -> list[str]:
    """The GPUs to serve from, as CUDA_VISIBLE_DEVICES names them: the node's own (the runner gives it every GPU
    it asked for), by UUID or MIG id. Not their ordinals: a replica's CUDA_VISIBLE_DEVICES=1 would name the
    machine's GPU 1, not the second of the node's."""
    from trtflow.environment import gpus

    found = [gpu.visible_id for gpu in gpus()]
    count = len(found) if wanted == "all" else int(wanted)
    if count > len(found):
        raise StageSkipped(f"gpus: {wanted} but {len(found)} GPU(s) are visible here",
                           needs=f"a machine with {count} GPUs")
    return found[:count]


def _torch_reference(spec: str | None, resolve: Callable[[str], Path]) -> str | None:
    """``python:file.py:fn`` with the file resolved to an absolute path, so replica processes find it."""
    if spec is None:
        return None
    target, _, attr = spec.rpartition(":")
    body = target[len("python:"):]
    if body.endswith(".py") or "/" in body:
        return f"python:{resolve(body)}:{attr}"
    return spec


def check_batches(largest: int, limits: tuple[int, int | None], batching: DynamicBatching | None) -> None:
    low, high = limits
    if high is not None and largest > high:
        what = (f"dynamic_batching.max_batch_size {batching.max_batch_size}" if batching is not None
                and batching.max_batch_size == largest else f"a request of {largest} samples")
        raise RecipeError(f"{what} exceeds the largest batch the model accepts ({high}: its optimization profile "
                          "or a fixed batch dimension)", field="dynamic_batching" if batching else "request_size",
                          hint=f"keep batches within [{low}, {high}]")
    if batching is not None and high is not None and low == high and high > 1:
        raise RecipeError(f"dynamic batching needs a model with a dynamic batch dimension; this one runs only "
                          f"batches of {high}", field="dynamic_batching",
                          hint="export the model with a dynamic batch axis (dynamic_axes: {0: batch})")


@contextmanager
def _serving(spec: ExecutorSpec, devices: Sequence[str] | None, instances: int, batching: DynamicBatching | None,
             warm_sizes: Sequence[int], timer_factory: Callable[[], Any]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Yields (run(levels) -> merged LoadRun per level, executor settings): in this process or on replicas."""
    if devices is None:
        with open_executor(spec, timer_factory) as executor:
            runs = executor.instances(instances)
            warm_up(runs, warm_sizes)
            with steady_interpreter() as quiet, Server(runs, batching) as server:
                yield (lambda level: run_level(server, level)), dict(executor.settings, **quiet)
        return
    from .replicas import Replicas

    with Replicas(spec, devices, instances, batching, warm_sizes) as replicas:
        count = len(devices)

        def run(level: Level) -> LoadRun:
            per_replica = [Level(level.mode, level.value / count if level.mode == "open" else level.value,
                                 level.request_samples, level.warmup_s, level.duration_s, level.seed + index)
                           for index in range(count)]
            timeout = 2 * (level.warmup_s + level.duration_s) + 120.0
            runs = replicas.run(per_replica, timeout)
            per_gpu = [round(summarize_run(run)["throughput_qps"], 3) for run in runs]
            merged = merge_runs(runs)
            merged.settings["throughput_qps_per_gpu"] = per_gpu
            return merged

        yield run, dict(replicas.settings[0], devices=list(devices))


def _closed_entry(summary: Mapping[str, Any], streams: int, gpus: int) -> dict[str, Any]:
    per_gpu = int(summary["concurrency"])
    entry = {"concurrency": per_gpu * gpus, "throughput_qps": summary["throughput_qps"],
             "latency_ms": {key: summary["latency_ms"][key] for key in ISSUE_LATENCY_KEYS},
             "streams": streams, "gpus": gpus}
    if gpus > 1:
        entry["concurrency_per_gpu"] = per_gpu
    entry.update({key: summary[key] for key in ("requests", "requests_per_s", "request_samples", "queue_ms",
                                                "service_ms", "mean_batch_size", "unfinished")})
    if "throughput_qps_per_gpu" in summary:
        entry["throughput_qps_per_gpu"] = summary["throughput_qps_per_gpu"]
    entry["latency_ms"].update(mean=summary["latency_ms"]["mean"], max=summary["latency_ms"]["max"])
    return entry


def _open_entry(summary: Mapping[str, Any], rate: float, streams: int, gpus: int) -> dict[str, Any]:
    entry = {"arrival_rate_qps": rate, "streams": streams, "gpus": gpus}
    entry.update({key: value for key, value in summary.items() if key not in ("arrival_rate_qps", "seed")})
    return entry


def _cpu_warnings(settings: Mapping[str, Any], instances: int, device: str) -> list[dict[str, str]]:
    if device != "cpu":
        return []
    cpus = int(settings.get("cpus") or available_cpus())
    threads = settings.get("intra_op_threads")
    per_instance = threads if isinstance(threads, int) and threads > 0 else cpus
    if instances * per_instance <= cpus:
        return []
    return [{"flag": "cpu-oversubscribed", "message": f"{instances} instance(s) x {per_instance} intra-op thread(s) "
             f"> {cpus} CPUs: instances compete for cores, so added streams show contention, not capacity; set "
             "onnxruntime.intra_op_threads so that streams x threads <= CPUs"}]


def measure_load(ctx: StageContext, params: Params, backend: str, device: str, model: Path | None,
                 provenance: Path | None, specs: Sequence[InputSpec], base_shapes: Mapping[str, list[int]],
                 limits: tuple[int, int | None], timer_factory: Callable[[], Any]) -> dict[str, Any]:
    from .feeds import batch_of, make_feed, with_batch

    batching = params.dynamic_batching
    closed_request = params.request_size or (1 if batching else batch_of(base_shapes))
    largest = max(closed_request if params.concurrency else 1, batching.max_batch_size if batching else 1)
    check_batches(largest, limits, batching)
    low = limits[0]
    feed = make_feed(specs, with_batch(base_shapes, max(largest, low)), params, ctx.resolve, ctx.log)
    spec = ExecutorSpec(backend=backend, device=device, feed=feed, model=str(model) if model else None,
                        provenance=str(provenance) if provenance else None,
                        torch_model=_torch_reference(params.torch_model, ctx.resolve),
                        onnxruntime=params.onnxruntime, min_batch=low)
    gpu_count = 1
    devices: list[str] = []
    if params.gpus != 1:
        devices = _visible_gpus(params.gpus)
        gpu_count = len(devices)
    # the batcher forms any size up to its maximum: warm every one, or the first use of a size (a kernel loaded
    # lazily, a shape-specific set-up) stalls a measured request
    warm_sizes = list(range(1, largest + 1)) if batching else sorted({1, closed_request})

    plans: list[tuple[int, int, list[Level]]] = []  # (streams, gpus, levels)
    for streams in params.stream_counts:
        for gpus in ([1, gpu_count] if gpu_count > 1 else [1]):
            levels = [Level("closed", c, closed_request, params.load_warmup_s, params.load_duration_s)
                      for c in params.concurrency]
            if gpus == gpu_count:
                levels += [Level("open", rate, 1, params.load_warmup_s, params.load_duration_s, params.seed)
                           for rate in params.arrival_rate_qps]
            plans.append((streams, gpus, levels))

    total = sum(len(levels) for _, _, levels in plans)
    done = 0
    load, open_loop, best, warnings = [], [], [], []
    settings: dict[str, Any] = {}
    for streams, gpus, levels in plans:
        where = None if gpu_count == 1 else devices[:gpus]
        with ctx.native_step(backend, f"serving load on {streams} instance(s), {gpus} GPU(s)"), \
                _serving(spec, where, streams, batching, warm_sizes, timer_factory) as (serve, used):
            settings = settings or dict(used)
            warnings += _cpu_warnings(used, streams, device)
            group: list[dict[str, Any]] = []
            searched = 0
            queue = list(levels)
            while queue:
                level = queue.pop(0)
                what = (f"concurrency {int(level.value)}" if level.mode == "closed"
                        else f"{level.value:g} requests/s")
                total = max(total, done + 1 + len(queue))
                ctx.progress(0.5 + 0.5 * done / total, f"load: {what}, {streams} stream(s), {gpus} GPU(s)")
                summary = summarize_run(serve(level), params.latency_budget_ms)
                done += 1
                if level.mode == "closed":
                    load.append(_closed_entry(summary, streams, gpus))
                    ctx.log.info("closed loop %s: %.1f samples/s, p50 %.4g ms, p99 %.4g ms", load[-1]["concurrency"],
                                 summary["throughput_qps"], summary["latency_ms"]["p50"], summary["latency_ms"]["p99"])
                else:
                    entry = _open_entry(summary, level.value, streams, gpus)
                    entry["searched"] = searched > 0
                    group.append(entry)
                    open_loop.append(entry)
                    ctx.log.info("open loop %g/s: %.1f samples/s, p99 %.4g ms, mean batch %.2f", level.value,
                                 summary["throughput_qps"], summary["latency_ms"]["p99"], summary["mean_batch_size"])
                if summary["delayed_sends"] > 0.01 * summary["requests"]:
                    warnings.append({"flag": "generator-behind", "message": f"{what}: {summary['delayed_sends']} "
                                     "requests were sent more than 1 ms late (the host was too busy); their latency "
                                     "still counts from the intended time"})
                if not queue and group and searched < params.rate_search_probes:
                    rate = next_rate_to_try(group)
                    if rate is not None:
                        searched += 1
                        queue.append(Level("open", rate, 1, params.load_warmup_s, params.load_duration_s,
                                           params.seed))
            if params.latency_budget_ms is not None and group:
                top = highest_rate_meeting_budget(group)
                best.append({"streams": streams, "gpus": gpus, "latency_budget_ms": params.latency_budget_ms,
                             "arrival_rate_qps": top["arrival_rate_qps"] if top else None,
                             "throughput_qps": top["throughput_qps"] if top else None,
                             "p99_ms": top["latency_ms"]["p99"] if top else None})

    result: dict[str, Any] = {
        "load_settings": {
            "request_size": closed_request, "duration_s": params.load_duration_s, "warmup_s": params.load_warmup_s,
            "dynamic_batching": batching.model_dump() if batching else None, "batch_limits": list(limits),
            "streams": params.stream_counts, "gpus": gpu_count, "executor": settings, "warnings": warnings,
        },
        "load": load,
    }
    if open_loop:
        result["open_loop"] = open_loop
    if best:
        result["max_rate_meeting_budget"] = best
    if gpu_count > 1:
        result["scaling"] = scaling(load, gpu_count)
    return result


def scaling(load: Sequence[Mapping[str, Any]], gpu_count: int) -> list[dict[str, Any]]:
    """Per streams and per-GPU concurrency: aggregate throughput on all GPUs against ``gpu_count`` x one GPU's."""
    single = {(p["streams"], p["concurrency"]): p["throughput_qps"] for p in load if p["gpus"] == 1}
    rows = []
    for point in load:
        if point["gpus"] != gpu_count:
            continue
        one = single.get((point["streams"], point["concurrency_per_gpu"]))
        if not one:
            continue
        rows.append({"streams": point["streams"], "concurrency_per_gpu": point["concurrency_per_gpu"],
                     "gpus": gpu_count, "throughput_qps_1gpu": one, "throughput_qps": point["throughput_qps"],
                     "scaling_efficiency": point["throughput_qps"] / (gpu_count * one)})
    return rows
