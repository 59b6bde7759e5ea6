"""Serving-style load through the benchmark stage: load curves, streams, dynamic batching, several GPUs.

Runs the real `benchmark` stage (in this process, through `trtflow.testing.run_stage`) with the PyTorch backend
and prints, side by side with what a user would measure instead (one stream timing fixed batches, as trtexec):

1. ``closed``: closed-loop concurrency levels on 1 and 2 streams (model instances): throughput and p50/p99;
2. ``curves``: closed-loop curves of single-sample requests without and with the dynamic batcher, and the
   highest throughput whose p99 meets a latency budget on each;
3. ``batching``: MLPerf's Server scenario (Poisson arrivals of single-sample requests, driven by LoadGen where it is
   installed), without and with the dynamic batcher; a search for the highest arrival rate that meets a p99 budget
   (LoadGen's verdict: VALID, the p99 within budget with confidence); repeated ``--runs`` times, with the spread;
4. ``scaling``: one replica process per GPU against one GPU at the same per-GPU concurrency (needs 2+ GPUs),
   repeated ``--runs`` times, with the spread of the efficiency;
5. ``scenarios``: MLPerf's Offline, SingleStream and MultiStream scenarios through LoadGen;
6. ``capacity``: the serving capacity (highest Server rate whose p99 meets the budget) as the stage reports it: the
   rate search with ``--duration`` levels ending in its confirmation (a staircase up and down a grid of
   ``--confirm-step`` percent, ``--confirm-s`` levels), ``--runs`` times; the same search with ``--long-level-s``
   levels and no confirmation; and an independent reference: LoadGen's Server scenario driving a plain SUT (a queue
   and one thread replaying the model as a CUDA graph, nothing of trtflow's server) for ``--reference-s`` a run,
   ``--reference-levels`` runs walked up (VALID) and down (INVALID) the same grid from the runs' median so far.

    python bench/serving_load.py --device cuda --model resnet50 --out results
    python bench/serving_load.py --device cpu --model tiny_cnn --quick      # try it on a CPU

The tables go to stdout and every measurement to --out/serving_load.json; bench/serving_load.md holds the
figures measured on an H100 and on two H200s.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
SHAPES = {"resnet50": [1, 3, 224, 224], "tiny_cnn": [1, 3, 32, 32]}


def run_benchmark(params: dict[str, Any], name: str) -> dict[str, Any]:
    from trtflow.testing import run_stage
    from trtflow_stages import benchmark

    started = time.perf_counter()
    began = time.strftime("%H:%M:%S", time.gmtime())
    workdir = Path(tempfile.mkdtemp(prefix=f"serving-{name}-"))
    result = run_stage(benchmark.stage, params, {}, workdir=workdir, recipe_dir=HERE)
    metrics = json.loads(result.outputs["metrics"].read_text())
    metrics["bench_wall_s"] = round(time.perf_counter() - started, 1)
    metrics["bench_started_utc"] = began
    return metrics


def base_params(args: argparse.Namespace) -> dict[str, Any]:
    return {"backend": "torch", "device": args.device, "torch_model": f"python:serving_models.py:{args.model}",
            "shapes": {"input": SHAPES[args.model]}, "warmup_ms": 200, "min_duration_s": 0.5 if args.quick else 1.0,
            "load_duration_s": args.duration, "load_warmup_s": 0.5, "load_generator": args.generator,
            **({"torch_cuda_graphs": True} if args.cuda_graphs else {})}


def spread(values: list[float]) -> str:
    """min / median / max and the range as a share of the median, of figures from repeated runs."""
    if not values:
        return "no figure"
    ordered = sorted(values)
    middle = statistics.median(ordered)
    return (f"min {ordered[0]:.4g}, median {middle:.4g}, max {ordered[-1]:.4g} (range "
            f"{(ordered[-1] - ordered[0]) / middle * 100:.1f}% of the median, {len(values)} runs)")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:8.2f}"


def fixed_batch_line(metrics: dict[str, Any]) -> str:
    point = metrics["points"][0]
    latency = point["report"]["latency_ms"]
    return (f"  trtexec-style, one stream, batch {point['batch_size']}: {point['report']['throughput_qps']:9.1f} "
            f"samples/s, p50 {latency['p50']:.2f} ms, p99 {latency['p99']:.2f} ms")


def closed(args: argparse.Namespace) -> dict[str, Any]:
    levels = [1, 2, 4] if args.quick else [1, 2, 4, 8, 16]
    metrics = run_benchmark({**base_params(args), "concurrency": levels, "streams": [1, 2]}, "closed")
    print(f"\n== closed loop: {args.model} on {args.device}, requests of 1 sample, no dynamic batching")
    print(fixed_batch_line(metrics))
    print("  streams  concurrency  samples/s   p50 ms   p99 ms")
    for point in metrics["load"]:
        latency = point["latency_ms"]
        print(f"  {point['streams']:7d}  {point['concurrency']:11d}  {point['throughput_qps']:9.1f}  "
              f"{_ms(latency['p50'])} {_ms(latency['p99'])}")
    return metrics


def batching(args: argparse.Namespace) -> dict[str, Any]:
    search = {"arrival_rate_qps": [args.start_rate], "latency_budget_ms": args.budget_ms,
              "rate_search_probes": 4 if args.quick else args.probes}
    configurations = (("no batching", None),
                      ("dynamic batching", {"max_batch_size": args.max_batch, "max_queue_delay_ms": args.delay_ms,
                                            "preferred_batch_sizes": [args.max_batch]}))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in configurations}
    for index in range(args.runs):
        for name, dynamic in configurations:  # interleaved: drift over time hits both configurations alike
            params = {**search, **base_params(args), "seed": index}
            if dynamic:
                params["dynamic_batching"] = dynamic
            runs[name].append(run_benchmark(params, f"{name.replace(' ', '_')}-{index}"))
            (top,) = runs[name][-1]["max_rate_meeting_budget"]
            levels = ", ".join(f"{p['arrival_rate_qps']:g}/s p99 {p['latency_ms']['p99']:.1f} ms "
                               f"{(p.get('loadgen') or {}).get('result_validity', '')}"
                               for p in runs[name][-1]["open_loop"])
            print(f"  run {index + 1}, {name}: highest rate meeting the budget {top['arrival_rate_qps']} "
                  f"({runs[name][-1]['bench_wall_s']} s; {levels})", flush=True)
    print(f"\n== Server scenario: {args.model} on {args.device}, Poisson arrivals of single samples, p99 budget "
          f"{args.budget_ms:g} ms, generator {runs['no batching'][0]['load_settings']['generator']}")
    print(fixed_batch_line(runs["no batching"][0]))
    print("  batcher           run  rate/s  samples/s   p50 ms   p99 ms  mean batch  late  verdict")
    best: dict[str, list[float]] = {name: [] for name in runs}
    for name, measured in runs.items():
        for index, metrics in enumerate(measured):
            for point in sorted(metrics["open_loop"], key=lambda p: p["arrival_rate_qps"]):
                latency = point["latency_ms"]
                verdict = (point.get("loadgen") or {}).get("result_validity") or (
                    "meets" if point.get("meets_budget") else "misses")
                print(f"  {name:17s} {index + 1:3d} {point['arrival_rate_qps']:7.1f}  {point['throughput_qps']:9.1f} "
                      f"{_ms(latency['p50'])} {_ms(latency['p99'])}  {point['mean_batch_size']:10.2f}  "
                      f"{point['late_requests']:4d}  {verdict}")
            (top,) = metrics["max_rate_meeting_budget"]
            if top["arrival_rate_qps"]:
                best[name].append(top["arrival_rate_qps"])
    for name, rates in best.items():
        print(f"  highest rate meeting the budget, {name}: {spread(rates)}; runs: "
              + ", ".join(f"{r:.1f}" for r in rates))
    gains = [b / p for p, b in zip(best["no batching"], best["dynamic batching"], strict=False) if p]
    if gains:
        print(f"  dynamic batching gain: {spread(gains)}")
    return {"runs": runs, "best_rates": best, "gains": gains}


def curves(args: argparse.Namespace) -> dict[str, Any]:
    """Closed-loop latency/throughput curves of single-sample requests, without and with the dynamic batcher:
    at full load the GPU stays busy (and its clocks up), so these are steadier than sparse open-loop arrivals."""
    levels = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32, 64]
    runs = {}
    for name, dynamic in (("no batching", None),
                          ("dynamic batching", {"max_batch_size": args.max_batch, "max_queue_delay_ms": args.delay_ms,
                                                "preferred_batch_sizes": [args.max_batch]})):
        params = {**base_params(args), "concurrency": levels, "request_size": 1}
        if dynamic:
            params["dynamic_batching"] = dynamic
        runs[name] = run_benchmark(params, "curve_" + name.replace(" ", "_"))
    print(f"\n== closed-loop curves: {args.model} on {args.device}, single-sample requests")
    print("  batcher           concurrency  samples/s   p50 ms   p99 ms  mean batch")
    best: dict[str, float | None] = {}
    for name, metrics in runs.items():
        for point in metrics["load"]:
            latency = point["latency_ms"]
            print(f"  {name:17s} {point['concurrency']:11d}  {point['throughput_qps']:9.1f} {_ms(latency['p50'])} "
                  f"{_ms(latency['p99'])}  {point['mean_batch_size']:10.2f}")
        within = [p["throughput_qps"] for p in metrics["load"] if p["latency_ms"]["p99"] <= args.budget_ms]
        best[name] = max(within) if within else None
    plain, batched = best["no batching"], best["dynamic batching"]
    print(f"  highest throughput with p99 <= {args.budget_ms:g} ms: no batching {plain or 0:.1f}, dynamic batching "
          f"{batched or 0:.1f} samples/s" + (f" -> x{batched / plain:.2f}" if plain and batched else ""))
    return {"runs": runs, "best_throughput_under_budget": best,
            "gain": batched / plain if plain and batched else None}


def scaling(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    import torch

    count = torch.cuda.device_count() if args.device == "cuda" else 0
    if count < 2:
        print("\n== scaling: skipped (fewer than 2 GPUs visible)")
        return None
    levels = [1, 4] if args.quick else [1, 4, 16]
    runs = []
    efficiencies: dict[int, list[float]] = {}
    for index in range(args.runs):
        metrics = run_benchmark({**base_params(args), "concurrency": levels, "gpus": "all"}, f"scaling{index}")
        runs.append(metrics)
        print(f"\n== scaling, run {index + 1}/{args.runs}: {args.model}, {metrics['load_settings']['gpus']} replica "
              f"processes (GPUs {metrics['load_settings']['devices']}), closed loop per GPU")
        print(f"  concurrency/GPU  1 GPU samples/s  {count} GPUs samples/s  efficiency  per GPU samples/s   "
              "service p50 ms (1 GPU / all)")
        service = {(p["gpus"], p.get("concurrency_per_gpu", p["concurrency"])): p["service_ms"]["p50"]
                   for p in metrics["load"]}
        per_gpu = {p["concurrency_per_gpu"]: p.get("throughput_qps_per_gpu") for p in metrics["load"]
                   if p["gpus"] == count}
        for row in metrics["scaling"]:
            level = row["concurrency_per_gpu"]
            efficiencies.setdefault(level, []).append(row["scaling_efficiency"] * 100)
            shares = ", ".join(f"{q:.1f}" for q in per_gpu.get(level) or [])
            print(f"  {level:15d}  {row['throughput_qps_1gpu']:15.1f}  {row['throughput_qps']:16.1f}  "
                  f"{row['scaling_efficiency']:10.1%}  {shares:>17s}   {service[(1, level)]:.2f} / "
                  f"{service[(count, level)]:.2f}")
    for level, values in sorted(efficiencies.items()):
        print(f"  scaling efficiency at concurrency {level}/GPU (%): {spread(values)}")
    return runs


def scenarios(args: argparse.Namespace) -> dict[str, Any]:
    """MLPerf's Offline (with the dynamic batcher), SingleStream and MultiStream scenarios through LoadGen."""
    params = {**base_params(args), "scenarios": ["Offline", "SingleStream", "MultiStream"],
              "dynamic_batching": {"max_batch_size": args.max_batch, "max_queue_delay_ms": args.delay_ms,
                                   "preferred_batch_sizes": [args.max_batch]}, "load_generator": "loadgen"}
    metrics = run_benchmark(params, "scenarios")
    print(f"\n== MLPerf scenarios through LoadGen: {args.model} on {args.device}")
    print("  scenario      valid  queries  samples/s   p50 ms  p90 ms   p99 ms  (95% interval of p99)  LoadGen")
    for entry in metrics["scenarios"]:
        latency, interval = entry["latency_ms"], entry["latency_ci_ms"]["p99"]
        verdict = entry["loadgen"]
        figure = verdict.get("early_stopping_result") or verdict.get("result_invalid_reason") or ""
        print(f"  {entry['scenario']:12s}  {'yes' if entry['valid'] else 'NO ':5s}  {entry['queries']:7d}  "
              f"{entry['throughput_qps']:9.1f} {_ms(latency['p50'])} {_ms(latency['p90'])} {_ms(latency['p99'])}  "
              f"({interval[0]:.2f}-{interval[1]:.2f})  {figure[:90]}")
    return metrics


