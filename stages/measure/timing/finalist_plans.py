"""How select times its finalists together, per objective and runtime: what each finalist's window runs, the figure
its rounds compare, the window and the cap; or why they cannot be timed here (said in the selection, which then
rests on the stored figures).

One machinery times them all (`measure.timing.finalists.measure_round_robin`: rounds of one short window per
finalist in a random order, judged by `decision.ties.paired_ties`); a plan says only what the windows are:

- **latency and throughput** at a batch size (``min_latency``, ``max_throughput``): fixed-batch windows at the
  operating point's batch, the figure its percentile or ``throughput``;
- **load objectives** (``max_throughput_under_latency``, ``max_throughput`` over a ``load`` sweep): each finalist is
  timed on fixed-batch windows at the batch its chosen operating point serves (a load level's request size, or a
  batch point's size), the figure ``throughput``. A load level itself is not re-run per round: it is a queue that
  must fill and settle (its relaxation time) before a window means anything, so each window would last the level's
  ``load_duration_s`` (seconds, not the few milliseconds that make a round see one host), and the co-tenant
  select must see through would land inside rounds. The service rate at the level's batch is what a level's
  throughput is made of; the latency bound (which levels qualify) stays judged on the stored figures, and the
  selection says both (``load_rule``);
- **generation** (``min_time_per_token``, ``min_time_to_first_token``): at concurrency 1, one request of each finalist
  per round, interleaved token by token (`measure.serving.generation.lockstep_timer`: each decode step of one next to
  the same step of the other, so a co-tenant switching every ~100 ms, shorter than a request, slows both alike);
  above 1, windows of the benchmarks' closed-loop requests per finalist (`generation_timers`); the figure the time
  per output token or the time to first token of the requests;
- **engines** (TensorRT candidates benchmarked on a TensorRT backend): fixed-batch windows on one execution
  context per engine, opened through the TensorRT runtime interface (`runtimes.trt_runtime.open_engine`: provenance,
  GPU and digest checked) and timed with the cuda-python harness (`measure.timing.fixed.EngineWindows`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The generation goals and the window figure each judges (`measure.serving.generation`'s two windows).
GENERATION_GOALS = {"min_time_per_token": "tpot", "min_time_to_first_token": "ttft"}
#: Goals whose operating point may be a load level (`decision.operating_point`).
LOAD_GOALS = ("max_throughput_under_latency", "max_throughput")
LOAD_RULE = ("load levels timed together on their service: fixed-batch windows at each level's batch, throughput "
             "compared; which levels meet the latency bound is judged on the stored figures")


def timing_plan(rows: Sequence[Mapping[str, Any]], objective: Mapping[str, Any], models: Mapping[str, Path],
                gpu: int | None, max_seconds: float | None) -> dict[str, Any] | str:
    """How select can time its finalists (``rows``: their selection rows, each with its benchmark and operating
    point) together here, or why it cannot."""
    goal = str(objective.get("goal"))
    if goal in GENERATION_GOALS:
        return generation_plan(rows, objective, models, gpu, max_seconds)
    if goal not in ("min_latency", *LOAD_GOALS):
        return f"objective {goal} is judged on sizes, which are not re-timed"
    figure = objective.get("percentile", "p50") if goal == "min_latency" else "throughput"
    points = {row["name"]: row.get("operating_point") or {} for row in rows}
    benches = {row["name"]: row.get("benchmark") or {} for row in rows}
    methods = [benches[name].get("method") or {} for name in benches]
    engines = [row.get("kind") == "engine" for row in rows]
    if all(engines):
        plan = _engine_settings(benches, gpu)
    elif not any(engines) and all(bench.get("backend") == "onnxruntime" for bench in benches.values()):
        plan = _onnxruntime_settings(benches, gpu)
    else:
        return ("the finalists are not all ONNX models benchmarked on ONNX Runtime or all engines benchmarked on one "
                "TensorRT backend")
    if isinstance(plan, str):
        return plan
    shapes, batches = {}, {}
    for name, point in points.items():
        batch = point.get("batch_size")
        measured = {p.get("batch_size"): p for p in benches[name].get("points") or []}
        if not isinstance(batch, int) or batch not in measured or not measured[batch].get("shapes"):
            where = f"its load level's batch {batch} among its fixed-batch points" \
                if point.get("concurrency") is not None else f"batch {batch}"
            return f"{name}'s benchmark does not record the shapes of {where}"
        shapes[name], batches[name] = measured[batch]["shapes"], batch
    load = any(point.get("concurrency") is not None for point in points.values())
    benchmark_window = min(max(float(m.get("min_duration_s") or 1.0) / max(int(m.get("repeats") or 1), 1), 0.02)
                           for m in methods) if methods else 0.2
    if load:  # the service of one query at each finalist's batch: its latency at that fixed-batch point
        latencies = [float(p["latency_ms"].get("p50")) for name in points for p in benches[name].get("points") or []
                     if p.get("batch_size") == batches[name] and isinstance((p.get("latency_ms") or {}).get("p50"),
                                                                              (int, float))]
    else:
        latencies = [float(p["latency_ms"]) for p in points.values() if isinstance(p.get("latency_ms"), (int, float))]
    from .finalists import finalist_cap, finalist_window

    window = finalist_window(max(latencies) if latencies else None, benchmark_window)
    cap = max_seconds or finalist_cap(min(float(m.get("max_duration_s") or 3.0) for m in methods))
    uniform = len(set(batches.values())) == 1
    return {**plan, "figure": figure, "batch_size": next(iter(batches.values())) if uniform else batches,
            "shapes": shapes, "warmup_ms": _warmup_ms(methods[0]), "window_s": window,
            "max_seconds": cap, "models": {name: models[name] for name in points},
            **({"load_rule": LOAD_RULE} if load else {})}


def _warmup_ms(method: Mapping[str, Any]) -> float:
    """The benchmark's warm-up (0 is a warm-up of nothing, not a missing one; absent: the benchmark's default)."""
    value = method.get("warmup_ms")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 200.0


def _onnxruntime_settings(benches: Mapping[str, Mapping[str, Any]], gpu: int | None) -> dict[str, Any] | str:
    methods = [bench.get("method") or {} for bench in benches.values()]
    devices = {bench.get("device") for bench in benches.values()}
    options = [m.get("onnxruntime") for m in methods]
    data = [m.get("data") for m in methods]
    if len(devices) != 1 or any(o != options[0] for o in options) or any(d != data[0] for d in data):
        return "the finalists were benchmarked with different devices, ONNX Runtime options or data"
    device = devices.pop() or "cpu"
    if device == "cuda" and gpu is None:
        return "they ran on CUDA, and this node has no GPU (give select `resources: {gpu: 1}`)"
    return {"runtime": "onnxruntime", "options": options[0] or {}, "device": device, "data": data[0]}


#: The engine benchmark's settings the finalists must share (how an engine is timed, `measure.timing.fixed`).
ENGINE_SETTINGS = ("spin_wait", "use_cuda_graph", "include_host_transfers", "data")


def _engine_settings(benches: Mapping[str, Mapping[str, Any]], gpu: int | None) -> dict[str, Any] | str:
    from ...runtimes.tensorrt import FLAVOURS
    from ...runtimes.trt_runtime import runtime_available, runtime_needs

    backends = {bench.get("backend") for bench in benches.values()}
    if len(backends) != 1 or next(iter(backends)) not in FLAVOURS:
        return "the engines were not all benchmarked on one TensorRT backend"
    methods = [bench.get("method") or {} for bench in benches.values()]
    settings = [{key: m.get(key) for key in ENGINE_SETTINGS} for m in methods]
    if any(s != settings[0] for s in settings):
        return "the engines were benchmarked with different timing settings or data (" + \
            ", ".join(ENGINE_SETTINGS) + ")"
    flavour = str(backends.pop())
    if gpu is None:
        return "they are engines, and this node has no GPU (give select `resources: {gpu: 1}`)"
    reason = runtime_available(flavour, gpu, need_cuda_python=True)
    if reason:
        return f"their engines do not run here ({reason}; {runtime_needs(flavour)})"
    return {"runtime": flavour, "device": "cuda", "gpu": gpu, "data": settings[0]["data"],
            "settings": {key: bool(settings[0][key]) if settings[0][key] is not None else default
                         for key, default in (("spin_wait", True), ("use_cuda_graph", True),
                                              ("include_host_transfers", False))}}


def generation_plan(rows: Sequence[Mapping[str, Any]], objective: Mapping[str, Any], models: Mapping[str, Path],
                    gpu: int | None, max_seconds: float | None) -> dict[str, Any] | str:
    """How select times finalists judged on generation (time per output token, or time to first token) together
    (`measure.serving.generation.generation_timers`): the benchmarks' requests (prompt length, new tokens, seed) at
    the judged concurrency, each window long enough for two requests of the slowest finalist; or why it cannot."""
    benches = {row["name"]: row.get("benchmark") or {} for row in rows}
    if any(row.get("kind") != "onnx" or benches[row["name"]].get("backend") != "onnxruntime" for row in rows):
        return "only ONNX models benchmarked on ONNX Runtime are timed together on generation so far"
    methods = [benches[name].get("method") or {} for name in benches]
    requests: list[dict[str, Any]] = [
        {k: (m.get("generation") or {}).get(k) for k in ("context_length", "new_tokens", "seed")} for m in methods]
    devices = {benches[name].get("device") for name in benches}
    options = [m.get("onnxruntime") for m in methods]
    if len(devices) != 1 or any(o != options[0] for o in options) or any(r != requests[0] for r in requests) \
            or not requests[0].get("new_tokens"):
        return "the finalists were benchmarked with different devices, ONNX Runtime options or requests"
    device = devices.pop() or "cpu"
    if device == "cuda" and gpu is None:
        return "they ran on CUDA, and this node has no GPU (give select `resources: {gpu: 1}`)"
    concurrency = {(row.get("operating_point") or {}).get("concurrency") for row in rows}
    if len(concurrency) != 1 or not isinstance(next(iter(concurrency)), int):
        return "the finalists are judged at different concurrencies"
    clients = concurrency.pop()
    stat = objective.get("percentile", "p50")
    new_tokens = int(requests[0]["new_tokens"])
    longest = 0.0
    for name, bench in benches.items():
        level: Mapping[str, Any] = next(
            (g for g in bench.get("generation") or [] if g.get("concurrency") == clients), {})
        ttft, tpot = (level.get("ttft_ms") or {}).get(stat), (level.get("tpot_ms") or {}).get(stat)
        if not isinstance(ttft, (int, float)) or not isinstance(tpot, (int, float)):
            return f"{name}'s benchmark has no {stat} time to first token and per output token at concurrency {clients}"
        longest = max(longest, ttft + tpot * (new_tokens - 1))
    from .finalists import finalist_cap
    from .windows import MIN_WINDOW_S

    # concurrency 1: one request of each finalist per round, in lockstep (`generation.lockstep_timer`); above: each
    # window long enough for two requests of the slowest finalist's clients
    window = MIN_WINDOW_S if clients == 1 else max(MIN_WINDOW_S, 2.0 * longest / 1000.0)
    cap = max_seconds or finalist_cap(min(float(m.get("max_duration_s") or 3.0) for m in methods))
    return {"runtime": "generation", "generation": {**requests[0], "concurrency": clients},
            "which": GENERATION_GOALS[str(objective.get("goal"))], "figure": stat, "batch_size": 1,
            "options": options[0] or {}, "device": device, "window_s": window, "max_seconds": cap,
            "models": {name: models[name] for name in benches}}
