"""TensorRT-RTX (on the CPU) builds NVFP4 and MXFP8 models for Blackwell (compute capability 12.0), and refuses FP4
for an older target with its own message. The models are made here in the form ModelOpt's nvfp4/mxfp8 exporters
write (modelopt/onnx/export): FP4 weights with two-level DequantizeLinear (FP8 block scales of 16, fp32 tensor
scale) and TRT_FP4DynamicQuantize activations; FP8 weights with E8M0 block scales of 32 through
TRT_MXFP8DequantizeLinear and TRT_MXFP8DynamicQuantize activations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtflow.environment import module_available
from trtflow.stage import StageFailed
from trtflow.testing import run_stage
from trtflow_stages import build
from trtflow_stages.precision.torch_quant import onnx_facts

pytestmark = pytest.mark.skipif(not module_available("tensorrt_rtx"), reason="needs tensorrt-rtx")
K = N = 64


def nvfp4_linear(path: Path) -> Path:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array(0.01, np.float32))),
        helper.make_node("TRT_FP4DynamicQuantize", ["x", "s"], ["xq", "xs"], domain="trt", axis=-1, block_size=16,
                         scale_type=T.FLOAT8E4M3FN),
        helper.make_node("DequantizeLinear", ["xs", "s"], ["xs32"]),
        helper.make_node("DequantizeLinear", ["xq", "xs32"], ["xd"], axis=-1, block_size=16),
        helper.make_node("DequantizeLinear", ["wsb", "wst"], ["ws32"]),
        helper.make_node("DequantizeLinear", ["wq", "ws32"], ["wd"], axis=-1, block_size=16),
        helper.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0]),
        helper.make_node("Cast", ["xd"], ["xh"], to=T.FLOAT16),
        helper.make_node("Cast", ["wt"], ["wh"], to=T.FLOAT16),
        helper.make_node("MatMul", ["xh", "wh"], ["y"]),
    ]
    weights = [
        helper.make_tensor("wq", T.FLOAT4E2M1, [N, K], rng.integers(0, 255, N * K // 2, np.uint8).tobytes(), raw=True),
        helper.make_tensor("wsb", T.FLOAT8E4M3FN, [N, K // 16], np.full(N * K // 16, 0x38, np.uint8).tobytes(),
                           raw=True),
        numpy_helper.from_array(np.array(0.001, np.float32), "wst"),
    ]
    graph = helper.make_graph(nodes, "nvfp4", [helper.make_tensor_value_info("x", T.FLOAT16, [4, 8, K])],
                              [helper.make_tensor_value_info("y", T.FLOAT16, [4, 8, N])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("trt", 1)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def mxfp8_linear(path: Path) -> Path:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    nodes = [
        helper.make_node("TRT_MXFP8DynamicQuantize", ["x"], ["xq", "xs"], domain="trt", axis=-1, block_size=32,
                         output_dtype=T.FLOAT8E4M3FN),
        helper.make_node("TRT_MXFP8DequantizeLinear", ["xq", "xs"], ["xd"], domain="trt", axis=-1, block_size=32,
                         output_dtype=T.FLOAT16),
        helper.make_node("TRT_MXFP8DequantizeLinear", ["w", "ws"], ["wd"], domain="trt", axis=-1, block_size=32,
                         output_dtype=T.FLOAT16),
        helper.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["xd", "wt"], ["y"]),
    ]
    weights = [helper.make_tensor("w", T.FLOAT8E4M3FN, [N, K], np.full(N * K, 0x38, np.uint8).tobytes(), raw=True),
               numpy_helper.from_array(np.full((N, K // 32), 127, np.uint8), "ws")]
    graph = helper.make_graph(nodes, "mxfp8", [helper.make_tensor_value_info("x", T.FLOAT16, [4, 8, K])],
                              [helper.make_tensor_value_info("y", T.FLOAT16, [4, 8, N])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("trt", 1)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_quantize_records_the_custom_ops_and_block_types(tmp_path):
    facts = onnx_facts(nvfp4_linear(tmp_path / "nvfp4.onnx"))
    assert facts["opsets"] == {"ai.onnx": 23, "trt": 1} and facts["custom_ops"] == {"trt::TRT_FP4DynamicQuantize": 1}
    assert facts["block_dequantize_linear"] == 2
    assert facts["low_precision_initializers"] == {"float4e2m1": 1, "float8e4m3fn": 1}
    assert onnx_facts(mxfp8_linear(tmp_path / "mxfp8.onnx"))["custom_ops"] == {
        "trt::TRT_MXFP8DequantizeLinear": 2, "trt::TRT_MXFP8DynamicQuantize": 1}


@pytest.mark.slow
@pytest.mark.parametrize(("make", "precision"), [(nvfp4_linear, "fp4"), (mxfp8_linear, "fp8")])
def test_tensorrt_rtx_builds_block_formats_for_blackwell(tmp_path, make, precision):
    result = run_stage(build.stage, {"backend": "tensorrt-rtx", "compute_capabilities": ["12.0"]},
                       {"model": make(tmp_path / "model.onnx")}, tmp_path / "work")
    assert result.summary["engine_bytes"] > 0 and result.summary["build_seconds"] > 0
    assert precision in result.summary["precision_audit"]["network"]  # layers reading tensors dequantized from it


@pytest.mark.slow
def test_fp4_for_an_older_target_is_refused_by_tensorrt_rtx_naming_the_target_and_type(tmp_path):
    with pytest.raises(StageFailed) as refused:
        run_stage(build.stage, {"backend": "tensorrt-rtx", "compute_capabilities": ["8.9"]},
                  {"model": nvfp4_linear(tmp_path / "model.onnx")}, tmp_path / "work")
    assert "Cannot compile for target(s) sm89, because the model contains HW-specific datatypes: fp4_e2m1" in \
        refused.value.message
