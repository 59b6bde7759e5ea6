"""The build stage's precision audit on real TensorRT-RTX networks (parsed and built on the CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_build import CNN_DYNAMIC, QDQ_PROFILE, qdq_matmul_model

from trtflow.environment import module_available
from trtflow.stage import StageFailed
from trtflow.testing import run_stage
from trtflow_stages import build

needs_rtx = pytest.mark.skipif(not module_available("tensorrt_rtx"), reason="needs tensorrt-rtx")


def build_engine(tmp_path: Path, model: Path, **params) -> tuple:
    result = run_stage(build.stage, {"backend": "tensorrt-rtx", **params}, {"model": model}, workdir=tmp_path)
    return result, json.loads(result.outputs["provenance"].read_text())


@needs_rtx
def test_an_int8_engine_records_its_int8_layers(tmp_path):
    result, manifest = build_engine(tmp_path, qdq_matmul_model(tmp_path / "qdq.onnx"), precision="int8",
                                    profile=QDQ_PROFILE)
    network = manifest["precision"]["network"]
    assert manifest["precision"]["requested"] == "int8"
    assert network["heavy_layers_by_precision"] == {"int8": 1}  # the MatMul reads int8 input and weights
    assert network["quantize_layers"] == {"int8": 1}
    (matmul,) = [layer for layer in network["per_layer"] if layer["type"] == "MATRIX_MULTIPLY"]
    assert matmul["precision"] == "int8" and matmul["outputs"] == ["fp32"]
    # No TensorRT-RTX runtime runs here: the built engine is not inspected, and the record says why.
    assert manifest["precision"]["engine"]["inspected"] is False
    assert "runtime" in manifest["precision"]["engine"]["reason"]
    assert result.summary["precision_audit"]["heavy_layers"] == {"int8": 1}


@needs_rtx
def test_an_fp16_model_computes_its_convolutions_in_fp16(tmp_path, tiny_cnn_fp16_onnx, tiny_cnn_onnx):
    _, fp16 = build_engine(tmp_path / "fp16", tiny_cnn_fp16_onnx, profile=CNN_DYNAMIC)
    _, fp32 = build_engine(tmp_path / "fp32", tiny_cnn_onnx, profile=CNN_DYNAMIC)
    assert set(fp16["precision"]["network"]["heavy_layers_by_precision"]) == {"fp16"}
    assert set(fp32["precision"]["network"]["heavy_layers_by_precision"]) == {"fp32"}


def qdq_beside_the_compute(path: Path) -> Path:
    """Q/DQ on a tensor that only leaves the graph: the model carries int8, but no layer computes in it."""
    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
                    numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
                    numpy_helper.from_array(np.array(0, np.int8), "zero")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul"),
             helper.make_node("QuantizeLinear", ["y", "scale", "zero"], ["y_q"], name="q"),
             helper.make_node("DequantizeLinear", ["y_q", "scale", "zero"], ["y_dq"], name="dq")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y_dq", TensorProto.FLOAT, ["batch", 8])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), str(path))
    return path


@needs_rtx
def test_int8_asked_for_a_network_with_no_int8_layer_fails_before_building(tmp_path):
    model = qdq_beside_the_compute(tmp_path / "beside.onnx")
    with pytest.raises(StageFailed) as info:
        build_engine(tmp_path / "out", model, precision="int8", profile=QDQ_PROFILE)
    assert "precision: int8 was asked, but no layer of the parsed network computes in int8" in info.value.message
    assert "1 tensor(s) are quantized to int8" in info.value.message
    assert "quantize the model's Conv/MatMul/Gemm nodes" in info.value.hint
    assert not (tmp_path / "out" / "scratch" / "out" / "model.engine").exists()
    # The same model built as it is (strongly typed, nothing asserted) is fine: the audit only records.
    _, manifest = build_engine(tmp_path / "plain", model, profile=QDQ_PROFILE)
    assert manifest["precision"]["network"]["heavy_layers_by_precision"] == {"fp32": 1}
