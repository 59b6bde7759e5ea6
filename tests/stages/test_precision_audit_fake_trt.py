"""The engine side of the build's precision audit, where a TensorRT runtime exists.

No TensorRT engine can execute here, so the machine gets an RTX GPU and TensorRT's deserialisation
(`runtimes.trt_runtime.deserialize_engine`, through `fake_rtx_machine`) returns `FakeInspectedEngine`, which stands
for a deserialised engine and its engine
inspector: ``layer_information()`` returns what ``IEngineInspector.get_engine_information(JSON)`` returns for an
engine built with profiling_verbosity: detailed (or names only). The network parse, the build, the provenance
and the audit logic are real (TensorRT-RTX on the CPU).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_build import QDQ_PROFILE, qdq_matmul_model
from test_runtime_fake_trt import fake_rtx_machine

from trtflow.environment import module_available
from trtflow.stage import StageFailed
from trtflow.testing import run_stage
from trtflow_stages import build
from trtflow_stages.runtimes.trt_audit import engine_precision

needs_rtx = pytest.mark.skipif(not module_available("tensorrt_rtx"), reason="needs tensorrt-rtx")


def detailed(*layers: tuple[str, str, str]) -> dict[str, Any]:
    """Inspector JSON: (name, layer type, input format) per layer."""
    return {"Layers": [{"Name": name, "LayerType": kind, "Inputs": [{"Name": "in", "Format/Datatype": fmt}],
                        "Outputs": [{"Name": "out", "Format/Datatype": "Float"}]} for name, kind, fmt in layers],
            "Bindings": ["x", "y"]}


class FakeInspectedEngine:
    """Stands for an opened TensorRT engine: its engine inspector returns ``information``."""

    def __init__(self, information: dict[str, Any], opened: list) -> None:
        self.information = information
        self.opened = opened

    def __enter__(self) -> FakeInspectedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def layer_information(self) -> dict[str, Any]:
        return self.information


@pytest.fixture
def inspector(monkeypatch):
    """Every check open_engine makes (provenance, version, GPU, digest) runs for real on the built engine."""
    state: dict[str, Any] = {}
    state["opened"] = fake_rtx_machine(monkeypatch, lambda: FakeInspectedEngine(state["information"], state["opened"]))
    return state


def build_int8(tmp_path: Path) -> Any:
    return run_stage(build.stage, {"backend": "tensorrt-rtx", "precision": "int8", "profile": QDQ_PROFILE},
                     {"model": qdq_matmul_model(tmp_path / "qdq.onnx")}, workdir=tmp_path / "work")


@needs_rtx
def test_an_engine_whose_kernels_are_int8_passes_and_is_recorded(tmp_path, inspector):
    inspector["information"] = detailed(("x_q + matmul", "CaskGemmMatrixMultiply", "Int8 NC/32HW32"),
                                        ("reformat", "Reformat", "Float"))
    result = build_int8(tmp_path)
    manifest = json.loads(result.outputs["provenance"].read_text())
    engine = manifest["precision"]["engine"]
    assert engine["inspected"] is True and engine["by_precision"] == {"fp32": 1, "int8": 1}
    assert engine["per_layer"][0] == {"name": "x_q + matmul", "type": "CaskGemmMatrixMultiply", "precision": "int8"}
    assert result.summary["precision_audit"]["engine"] == {"fp32": 1, "int8": 1}
    assert inspector["opened"] == [("model.engine", "tensorrt-rtx", manifest["engine_digest"])]


@needs_rtx
def test_an_engine_asked_int8_without_int8_kernels_fails_the_build(tmp_path, inspector):
    inspector["information"] = detailed(("matmul", "CaskGemmMatrixMultiply", "Half"), ("out", "Reformat", "Float"))
    with pytest.raises(StageFailed) as info:
        build_int8(tmp_path)
    assert info.value.message == ("precision: int8 was asked, but TensorRT built no int8 kernel: the engine's "
                                  "layers run in fp16 (1 layers), fp32 (1 layers)")
    assert "precision.engine.per_layer" in info.value.hint


@needs_rtx
def test_an_engine_with_layer_names_only_is_recorded_as_not_inspected(tmp_path, inspector):
    inspector["information"] = {"Layers": ["matmul", "reformat"], "Bindings": ["x", "y"]}
    result = build_int8(tmp_path)
    engine = json.loads(result.outputs["provenance"].read_text())["precision"]["engine"]
    assert engine == {"layers": 2, "inspected": False,
                      "reason": "the engine holds layer names only: build with profiling_verbosity: detailed"}


def test_engine_formats_map_to_precisions():
    layers = [("a", "Conv", "Int8 NC/32HW32"), ("b", "Conv", "FP8 NHWC"), ("c", "Gemm", "Half(1,64)"),
              ("d", "Gemm", "BFloat16"), ("e", "Shuffle", "Float")]
    audit = engine_precision(detailed(*layers))
    assert [layer["precision"] for layer in audit["per_layer"]] == ["int8", "fp8", "fp16", "bf16", "fp32"]
