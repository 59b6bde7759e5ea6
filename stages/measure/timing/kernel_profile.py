"""Where the GPU time of the timed work goes: a CUDA kernel summary like Nsight Systems' ``cuda_gpu_kern_sum``.

`profile_kernels` runs the benchmark's own call (the one the timing measured) for some iterations under the
PyTorch profiler with CUDA activities, which records every kernel of the process through CUPTI (TensorRT's as well
as PyTorch's), writes the trace in Chrome's trace format and aggregates its ``kernel`` events by name: instances,
total, average, median, minimum, maximum and standard deviation of the duration, and each kernel's share of the
kernel time, as ``nsys stats --report cuda_gpu_kern_sum`` does. The profiled iterations are bracketed with
``cudaProfilerStart``/``cudaProfilerStop``, so a run under ``nsys profile --capture-range=cudaProfilerApi``
captures exactly them.

Nsight Systems itself cannot attach to a running process; `nsys_status` says whether it is installed here and
whether it can write a report (on some machines it writes only a ``.qdstrm`` it cannot import).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trtflow.summaries import KernelRow

#: The columns of ``nsys stats --report cuda_gpu_kern_sum``, in its order (times in ns).
COLUMNS = ("time_percent", "total_ns", "instances", "avg_ns", "med_ns", "min_ns", "max_ns", "stddev_ns", "name")
#: Kernels kept in a benchmark's summary (kernels.json keeps them all).
TOP = 5


def kernel_durations(trace: Mapping[str, Any]) -> tuple[dict[str, list[float]], float]:
    """Per kernel name, the duration (ns) of each of its launches, from a Chrome-format trace as the PyTorch
    profiler writes it (complete events of category ``kernel``); and the wall time (ns) from the first kernel's
    start to the last one's end."""
    durations: dict[str, list[float]] = {}
    first, last = math.inf, -math.inf
    for event in trace.get("traceEvents", []):
        if not isinstance(event, Mapping) or event.get("cat") != "kernel" or event.get("ph") != "X":
            continue
        start, duration = float(event.get("ts", 0.0)), float(event.get("dur", 0.0))
        durations.setdefault(str(event.get("name", "?")), []).append(duration * 1000.0)
        first, last = min(first, start), max(last, start + duration)
    span = (last - first) * 1000.0 if durations else 0.0
    return durations, span


def summarize(durations: Mapping[str, Sequence[float]]) -> list[dict[str, Any]]:
    """One row per kernel name with nsys' kernel-summary columns, most total time first."""
    total = sum(sum(values) for values in durations.values())
    rows: list[dict[str, Any]] = []
    for name, values in durations.items():
        if not values:
            continue
        spent = sum(values)
        rows.append({
            "time_percent": round(100.0 * spent / total, 3) if total else 0.0,
            "total_ns": round(spent),
            "instances": len(values),
            "avg_ns": round(spent / len(values), 1),
            "med_ns": round(statistics.median(values), 1),
            "min_ns": round(min(values)),
            "max_ns": round(max(values)),
            "stddev_ns": round(statistics.stdev(values), 1) if len(values) > 1 else 0.0,
            "name": name,
        })
    rows.sort(key=lambda row: (-row["total_ns"], row["name"]))
    return rows


def top_kernels(record: Mapping[str, Any], count: int = TOP) -> list[KernelRow]:
    """The first ``count`` kernels of a kernels.json record, as a benchmark summary and the report show them."""
    iterations = max(int(record.get("iterations") or 1), 1)
    return [{"name": row["name"], "percent": row["time_percent"], "average_us": round(row["avg_ns"] / 1000.0, 3),
             "per_iteration": round(row["instances"] / iterations, 2)}
            for row in record.get("kernels", [])[:count]]


