"""Timing a benchmark point in windows until its figures are precise enough (or a time cap says stop).

A point is timed as a series of *windows* (``repeats``): back-to-back queries for ``min_duration_s / repeats``
each, the first one after a warm-up. Once there are at least ``repeats`` windows, ``min_iterations`` queries
and ``min_duration_s`` of timing, the intervals are computed (`measure.statistics.intervals`); while they are wider than
the precision asked for, one more window is timed, until ``max_duration_s`` of timing. A point that stopped at
the cap without the precision is flagged ``not-converged``: its figures are reported with their (wide)
intervals, never silently. The points of one benchmark take turns, a window each (`measure_interleaved`).

Why a point stopped is in its report (``stopped``): ``converged``; ``cap`` (``max_duration_s`` of timing spent);
or ``busy-host``: past the minimums, its threads waited for a CPU for at least `BUSY_STOP_WAIT_PERCENT` of the
time it was timed (other programs held the CPUs), so more windows would time the neighbours, not the model; it
stops there, flagged, instead of running to the cap. A point is therefore timed at most ``max_duration_s`` plus
one window (``min_duration_s / repeats``), and a stage's points, taking turns, at most their number times that,
plus the warm-up of each; the stopping rule computes only the intervals it reads (`Precision.keys`).

`host_window` times a callable on the host clock (ONNX Runtime, PyTorch on the CPU), `cuda_event_window` with
CUDA events around each call (PyTorch on a GPU); engines go through the cuda-python harness
(`measure.timing.cuda_timing`) window by window, in the benchmark stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..statistics.intervals import Precision, Uncertainty, Window, uncertainty
from ..statistics.stats import report_host_latencies, summarize
from .ab import Pairing
from .interference import thread_wait_ns

#: Times one window of about ``seconds``; ``index`` 0 is the first (the one that warms up).
TimeWindow = Callable[[float, int], Window]
MIN_WINDOW_S = 0.02
#: A point whose threads waited for a CPU this share (percent) of its timed time stops at its minimums.
BUSY_STOP_WAIT_PERCENT = 20.0
#: Why a point stopped timing (its report's ``stopped``).
CONVERGED, CAP, BUSY_HOST = "converged", "cap", "busy-host"


@dataclass(frozen=True)
class Measured:
    """A point's windows, what was still imprecise when it stopped (empty: converged) and why it stopped."""

    windows: list[Window]
    unmet: list[str]
    stopped: str


@dataclass(frozen=True)
class WindowPlan:
    repeats: int = 5  # windows at least
    min_iterations: int = 10  # queries at least, over all windows
    min_duration_s: float = 3.0  # timed seconds at least, over all windows
    max_duration_s: float = 10.0  # timed seconds at most while the precision is not reached
    precision: Precision = field(default_factory=Precision)

    @property
    def window_s(self) -> float:
        return max(self.min_duration_s / self.repeats, MIN_WINDOW_S)


def measure_windows(time_window: TimeWindow, plan: WindowPlan,
                    assess: Callable[[list[Window]], list[str]]) -> Measured:
    """Windows timed until the plan's minimums are met and ``assess`` (what is still imprecise) says nothing,
    ``max_duration_s`` of timing is spent, or the host is too busy; returns the windows, what was still
    imprecise at the end and why timing stopped."""
    return measure_interleaved([time_window], plan, [assess])[0]


def busy(windows: Sequence[Window]) -> bool:
    """Whether the threads timing these windows waited for a CPU `BUSY_STOP_WAIT_PERCENT` of their time or more
    (False when the waits are not known: the rule never guesses)."""
    waits = [w.wait_ms for w in windows]
    wall = sum(w.wall_ms for w in windows)
    if wall <= 0 or any(wait is None for wait in waits):
        return False
    return sum(wait for wait in waits if wait is not None) / wall * 100.0 >= BUSY_STOP_WAIT_PERCENT


