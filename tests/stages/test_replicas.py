"""Replica processes (one per GPU in real use), exercised on the CPU with ONNX Runtime: spawned processes load the
model from a picklable spec, start each level together and send back request records that merge into one run."""

from __future__ import annotations

import numpy as np
import pytest

from trtflow_stages.measure.serving import levels as _levels
from trtflow_stages.measure.serving import measurements as _serving
from trtflow_stages.measure.serving import traffic as _load
from trtflow_stages.measure.serving.instances import ExecutorSpec
from trtflow_stages.measure.serving.replicas import Replicas
from trtflow_stages.runtimes.ort import OrtOptions


@pytest.mark.slow
def test_two_replicas_serve_one_level_together(tiny_mlp_onnx):
    spec = ExecutorSpec(backend="onnxruntime", device="cpu", model=str(tiny_mlp_onnx),
                        feed={"input": np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)},
                        onnxruntime=OrtOptions(intra_op_threads=1))
    gpus = [f"GPU-{'a' * 8}-0000-0000-0000-00000000000{i}" for i in (2, 3)]  # what serving_gpus hands out
    with Replicas(spec, gpus, instances=1, batching=None, warm_sizes=[1, 4]) as replicas:
        assert [settings["intra_op_threads"] for settings in replicas.settings] == [1, 1]
        # each replica process sees exactly its own GPU
        assert [settings["cuda_visible_devices"] for settings in replicas.settings] == gpus
        closed = replicas.run([_levels.Level("closed", 2, 4, 0.0, 0.3)] * 2, timeout_s=120)
        open_runs = replicas.run([_levels.Level("open", 100, 1, 0.0, 0.3, seed=1),
                                  _levels.Level("open", 100, 1, 0.0, 0.3, seed=2)], timeout_s=120)
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


SMI_QUERY = """0, GPU-00000000-0000-0000-0000-000000000000, NVIDIA H200, 9.0, 580.159.04, 143771
1, GPU-11111111-0000-0000-0000-000000000000, NVIDIA H200, 9.0, 580.159.04, 143771
2, GPU-22222222-0000-0000-0000-000000000000, NVIDIA H200, 9.0, 580.159.04, 143771
3, GPU-33333333-0000-0000-0000-000000000000, NVIDIA H200, 9.0, 580.159.04, 143771
"""
SMI_LIST = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{str(i) * 8}-0000-0000-0000-000000000000)\n" for i in range(4))


def test_replicas_use_every_gpu_the_node_was_given():
    """The runner names all of a node's GPUs in CUDA_VISIBLE_DEVICES (here the third and fourth of four): the
    benchmark serves from each, by UUID (a replica's own CUDA_VISIBLE_DEVICES is read without the parent's), and
    counts them as they are."""
    from trtflow.environment import parse_smi, visible
    from trtflow.errors import StageSkipped

    given = visible(parse_smi(SMI_QUERY, SMI_LIST), "2,3")
    assert [gpu.index for gpu in given] == [0, 1]  # CUDA renumbers them; their UUIDs name them anywhere
    assert _serving.serving_gpus("all", given) == ["GPU-22222222-0000-0000-0000-000000000000",
                                                   "GPU-33333333-0000-0000-0000-000000000000"]
    assert _serving.serving_gpus(2, given) == _serving.serving_gpus("all", given)
    assert _serving.serving_gpus(1, given) == ["GPU-22222222-0000-0000-0000-000000000000"]
    with pytest.raises(StageSkipped, match="gpus: 3 but 2 GPU"):
        _serving.serving_gpus(3, given)
    with pytest.raises(StageSkipped, match="gpus: all but 0 GPU"):
        _serving.serving_gpus("all", visible(parse_smi(SMI_QUERY, SMI_LIST), "7"))


def test_a_level_is_shared_among_replicas():
    from trtflow_stages.measure.serving.levels import Level
    from trtflow_stages.measure.serving.loadgen import ScenarioSpec

    server = Level("loadgen", 300.0, 1, 0.0, 2.0, seed=5, scenario=ScenarioSpec("Server", 2.0, target_qps=300.0))
    parts = [_serving.share(server, 2, index) for index in range(2)]
    assert [p.value for p in parts] == [150.0, 150.0] and [p.scenario.target_qps for p in parts] == [150.0, 150.0]
    assert [p.scenario.seed for p in parts] == [5, 6]  # independent Poisson streams add up to one of 300/s
    closed = _serving.share(Level("closed", 4, 1, 0.0, 1.0), 2, 1)
    assert closed.value == 4  # clients are per replica
