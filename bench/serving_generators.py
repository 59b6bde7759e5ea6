"""How much latency does a load generator add, and where do the stalls at low arrival rates come from?

Both on one model (eager PyTorch, ``bench/serving_models.py``) served by trtflow's `measure.serving.traffic.Server` (its
queue
and worker thread; no dynamic batching), single-sample requests arriving as a Poisson process:

``generators``: at each ``--rates`` level, ``--repeats`` times, interleaved:
  - ``loadgen+server``: MLPerf LoadGen's Server scenario driving trtflow's server (what the benchmark stage does);
  - ``trtflow+server``: trtflow's own open-loop generator (a Python thread sleeping until each arrival) driving it;
  - ``loadgen+plain``: LoadGen driving a plain SUT: one worker thread taking queries from a `queue.Queue`, the
    shape of MLPerf's reference Python SUTs (the independent reference).
  Latency is from each request's scheduled arrival to its completion (LoadGen's clock for LoadGen, ours for ours);
  each level reports p50/p90/p99 with 95% order-statistic intervals, and the difference to the reference.

``stalls``: at low ``--stall-rates``, LoadGen driving an instrumented server: per request the queueing delay
  (arrival to dispatch), the host time of the forward (dispatch to completion), its GPU time (CUDA events around
  it), the GPU's SM clock when it started (NVML), and whether the caching allocator had to call cudaMalloc. A request
  slower than 2x the median service time is a stall; each is attributed to what was slow.

    python bench/serving_generators.py --device cuda --model resnet50 --out results
    python bench/serving_generators.py --device cpu --model tiny_cnn --quick      # try it on a CPU
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
SHAPES = {"resnet50": [1, 3, 224, 224], "tiny_cnn": [1, 3, 32, 32]}


def _model(args: argparse.Namespace) -> tuple[Any, Any]:
    import serving_models
    import torch

    module = getattr(serving_models, args.model)().to(args.device).eval()
    sample = torch.randn(*SHAPES[args.model], device=args.device)
    with torch.inference_mode():
        for _ in range(20):
            module(sample)
    if args.device == "cuda":
        torch.cuda.synchronize()
    return module, sample


def _runner(module: Any, sample: Any, device: str) -> Any:
    import torch

    stream = torch.cuda.Stream() if device == "cuda" else None

    def run(batch: int) -> None:
        with torch.inference_mode():
            if stream is None:
                module(sample)
                return
            with torch.cuda.stream(stream):
                module(sample)
            stream.synchronize()

    return run


def _summary(latencies_ns: list[int]) -> dict[str, Any]:
    from trtflow_stages.measure.statistics.intervals import quantile_interval
    from trtflow_stages.measure.statistics.stats import summarize

    values = sorted(v / 1e6 for v in latencies_ns)
    stats = summarize(values)
    out = {"queries": len(values), "p50": stats["p50"], "p90": stats["p90"], "p99": stats["p99"],
           "max": stats["max"], "mean": stats["mean"]}
    for key, q in (("p50", 0.5), ("p99", 0.99)):
        low, high, _ = quantile_interval(values, q)
        out[f"{key}_ci"] = [min(low, out[key]), max(high, out[key])]
    return out


def _loadgen_server(run: Any, rate: float, duration: float, seed: int) -> dict[str, Any]:
    from trtflow_stages.measure.serving import loadgen
    from trtflow_stages.measure.serving.traffic import Server

    with Server([run], warm_sizes=[1]) as server:
        spec = loadgen.ScenarioSpec("Server", duration, target_qps=rate, latency_budget_ms=20.0,
                                    min_query_count=int(rate * duration), seed=seed)
        result = loadgen.run(server, spec)
    figures = _summary(result.settings["latencies_ns"])
    figures["loadgen_p99_ms"] = result.settings["loadgen"]["percentiles_ns"].get("99.00", 0) / 1e6
    return figures


def _trtflow_server(run: Any, rate: float, duration: float, seed: int) -> dict[str, Any]:
    from trtflow_stages.measure.serving.traffic import Server, open_loop

    with Server([run], warm_sizes=[1]) as server:
        result = open_loop(server, rate, 1, 0.0, duration, seed)
    measured = [r for r in result.requests if r.done_ns]
    figures = _summary([r.done_ns - r.arrival_ns for r in measured])
    figures["late_sends_over_1ms"] = sum(1 for r in measured if r.sent_ns - r.arrival_ns > 1_000_000)
    return figures


def _loadgen_plain(run: Any, rate: float, duration: float, seed: int) -> dict[str, Any]:
    """LoadGen and a plain SUT: a queue and one worker thread, as MLPerf's reference Python SUTs are written."""
    import tempfile

    import mlperf_loadgen as lg

    from trtflow_stages.measure.serving.loadgen import read_trace

    work: queue.Queue = queue.Queue()

    ready = threading.Event()

    def worker() -> None:
        for _ in range(3):  # warmed on its own thread, as trtflow's server is
            run(1)
        ready.set()
        while (item := work.get()) is not None:
            run(1)
            lg.QuerySamplesComplete([lg.QuerySampleResponse(item.id, 0, 0)])

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    ready.wait()

    def issue(samples: Any) -> None:
        for sample in samples:
            work.put(sample)

    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = rate
    settings.server_target_latency_ns = 20_000_000
    settings.min_duration_ms = int(duration * 1000)
    settings.min_query_count = int(rate * duration)
    settings.schedule_rng_seed = seed
    with tempfile.TemporaryDirectory() as folder:
        logs = lg.LogSettings()
        logs.log_output.outdir = folder
        logs.enable_trace = True
        sut = lg.ConstructSUT(issue, lambda: None)
        qsl = lg.ConstructQSL(1024, 1024, lambda s: None, lambda s: None)
        lg.StartTestWithLogSettings(sut, qsl, settings, logs)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        latencies, _ = read_trace(Path(folder) / "mlperf_log_trace.json")
    work.put(None)
    thread.join()
    return _summary(latencies)


