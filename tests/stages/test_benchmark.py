"""The benchmark stage with real ONNX Runtime and real PyTorch on the CPU, and trtexec's statistics."""

from __future__ import annotations

import json
import math

import pytest

from trtflow.errors import GateFailed, RecipeError, StageSkipped
from trtflow.testing import run_stage
from trtflow_stages import _stats, benchmark
from trtflow_stages._cuda_timing import cuda_unavailable_reason

SHORT = {"warmup_ms": 5, "min_iterations": 5, "min_duration_s": 0.0}


# -- statistics (trtexec's rules) ---------------------------------------------------------------------------
def test_percentiles_follow_trtexec():
    values = [float(v) for v in range(1, 101)]  # 1..100 ms
    # index max(n - 1 - int((1 - p/100) * n), 0) in float32 as trtexec computes it:
    # p99: (1 - 0.99f) * 100 = 0.9999991 -> exclude 0 -> 100.0; p90: 10.0000024 -> exclude 10 -> 90.0
    assert _stats.percentile(values, 99) == 100.0
    assert _stats.percentile(values, 90) == 90.0
    assert _stats.percentile(values, 50) == 50.0
    assert _stats.percentile(values, 100) == 100.0 and _stats.percentile(values, 0) == 1.0
    assert _stats.percentile([3.0, 7.0], 99) == 7.0  # int(0.01 * 2) = 0 excluded: index 1
    assert _stats.percentile([float(v) for v in range(10)], 95) == 9.0  # int(0.05 * 10) = 0: the max
    assert _stats.median([1.0, 2.0, 3.0, 4.0]) == 2.5 and _stats.median([5.0]) == 5.0
    assert math.isinf(_stats.percentile([], 50))
    with pytest.raises(ValueError):
        _stats.percentile(values, 101)


def test_summary_and_coefficient_of_variation():
    summary = _stats.summarize([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert summary["mean"] == 5.0 and summary["median"] == 4.5
    assert summary["cv_percent"] == pytest.approx(40.0)  # population std 2 / mean 5
    assert summary["min"] == 2.0 and summary["max"] == 9.0 and summary["p99"] == 9.0
    assert _stats.throughput_qps(queries=100, batch_size=8, wall_ms=400.0) == pytest.approx(2000.0)


def _trace(compute_ms: list[float], enqueue_ms: float, start_ms: float = 0.0, h2d_ms: float = 0.0):
    trace, t = [], start_ms
    for compute in compute_ms:
        trace.append(_stats.QueryTiming(0, t, t + enqueue_ms, t, t + h2d_ms, t + h2d_ms, t + h2d_ms + compute,
                                        t + h2d_ms + compute, t + h2d_ms + compute))
        t += h2d_ms + compute
    return trace


def test_trace_report_drops_warmup_and_flags_like_trtexec():
    warm = _trace([1.0] * 5, enqueue_ms=0.1)  # compute starts 0..4 ms: inside a 5 ms warm-up
    timed = _trace([1.0] * 20, enqueue_ms=0.1, start_ms=5.0)
    report = _stats.report_trace(warm + timed, warmup_ms=5.0, batch_size=4)
    assert report["warmup_queries"] == 5 and report["queries"] == 20
    assert report["wall_time_ms"] == pytest.approx(20.0)
    assert report["throughput_qps"] == pytest.approx(20 * 4 / 20.0 * 1000)
    assert report["flags"] == [] and report["gpu_compute_ms"]["cv_percent"] == pytest.approx(0.0)

    enqueue_bound = _stats.report_trace(_trace([1.0] * 10, enqueue_ms=0.9), warmup_ms=0, batch_size=1)
    assert "enqueue-bound" in enqueue_bound["flags"]  # 0.9 > 0.8 x 1.0
    unstable = _stats.report_trace(_trace([1.0, 1.2] * 10, enqueue_ms=0.1), warmup_ms=0, batch_size=1)
    assert unstable["flags"] == ["unstable"] and "coefficient of variation 9.09%" in unstable["warnings"][0]["message"]
    transfers = _stats.report_trace(_trace([1.0] * 10, enqueue_ms=0.1, h2d_ms=2.0), warmup_ms=0, batch_size=1)
    assert "h2d-bound" in transfers["flags"] and transfers["latency_ms"]["median"] == pytest.approx(3.0)
    multi = _stats.report_trace(_trace([1.0] * 10, enqueue_ms=0.1), warmup_ms=0, batch_size=1, streams=2)
    assert "multi-stream" in multi["flags"]
    with pytest.raises(ValueError, match="warm-up"):
        _stats.report_trace(warm, warmup_ms=100.0, batch_size=1)


# -- onnxruntime and torch baselines, for real --------------------------------------------------------------
def test_onnxruntime_cnn_benchmark_with_batch_sweep(tiny_cnn_onnx, tmp_path):
    result = run_stage(benchmark.stage, {**SHORT, "shapes": {"input": [1, 3, 32, 32]}, "batch_sizes": [1, 4]},
                       {"model": tiny_cnn_onnx}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert metrics["backend"] == "onnxruntime" and metrics["passed"]
    assert [p["batch_size"] for p in metrics["points"]] == [1, 4]
    assert metrics["points"][1]["shapes"] == {"input": [4, 3, 32, 32]}
    for point in metrics["points"]:
        report = point["report"]
        assert report["queries"] >= 5 and point["runs_on"] == "onnxruntime CPUExecutionProvider"
        latency = report["latency_ms"]
        assert 0 < latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
        assert report["throughput_qps"] == pytest.approx(
            report["queries"] * point["batch_size"] / report["wall_time_ms"] * 1000)
    assert benchmark.stage.resources_for(benchmark.Params()).gpu == 0


def test_profile_opt_shapes_are_run(tiny_mlp_onnx, tmp_path):
    profile = {"name": "bs3", "shapes": {"input": {"min": [1, 16], "opt": [3, 16], "max": [8, 16]}}}
    result = run_stage(benchmark.stage, {**SHORT, "profile": profile}, {"model": tiny_mlp_onnx}, workdir=tmp_path)
    assert result.summary["points"][0]["batch_size"] == 3
    with pytest.raises(RecipeError, match="dynamic dimensions and no shape to run"):
        run_stage(benchmark.stage, SHORT, {"model": tiny_mlp_onnx}, workdir=tmp_path / "noshape")
    with pytest.raises(RecipeError, match="dimension 1 is fixed at 16"):
        run_stage(benchmark.stage, {**SHORT, "shapes": {"input": [2, 15]}}, {"model": tiny_mlp_onnx},
                  workdir=tmp_path / "bad")


def test_torch_cpu_baseline(tmp_path):
    (tmp_path / "factory.py").write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))\n"
    )
    params = {**SHORT, "backend": "torch", "torch_model": "python:factory.py:build",
              "shapes": {"input": [2, 16]}}
    result = run_stage(benchmark.stage, params, {}, workdir=tmp_path, recipe_dir=tmp_path)
    point = json.loads(result.outputs["metrics"].read_text())["points"][0]
    assert point["runs_on"] == "torch cpu" and point["report"]["queries"] >= 5
    assert benchmark.stage.files_for(benchmark.Params.model_validate(params)) == ("factory.py",)
    with pytest.raises(ValueError, match="backend torch needs torch_model"):
        benchmark.Params.model_validate({"backend": "torch"})


