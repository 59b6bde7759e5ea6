"""Check trtflow's cuda-python timing harness against PyTorch's own CUDA-event timing, without TensorRT.

Workload: a PyTorch CUDA graph of a few matrix products (captured with ``torch.cuda.graph``). The same graph
is timed twice on one stream:
  1. by our harness (``stages/measure/timing/cuda_timing.py``): enqueue = ``graph.replay()`` on the harness's stream,
     trtexec's loop (time-based warm-up, two queries in flight, CUDA events around each enqueue);
  2. by ``torch.cuda.Event`` pairs around each replay, enqueued back to back, one synchronize at the end.
Both sets of per-replay GPU times are summarised with the same trtexec percentile rule; the ratio of the
medians should be within 2% of 1. Separate runs (the harness's loop against torch events around back-to-back
replays, interleaved in rounds) agree when the median of the rounds' ratios is within 2% of 1 or not significantly
different from 1: an unlocked GPU's speed itself moves by several percent from one run to the next.

Then it exercises the rest of the harness on the GPU and checks the results: capturing eager PyTorch work
into a CUDA graph with cuda-python (and comparing its output), host transfers through pinned buffers, two
streams, and blocking-sync events.

Run on a machine with a CUDA GPU, PyTorch and cuda-python (no TensorRT, no pydantic needed):
    python bench/cuda_harness_check.py [--size 4096 --matmuls 4 --duration 2]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _load_harness():
    """Import the harness (stages/measure/timing/cuda_timing.py), its statistics and cuda helpers as trtflow_stages.*
    even where trtflow is not installed."""
    names = ("trtflow_stages.measure.timing.cuda_timing", "trtflow_stages.measure.statistics.stats",
             "trtflow_stages.runtimes.cuda")
    try:
        return tuple(importlib.import_module(name) for name in names)
    except ImportError:
        stages = REPO / "stages"
        spec = importlib.util.spec_from_file_location(
            "trtflow_stages", stages / "__init__.py", submodule_search_locations=[str(stages)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules["trtflow_stages"] = package
        spec.loader.exec_module(package)
        return tuple(importlib.import_module(name) for name in names)


def _bootstrap_median(values: list[float]) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``values`` (seeded; numpy only)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(data, size=(4000, data.size), replace=True), axis=1)
    return float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="square matrix size")
    parser.add_argument("--matmuls", type=int, default=4, help="matrix products per graph replay")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds timed per configuration")
    parser.add_argument("--warmup-ms", type=float, default=200.0)
    args = parser.parse_args()

    import torch

    timing, stats, cuda = _load_harness()
    reason = cuda.cuda_unavailable_reason()
    if reason or not torch.cuda.is_available():
        print(f"cannot run: {reason or 'torch sees no CUDA device'}")
        return 3
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    results: dict = {"device": torch.cuda.get_device_name(), "size": args.size, "matmuls": args.matmuls}
    failures: list[str] = []

    dtype = torch.bfloat16
    torch.manual_seed(0)
    a = torch.randn(args.size, args.size, device="cuda", dtype=dtype) / args.size**0.5
    weights = [torch.randn(args.size, args.size, device="cuda", dtype=dtype) / args.size**0.5
               for _ in range(args.matmuls)]

    def chain(x: torch.Tensor, out: list[torch.Tensor] | None = None) -> torch.Tensor:
        for i, w in enumerate(weights):
            x = torch.matmul(x, w, out=out[i]) if out is not None else x @ w
        return x

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            chain(a)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = chain(a)
    torch.cuda.synchronize()

    with timing.CudaTimer(device=torch.cuda.current_device()) as timer:
        stream_ptr = timer.new_stream()
        ext = torch.cuda.ExternalStream(stream_ptr)

        # The torch stream stays ``ext`` while timing, so an enqueue is just ``graph.replay()``.
        torch.cuda.set_stream(ext)

        def replay(_stream: int) -> bool:
            graph.replay()
            return True

        def describe(name: str, summary: dict) -> str:
            return (f"  {name:<14}: median {summary['median']:.4f} ms  p99 {summary['p99']:.4f} ms  "
                    f"mean {summary['mean']:.4f} ms  cv {summary['cv_percent']:.2f}%")

        title = f"{args.matmuls} x bf16 {args.size}^3 matmuls"

        # 1. the same replays timed by both: torch events recorded inside our enqueue, our events around it
        torch_pairs: list[tuple] = []

        def replay_with_torch_events(_stream: int) -> bool:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(ext)
            graph.replay()
            end.record(ext)
            torch_pairs.append((start, end))
            return True

        options = timing.TimingOptions(warmup_ms=args.warmup_ms, min_iterations=200,
                                       min_duration_s=args.duration, spin_wait=True)
        run = timer.time([timing.StreamWork(stream_ptr, replay_with_torch_events)], options)
        torch.cuda.synchronize()
        assert len(torch_pairs) == len(run.trace), (len(torch_pairs), len(run.trace))
        kept = [i for i, t in enumerate(run.trace) if t.compute_start >= options.warmup_ms]
        same_ours = stats.summarize([run.trace[i].compute for i in kept])
        same_torch = stats.summarize([torch_pairs[i][0].elapsed_time(torch_pairs[i][1]) for i in kept])
        same_ratio = same_ours["median"] / same_torch["median"]
        print(f"\n[1. same replays, both timers; {title}] {len(kept)} timed queries")
        print(describe("harness", same_ours))
        print(describe("torch events", same_torch))
        print(f"  ratio harness/torch: median {same_ratio:.4f}  p99 {same_ours['p99'] / same_torch['p99']:.4f}")
        results["same_replays"] = {"harness": same_ours, "torch": same_torch, "ratio_median": same_ratio}
        # Our events bracket torch's event records, whose host cost (~10 us) starves the GPU when a replay
        # is that short; so this check gates only replays well above launch cost. Section 2 gates all.
        if same_torch["median"] >= 0.2 and abs(same_ratio - 1) > 0.02:
            failures.append(f"same replays: median ratio {same_ratio:.4f} is not within 2% of 1")

        # 2. separate runs, interleaved in rounds so clock and thermal drift hit both alike:
        #    our harness loop vs torch events around back-to-back replays (one synchronize at the end).
        #    Which one goes first alternates from round to round (the GPU heats up and its clocks sag within a
        #    round: whatever runs second in every round would look slower), and the verdict is the median of the
        #    per-round ratios, with a bootstrap interval over the rounds.
        rounds = 6
        ours_times: list[float] = []
        torch_times: list[float] = []
        reports = []
        round_ratios = []

        def ours_round() -> list[float]:
            options = timing.TimingOptions(warmup_ms=args.warmup_ms, min_iterations=200,
                                           min_duration_s=args.duration / rounds, spin_wait=True)
            run = timer.time([timing.StreamWork(stream_ptr, replay)], options)
            reports.append(stats.report_trace(run.trace, options.warmup_ms, batch_size=1))
            return [t.compute for t in run.trace if t.compute_start >= options.warmup_ms]

        def torch_round(count: int) -> list[float]:
            for _ in range(20):
                graph.replay()
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(count)]
            for start, end in pairs:
                start.record(ext)
                graph.replay()
                end.record(ext)
            torch.cuda.synchronize()
            return [start.elapsed_time(end) for start, end in pairs]

        for index in range(rounds):
            if index % 2 == 0:
                mine = ours_round()
                theirs = torch_round(len(mine))
            else:
                theirs = torch_round(max(len(ours_times) // max(index, 1), 200))
                mine = ours_round()
            ours_times += mine
            torch_times += theirs
            round_ratios.append(stats.summarize(mine)["median"] / stats.summarize(theirs)["median"])
        ours = stats.summarize(ours_times)
        reference = stats.summarize(torch_times)
        ratio_median = stats.median(sorted(round_ratios))
        ratio_p99 = ours["p99"] / reference["p99"]
        spread = _bootstrap_median(round_ratios)
        print(f"\n[2. separate runs, {rounds} interleaved rounds, order alternating; {title}] {len(ours_times)} "
              "timed queries each")
        print(describe("harness", ours))
        print(describe("torch events", reference))
        print(f"  per-round median ratios harness/torch: {', '.join(f'{r:.4f}' for r in round_ratios)}")
        print(f"  median of the rounds' ratios {ratio_median:.4f} (95% interval {spread[0]:.4f}-{spread[1]:.4f}); "
              f"pooled p99 ratio {ratio_p99:.4f}")
        last = reports[-1]
        print(f"  harness report (last round): enqueue median {last['enqueue_ms']['median']:.4f} ms  "
              f"throughput {last['throughput_qps']:.1f} qps  flags {last['flags']}")
        results["separate_runs"] = {"harness": ours, "torch": reference, "ratio_median": ratio_median,
                                    "round_ratios": round_ratios, "ratio_interval": spread,
                                    "ratio_p99": ratio_p99, "last_report": last}
        # The GPU's own speed moves between separate runs (boost clocks follow power and temperature: the rounds'
        # ratios above spread by several percent on an H100 whose clocks cannot be locked here), so two separate
        # runs cannot be asked to agree within 2% each time. The criterion: the median ratio within 2% of 1, or
        # else no significant difference (its 95% interval over the rounds contains 1). The harness's own
        # accuracy is checked within 2% on the same replays (section 1).
        if abs(ratio_median - 1) > 0.02 and not spread[0] <= 1.0 <= spread[1]:
            failures.append(f"separate runs: median ratio {ratio_median:.4f} is not within 2% of 1, and its 95% "
                            f"interval {spread[0]:.4f}-{spread[1]:.4f} excludes 1")
        elif abs(ratio_median - 1) > 0.02:
            print(f"  separate runs: median ratio {ratio_median:.4f} is {abs(ratio_median - 1) * 100:.1f}% from 1, "
                  "within the GPU's run-to-run drift (its interval contains 1): no significant difference")
        ours = last

        # 3. our own CUDA graph capture of eager PyTorch work on the harness stream
        outs = [torch.empty_like(a) for _ in weights]

        def eager(_stream: int) -> bool:
            chain(a, outs)
            return True

        captured = timer.time([timing.StreamWork(stream_ptr, eager)],
                              timing.TimingOptions(warmup_ms=args.warmup_ms, min_iterations=100,
                                                   min_duration_s=args.duration / 2, use_cuda_graph=True))
        outs[-1].zero_()
        torch.cuda.synchronize()
        if captured.cuda_graph[0]:
            launch, _ = timer.capture_graph(eager, stream_ptr)
            outs[-1].zero_()
            torch.cuda.synchronize()
            launch(stream_ptr)
            timer.synchronize(stream_ptr)
        same = bool(torch.equal(outs[-1], graph_out))
        capture = stats.report_trace(captured.trace, args.warmup_ms, 1)
        print(f"\n[cuda-python graph capture of eager matmuls] captured={captured.cuda_graph[0]} "
              f"failures={captured.graph_failures} output matches torch graph: {same}")
        print(f"  median {capture['gpu_compute_ms']['median']:.4f} ms  enqueue median "
              f"{capture['enqueue_ms']['median']:.4f} ms")
        results["own_capture"] = {"captured": captured.cuda_graph[0], "matches": same, "report": capture}
        if not (captured.cuda_graph[0] and same):
            failures.append("own CUDA graph capture failed or gave a different result")

        # 4. host transfers through pinned buffers, result checked
        host_in = timer.pinned_array((args.size, args.size), "uint16")
        host_out = timer.pinned_array((args.size, args.size), "uint16")
        source = a.clone()
        host_in[...] = source.view(torch.uint16).cpu().numpy()
        nbytes = a.numel() * a.element_size()
        work = timing.StreamWork(stream_ptr, replay,
                                 h2d=[timing.Copy(a.data_ptr(), int(host_in.ctypes.data), nbytes)],
                                 d2h=[timing.Copy(int(host_out.ctypes.data), graph_out.data_ptr(), nbytes)])
        transfers = timer.time([work], timing.TimingOptions(warmup_ms=args.warmup_ms, min_iterations=50,
                                                            min_duration_s=args.duration / 2,
                                                            include_host_transfers=True))
        transfer_report = stats.report_trace(transfers.trace, args.warmup_ms, 1)
        expected = graph_out.view(torch.uint16).cpu().numpy()
        transfer_ok = bool((host_out == expected).all())
        print(f"\n[with host transfers, {nbytes / 2**20:.0f} MiB each way] h2d median "
              f"{transfer_report['h2d_ms']['median']:.4f} ms  compute median "
              f"{transfer_report['gpu_compute_ms']['median']:.4f} ms  d2h median "
              f"{transfer_report['d2h_ms']['median']:.4f} ms  latency median "
              f"{transfer_report['latency_ms']['median']:.4f} ms  flags {transfer_report['flags']}  "
              f"output copied back correctly: {transfer_ok}")
        results["transfers"] = {"report": transfer_report, "output_ok": transfer_ok}
        if not transfer_ok or transfer_report["h2d_ms"]["median"] <= 0:
            failures.append("host-transfer timing did not copy the data or timed no transfer")

        # 5. two streams (two independent graph replays) and blocking-sync events
        second_ptr = timer.new_stream()
        second_ext = torch.cuda.ExternalStream(second_ptr)
        b = torch.randn_like(a)
        torch.cuda.set_stream(torch.cuda.default_stream())
        graph2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph2):
            chain(b)
        torch.cuda.synchronize()
        torch.cuda.set_stream(ext)

        def replay2(_stream: int) -> bool:
            torch.cuda.set_stream(second_ext)
            graph2.replay()
            torch.cuda.set_stream(ext)
            return True

        multi = timer.time([timing.StreamWork(stream_ptr, replay), timing.StreamWork(second_ptr, replay2)],
                           timing.TimingOptions(warmup_ms=args.warmup_ms, min_iterations=100,
                                                min_duration_s=args.duration / 2, spin_wait=False))
        multi_report = stats.report_trace(multi.trace, args.warmup_ms, 1, streams=2)
        print(f"\n[2 streams, blocking-sync events] throughput {multi_report['throughput_qps']:.1f} qps "
              f"(1 stream: {ours['throughput_qps']:.1f} qps)  flags {multi_report['flags']}")
        results["two_streams"] = multi_report
        per_stream = {t.stream for t in multi.trace}
        if per_stream != {0, 1}:
            failures.append(f"two-stream run recorded streams {sorted(per_stream)}")

        torch.cuda.set_stream(torch.cuda.default_stream())
        torch.cuda.synchronize()

    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "cuda_harness_check.json").write_text(json.dumps(results, indent=2))
    print("\nRESULT:", "PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
