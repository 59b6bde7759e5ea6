"""The PyTorch route of ModelOpt (nvfp4/mxfp8 need a CUDA GPU; their plumbing is exercised here on the CPU with
ModelOpt's int8 config, which fake-quantizes on the CPU): quantize, TensorRT's restrictions, checkpoint round trip,
ONNX export with the fp32 export's I/O names and types."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("modelopt.torch.quantization")

from trtflow_stages.precision import torch_quant  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models.vit import build_small  # noqa: E402


def test_nvfp4_and_mxfp8_configs_put_convolutions_in_fp8():
    for mode, method in torch_quant.CONFIGS:
        config = torch_quant.quant_config(mode, method)
        conv = [entry for entry in config["quant_cfg"] if entry.get("parent_class") == "nn.Conv2d"]
        assert [entry["cfg"]["num_bits"] for entry in conv] == [(4, 3), (4, 3)]
    block = torch_quant.quant_config("nvfp4", "max")["quant_cfg"][1]["cfg"]
    assert block["num_bits"] == (2, 1) and block["block_sizes"][-1] == 16
    assert torch_quant.quant_config("nvfp4", "awq_lite")["algorithm"] == "awq_lite"
    with pytest.raises(ValueError, match=r"calibration_method 'awq_lite' does not apply to mode mxfp8; choose one "
                       r"of \['max'\]"):
        torch_quant.config_name("mxfp8", "awq_lite")


@pytest.mark.slow
def test_quantize_save_restore_and_export_on_the_cpu(tmp_path):
    import modelopt.torch.quantization as mtq
    import onnxruntime as ort

    torch.manual_seed(0)  # the weights and images: the bounds below hold for this draw, not for every one
    images = torch.rand(2, 3, 32, 32)
    model = build_small()
    reference = model(images).detach()
    config = copy.deepcopy(mtq.INT8_DEFAULT_CFG)
    config["quant_cfg"].append({"quantizer_name": "head.*", "enable": False})  # what quant_config adds for exclude
    model, off = torch_quant.quantize_module(model, config, lambda m: m(images), lambda m: m(images),
                                             exclude=["head"])
    assert off == {"excluded": ["head.input_quantizer", "head.output_quantizer", "head.weight_quantizer"],
                   "image_input_conv": ["patch_embed.input_quantizer"]}
    counts = torch_quant.quantizer_counts(model)
    assert counts["quantizers"] == {"int8 input": 13, "int8 weight": 9}
    assert torch_quant.quant_config("nvfp4", "max", ["head"])["quant_cfg"][-1] == {"quantizer_name": "head.*",
                                                                                  "enable": False}
    assert counts["quantized_by_module_type"] == {"QuantConv2d": 1, "QuantLinear": 8}
    with torch.no_grad():
        quantized = model(images)
    assert 0 < float((quantized - reference).abs().max()) < 0.2  # fake quantization changes the outputs a little

    checkpoint = tmp_path / "modelopt.pth"
    torch_quant.save_checkpoint(model, checkpoint)
    restored = torch_quant.restore_checkpoint(build_small(), checkpoint)
    with torch.no_grad():
        assert torch.equal(restored(images), quantized)
    assert torch_quant.quantizer_counts(restored) == counts

    target = tmp_path / "model.onnx"
    torch_quant.export_onnx(model, [images], {}, ["images"], ["logits"], {"images": {0: "batch"}}, 17, "fp32",
                            target, tmp_path / "export")
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    (graph_input,) = session.get_inputs()
    assert (graph_input.name, graph_input.type, graph_input.shape) == ("images", "tensor(float)", ["batch", 3, 32, 32])
    assert [output.name for output in session.get_outputs()] == ["logits"]
    batch = np.random.default_rng(0).random((3, 3, 32, 32), dtype=np.float32)
    (logits,) = session.run(None, {"images": batch})
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    # ONNX Runtime's int8 Q/DQ and ModelOpt's fake quantization round a few values to neighbouring steps
    cosine = float((logits * expected).sum() / np.linalg.norm(logits) / np.linalg.norm(expected))
    assert logits.shape == (3, 10) and np.abs(logits - expected).max() < 0.1 and cosine > 0.995
    facts = torch_quant.onnx_facts(target)
    assert facts["opset"] == 17 and facts["custom_ops"] == {} and facts["nodes"] > 100


def test_float16_io_becomes_float32_with_casts():
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert torch_quant.keep_float32_io(proto) == ["x", "y"]
    onnx.checker.check_model(proto)
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": np.array([-1.5, 2.25], np.float32)})
    assert out.dtype == np.float32 and out.tolist() == [0.0, 2.25]
    assert [n.op_type for n in proto.graph.node] == ["Cast", "Relu", "Cast"]