def _capacity_of(metrics: dict[str, Any]) -> dict[str, Any]:
    (top,) = metrics["max_rate_meeting_budget"]
    return top


def _capacity_line(label: str, metrics: dict[str, Any]) -> str:
    top = _capacity_of(metrics)
    searched = [p for p in metrics["open_loop"] if not p.get("confirmation")]
    confirmations = [p for p in metrics["open_loop"] if p.get("confirmation")]
    levels = ", ".join(f"{p['arrival_rate_qps']:g}/s {'ok' if p.get('meets_budget') else 'miss'}" for p in searched)
    confirmed = ", ".join(f"{p['arrival_rate_qps']:.1f}/s {p['duration_s']:g} s: p99 {p['latency_ms']['p99']:.1f} ms "
                          f"(bound {(p.get('latency_ci_ms') or {}).get('p99', [0, p['latency_ms']['p99']])[1]:.1f}), "
                          f"{p['late_requests']}/{p['queries']} late, service p50 {p['service_ms']['p50']:.3f} ms, "
                          f"{'VALID' if p.get('meets_budget') else 'INVALID'}" for p in confirmations)
    confirmation = top.get("confirmation") or {}
    pooled = ", ".join(f"{row['rate_qps']:g}/s x{row['levels']}: median p99 {row.get('median_p99_ms')} ms, fitted "
                       f"{row.get('fitted_p99_ms')} ms {'meets' if row['meets_budget'] else 'misses'}, "
                       f"{row['late_requests']}/{row['queries']} late (pooled LoadGen rule: "
                       f"{'VALID' if row.get('pooled_meets_budget') else 'INVALID'})"
                       for row in confirmation.get("pooled") or [])
    return (f"  {label}: capacity {top['arrival_rate_qps']} (90% interval {top.get('interval_qps')}, between "
            f"{confirmation.get('meets_qps')} and {confirmation.get('miss_above_qps')}; settled {top.get('settled')}, "
            f"search {top['search_rate_qps']}, bracket {top['bracket_qps']}, search levels {top['level_s']:g} s, "
            f"confirmation levels {top.get('confirm_level_s')} s x {confirmation.get('levels')}; "
            f"{metrics['bench_wall_s']} s from {metrics.get('bench_started_utc')} UTC)\n"
            f"    search: {levels}\n" + (f"    confirmation: {confirmed}\n    per rate: {pooled}" if confirmed
                                          else "    no confirmation"))