def test_latency_gate_failure_names_statistic_and_ratio(tiny_mlp_onnx, tmp_path):
    params = {**SHORT, "shapes": {"input": [1, 16]}, "max_latency_ms_p99": 1e-6, "min_throughput_qps": 1e12}
    with pytest.raises(GateFailed) as failure:
        run_stage(benchmark.stage, params, {"model": tiny_mlp_onnx}, workdir=tmp_path)
    message = str(failure.value)
    assert "batch 1: p99 latency" in message and "> max_latency_ms_p99 1e-06 ms" in message
    assert "throughput" in message and "< min_throughput_qps 1e+12" in message
    assert failure.value.metrics["passed"] is False and len(failure.value.metrics["failures"]) == 2
    assert json.loads((tmp_path / "scratch" / "out" / "benchmark.json").read_text())["failures"]


def test_tensorrt_backend_is_skipped_in_check_without_a_runtime():
    """Real check: this machine cannot execute engines (and cuda-python finds no device)."""
    params = benchmark.Params.model_validate({"backend": "tensorrt-rtx"})
    assert benchmark.stage.resources_for(params).gpu == 1
    if cuda_unavailable_reason() is None:
        pytest.skip("a CUDA device is visible here")
    with pytest.raises(StageSkipped) as skipped:
        benchmark.stage.check(params)
    assert skipped.value.needs and "tensorrt-rtx" in skipped.value.reason


def test_regression_gate_compares_with_the_previous_run():
    from trtflow_stages.benchmark import Params, regression_gates

    params = Params(backend="onnxruntime", max_regression_percent=10)
    point = {"batch_size": 4, "report": {"latency_ms": {"median": 12.0}}}
    assert regression_gates([point], params, None) == []
    assert regression_gates([point], params, {"points": [{"batch_size": 4, "median_ms": 11.5}]}) == []
    failures = regression_gates([point], params, {"points": [{"batch_size": 4, "median_ms": 10.0}]})
    assert failures == ["batch 4: median latency 12 ms is 20.0% above the previous run's 10 ms "
                        "(max_regression_percent 10)"]
    assert regression_gates([point], params, {"points": [{"batch_size": 8, "median_ms": 1.0}]}) == []
