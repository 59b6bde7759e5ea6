"""Kernel summaries: a PyTorch-profiler trace aggregated like `nsys stats --report cuda_gpu_kern_sum`."""

from __future__ import annotations

import statistics

import pytest

from trtflow_stages.measure.timing import kernel_profile as kernels


def _trace() -> dict:
    """A Chrome-format trace as torch.profiler writes it: CPU ops, runtime calls and GPU kernels (us)."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0.0, "dur": 50.0},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1.0, "dur": 3.0},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 2.0, "dur": 9.0}]
    gemm = [10.0, 12.0, 11.0, 40.0]
    for index, duration in enumerate(gemm):
        events.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "ts": 100.0 + 100 * index,
                       "dur": duration})
    for index in range(4):
        events.append({"ph": "X", "cat": "kernel", "name": "layer_norm", "ts": 150.0 + 100 * index, "dur": 5.0})
    events.append({"ph": "f", "cat": "ac2g", "name": "flow", "ts": 1.0})
    return {"traceEvents": events, "deviceProperties": []}


def test_kernels_are_aggregated_by_name_like_the_nsys_kernel_summary():
    durations, span = kernels.kernel_durations(_trace())
    assert sorted(durations) == ["layer_norm", "sm90_xmma_gemm"]  # CPU ops, runtime calls, copies left out
    assert span == pytest.approx((455.0 - 100.0) * 1000)  # first kernel start to last kernel end, ns
    rows = kernels.summarize(durations)
    assert [row["name"] for row in rows] == ["sm90_xmma_gemm", "layer_norm"]
    gemm = rows[0]
    assert list(gemm) == list(kernels.COLUMNS)
    assert gemm["instances"] == 4 and gemm["total_ns"] == 73_000
    assert gemm["time_percent"] == pytest.approx(100 * 73 / 93, abs=1e-3)
    assert gemm["avg_ns"] == 18_250 and gemm["med_ns"] == 11_500 and gemm["min_ns"] == 10_000
    assert gemm["max_ns"] == 40_000
    assert gemm["stddev_ns"] == pytest.approx(statistics.stdev([10_000, 12_000, 11_000, 40_000]), abs=0.1)
    assert rows[1]["stddev_ns"] == 0.0 and sum(r["time_percent"] for r in rows) == pytest.approx(100.0, abs=1e-2)


def test_top_kernels_per_iteration():
    record = {"iterations": 4, "kernels": kernels.summarize(kernels.kernel_durations(_trace())[0])}
    assert kernels.top_kernels(record, 1) == [{"name": "sm90_xmma_gemm", "percent": pytest.approx(78.495, abs=1e-3),
                                               "average_us": 18.25, "per_iteration": 1.0}]


def test_without_a_gpu_the_profiler_says_why():
    reason = kernels.cuda_profiler_unavailable()
    if reason is None:
        pytest.skip("this machine can record CUDA kernels")
    assert "CUDA" in reason


def test_nsys_status_names_what_is_missing(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("NSYS", raising=False)
    if kernels.find_nsys() is not None:
        pytest.skip("an Nsight Systems installation under /opt/nvidia")
    assert kernels.nsys_status() == {"usable": False, "reason": "nsys is not installed here (not on PATH, $NSYS "
                                     "unset, none under /opt/nvidia)"}