def generators(args: argparse.Namespace, run: Any) -> dict[str, Any]:
    from trtflow_stages.measure.serving.traffic import steady_interpreter

    configurations = {"loadgen+server": _loadgen_server, "trtflow+server": _trtflow_server,
                      "loadgen+plain": _loadgen_plain}
    results: dict[str, Any] = {}
    print(f"\n== generators: {args.model} on {args.device}, Poisson single-sample requests, {args.duration:g} s per "
          f"level, {args.repeats} repeats (interleaved)")
    print("  rate/s  configuration     run  queries   p50 ms (95% CI)          p90 ms   p99 ms (95% CI)")
    for rate in args.rates:
        per_rate: dict[str, list[dict[str, Any]]] = {name: [] for name in configurations}
        for repeat in range(args.repeats):
            for name, measure in configurations.items():
                with steady_interpreter():
                    figures = measure(run, rate, args.duration, repeat)
                per_rate[name].append(figures)
                print(f"  {rate:6g}  {name:16s}  {repeat + 1:3d}  {figures['queries']:7d}   {figures['p50']:6.2f} "
                      f"({figures['p50_ci'][0]:.2f}-{figures['p50_ci'][1]:.2f})    {figures['p90']:6.2f}  "
                      f"{figures['p99']:6.2f} ({figures['p99_ci'][0]:.2f}-{figures['p99_ci'][1]:.2f})", flush=True)
        reference = {key: statistics.median(f[key] for f in per_rate["loadgen+plain"]) for key in ("p50", "p99")}
        for name, runs in per_rate.items():
            medians = {key: statistics.median(f[key] for f in runs) for key in ("p50", "p99")}
            ranges = {key: (min(f[key] for f in runs), max(f[key] for f in runs)) for key in ("p50", "p99")}
            print(f"  {rate:6g}  {name:16s}  median over runs: p50 {medians['p50']:.2f} ms (range "
                  f"{ranges['p50'][0]:.2f}-{ranges['p50'][1]:.2f}), p99 {medians['p99']:.2f} ms (range "
                  f"{ranges['p99'][0]:.2f}-{ranges['p99'][1]:.2f}); vs loadgen+plain: p50 "
                  f"{medians['p50'] - reference['p50']:+.2f} ms, p99 {medians['p99'] - reference['p99']:+.2f} ms")
        results[str(rate)] = per_rate
    return results


