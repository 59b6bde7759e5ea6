"""Latency statistics computed the way trtexec computes them (TensorRT samples/common/sampleReporting.cpp).

- percentile p of n sorted timings: the value at index ``max(n - 1 - int((1 - p/100) * n), 0)``;
- median: the middle value, or the mean of the two middle values;
- coefficient of variation: population standard deviation / mean, in percent;
- throughput: queries x batch size / host wall time;
- warnings: enqueue-bound when the median enqueue time exceeds 80% of the median GPU compute time,
  transfer-bound when a median transfer time reaches the median GPU compute time, unstable when the
  GPU compute time's coefficient of variation exceeds 2.5%.

Pure Python (no numpy), so it is cheap to import and easy to test.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import numpy as np

#: Ascending values: a list, or a sorted numpy array.
Values: TypeAlias = "Sequence[float] | np.ndarray"

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
ENQUEUE_BOUND_RATIO = 0.8  # trtexec: enqueue median > 0.8 x GPU compute median
UNSTABLE_CV_PERCENT = 2.5  # trtexec: GPU compute coefficient of variation above 2.5%


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def percentile(sorted_values: Values, p: float) -> float:
    """trtexec's percentile of ascending ``sorted_values`` (no interpolation); inf when empty.

    The excluded count is computed in float32 as trtexec does, so e.g. p90 of 100 values excludes 10
    (float64 arithmetic would give 9.999... and exclude 9)."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    count = len(sorted_values)
    if count == 0:
        return math.inf
    exclude = int(_f32(_f32(1.0 - _f32(_f32(p) / 100.0)) * count))
    return float(sorted_values[max(count - 1 - exclude, 0)])


def median(sorted_values: Values) -> float:
    count = len(sorted_values)
    if count == 0:
        return math.inf
    middle = count // 2
    if count % 2:
        return float(sorted_values[middle])
    return (sorted_values[middle - 1] + sorted_values[middle]) / 2.0


def coefficient_of_variation(values: Sequence[float], mean: float) -> float:
    """Population standard deviation over the mean, in percent (trtexec's 'coefficient of variance')."""
    if not values:
        return 0.0
    if mean == 0.0:
        return math.inf
    variance = sum((v - mean) ** 2 for v in values) / len(values)
    return math.sqrt(variance) / mean * 100.0


def _percentile_key(p: float) -> str:
    return f"p{p:g}".replace(".", "_")


