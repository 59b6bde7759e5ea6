"""Fixed-batch benchmark points (trtexec's method), timed in windows until precise enough (`measure.windows`).

- `engine_point`: an engine through the cuda-python harness (`measure.cuda_timing`): one execution context and
  stream per ``streams`` (as trtexec --streams), optional CUDA graph, spin-wait, host transfers through pinned
  buffers; each window is one run of the harness's loop, the first after the time-based warm-up;
- `host_points`: callables (ONNX Runtime, eager PyTorch; one per batch size) on the host clock, or with CUDA
  events for PyTorch on a GPU, timed in turns.

Each returns the point's report: trtexec's statistics over every timed query (`measure.stats`), their 95%
intervals (`measure.intervals`), the windows' own figures, whether it converged, and what else ran on the host
meanwhile (`measure.interference`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .ab import Pairing
from .interference import HostWatch, busy_warning, thread_wait_ns
from .intervals import Window, uncertainty
from .stats import QueryTiming, kept_queries, report_traces, trace_wall_ms
from .windows import (
    TimeWindow,
    WindowPlan,
    add_uncertainty,
    assessor,
    cuda_event_window,
    host_window,
    measure_interleaved,
    measure_windows,
    report_windows,
    windows_record,
)


@dataclass(frozen=True)
class PointSettings:
    plan: WindowPlan
    warmup_ms: float = 200.0
    unstable_cv_percent: float = 2.5
    device: str = "cpu"
    spin_wait: bool = True
    use_cuda_graph: bool = True
    include_host_transfers: bool = False


def _with_host(report: dict[str, Any], host: dict[str, Any], device: str) -> dict[str, Any]:
    report["host"] = dict(host)
    warning = busy_warning(report["host"], device)
    if warning is not None:
        report["warnings"].append(warning)
        report["flags"] = sorted({w["flag"] for w in report["warnings"]})
    return report


def host_points(calls: Sequence[Callable[[], Any]], batch_sizes: Sequence[int], settings: PointSettings,
                cuda_events: bool = False, pairings: Mapping[int, Pairing] | None = None) -> list[dict[str, Any]]:
    """Points of ``calls`` (each one query of its ``batch_sizes`` samples) on the host clock, or with CUDA events,
    timed in turns (`measure.windows.measure_interleaved`); what else ran is watched over them all. ``pairings``:
    points timed in pairs with a reference (`measure.ab`)."""
    watch = HostWatch()
    measured = measure_interleaved([host_timer(call, settings, cuda_events) for call in calls], settings.plan,
                                   [assessor(batch, settings.plan.precision) for batch in batch_sizes], pairings)
    reports = [report_windows(windows, batch, settings.unstable_cv_percent, settings.device, settings.plan, unmet)
               for (windows, unmet), batch in zip(measured, batch_sizes, strict=True)]
    host = watch.report()
    return [_with_host(report, host, settings.device) for report in reports]


def host_timer(call: Callable[[], Any], settings: PointSettings, cuda_events: bool = False) -> TimeWindow:
    """Windows of ``call`` on the host clock, or with CUDA events around each call (PyTorch on a GPU)."""
    return (cuda_event_window if cuda_events else host_window)(call, settings.warmup_ms)


def engine_point(session: Any, feed: Mapping[str, Any], batch: int, streams: int, settings: PointSettings,
                 timer_factory: Callable[[], Any]) -> dict[str, Any]:
    """A point of an engine with the cuda-python harness: one execution context and stream per ``streams``."""
    import numpy as np

    from .cuda_timing import Copy, StreamWork, TimingOptions

    watch = HostWatch()
    plan = settings.plan
    sessions = [session] + [session.fork().__enter__() for _ in range(streams - 1)]
    traces: list[list[QueryTiming]] = []
    skipped = 0
    graphs: list[bool] = []
    failures: list[str] = []
    try:
        with timer_factory() as timer:
            work = []
            for each in sessions:
                tensors = each.prepare(feed)
                h2d, d2h = [], []
                if settings.include_host_transfers:
                    for tensor in tensors:
                        host = timer.pinned_array((tensor.nbytes,), "uint8")
                        if tensor.is_input:
                            host[...] = np.frombuffer(np.ascontiguousarray(feed[tensor.name]).tobytes(),
                                                      dtype=np.uint8)
                            h2d.append(Copy(tensor.device_ptr, int(host.ctypes.data), tensor.nbytes))
                        else:
                            d2h.append(Copy(int(host.ctypes.data), tensor.device_ptr, tensor.nbytes))
                work.append(StreamWork(timer.new_stream(), each.enqueue, h2d, d2h))

            def window(seconds: float, index: int) -> Window:
                nonlocal skipped, graphs, failures
                warmup = settings.warmup_ms if index == 0 else 0.0
                options = TimingOptions(warmup_ms=warmup, min_iterations=math.ceil(plan.min_iterations / plan.repeats),
                                        min_duration_s=seconds, spin_wait=settings.spin_wait,
                                        use_cuda_graph=settings.use_cuda_graph,
                                        include_host_transfers=settings.include_host_transfers)
                wait_before = thread_wait_ns()
                run = timer.time(work, options)
                wait_after = thread_wait_ns()
                timed = kept_queries(run.trace, warmup)
                skipped += len(run.trace) - len(timed)
                traces.append(timed)
                if index == 0:
                    graphs, failures = list(run.cuda_graph), list(run.graph_failures)
                waited = None if wait_before is None or wait_after is None else (wait_after - wait_before) / 1e6
                return Window([t.latency for t in timed], trace_wall_ms(timed), waited)

            windows, unmet = measure_windows(window, plan, assessor(batch, plan.precision))
    finally:
        for extra in sessions[1:]:
            extra.__exit__(None, None, None)
    report = report_traces(traces, skipped, batch, streams, unstable_cv_percent=settings.unstable_cv_percent)
    found = uncertainty(windows, report["latency_ms"], report["throughput_qps"], batch)
    add_uncertainty(report, found, unmet, plan, windows_record(windows, batch))
    report["cuda_graph"] = all(graphs)
    report["cuda_graph_failures"] = failures
    for failure in failures:
        report["warnings"].append({"flag": "no-cuda-graph", "message": failure})
    report["flags"] = sorted({w["flag"] for w in report["warnings"]})
    return _with_host(report, watch.report(), "cuda")

