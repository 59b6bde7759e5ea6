"""The benchmark stage with real ONNX Runtime and real PyTorch on the CPU, and trtexec's statistics."""

from __future__ import annotations

import json
import math

import pytest

from trtflow.errors import RecipeError, StageSkipped
from trtflow.stage import GateContext
from trtflow.testing import run_stage
from trtflow_stages import benchmark
from trtflow_stages.measure.statistics import stats as _stats
from trtflow_stages.runtimes.cuda import cuda_unavailable_reason

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
    assert metrics["backend"] == "onnxruntime" and metrics["device"] == "cpu"
    assert "passed" not in metrics  # the engine judges gates; a verdict in the file could go stale
    assert [p["batch_size"] for p in metrics["points"]] == [1, 4]
    assert metrics["points"][1]["shapes"] == {"input": [4, 3, 32, 32]}
    for point in metrics["points"]:
        report = point["report"]
        assert report["queries"] >= 5 and point["runs_on"] == "onnxruntime CPUExecutionProvider"
        latency = report["latency_ms"]
        assert 0 < latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
        assert report["throughput_qps"] == pytest.approx(
            report["queries"] * point["batch_size"] / report["wall_time_ms"] * 1000)
    # settings that fit the backend: no CUDA graph or spin-wait for a CPU run
    method = metrics["method"]
    assert "use_cuda_graph" not in method and "spin_wait" not in method and method["onnxruntime"]
    assert metrics["host"]["cpus"] >= 1 and len(metrics["host"]["load_average_before"]) == 3
    assert "ran_alone" not in metrics["host"]  # measured instead: what else used the CPUs, how long we waited
    assert metrics["host"]["others_cpu_percent"] is not None and metrics["host"]["wait_percent"] is not None
    for point in metrics["points"]:  # every figure with its uncertainty
        report = point["report"]
        assert report["queries"] == sum(w["queries"] for w in report["repeats"]) and len(report["repeats"]) >= 5
        for key in ("p50", "p99"):
            low, high = report["latency_ci_ms"][key]
            assert low <= report["latency_ms"][key] <= high
        median_low, median_high = report["latency_ci_ms"]["p50"]
        assert median_low <= report["latency_ms"]["median"] <= median_high
        assert report["throughput_ci_qps"][0] <= report["throughput_qps"] <= report["throughput_ci_qps"][1]
        assert isinstance(report["converged"], bool)
        assert ("not-converged" in report["flags"]) == (not report["converged"])
        assert report["stopped"] in ("converged", "cap", "busy-host")  # why it stopped timing, in its report
        assert (report["stopped"] == "converged") == report["converged"]
        # the stated bound: the cap (or the minimum windows, if longer) plus one window, each window overrunning
        # its length by at most the query in flight
        plan = benchmark.Params(**SHORT).window_plan()
        bound_s = max(plan.max_duration_s, plan.repeats * plan.window_s) + plan.window_s
        assert report["wall_time_ms"] <= bound_s * 1000 + len(report["repeats"]) * report["latency_ms"]["max"]
        assert report["host"]["seconds"] > 0 and report["cpu_wait_ms_per_query"] >= 0
    resources = benchmark.stage.resources_for(benchmark.Params())
    assert resources.gpu == 0 and resources.exclusive
    summary = result.summary
    assert summary["hardware"]["cpu"] and [p["batch_size"] for p in summary["points"]] == [1, 4]
    assert set(summary["points"][0]["latency_ms"]) == {"p50", "p90", "p95", "p99", "mean"}
    assert {"queries", "latency_ci_ms", "throughput_ci_qps", "converged", "stopped"} <= set(summary["points"][0])
    assert "verdicts" not in summary and "reference" not in summary  # the engine records verdicts, not the stage