def summarize(
    values_ms: Iterable[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict[str, float]:
    """min, max, mean, median, the requested percentiles (``p50``, ``p99``...) and ``cv_percent``."""
    ordered = sorted(float(v) for v in values_ms)
    if not ordered:
        raise ValueError("no timings to summarize")
    mean = sum(ordered) / len(ordered)
    summary = {"min": ordered[0], "max": ordered[-1], "mean": mean, "median": median(ordered)}
    for p in percentiles:
        summary[_percentile_key(p)] = percentile(ordered, p)
    summary["cv_percent"] = coefficient_of_variation(ordered, mean)
    return summary


def throughput_qps(queries: int, batch_size: int, wall_ms: float) -> float:
    """Inferences (samples) per second: ``queries`` runs of ``batch_size`` samples in ``wall_ms``."""
    if wall_ms <= 0:
        return math.inf
    return queries * batch_size / wall_ms * 1000.0


@dataclass(frozen=True)
class QueryTiming:
    """One timed query, in milliseconds from a common origin (host clock for enqueue, GPU events otherwise).

    Without host transfers, the h2d/d2h marks equal the compute marks (zero-length transfers), as trtexec
    records them.
    """

    stream: int
    enqueue_start: float
    enqueue_end: float
    h2d_start: float
    h2d_end: float
    compute_start: float
    compute_end: float
    d2h_start: float
    d2h_end: float

    @property
    def enqueue(self) -> float:
        return self.enqueue_end - self.enqueue_start

    @property
    def h2d(self) -> float:
        return self.h2d_end - self.h2d_start

    @property
    def compute(self) -> float:
        return self.compute_end - self.compute_start

    @property
    def d2h(self) -> float:
        return self.d2h_end - self.d2h_start

    @property
    def latency(self) -> float:
        """H2D + GPU compute + D2H: the latency of a single query (trtexec's 'Latency')."""
        return self.h2d + self.compute + self.d2h


def kept_queries(trace: Sequence[QueryTiming], warmup_ms: float) -> list[QueryTiming]:
    """The queries of a trace timed after the warm-up (those whose compute started at or after ``warmup_ms``)."""
    kept_from = next((i for i, t in enumerate(trace) if t.compute_start >= warmup_ms), None)
    if kept_from is None:
        raise ValueError(
            f"all {len(trace)} timed queries fell inside the {warmup_ms} ms warm-up; run longer"
        )
    return list(trace[kept_from:])


def trace_wall_ms(timed: Sequence[QueryTiming]) -> float:
    """From the first kept query's H2D start to the last D2H end."""
    return max(t.d2h_end for t in timed) - timed[0].h2d_start


def report_trace(
    trace: Sequence[QueryTiming],
    warmup_ms: float,
    batch_size: int,
    streams: int = 1,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    unstable_cv_percent: float = UNSTABLE_CV_PERCENT,
) -> dict:
    """trtexec's performance summary of a trace: queries whose compute started before ``warmup_ms`` are
    warm-up and dropped; wall time runs from the first kept query's H2D start to the last D2H end."""
    timed = kept_queries(trace, warmup_ms)
    return report_traces([timed], len(trace) - len(timed), batch_size, streams, percentiles, unstable_cv_percent)


def report_traces(
    windows: Sequence[Sequence[QueryTiming]],
    warmup_queries: int,
    batch_size: int,
    streams: int = 1,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    unstable_cv_percent: float = UNSTABLE_CV_PERCENT,
) -> dict:
    """`report_trace` over several timed windows (their kept queries each): statistics over all their queries,
    wall time summed over the windows."""
    timed = [t for window in windows for t in window]
    wall_ms = sum(trace_wall_ms(window) for window in windows if window)
    result: dict[str, Any] = {
        "queries": len(timed),
        "warmup_queries": warmup_queries,
        "wall_time_ms": wall_ms,
        "throughput_qps": throughput_qps(len(timed), batch_size, wall_ms),
        "latency_ms": summarize([t.latency for t in timed], percentiles),
        "gpu_compute_ms": summarize([t.compute for t in timed], percentiles),
        "enqueue_ms": summarize([t.enqueue for t in timed], percentiles),
        "h2d_ms": summarize([t.h2d for t in timed], percentiles),
        "d2h_ms": summarize([t.d2h for t in timed], percentiles),
        "total_gpu_compute_ms": sum(t.compute for t in timed),
    }
    result["warnings"] = warnings_for(result, streams, unstable_cv_percent)
    result["flags"] = sorted({w["flag"] for w in result["warnings"]})
    return result


def report_host_latencies(
    latencies_ms: Sequence[float],
    wall_ms: float,
    batch_size: int,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    unstable_cv_percent: float = UNSTABLE_CV_PERCENT,
    device: str = "cpu",
) -> dict:
    """Summary of host-timed runs (ONNX Runtime, eager PyTorch): latency statistics, throughput and the
    'unstable' warning (there is no separate enqueue or transfer time to compare). ``device`` ("cpu" or
    "cuda") picks the advice that fits the hardware that did the work."""
    latency = summarize(latencies_ms, percentiles)
    result: dict = {
        "queries": len(latencies_ms),
        "wall_time_ms": wall_ms,
        "throughput_qps": throughput_qps(len(latencies_ms), batch_size, wall_ms),
        "latency_ms": latency,
    }
    warnings = []
    if latency["cv_percent"] > unstable_cv_percent:
        warnings.append(_unstable("latency", latency["cv_percent"], unstable_cv_percent, device))
    result["warnings"] = warnings
    result["flags"] = sorted({w["flag"] for w in warnings})
    return result


STEADIER = {
    "cuda": "lock the GPU clocks, stop other work on the GPU, or run longer",
    "cpu": "stop other work on the machine (run benchmarks alone, e.g. `trtflow run -j 1`), set "
    "onnxruntime.intra_op_threads to the cores you can dedicate, or run longer",
}


def _unstable(what: str, cv: float, threshold: float, device: str = "cuda") -> dict:
    return {
        "flag": "unstable",
        "message": f"{what} is unstable: coefficient of variation {cv:.2f}% > {threshold:g}%; "
        f"{STEADIER.get(device, STEADIER['cuda'])}",
    }


def warnings_for(result: dict, streams: int, unstable_cv_percent: float = UNSTABLE_CV_PERCENT) -> list[dict]:
    """trtexec's performance warnings for a `report_trace` result, each ``{"flag", "message"}``."""
    compute = result["gpu_compute_ms"]["median"]
    enqueue = result["enqueue_ms"]["median"]
    found = []
    if enqueue > ENQUEUE_BOUND_RATIO * compute:
        found.append({
            "flag": "enqueue-bound",
            "message": f"throughput may be bound by enqueue time (median {enqueue:.4g} ms > "
            f"{ENQUEUE_BOUND_RATIO:g} x median GPU compute {compute:.4g} ms); the GPU may be under-used: "
            "enable use_cuda_graph if it is off",
        })
    for key, what in (("h2d_ms", "host-to-device"), ("d2h_ms", "device-to-host")):
        transfer = result[key]["median"]
        if transfer > 0 and transfer >= compute:
            found.append({
                "flag": f"{key[:3]}-bound",
                "message": f"throughput may be bound by {what} transfers (median {transfer:.4g} ms >= median "
                f"GPU compute {compute:.4g} ms); set include_host_transfers: false to time compute alone",
            })
    cv = result["gpu_compute_ms"]["cv_percent"]
    if cv > unstable_cv_percent:
        found.append(_unstable("GPU compute time", cv, unstable_cv_percent))
    if streams > 1:
        found.append({
            "flag": "multi-stream",
            "message": f"{streams} inference streams ran in parallel: per-query latencies overlap, so use "
            "throughput as the performance metric",
        })
    return found


def summarize_layer_times(times: Mapping[str, Sequence[float]]) -> dict:
    """Per-layer profile like trtexec's --exportProfile: per layer its total, average and median time over the
    profiled iterations and its share of the summed layer time, most expensive first."""
    if not times:
        raise ValueError("the layer profiler reported no layers")
    iterations = max(len(values) for values in times.values())
    totals = {name: sum(values) for name, values in times.items()}
    overall = sum(totals.values())
    layers = [
        {"name": name, "total_ms": totals[name], "average_ms": totals[name] / iterations,
         "median_ms": median(sorted(values)),
         "percent": totals[name] / overall * 100.0 if overall > 0 else 0.0}
        for name, values in times.items()
    ]
    layers.sort(key=lambda layer: layer["total_ms"], reverse=True)
    return {"iterations": iterations, "total_average_ms": overall / iterations, "layers": layers}


def grid_median(ordered: Sequence[float]) -> float:
    """The median of sorted latencies, read between the ticks of a coarse timer: where the values fall on a grid
    (fewer distinct values than a quarter of the queries), the grouped-data median (the median tick's lower edge
    plus its share of the way through the tick) instead of the tick itself, so two windows on the same tick still
    differ by how their queries fall; the plain median otherwise."""
    from bisect import bisect_left, bisect_right
    from itertools import pairwise

    count = len(ordered)
    middle = median(ordered)
    distinct = sorted(set(ordered))
    if count < 8 or len(distinct) < 2 or len(distinct) * 4 > count:
        return middle
    width = min(b - a for a, b in pairwise(distinct))
    below = bisect_left(ordered, middle)
    at = bisect_right(ordered, middle) - below
    if at == 0:
        return middle
    return middle - width / 2.0 + width * (count / 2.0 - below) / at