def cuda_profiler_unavailable() -> str | None:
    """None when the PyTorch profiler can record CUDA kernels here, else why not (imports torch)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed: the kernel summary records CUDA kernels with the PyTorch profiler (CUPTI)"
    if not torch.cuda.is_available():
        return "this PyTorch sees no CUDA device: CUDA kernels are recorded only on a GPU"
    return None


def profile_kernels(call: Callable[[], Any], synchronize: Callable[[], None], iterations: int,
                    trace_path: Path | None = None) -> dict[str, Any]:
    """Run ``call`` ``iterations`` times under the PyTorch profiler (CUDA activities, CUPTI) and summarise the
    kernels they launched; ``synchronize`` waits for the GPU. ``trace_path``: keep the trace (gzip'd JSON)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    synchronize()
    with tempfile.TemporaryDirectory(prefix="trtflow-kernels-") as scratch:
        raw = Path(scratch) / "trace.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            torch.cuda.profiler.start()
            try:
                for _ in range(iterations):
                    call()
                synchronize()
            finally:
                torch.cuda.profiler.stop()
        profiler.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text(encoding="utf-8"))
        if trace_path is not None:
            with raw.open("rb") as source, gzip.open(trace_path, "wb") as target:
                shutil.copyfileobj(source, target)
    durations, span = kernel_durations(trace)
    rows = summarize(durations)
    kernel_ns = sum(row["total_ns"] for row in rows)
    return {
        "tool": f"torch.profiler (CUPTI), torch {torch.__version__}",
        "iterations": iterations,
        "kernel_launches": sum(row["instances"] for row in rows),
        "kernel_time_ms": round(kernel_ns / 1e6, 4),
        "kernel_time_per_iteration_ms": round(kernel_ns / 1e6 / iterations, 4) if iterations else None,
        "span_ms": round(span / 1e6, 4),
        "kernels": rows,
    }


# -- Nsight Systems --------------------------------------------------------------------------------------------------


def find_nsys() -> str | None:
    """The nsys executable: $NSYS, on PATH, or under /opt/nvidia's Nsight installations."""
    explicit = os.environ.get("NSYS")
    if explicit and Path(explicit).is_file():
        return explicit
    found = shutil.which("nsys")
    if found:
        return found
    candidates = sorted(Path("/opt/nvidia").glob("nsight-*/**/nsys")) if Path("/opt/nvidia").is_dir() else []
    return str(candidates[-1]) if candidates else None


def nsys_status(timeout_s: float = 120.0) -> dict[str, Any]:
    """Whether Nsight Systems can profile here and write a report: it profiles a trivial program and asks
    ``nsys stats`` for its kernel summary; ``usable`` is true only when that report came out."""
    nsys = find_nsys()
    if nsys is None:
        return {"usable": False, "reason": "nsys is not installed here (not on PATH, $NSYS unset, none under "
                "/opt/nvidia)"}
    with tempfile.TemporaryDirectory(prefix="trtflow-nsys-") as scratch:
        output = Path(scratch) / "probe"
        program = "true"
        try:
            done = subprocess.run([nsys, "profile", "--trace=cuda", "--force-overwrite=true", "-o", str(output),
                                   program], capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            return {"usable": False, "nsys": nsys, "reason": f"nsys profile did not finish: {error}"}
        report = output.with_suffix(".nsys-rep")
        if not report.is_file():
            written = sorted(p.name for p in Path(scratch).iterdir())
            tail = " ".join((done.stderr or done.stdout).split())[-300:]
            return {"usable": False, "nsys": nsys,
                    "reason": f"nsys wrote no report (files: {', '.join(written) or 'none'}; exit {done.returncode}: "
                    f"{tail})"}
    return {"usable": True, "nsys": nsys,
            "reason": "nsys writes reports here: run the benchmark under `nsys profile --trace=cuda "
            "--capture-range=cudaProfilerApi` to capture the profiled iterations"}


def timed_call_kernels(session: Any, torch_call: Callable[[], Any] | None, feed: Mapping[str, Any], iterations: int,
                       timer_factory: Callable[[], Any]) -> dict[str, Any]:
    """The CUDA kernels of a benchmark's timed call, like nsys' kernel summary: an engine's enqueue on a forked
    execution context (``session``), or the PyTorch module's call (``torch_call``)."""
    reason = cuda_profiler_unavailable()
    if reason:
        return {"recorded": False, "reason": reason, "nsys": nsys_status()}
    if session is not None:
        with session.fork() as profiled, timer_factory() as timer:
            profiled.prepare(feed)
            stream = timer.new_stream()
            record = profile_kernels(lambda: profiled.enqueue(stream), lambda: timer.synchronize(stream), iterations)
    else:
        import torch

        assert torch_call is not None
        torch_call()
        record = profile_kernels(torch_call, torch.cuda.synchronize, iterations)
    return {"recorded": True, **record, "nsys": nsys_status()}
