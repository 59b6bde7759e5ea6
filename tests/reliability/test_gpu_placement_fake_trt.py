"""Several GPUs per node (issue 20.6): a node that asks for N GPUs gets N, and its process sees all of them.

The GPUs are what a fake ``nvidia-smi`` on PATH lists: no GPU and no NVIDIA driver exist on CI machines, so the
driver's tool is stood in for here, as the TensorRT runtime is in the other ``*_fake_trt*`` tests. Everything
else is real: the scheduler, the GPU locks, the local executor, the node's process and `trtflow.environment`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu*)
    echo "0, GPU-aaaa1111, NVIDIA H100 80GB HBM3, 9.0, 550.54, 81559"
    echo "1, GPU-bbbb2222, NVIDIA H100 80GB HBM3, 9.0, 550.54, 81559" ;;
  *-L*)
    echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa1111)"
    echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb2222)" ;;
esac
"""


@pytest.fixture
def two_gpus(tmp_path: Path, plugin_env: dict[str, str]) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    env = dict(plugin_env, PATH=f"{bin_dir}{os.pathsep}{plugin_env.get('PATH', '')}",
               TRTFLOW_GPU_LOCK_DIR=str(tmp_path / "gpu-locks"))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def test_a_node_that_asks_for_two_gpus_sees_both(tmp_path: Path, trtflow, two_gpus: dict[str, str]) -> None:
    recipe = tmp_path / "gpus.yaml"
    recipe.write_text("name: gpus\nnodes:\n"
                      "  - {name: pair, stage: probe, params: {gpus: 2}}\n"
                      "  - {name: single, stage: probe, params: {gpus: 1}}\n"
                      "  - {name: triple, stage: probe, params: {gpus: 3}}\n")
    proc = trtflow("run", str(recipe), "-j", "1", env=two_gpus)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pair = json.loads((tmp_path / "build" / "gpus" / "pair" / "devices.json").read_text())
    assert pair["cuda_visible_devices"] == "GPU-aaaa1111,GPU-bbbb2222", "a node given two GPUs saw only the first"
    assert pair["devices"] == ["GPU-aaaa1111", "GPU-bbbb2222"] and pair["ctx_gpu"] == 0
    single = json.loads((tmp_path / "build" / "gpus" / "single" / "devices.json").read_text())
    assert single["devices"] in (["GPU-aaaa1111"], ["GPU-bbbb2222"])
    assert "needs 3 GPU(s); this machine has" in proc.stdout  # skipped, never cached


def test_a_benchmark_serves_from_the_gpus_its_node_was_given(two_gpus: dict[str, str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Serving replicas are pinned by the ids the runner gave the node (UUIDs), not by ordinals: a replica's
    CUDA_VISIBLE_DEVICES=0 would name the machine's first GPU even when the node was given the second."""
    from trtflow.environment import gpus
    from trtflow_stages.measure.serving.measurements import serving_gpus

    monkeypatch.setenv("PATH", two_gpus["PATH"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb2222")  # the node was given the machine's second GPU
    gpus.cache_clear()
    try:
        assert serving_gpus(1) == ["GPU-bbbb2222"]
        assert serving_gpus("all") == ["GPU-bbbb2222"]
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa1111,GPU-bbbb2222")
        gpus.cache_clear()
        assert serving_gpus(2) == ["GPU-aaaa1111", "GPU-bbbb2222"]
    finally:
        gpus.cache_clear()