def _plain_loadgen_verdict(run: Any, rate: float, duration: float, budget_ms: float, seed: int) -> dict[str, Any]:
    """LoadGen's Server scenario at ``rate`` driving a plain SUT (a queue and one worker thread): its verdict."""
    import tempfile

    import mlperf_loadgen as lg

    from trtflow_stages.measure.serving.loadgen import early_stopping_queries, read_detail, read_trace

    work: queue.Queue = queue.Queue()
    ready = threading.Event()

    def worker() -> None:
        for _ in range(3):
            run()
        ready.set()
        while (item := work.get()) is not None:
            run()
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
    settings.server_target_latency_ns = int(budget_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_duration_ms = int(duration * 1000)
    settings.min_query_count = early_stopping_queries(0.99)
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
        detail = read_detail(Path(folder) / "mlperf_log_detail.txt")
        latencies, _ = read_trace(Path(folder) / "mlperf_log_trace.json")
    work.put(None)
    thread.join()
    ordered = sorted(v / 1e6 for v in latencies)
    return {"rate": rate, "duration_s": duration, "valid": detail.get("result_validity") == "VALID",
            "queries": len(ordered), "p99_ms": ordered[int(0.99 * (len(ordered) - 1))] if ordered else None,
            "overlatency": detail.get("result_overlatency_query_count"),
            "early_stopping": detail.get("early_stopping_result")}


def _graph_replay(args: argparse.Namespace) -> Any:
    """The model's forward as one CUDA graph replayed on its own stream (or eager on a CPU), synchronised."""
    import serving_models
    import torch

    module = getattr(serving_models, args.model)().to(args.device).eval()
    sample = torch.randn(*SHAPES[args.model], device=args.device)
    if args.device != "cuda":
        def eager() -> None:
            with torch.inference_mode():
                module(sample)
        return eager
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(3):
            module(sample)
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            module(sample)
    stream.synchronize()

    def replay() -> None:
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()

    return replay


def capacity(args: argparse.Namespace) -> dict[str, Any]:
    """The capacity with short levels and a confirmation (``--runs`` times), with long levels, and LoadGen's
    verdicts on a plain SUT around it; interleaved, and saved after each step (a call cut short keeps them)."""
    search = {"arrival_rate_qps": [args.start_rate], "latency_budget_ms": args.budget_ms,
              "rate_search_probes": args.probes, "min_duration_s": 0.3, "warmup_ms": 100}
    results: dict[str, Any] = {"short": [], "long": None, "long_runs": [], "reference": []}
    out = args.out / "capacity.json"

    def save() -> None:
        out.write_text(json.dumps(results, indent=1, default=str))

    def short(index: int) -> None:
        params = {**base_params(args), **search, "seed": index, "confirm_duration_s": args.confirm_s,
                  "confirm_steps": args.confirm_steps, "confirm_visits": args.confirm_visits,
                  "confirm_step_percent": args.confirm_step}
        metrics = run_benchmark(params, f"capacity-short-{index}")
        results["short"].append(metrics)
        print(_capacity_line(f"run {index + 1}, {args.duration:g} s levels + confirmation", metrics), flush=True)
        save()

    def long(index: int = 0) -> None:
        params = {**base_params(args), **search, "load_duration_s": args.long_level_s, "confirm_duration_s": 0,
                  "seed": 100 + index}
        results["long_runs"].append(run_benchmark(params, f"capacity-long-{index}"))
        results["long"] = results["long_runs"][0]
        print(_capacity_line(f"{args.long_level_s:g} s levels, no confirmation, run {index + 1}",
                             results["long_runs"][-1]), flush=True)
        save()

    def reference() -> None:
        """LoadGen on a plain SUT, its own verdict per run, walked up (VALID) and down (INVALID) on the stage's
        grid from the runs' median so far; its capacity: the highest VALID rate below the lowest INVALID one."""
        from trtflow_stages.measure.serving.traffic import grid_index, grid_rate

        done = [r for r in (_capacity_of(m)["arrival_rate_qps"] for m in results["short"]) if r]
        if args.reference_rates:
            rates = list(args.reference_rates)
            index = None
        elif done:
            index = grid_index(statistics.median(done), args.confirm_step)
            rates = []
        else:
            print("  reference: skipped (no confirmed rate to center it on)")
            return
        run = _graph_replay(args)
        for level in range(len(rates) if rates else args.reference_levels):
            rate = rates[level] if rates else grid_rate(index, args.confirm_step)
            verdict = _plain_loadgen_verdict(run, rate, args.reference_s, args.budget_ms, level)
            results["reference"].append(verdict)
            print(f"  LoadGen + plain SUT at {verdict['rate']:g}/s for {args.reference_s:g} s: "
                  f"{'VALID' if verdict['valid'] else 'INVALID'}, p99 {verdict['p99_ms']:.2f} ms, "
                  f"{verdict['queries']} queries, {verdict['overlatency']} over {args.budget_ms:g} ms", flush=True)
            save()
            if index is not None:
                index += 1 if verdict["valid"] else -1

    print(f"\n== serving capacity: {args.model} on {args.device}, p99 budget {args.budget_ms:g} ms, "
          f"{'CUDA graphs' if args.cuda_graphs else 'eager'}, no batching")
    parts = set(args.capacity_parts)
    shorts = [lambda i=i: short(i) for i in range(args.runs)] if "short" in parts else []
    longs = [lambda i=i: long(i) for i in range(args.long_runs)] if "long" in parts else []
    # interleaved (drift over the call hits every configuration alike); the reference after two short runs
    order = [*shorts[:1], *longs[:1], *shorts[1:2], *([reference] if "reference" in parts else []), *shorts[2:],
             *longs[1:]]
    for step in order:
        try:
            step()
        except Exception:  # one failed step costs its figure, not the call's others
            traceback.print_exc()
    rates = [_capacity_of(m)["arrival_rate_qps"] for m in results["short"]]
    confirmed = [r for r in rates if r]
    print(f"  capacity with {args.duration:g} s levels + confirmation: {spread(confirmed)}; runs: {rates}")
    long_rates = [_capacity_of(m)["arrival_rate_qps"] for m in results["long_runs"]]
    if long_rates:
        print(f"  capacity with {args.long_level_s:g} s levels: {spread([r for r in long_rates if r])}")
    if long_rates and confirmed:
        long_rate = statistics.median(r for r in long_rates if r)
        print(f"  against the {args.long_level_s:g} s levels' median ({long_rate}): "
              + ", ".join(f"{r / long_rate - 1:+.1%}" for r in confirmed))
    valid = [v["rate"] for v in results["reference"] if v["valid"]]
    invalid = [v["rate"] for v in results["reference"] if not v["valid"]]
    lowest_invalid = min(invalid) if invalid else None
    below = [r for r in valid if lowest_invalid is None or r < lowest_invalid]
    loadgen_capacity = max(below) if below else None
    if loadgen_capacity and confirmed:
        print(f"  LoadGen + plain SUT: VALID at {sorted(valid)}, INVALID at {sorted(invalid)}; its capacity (highest "
              f"VALID below the lowest INVALID) {loadgen_capacity:g}; runs against it: "
              + ", ".join(f"{r / loadgen_capacity - 1:+.1%}" for r in confirmed))
    results["capacity"] = {"short": rates, "long": long_rates, "reference_valid": valid,
                           "loadgen_capacity": loadgen_capacity,
                           "reference_invalid": [v["rate"] for v in results["reference"] if not v["valid"]]}
    save()
    return results["capacity"]


SECTIONS = {"closed": closed, "curves": curves, "batching": batching, "scaling": scaling, "scenarios": scenarios,
            "capacity": capacity}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", choices=sorted(SHAPES), default="resnet50")
    parser.add_argument("--sections", nargs="+", choices=sorted(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per load level")
    parser.add_argument("--budget-ms", type=float, default=20.0, help="p99 latency budget")
    parser.add_argument("--start-rate", type=float, default=50.0, help="first arrival rate of the search")
    parser.add_argument("--probes", type=int, default=8, help="search probes after the first rate")
    parser.add_argument("--max-batch", type=int, default=32, help="dynamic batching max_batch_size")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="dynamic batching max_queue_delay_ms")
    parser.add_argument("--runs", type=int, default=3, help="repeat the batching and scaling sections")
    parser.add_argument("--generator", choices=["auto", "loadgen", "trtflow"], default="auto",
                        help="what drives the Server levels (benchmark param load_generator)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="serve CUDA graph replays of the model (benchmark param torch_cuda_graphs)")
    parser.add_argument("--confirm-s", type=float, default=10.0, help="capacity: confirm_duration_s of the stage")
    parser.add_argument("--confirm-steps", type=int, default=7, help="capacity: confirm_steps of the stage")
    parser.add_argument("--confirm-visits", type=int, default=2, help="capacity: confirm_visits of the stage")
    parser.add_argument("--confirm-step", type=float, default=2.5, help="capacity: confirm_step_percent")
    parser.add_argument("--reference-levels", type=int, default=5, help="capacity: LoadGen reference runs")
    parser.add_argument("--long-level-s", type=float, default=10.0, help="capacity: level length of the long search")
    parser.add_argument("--reference-s", type=float, default=12.0, help="capacity: seconds per LoadGen reference run")
    parser.add_argument("--reference-rates", type=float, nargs="*", default=[],
                        help="capacity: the reference's rates (default: 0.9, 1 and 1.1 x the first run's capacity)")
    parser.add_argument("--long-runs", type=int, default=1, help="capacity: searches with --long-level-s levels")
    parser.add_argument("--capacity-parts", nargs="+", choices=["short", "long", "reference"],
                        default=["short", "long", "reference"], help="capacity: which parts to run")
    parser.add_argument("--quick", action="store_true", help="fewer levels and probes (a trial run)")
    parser.add_argument("--out", type=Path, default=Path("serving-results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    try:
        import torch

        results["torch"] = torch.__version__
        if args.device == "cuda":
            results["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            print(f"torch {torch.__version__}, GPUs: {results['gpus']}")
    except ImportError:
        pass
    failed = []
    for section in args.sections:
        try:
            results[section] = SECTIONS[section](args)
        except Exception:  # report it and go on with the other sections
            traceback.print_exc()
            failed.append(section)
        (args.out / "serving_load.json").write_text(json.dumps(results, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