def measure_interleaved(time_windows: Sequence[TimeWindow], plan: WindowPlan,
                        assessments: Sequence[Callable[[list[Window]], list[str]]],
                        pairings: Mapping[int, Pairing] | None = None) -> list[Measured]:
    """Several points timed in turns, one window each per round, each until it is done as `measure_windows`
    says. Taking turns spreads every point's windows over the whole measurement, so a spell of a slower host
    (another program, a busy neighbour core) lands in every point's windows and widens their intervals, instead
    of shifting one point as a whole while its intervals stay tight.

    ``pairings``: points (by index) timed in pairs with a reference (`measure.timing.ab.Pairing`): each round times a
    pair instead of a window, and the point is done when its pairing is (decided, or at its cap)."""
    windows: list[list[Window]] = [[] for _ in time_windows]
    spent_s = [0.0 for _ in time_windows]
    unmet: list[list[str] | None] = [None for _ in time_windows]  # None: still timing
    stopped = [CONVERGED for _ in time_windows]
    pairings = pairings or {}
    while any(found is None for found in unmet):
        for index, time_window in enumerate(time_windows):
            if unmet[index] is not None:
                continue
            pairing = pairings.get(index)
            if pairing is not None:
                windows[index].append(pairing.step(time_window, plan.window_s, len(windows[index])))
                if pairing.done:
                    unmet[index] = assessments[index](windows[index])
                    stopped[index] = CAP if unmet[index] else CONVERGED
                continue
            window = time_window(plan.window_s, len(windows[index]))
            windows[index].append(window)
            spent_s[index] += window.wall_ms / 1000.0
            if len(windows[index]) < plan.repeats or spent_s[index] < plan.min_duration_s or \
                    sum(len(w.latencies_ms) for w in windows[index]) < plan.min_iterations:
                continue
            imprecise = assessments[index](windows[index])
            if not imprecise:
                unmet[index] = imprecise
            elif spent_s[index] >= plan.max_duration_s:
                unmet[index], stopped[index] = imprecise, CAP
            elif busy(windows[index]):
                unmet[index], stopped[index] = imprecise, BUSY_HOST
    return [Measured(found, left or [], why) for found, left, why in zip(windows, unmet, stopped, strict=True)]


def host_window(call: Callable[[], Any], warmup_ms: float) -> TimeWindow:
    """Windows of ``call`` timed on the host clock (the first one after ``warmup_ms`` of untimed calls)."""

    def window(seconds: float, index: int) -> Window:
        if index == 0:
            start = time.perf_counter_ns()
            while (time.perf_counter_ns() - start) / 1e6 < warmup_ms:
                call()
        latencies: list[float] = []
        wait_before = thread_wait_ns()
        begin = now = time.perf_counter_ns()
        while not latencies or (now - begin) / 1e9 < seconds:
            before = time.perf_counter_ns()
            call()
            now = time.perf_counter_ns()
            latencies.append((now - before) / 1e6)
        wait_after = thread_wait_ns()
        waited = (wait_after - wait_before) / 1e6 if wait_before is not None and wait_after is not None else None
        return Window(latencies, (now - begin) / 1e6, waited)

    return window


def cuda_event_window(call: Callable[[], Any], warmup_ms: float) -> TimeWindow:
    """As `host_window`, with torch.cuda events around each call (the GPU time of each query)."""
    import torch

    def window(seconds: float, index: int) -> Window:
        if index == 0:
            start_ns = time.perf_counter_ns()
            while (time.perf_counter_ns() - start_ns) / 1e6 < warmup_ms:
                call()
            torch.cuda.synchronize()
        latencies: list[float] = []
        wait_before = thread_wait_ns()
        begin = time.perf_counter_ns()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        while not latencies or (time.perf_counter_ns() - begin) / 1e9 < seconds:
            start.record()
            call()
            end.record()
            end.synchronize()
            latencies.append(start.elapsed_time(end))
        wall_ms = (time.perf_counter_ns() - begin) / 1e6
        wait_after = thread_wait_ns()
        waited = (wait_after - wait_before) / 1e6 if wait_before is not None and wait_after is not None else None
        return Window(latencies, wall_ms, waited)

    return window