def test_onnxruntime_session_options_are_used(tiny_mlp_onnx, tmp_path):
    options = {"graph_optimization_level": "disable", "intra_op_threads": 1}
    result = run_stage(benchmark.stage, {**SHORT, "shapes": {"input": [2, 16]}, "onnxruntime": options,
                                         "concurrency": [1], "load_duration_s": 0.1, "load_warmup_s": 0.0},
                       {"model": tiny_mlp_onnx}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert metrics["method"]["onnxruntime"]["graph_optimization_level"] == "disable"
    executor = metrics["load_settings"]["executor"]
    assert executor["intra_op_threads"] == 1 and executor["onnxruntime"]["graph_optimization_level"] == "disable"


def test_cpu_advice_does_not_mention_gpu_clocks():
    noisy = _stats.report_host_latencies([1.0, 2.0] * 10, 30.0, 1, device="cpu")
    assert noisy["flags"] == ["unstable"]
    assert "GPU" not in noisy["warnings"][0]["message"] and "-j 1" in noisy["warnings"][0]["message"]
    assert "lock the GPU clocks" in _stats.report_host_latencies([1.0, 2.0] * 10, 30.0, 1,
                                                                 device="cuda")["warnings"][0]["message"]


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
              "shapes": {"input": [2, 16]}, "concurrency": [2], "streams": 2, "load_duration_s": 0.2,
              "load_warmup_s": 0.0}
    result = run_stage(benchmark.stage, params, {}, workdir=tmp_path, recipe_dir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    point = metrics["points"][0]
    assert point["runs_on"] == "torch cpu" and point["report"]["queries"] >= 5
    (load,) = metrics["load"]
    assert load["concurrency"] == 2 and load["streams"] == 2 and load["throughput_qps"] > 0
    assert metrics["load_settings"]["executor"]["runs_on"] == "torch cpu"
    assert benchmark.stage.files_for(benchmark.Params.model_validate(params)) == ("factory.py",)
    with pytest.raises(RecipeError, match=r"backend torch needs torch_model \(a factory\) or, as model, an "
                       r"nvfp4/mxfp8 quantize node's model"):
        run_stage(benchmark.stage, {**SHORT, "backend": "torch", "shapes": {"input": [2, 16]}}, {},
                  workdir=tmp_path / "no-model", recipe_dir=tmp_path)
    with pytest.raises(ValueError, match="profile_kernels records CUDA kernels: an engine, or device cuda"):
        benchmark.Params.model_validate({**params, "profile_kernels": True})


def _gate(params: dict, summary: dict, previous: dict | None = None, **context) -> list[str]:
    from trtflow.verdicts import failures

    validated = benchmark.Params.model_validate(params)
    return failures(benchmark.stage.judge(validated, summary, GateContext(previous=previous, **context)))


def test_latency_gates_are_judged_on_the_summary(tiny_mlp_onnx, tmp_path):
    params = {**SHORT, "shapes": {"input": [1, 16]}, "max_latency_ms_p99": 1e-6, "min_throughput_qps": 1e12}
    result = run_stage(benchmark.stage, params, {"model": tiny_mlp_onnx}, workdir=tmp_path)  # measures, no raise
    failures = _gate(params, result.summary)
    assert len(failures) == 2
    assert "batch 1: p99 latency" in failures[0] and "> max_latency_ms_p99 1e-06 ms" in failures[0]
    assert "throughput" in failures[1] and "< min_throughput_qps 1e+12" in failures[1]
    assert _gate({**params, "max_latency_ms_p99": 1e6, "min_throughput_qps": 1e-3}, result.summary) == []
    # thresholds only configure gates: they are left out of the node key
    assert {"max_latency_ms_p99", "min_throughput_qps", "baseline", "max_regression_percent", "on_inconclusive",
            "gate_figure"} <= set(benchmark.stage.gate_params)


def _summary(median_ms: float, qps: float, gpu: str = "NVIDIA H100 (sm90)") -> dict:
    return {"backend": "tensorrt", "device": "cuda", "hardware": {"gpu": gpu},
            "points": [{"batch_size": 4, "streams": 1, "median_ms": median_ms,
                        "latency_ms": {"p50": median_ms, "p99": median_ms * 2}, "throughput_qps": qps}]}


def test_regression_gate_compares_stored_figures_of_the_previous_run_on_the_same_gpu():
    """Results from before accepted references were kept: the previous run's stored figures, labelled so."""
    params = {"backend": "tensorrt", "max_regression_percent": 10, "run_to_run_percent": 0}
    now = _summary(12.0, 1000.0)
    assert _gate(params, now, None) == []
    assert _gate(params, now, _summary(11.5, 1000.0)) == []
    (slower,) = _gate(params, now, _summary(10.0, 1000.0))
    assert slower.startswith("batch 4: median latency 12 ms vs the previous run's") is False
    assert "median latency 12 ms vs the last accepted result's 10 ms (+20.0%" in slower
    assert "stored figures: drift between runs not cancelled" in slower
    # throughput is reported at the gate point, not judged (the primary figure is the median latency)
    assert _gate(params, now, _summary(12.0, 1200.0)) == []
    assert _gate({**params, "gate_figure": "throughput"}, now, _summary(12.0, 1200.0))
    # the default allows for the host running up to 15% slower between runs: 20% cannot be told from that drift,
    # and a gate that cannot decide fails (on_inconclusive: fail); 30% fails outright
    (undecided,) = _gate({**params, "run_to_run_percent": 15}, now, _summary(10.0, 1000.0))
    assert "inconclusive" in undecided
    assert _gate({**params, "run_to_run_percent": 15, "on_inconclusive": "warn"}, now, _summary(10.0, 1000.0)) == []
    (beyond,) = _gate({"backend": "tensorrt", "max_regression_percent": 10}, _summary(13.0, 1000.0),
                      _summary(10.0, 1000.0))
    assert "beyond max_regression_percent 10 and the host's run-to-run 15%" in beyond
    assert _gate(params, now, _summary(10.0, 1000.0, gpu="NVIDIA L4 (sm89)")) == []  # another GPU: no comparison
    assert _gate({"backend": "tensorrt"}, now, _summary(1.0, 1e6)) == []  # no threshold, no regression gate


def test_pinned_baseline_gate_compares_and_refuses_other_hardware(tmp_path):
    from trtflow_stages.measure.judging.baseline import make_baseline

    facts = {"gpu": "NVIDIA H100 (sm90)", "tensorrt": "10.13.0", "driver": "580.1"}
    document = make_baseline("demo", {"bench": {"stage": "benchmark", "summary": _summary(10.0, 1000.0),
                                                "facts": facts},
                                      "check": {"stage": "validate", "summary": {"passed": True, "outputs": {}},
                                                "facts": facts}})
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(document))
    params = {"backend": "tensorrt", "baseline": "baseline.json", "run_to_run_percent": 0}
    context = {"resolve": lambda p: tmp_path / p}
    assert _gate(params, _summary(10.5, 980.0), facts=facts, **context) == []  # within the default 10%
    (failure,) = _gate(params, _summary(13.0, 1000.0), facts=facts, **context)
    assert "vs the baseline's 10 ms (+30.0%" in failure and "(saved by an older trtflow): pin it again" in failure
    assert _gate({**params, "max_regression_percent": 35}, _summary(13.0, 1000.0), facts=facts, **context) == []
    (refusal,) = _gate(params, _summary(10.0, 1000.0), facts={**facts, "tensorrt": "10.14.1"}, **context)
    assert "not compared with baseline" in refusal and "tensorrt: 10.13.0 -> 10.14.1" in refusal
    (missing,) = _gate(params, {**_summary(10.0, 1000.0), "points": [
        {"batch_size": 8, "streams": 1, "latency_ms": {"p50": 1.0}, "throughput_qps": 1.0}]}, facts=facts, **context)
    assert "batch 8: baseline" in missing and "has no such point" in missing
    with pytest.raises(RecipeError, match="baseline file .*nowhere.json does not exist"):  # the engine reports it
        _gate({**params, "baseline": "nowhere.json"}, _summary(10.0, 1000.0), facts=facts, **context)


