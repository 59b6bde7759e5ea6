"""Fixed-batch benchmark points (trtexec's method), timed in windows until precise enough (`measure.timing.windows`).

- `engine_point`: an engine through the cuda-python harness (`measure.timing.cuda_timing`): one execution context and
  stream per ``streams`` (as trtexec --streams), optional CUDA graph, spin-wait, host transfers through pinned
  buffers; each window is one run of the harness's loop, the first after the time-based warm-up;
- `host_points`: callables (ONNX Runtime, eager PyTorch; one per batch size) on the host clock, or with CUDA
  events for PyTorch on a GPU, timed in turns.

Each returns the point's report: trtexec's statistics over every timed query (`measure.statistics.stats`), their 95%
intervals (`measure.statistics.intervals`), the windows' own figures, whether it converged, and what else ran on the
host meanwhile (`measure.timing.interference`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..statistics.intervals import Window, uncertainty
from ..statistics.stats import QueryTiming, kept_queries, report_traces, trace_wall_ms
from .ab import Pairing
from .interference import HostWatch, busy_warning, thread_wait_ns
from .windows import (
    TimeWindow,
    WindowPlan,
    add_uncertainty,
    assessor,
    cuda_event_window,
    host_window,
    measure_interleaved,
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
    timed in turns (`measure.timing.windows.measure_interleaved`); what else ran is watched over them all. ``pairings``:
    points timed in pairs with a reference (`measure.timing.ab`)."""
    watch = HostWatch()
    measured = measure_interleaved([host_timer(call, settings, cuda_events) for call in calls], settings.plan,
                                   [assessor(batch, settings.plan.precision) for batch in batch_sizes], pairings)
    reports = [report_windows(found.windows, batch, settings.unstable_cv_percent, settings.device, settings.plan,
                              found.unmet, found.stopped) for found, batch in zip(measured, batch_sizes, strict=True)]
    host = watch.report()
    return [_with_host(report, host, settings.device) for report in reports]


def host_timer(call: Callable[[], Any], settings: PointSettings, cuda_events: bool = False) -> TimeWindow:
    """Windows of ``call`` on the host clock, or with CUDA events around each call (PyTorch on a GPU)."""
    return (cuda_event_window if cuda_events else host_window)(call, settings.warmup_ms)


class EngineWindows:
    """Windows of an engine through the cuda-python harness: one execution context and stream per ``streams``
    (the session and its forks), host transfers through pinned buffers when asked for; collects what each window
    timed (`traces`), the warm-up queries it dropped and whether CUDA graphs were used."""

    def __init__(self, session: Any, feed: Mapping[str, Any], batch: int, streams: int, settings: PointSettings,
                 timer: Any) -> None:
        import numpy as np

        from .cuda_timing import Copy, StreamWork

        self.settings = settings
        self.timer = timer
        self.sessions = [session] + [session.fork().__enter__() for _ in range(streams - 1)]
        self.traces: list[list[QueryTiming]] = []
        self.skipped = 0
        self.graphs: list[bool] = []
        self.failures: list[str] = []
        self.work = []
        for each in self.sessions:
            tensors = each.prepare(feed)
            h2d, d2h = [], []
            if settings.include_host_transfers:
                for tensor in tensors:
                    host = timer.pinned_array((tensor.nbytes,), "uint8")
                    if tensor.is_input:
                        host[...] = np.frombuffer(np.ascontiguousarray(feed[tensor.name]).tobytes(), dtype=np.uint8)
                        h2d.append(Copy(tensor.device_ptr, int(host.ctypes.data), tensor.nbytes))
                    else:
                        d2h.append(Copy(int(host.ctypes.data), tensor.device_ptr, tensor.nbytes))
            self.work.append(StreamWork(timer.new_stream(), each.enqueue, h2d, d2h))

    def window(self, seconds: float, index: int) -> Window:
        from .cuda_timing import TimingOptions

        plan = self.settings.plan
        warmup = self.settings.warmup_ms if index == 0 else 0.0
        options = TimingOptions(warmup_ms=warmup, min_iterations=math.ceil(plan.min_iterations / plan.repeats),
                                min_duration_s=seconds, spin_wait=self.settings.spin_wait,
                                use_cuda_graph=self.settings.use_cuda_graph,
                                include_host_transfers=self.settings.include_host_transfers)
        wait_before = thread_wait_ns()
        run = self.timer.time(self.work, options)
        wait_after = thread_wait_ns()
        timed = kept_queries(run.trace, warmup)
        self.skipped += len(run.trace) - len(timed)
        self.traces.append(timed)
        if index == 0:
            self.graphs, self.failures = list(run.cuda_graph), list(run.graph_failures)
        waited = None if wait_before is None or wait_after is None else (wait_after - wait_before) / 1e6
        return Window([t.latency for t in timed], trace_wall_ms(timed), waited)

    def close(self) -> None:
        for extra in self.sessions[1:]:
            extra.__exit__(None, None, None)


def engine_point(session: Any, feed: Mapping[str, Any], batch: int, streams: int, settings: PointSettings,
                 timer_factory: Callable[[], Any], reference: Any = None,
                 pair: Callable[[TimeWindow], Pairing] | None = None,
                 reference_settings: PointSettings | None = None) -> dict[str, Any]:
    """A point of an engine with the cuda-python harness: one execution context and stream per ``streams``.
    ``reference`` (an opened engine session) and ``pair`` (makes the `measure.timing.ab.Pairing` from the reference's
    window timer): the point is timed in A/B pairs with the reference, which runs with ``reference_settings`` (its
    pinned ones; default the candidate's); the report's ``paired`` holds the pairs."""
    watch = HostWatch()
    plan = settings.plan
    pairing = None
    with timer_factory() as timer:
        timed = EngineWindows(session, feed, batch, streams, settings, timer)
        theirs = EngineWindows(reference, feed, batch, streams, reference_settings or settings, timer) \
            if reference is not None and pair is not None else None
        try:
            pairings = {}
            if theirs is not None and pair is not None:
                pairing = pair(theirs.window)
                pairings[0] = pairing
            (measured,) = measure_interleaved([timed.window], plan, [assessor(batch, plan.precision)], pairings)
        finally:
            timed.close()
            if theirs is not None:
                theirs.close()
    report = report_traces(timed.traces, timed.skipped, batch, streams,
                           unstable_cv_percent=settings.unstable_cv_percent)
    found = uncertainty(measured.windows, report["latency_ms"], report["throughput_qps"], batch)
    add_uncertainty(report, found, measured.unmet, plan, windows_record(measured.windows, batch), measured.stopped)
    report["cuda_graph"] = all(timed.graphs)
    report["cuda_graph_failures"] = timed.failures
    for failure in timed.failures:
        report["warnings"].append({"flag": "no-cuda-graph", "message": failure})
    report["flags"] = sorted({w["flag"] for w in report["warnings"]})
    if pairing is not None:
        report["paired"] = pairing.summary()
    return _with_host(report, watch.report(), "cuda")