class ClockReader:
    """The GPU's SM clock (MHz) through NVML, where it can be read; None otherwise."""

    def __init__(self, device: str) -> None:
        self.handle = None
        if device != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception as error:  # no NVML binding here: clocks are not read
            print(f"  (SM clock not readable: {type(error).__name__}: {error})")

    def sm_mhz(self) -> int | None:
        if self.handle is None:
            return None
        return int(self._nvml.nvmlDeviceGetClockInfo(self.handle, self._nvml.NVML_CLOCK_SM))


def stalls(args: argparse.Namespace, module: Any, sample: Any) -> dict[str, Any]:
    """Each low rate twice: with the instance warmed up on its serving thread (what the benchmark stage does) and
    without (warmed up on the main thread only, as the stage did before): the first request a fresh thread serves
    pays for PyTorch's per-thread state (cuDNN/cuBLAS handles)."""
    import torch

    from trtflow_stages.measure.serving import loadgen
    from trtflow_stages.measure.serving.traffic import Server, steady_interpreter

    clock = ClockReader(args.device)
    stream = torch.cuda.Stream() if args.device == "cuda" else None
    records: list[dict[str, Any]] = []
    forward = (lambda: module(sample)) if not args.stall_graph else _graphed(module, sample, stream)

    def run(batch: int) -> None:
        record: dict[str, Any] = {"clock_mhz": clock.sm_mhz()}
        allocations = torch.cuda.memory_stats().get("num_device_alloc", 0) if stream is not None else 0
        start = time.monotonic_ns()
        with torch.inference_mode():
            if stream is None:
                module(sample)
            else:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(stream):
                    begin.record(stream)
                    forward()
                    end.record(stream)
                launched = time.monotonic_ns()
                stream.synchronize()
                record["gpu_ms"] = begin.elapsed_time(end)
                record["launch_ms"] = (launched - start) / 1e6
                record["cuda_mallocs"] = torch.cuda.memory_stats().get("num_device_alloc", 0) - allocations
        record["host_ms"] = (time.monotonic_ns() - start) / 1e6
        record["clock_after_mhz"] = clock.sm_mhz()
        records.append(record)

    results: dict[str, Any] = {}
    interval = [args.switch_interval_ms / 1e3] if args.switch_interval_ms else []
    print(f"\n== stalls at low rates: {args.model} on {args.device}, LoadGen Server, instrumented instance"
          f"{', CUDA graph replays' if args.stall_graph else ', eager'}, thread switch interval "
          f"{args.switch_interval_ms or 'trtflow default'} ms")
    for rate in args.stall_rates:
        for warmed in [mode == "warmed" for mode in args.stall_modes]:
            queries = max(int(rate * args.stall_seconds), 20)
            with steady_interpreter(*interval), Server([run], warm_sizes=[1] if warmed else ()) as server:
                records.clear()
                result = loadgen.run(server, loadgen.ScenarioSpec("Server", queries / rate, target_qps=rate,
                                                                  latency_budget_ms=20.0, min_query_count=queries))
            rows = [{**record, "index": index, "latency_ms": latency / 1e6,
                     "queue_ms": (request.dispatch_ns - request.arrival_ns) / 1e6}
                    for index, (request, record, latency) in
                    enumerate(zip(result.requests, records, result.settings["latencies_ns"], strict=False))]
            key = f"{rate:g}/s, {'warmed on its thread' if warmed else 'fresh thread'}"
            results[key] = _stall_summary(key, rows, result.settings["latencies_ns"])
    return results


