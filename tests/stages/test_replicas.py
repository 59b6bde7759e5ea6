"""Replica processes (one per GPU in real use), exercised on the CPU with ONNX Runtime: spawned processes load the
model from a picklable spec, start each level together and send back request records that merge into one run."""

from __future__ import annotations

import numpy as np
import pytest

from trtflow_stages.measure import load as _load
from trtflow_stages.measure import serving as _serving
from trtflow_stages.measure.instances import ExecutorSpec
from trtflow_stages.measure.replicas import Replicas
from trtflow_stages.runtimes.ort import OrtOptions


@pytest.mark.slow
def test_two_replicas_serve_one_level_together(tiny_mlp_onnx):
    spec = ExecutorSpec(backend="onnxruntime", device="cpu", model=str(tiny_mlp_onnx),
                        feed={"input": np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)},
                        onnxruntime=OrtOptions(intra_op_threads=1))
    with Replicas(spec, ["0", "1"], instances=1, batching=None, warm_sizes=[1, 4]) as replicas:
        assert [settings["intra_op_threads"] for settings in replicas.settings] == [1, 1]
        closed = replicas.run([_load.Level("closed", 2, 4, 0.0, 0.3)] * 2, timeout_s=120)
        open_runs = replicas.run([_load.Level("open", 100, 1, 0.0, 0.3, seed=1),
                                  _load.Level("open", 100, 1, 0.0, 0.3, seed=2)], timeout_s=120)
    assert len(closed) == 2 and all(run.requests for run in closed)
    # started together: each replica's window overlaps the other's for most of its length
    merged = _load.merge_runs(closed)
    assert (merged.window_end_ns - merged.window_start_ns) > 0.5 * (closed[0].window_end_ns - closed[0].window_start_ns)
    total = _load.summarize_run(merged)
    assert total["requests"] > 0 and total["mean_batch_size"] == 4
    assert total["throughput_qps"] > max(_load.summarize_run(run)["throughput_qps"] for run in closed) * 0.5
    seeds = [sorted(r.arrival_ns - run.requests[0].arrival_ns for r in run.requests) for run in open_runs]
    assert seeds[0] != seeds[1]  # each replica draws its own arrivals


def test_scaling_efficiency_against_one_gpu():
    load = [{"streams": 1, "gpus": 1, "concurrency": 4, "throughput_qps": 1000.0},
            {"streams": 1, "gpus": 2, "concurrency": 8, "concurrency_per_gpu": 4, "throughput_qps": 1900.0},
            {"streams": 2, "gpus": 2, "concurrency": 8, "concurrency_per_gpu": 4, "throughput_qps": 1.0}]
    (row,) = _serving.scaling(load, 2)  # no one-GPU point for 2 streams: nothing to compare with
    assert row == {"streams": 1, "concurrency_per_gpu": 4, "gpus": 2, "throughput_qps_1gpu": 1000.0,
                   "throughput_qps": 1900.0, "scaling_efficiency": 0.95}