def window_uncertainty(windows: Sequence[Window], batch_size: int, only: Sequence[str] | None = None) -> Uncertainty:
    """The intervals of the pooled figures of ``windows`` (``only``: just these percentiles')."""
    pooled = [v for w in windows for v in w.latencies_ms]
    latency = summarize(pooled)
    wall = sum(w.wall_ms for w in windows)
    throughput = len(pooled) * batch_size / wall * 1000.0 if wall > 0 else float("inf")
    return uncertainty(windows, latency, throughput, batch_size, only=only)


def windows_record(windows: Sequence[Window], batch_size: int) -> list[dict[str, Any]]:
    """Per window: its queries, median, p99, throughput and how long our threads waited for a CPU."""
    rows = []
    for w in windows:
        summary = summarize(w.latencies_ms)
        rows.append({"queries": len(w.latencies_ms), "median_ms": summary["median"], "p99_ms": summary["p99"],
                     "throughput_qps": w.throughput(batch_size), "wait_ms": w.wait_ms,
                     "wait_percent": None if w.wait_ms is None or w.wall_ms <= 0 else
                     round(w.wait_ms / w.wall_ms * 100.0, 2)})
    return rows


def add_uncertainty(report: dict[str, Any], found: Uncertainty, unmet: Sequence[str], plan: WindowPlan,
                    windows: list[dict[str, Any]], stopped: str | None = None) -> dict[str, Any]:
    """A point's report with its intervals, its windows, whether it converged (a flag when it did not) and why
    it stopped timing (``stopped``: converged, cap or busy-host)."""
    report.update(found.as_dict())
    report["repeats"] = windows
    report["converged"] = not unmet
    report["stopped"] = stopped or (CAP if unmet else CONVERGED)
    waits = [wait for w in windows if isinstance(wait := w.get("wait_ms"), (int, float))]
    if windows and len(waits) == len(windows):
        report["cpu_wait_ms_per_query"] = sum(waits) / max(sum(w["queries"] for w in windows), 1)
    if unmet:
        why = (f"stopped early: the host was busy (its threads waited for a CPU {BUSY_STOP_WAIT_PERCENT:g}% of the "
               "time or more, so more windows would time the other programs); steady the host"
               if report["stopped"] == BUSY_HOST else
               f"raise max_duration_s (now {plan.max_duration_s:g} s) or steady the host")
        report["warnings"].append({
            "flag": "not-converged",
            "message": f"not precise enough after {sum(w['queries'] for w in windows)} queries in {len(windows)} "
            f"windows ({'; '.join(unmet)}): the intervals say how far the figures can be trusted; {why}"})
        report["flags"] = sorted({w["flag"] for w in report["warnings"]})
    return report


def report_windows(windows: Sequence[Window], batch_size: int, unstable_cv_percent: float, device: str,
                   plan: WindowPlan, unmet: Sequence[str], stopped: str | None = None) -> dict[str, Any]:
    """The report of a host-timed point (`measure.statistics.stats.report_host_latencies` over all its windows), with
    its intervals, per-window figures and convergence."""
    pooled = [v for w in windows for v in w.latencies_ms]
    report = report_host_latencies(pooled, sum(w.wall_ms for w in windows), batch_size,
                                   unstable_cv_percent=unstable_cv_percent, device=device)
    found = window_uncertainty(windows, batch_size)
    return add_uncertainty(report, found, unmet, plan, windows_record(windows, batch_size), stopped)


def assessor(batch_size: int, precision: Precision) -> Callable[[list[Window]], list[str]]:
    """What is still imprecise in a point's windows: only the intervals the precision reads are computed."""
    return lambda windows: precision.unmet(window_uncertainty(windows, batch_size, precision.keys))
