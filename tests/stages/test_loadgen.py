"""MLPerf LoadGen driving trtflow's server (`measure.serving.loadgen`) on a tiny real model, and through the benchmark
stage.

The model is a tiny MLP on ONNX Runtime (one thread); nothing asserts on speed, only on what LoadGen issued, how the
server answered, and what the stage reports (scenarios named as MLPerf names them, LoadGen's verdicts, intervals).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from trtflow.testing import run_stage
from trtflow_stages import benchmark
from trtflow_stages.measure.serving import loadgen
from trtflow_stages.measure.serving.traffic import DynamicBatching, Server, summarize_run
from trtflow_stages.runtimes.ort import OrtOptions, create_session

pytest.importorskip("mlperf_loadgen")


@pytest.fixture
def mlp(tiny_mlp_onnx):
    session = create_session(tiny_mlp_onnx, OrtOptions(intra_op_threads=1))
    feed = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    batches: list[int] = []

    def run(batch: int) -> None:
        batches.append(batch)
        session.run(None, {"input": feed[:batch]})

    return run, batches


def test_early_stopping_needs_the_queries_mlperf_asks_for():
    assert loadgen.early_stopping_queries(0.99) == 459
    assert loadgen.early_stopping_queries(0.9, overlatency=1) == 64
    assert loadgen.early_stopping_queries(0.99, overlatency=1) == 662


def test_server_scenario_is_judged_by_loadgen(mlp):
    run, _ = mlp
    with Server([run], warm_sizes=[1]) as server:
        result = loadgen.run(server, loadgen.ScenarioSpec("Server", 0.5, target_qps=600.0, latency_budget_ms=1000.0,
                                                          min_query_count=459))
    verdict = result.settings["loadgen"]
    assert verdict["valid"] and verdict["result_validity"] == "VALID" and verdict["early_stopping_met"]
    assert len(result.requests) == len(result.settings["latencies_ns"]) == verdict["result_query_count"] >= 459
    assert all(r.done_ns >= r.dispatch_ns > 0 for r in result.requests)
    summary = summarize_run(result, latency_budget_ms=1000.0)
    assert summary["meets_budget"] and summary["generator"] == "loadgen" and summary["scenario"] == "Server"
    assert "latencies_ns" not in summary and summary["queries"] >= 459
    for key in ("p50", "p99"):
        low, high = summary["latency_ci_ms"][key]
        assert low <= summary["latency_ms"][key] <= high
    # a budget no request can meet: INVALID, so the rate does not meet it
    with Server([run], warm_sizes=[1]) as server:
        tight = loadgen.run(server, loadgen.ScenarioSpec("Server", 0.3, target_qps=600.0, latency_budget_ms=1e-4,
                                                         min_query_count=100))
    assert not tight.settings["loadgen"]["valid"] and not summarize_run(tight, 1e-4)["meets_budget"]


def test_offline_and_streams(mlp):
    run, batches = mlp
    with Server([run], DynamicBatching(max_batch_size=8), warm_sizes=range(1, 9)) as server:
        batches.clear()
        offline = loadgen.run_sized(server, loadgen.ScenarioSpec("Offline", 0.3, target_qps=200.0, min_query_count=1,
                                                                 request_samples=8))
    verdict = offline.settings["loadgen"]
    assert verdict["result_samples_per_second"] > 0 and max(batches) == 8  # the batcher filled its batches
    assert sum(r.samples for r in offline.requests) == len(offline.settings["latencies_ns"])
    with Server([run], warm_sizes=[1, 4]) as server:
        single = loadgen.run(server, loadgen.ScenarioSpec("SingleStream", 0.2, min_query_count=64,
                                                          expected_latency_ms=0.2))
        multi = loadgen.run(server, loadgen.ScenarioSpec("MultiStream", 0.2, min_query_count=100,
                                                         samples_per_query=4, expected_latency_ms=0.2))
    assert single.settings["loadgen"]["early_stopping_latency_ss"] > 0
    assert len(single.settings["latencies_ns"]) == len(single.requests) >= 64
    assert all(r.samples == 4 for r in multi.requests)  # one query, one request of its samples
    assert len(multi.settings["latencies_ns"]) == len(multi.requests)  # query latencies


def test_benchmark_stage_runs_mlperf_scenarios(tiny_mlp_onnx, tmp_path):
    params = {"backend": "onnxruntime", "warmup_ms": 5, "min_duration_s": 0.0, "shapes": {"input": [1, 16]},
              "onnxruntime": {"intra_op_threads": 1}, "arrival_rate_qps": [400], "latency_budget_ms": 1000,
              "scenarios": ["Offline", "SingleStream", "MultiStream"], "multi_stream_samples": 4,
              "load_duration_s": 0.2, "load_generator": "loadgen"}  # LoadGen's own query counts (459, 64, 662)
    result = run_stage(benchmark.stage, params, {"model": tiny_mlp_onnx}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert metrics["load_settings"]["generator"] == "loadgen"
    (server,) = metrics["open_loop"]
    assert server["scenario"] == "Server" and server["generator"] == "loadgen" and server["meets_budget"]
    assert server["loadgen"]["result_validity"] == "VALID" and server["queries"] >= 459
    assert [s["scenario"] for s in metrics["scenarios"]] == ["Offline", "SingleStream", "MultiStream"]
    for scenario in metrics["scenarios"]:
        assert scenario["generator"] == "loadgen" and scenario["throughput_qps"] > 0 and scenario["queries"] > 0
        for key in ("p50", "p99"):
            low, high = scenario["latency_ci_ms"][key]
            assert low <= scenario["latency_ms"][key] <= high
    assert result.summary["scenarios"] == metrics["scenarios"]
    (best,) = metrics["max_rate_meeting_budget"]
    assert best["generator"] == "loadgen" and best["arrival_rate_qps"] == 400


def test_scenarios_need_loadgen():
    with pytest.raises(ValueError, match="run by MLPerf LoadGen"):
        benchmark.Params.model_validate({"scenarios": ["Offline"], "load_generator": "trtflow"})
