"""The shipped precision study on a CPU-only machine (a 2-layer ViT): fp16, int8 and fp8 are converted, quantized,
validated and built for Blackwell with TensorRT-RTX; the nvfp4/mxfp8 nodes and everything that runs on a GPU are
skipped with a reason that names the GPU need, never failed and never faked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli
from trtflow.environment import gpus, module_available

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "pipelines" / "precision_study.yaml"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(gpus()), reason="checks the CPU-only behaviour"),
              pytest.mark.skipif(not module_available("tensorrt_rtx"), reason="needs tensorrt-rtx")]


def test_the_study_runs_on_the_cpu_with_the_gpu_nodes_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_SIZE", "_small")
    monkeypatch.setenv("VIT_IMAGE", "32")
    plan = trtflow_cli("plan", str(STUDY), "--json", cwd=tmp_path)
    steps = {step["node"]: step for step in json.loads(plan.stdout)}
    assert {"quantize-torch-nvfp4", "quantize-torch-mxfp8", "build-nvfp4", "benchmark-fake-quant-nvfp4"} <= set(steps)
    trtflow_cli("run", str(STUDY), "--output-dir", str(tmp_path / "out"), cwd=tmp_path)
    report = json.loads(trtflow_cli("report", str(STUDY), "-f", "json", cwd=tmp_path).stdout)
    nodes = {node["node"]: node for node in report["nodes"]}
    done = {name for name, node in nodes.items() if node["status"] == "done"}
    assert done == {"export", "convert-fp16", "quantize-int8", "quantize-fp8", "validate-fp16", "validate-int8",
                    "build-fp16", "build-int8", "build-fp8"}
    for name in ("quantize-torch-nvfp4", "quantize-torch-mxfp8"):
        assert nodes[name]["status"] == "skipped"
        assert "runs only on a CUDA GPU, and this machine has none" in nodes[name]["reason"]
    assert nodes["build-nvfp4"]["reason"] == "upstream quantize-torch-nvfp4 cannot run here"
    for name, node in nodes.items():
        if name not in done:
            assert node["status"] == "skipped" and ("GPU" in node["reason"] or "upstream" in node["reason"]), node
    built = json.loads((tmp_path / "out" / "build-fp8" / "engine.json").read_text())
    assert built["builder"]["compute_capabilities"] == ["12.0"] and built["engine_bytes"] > 0
    source = json.loads((tmp_path / "out" / "export" / "source.json").read_text())
    assert source["model"].endswith("vit.py:build_small") and source["code_digest"]