def test_closed_loop_load_on_onnxruntime(tiny_cnn_onnx, tmp_path):
    """The quickstart's check: concurrency [1, 2, 4] gives three load points, each with throughput and p50 <= p99."""
    params = {**SHORT, "shapes": {"input": [4, 3, 32, 32]}, "concurrency": [1, 2, 4], "load_duration_s": 0.3,
              "load_warmup_s": 0.05}
    result = run_stage(benchmark.stage, params, {"model": tiny_cnn_onnx}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    load = metrics["load"]
    assert [p["concurrency"] for p in load] == [1, 2, 4]
    for point in load:
        assert point["throughput_qps"] > 0 and point["request_samples"] == 4 and point["mean_batch_size"] == 4
        latency = point["latency_ms"]
        assert {"p50", "p90", "p95", "p99"} <= set(latency)
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p95"] <= latency["p99"]
        assert point["queue_ms"]["p50"] >= 0
    assert result.summary["load"] == load
    settings = metrics["load_settings"]
    assert settings["executor"]["intra_op_threads"] == "default (one per physical core)"
    assert settings["executor"]["cpus"] >= 1 and settings["request_size"] == 4


def test_open_loop_with_dynamic_batching_on_onnxruntime(tiny_mlp_onnx, tmp_path):
    params = {**SHORT, "shapes": {"input": [1, 16]}, "arrival_rate_qps": [500], "load_duration_s": 0.5,
              "load_warmup_s": 0.05, "latency_budget_ms": 1000, "rate_search_probes": 2, "confirm_duration_s": 0.5,
              "confirm_steps": 1, "dynamic_batching": {"max_batch_size": 8, "max_queue_delay_ms": 5}}
    result = run_stage(benchmark.stage, params, {"model": tiny_mlp_onnx}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    listed, *searched, confirmed, extended = metrics["open_loop"]
    assert listed["arrival_rate_qps"] == 500 and not listed["searched"]
    # a budget of a second is met at every rate: the search doubles twice, and the confirmation's one level (on
    # its grid, at or below 2000/s) meets too, and so does the one more it goes on to (the fit brackets nothing)
    assert extended["confirmation"] and extended["arrival_rate_qps"] > confirmed["arrival_rate_qps"]
    assert [p["arrival_rate_qps"] for p in searched] == [1000, 2000] and all(p["searched"] for p in searched)
    assert confirmed["confirmation"] and 1950 < confirmed["arrival_rate_qps"] <= 2000 and confirmed["meets_budget"]
    point = searched[-1]
    assert point["requests"] > 100
    assert 1 < point["mean_batch_size"] <= 8  # arrivals 0.5 ms apart wait up to 5 ms for company
    assert point["queue_ms"]["p50"] > 0 and point["latency_ms"]["p50"] <= point["latency_ms"]["p99"]
    assert point["late_requests"] == 0 and point["meets_budget"]
    (best,) = metrics["max_rate_meeting_budget"]
    # no rate missed above it: a lower bound, not a capacity
    assert best["arrival_rate_qps"] is None and best["latency_budget_ms"] == 1000 and not best["confirmed"]
    assert best["confirmation"]["lower_bound_qps"] == extended["arrival_rate_qps"] and best["search_rate_qps"] == 2000
    assert metrics["load_settings"]["dynamic_batching"]["max_batch_size"] == 8


def test_dynamic_batching_stays_within_the_profile(tiny_mlp_onnx, tmp_path):
    profile = {"name": "small", "shapes": {"input": {"min": [1, 16], "opt": [2, 16], "max": [4, 16]}}}
    params = {**SHORT, "profile": profile, "arrival_rate_qps": [100],
              "dynamic_batching": {"max_batch_size": 8}}
    with pytest.raises(RecipeError, match=r"max_batch_size 8 exceeds the largest batch the model accepts \(4"):
        run_stage(benchmark.stage, params, {"model": tiny_mlp_onnx}, workdir=tmp_path)


def test_load_params_are_checked():
    with pytest.raises(ValueError, match="applies to serving load only"):
        benchmark.Params.model_validate({"backend": "onnxruntime", "streams": 2})
    with pytest.raises(ValueError, match="gpus applies to GPU backends"):
        benchmark.Params.model_validate({"backend": "onnxruntime", "gpus": 2, "concurrency": [1]})
    with pytest.raises(ValueError, match="apply to serving load"):
        benchmark.Params.model_validate({"dynamic_batching": {"max_batch_size": 4}})
    with pytest.raises(ValueError, match="streams must be between 1 and 16"):
        benchmark.Params.model_validate({"streams": [1, 17]})
    for wrong in ({"backend": "torch", "device": "cpu", "concurrency": [1]},  # CUDA graphs need CUDA
                  {"backend": "onnxruntime", "device": "cuda", "concurrency": [1]},
                  {"backend": "torch", "device": "cuda"}):  # no serving load to run them under
        with pytest.raises(ValueError, match="torch_cuda_graphs applies to backend torch on device cuda"):
            benchmark.Params.model_validate({**wrong, "torch_cuda_graphs": True})
    assert benchmark.Params.model_validate({"backend": "torch", "device": "cuda", "arrival_rate_qps": [10],
                                            "torch_cuda_graphs": True}).torch_cuda_graphs
    params = benchmark.Params.model_validate({"backend": "tensorrt", "gpus": 2, "concurrency": [1]})
    resources = benchmark.stage.resources_for(params)
    assert resources.gpu == 2 and resources.exclusive


def test_tensorrt_backend_is_skipped_in_check_without_a_runtime():
    """Real check: this machine cannot execute engines (and cuda-python finds no device)."""
    params = benchmark.Params.model_validate({"backend": "tensorrt-rtx"})
    assert benchmark.stage.resources_for(params).gpu == 1
    if cuda_unavailable_reason() is None:
        pytest.skip("a CUDA device is visible here")
    with pytest.raises(StageSkipped) as skipped:
        benchmark.stage.check(params)
    assert skipped.value.needs and "tensorrt-rtx" in skipped.value.reason


def test_host_watch_names_what_else_ran():
    """A CPU-bound process that is not ours (started through a shell that exits, so it is nobody's child here)."""
    import os
    import subprocess
    import sys
    import time

    from trtflow_stages.measure.timing.interference import HostWatch, busy_warning

    loop = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"
    shell = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{loop}" >/dev/null 2>&1 & echo $!'],
                           capture_output=True, text=True, check=True)
    pid = int(shell.stdout.strip())
    watch = HostWatch()
    time.sleep(1.0)
    record = watch.report(busiest=1000)
    while os.path.exists(f"/proc/{pid}"):  # let it finish (1.5 s of work at most)
        time.sleep(0.1)
    assert record["others_cpu_percent"] > 0 and record["steal_percent"] is not None
    neighbour = next(p for p in record["busiest_others"] if p["pid"] == pid)
    assert neighbour["command"].startswith("python") and neighbour["cpu_percent"] > 0
    warning = busy_warning(dict(record, others_cpu_percent=60.0, wait_percent=12.0), "cpu")
    assert warning["flag"] == "busy-host" and "waited for a CPU 12% of the time" in warning["message"]
    assert busy_warning(dict(record, others_cpu_percent=1.0, wait_percent=0.5), "cpu") is None