def _graphed(module: Any, sample: Any, stream: Any) -> Any:
    """The module's forward captured in a CUDA graph (one launch a request instead of one a kernel)."""
    import torch

    if stream is None:
        raise SystemExit("--stall-graph needs --device cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode():
        with torch.cuda.stream(stream):
            for _ in range(3):
                module(sample)
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            module(sample)
    return graph.replay


def _stall_summary(key: str, rows: list[dict[str, Any]], latencies: list[int]) -> dict[str, Any]:
    service = statistics.median(r["host_ms"] for r in rows)
    gpu = statistics.median(r.get("gpu_ms", r["host_ms"]) for r in rows)
    launch = statistics.median(r.get("launch_ms", r["host_ms"]) for r in rows)
    clocks = [r["clock_mhz"] for r in rows if r.get("clock_mhz")]
    top_clock = max(clocks) if clocks else None
    causes: dict[str, int] = {}
    stalled = []
    for row in rows:
        if row["latency_ms"] <= 2 * service:
            continue
        if row["queue_ms"] > service:
            cause = "queued behind a slow request, or a late thread wake-up"
        elif row.get("cuda_mallocs"):
            cause = "allocator: cudaMalloc during the forward"
        elif row.get("launch_ms", 0) > 2 * launch and row.get("launch_ms", 0) >= 0.8 * row.get("gpu_ms", 0):
            cause = ("host: kernel launches slow on the first request of a fresh thread" if row["index"] == 0
                     else "host: kernel launches slow (the GPU waited for them)")
        elif "gpu_ms" in row and row["gpu_ms"] > 1.5 * gpu:
            slow_clock = top_clock and row.get("clock_mhz") and row["clock_mhz"] < 0.8 * top_clock
            cause = "GPU: SM clock below 80% of its highest (ramping up from idle)" if slow_clock \
                else "GPU: slower at full clock"
        elif "gpu_ms" not in row:
            cause = "host: the forward itself took longer (a CPU model)"
        else:
            cause = "host: after the kernels (synchronisation, completion)"
        causes[cause] = causes.get(cause, 0) + 1
        stalled.append(row)
    summary = _summary(latencies)
    print(f"  {key}: {len(rows)} requests, latency p50 {summary['p50']:.2f} ms p99 {summary['p99']:.2f} ms max "
          f"{summary['max']:.2f} ms; service median {service:.2f} ms (GPU {gpu:.2f}, launches {launch:.2f} ms); "
          f"SM clock at dispatch {min(clocks) if clocks else '-'}-{top_clock or '-'} MHz; stalls {len(stalled)}: "
          f"{causes}")
    for row in sorted(stalled, key=lambda r: -r["latency_ms"])[:4]:
        print("     " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    return {"rows": rows, "service_median_ms": service, "gpu_median_ms": gpu, "launch_median_ms": launch,
            "causes": causes, "latency": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", choices=sorted(SHAPES), default="resnet50")
    parser.add_argument("--sections", nargs="+", choices=["generators", "stalls"], default=["generators", "stalls"])
    parser.add_argument("--rates", type=float, nargs="+", default=[40.0, 100.0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stall-rates", type=float, nargs="+", default=[2.0, 5.0, 20.0])
    parser.add_argument("--stall-seconds", type=float, default=10.0)
    parser.add_argument("--stall-graph", action="store_true", help="replay the forward as a CUDA graph")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="Python's thread switch interval while timing (default: trtflow's)")
    parser.add_argument("--stall-modes", nargs="+", choices=["fresh", "warmed"], default=["fresh", "warmed"],
                        help="instances warmed on the main thread only (fresh) or on their serving thread (warmed)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("serving-results"))
    args = parser.parse_args()
    if args.quick:
        args.rates, args.duration, args.repeats, args.stall_rates, args.stall_seconds = [50.0], 1.0, 1, [5.0], 3.0
    args.out.mkdir(parents=True, exist_ok=True)
    module, sample = _model(args)
    run = _runner(module, sample, args.device)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    if "generators" in args.sections:
        results["generators"] = generators(args, run)
        (args.out / "serving_generators.json").write_text(json.dumps(results, indent=1, default=str))
    if "stalls" in args.sections:
        results["stalls"] = stalls(args, module, sample)
        (args.out / "serving_generators.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
