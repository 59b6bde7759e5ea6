"""The quantize stage: real ModelOpt ONNX PTQ on tiny real models, calibrated on ONNX Runtime CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from pydantic import ValidationError

from trtflow.environment import gpus
from trtflow.stage import StageFailed, StageSkipped
from trtflow.testing import run_stage
from trtflow_stages import quantize as quantize_stage
from trtflow_stages.quantize import Params, count_quantized, stage, supported_modes


def cnn_data(tmp_path: Path, samples: int = 16, **overrides) -> str:
    arrays = {"input": np.random.default_rng(0).standard_normal((samples, 3, 32, 32)).astype(np.float32)}
    arrays.update(overrides)
    np.savez(tmp_path / "calib.npz", **arrays)
    return "calib.npz"


def quantize(tmp_path: Path, model: Path, **params):
    return run_stage(stage, params, {"model": model}, workdir=tmp_path / "work", recipe_dir=tmp_path)


def ort_run(path: Path, feed: dict) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def dq_consumers(model: onnx.ModelProto) -> dict[str, str]:
    """Names and op types of the nodes that read a DequantizeLinear output."""
    dq_outputs = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {n.name: n.op_type for n in model.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and set(n.input) & dq_outputs}


def test_int8_tiny_cnn_on_cpu(tmp_path, tiny_cnn_onnx):
    result = quantize(tmp_path, tiny_cnn_onnx, mode="int8", calibration_method="max",
                      calibration_data={"path": cnn_data(tmp_path)}, high_precision_dtype="fp32")
    summary = result.summary
    assert summary["mode"] == "int8" and summary["calibration_method"] == "max"
    assert summary["calibrated"] is True and summary["calibration_samples"] == 16
    assert summary["calibration_data"] == "path"
    assert summary["quantized_by_op_type"]["Conv"] == 9  # every conv of the CNN
    assert summary["quantize_linear"] > 0 and summary["quantized_dtypes"] == {"int8": summary["dequantize_linear"]}
    assert json.loads(result.outputs["summary"].read_text()) == summary

    model = onnx.load(str(result.outputs["model"]))
    assert count_quantized(model)["quantized_nodes"] == summary["quantized_nodes"]
    assert set(dq_consumers(model).values()) >= {"Conv"}
    x = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    reference, quantized = ort_run(tiny_cnn_onnx, {"input": x}), ort_run(result.outputs["model"], {"input": x})
    assert quantized.shape == reference.shape == (4, 10)
    assert np.abs(quantized - reference).max() < 0.1 * np.abs(reference).max() + 1e-3
    # The store's copy of the input is never written to: ModelOpt works on a private copy.
    assert sorted(p.name for p in tiny_cnn_onnx.parent.iterdir() if p.name.startswith("cnn")) == ["cnn.onnx"]


def test_int8_default_converts_the_rest_to_fp16_and_honours_exclusions(tmp_path, tiny_cnn_onnx):
    result = quantize(tmp_path, tiny_cnn_onnx, mode="int8", calibration_data={"path": cnn_data(tmp_path, 8)},
                      nodes_to_exclude=["/stem/"], op_types_to_exclude=["GlobalAveragePool"])
    summary = result.summary
    assert summary["calibration_method"] == "entropy"  # ModelOpt's default for int8
    assert summary["high_precision_dtype"] == "fp16"
    model = onnx.load(str(result.outputs["model"]))
    consumers = dq_consumers(model)
    assert not any(name.startswith("/stem/") for name in consumers)
    assert "GlobalAveragePool" not in consumers.values()
    assert "GlobalAveragePool" not in summary["quantized_by_op_type"]
    assert summary["quantized_by_op_type"]["Conv"] == 8
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_fp8_with_random_data_is_marked_uncalibrated(tmp_path, tiny_cnn_onnx):
    result = quantize(tmp_path, tiny_cnn_onnx, mode="fp8", calibration_method="max",
                      calibration_data={"random": {"num_samples": 4, "seed": 1}})
    summary = result.summary
    assert summary["calibrated"] is False and summary["calibration_data"] == "random"
    assert summary["calibration_samples"] == 4
    assert summary["quantized_dtypes"] == {"float8e4m3fn": summary["dequantize_linear"]}
    # ModelOpt's fp8 mode leaves the narrow convs (16 channels) alone and quantizes the wider ones.
    consumers = dq_consumers(onnx.load(str(result.outputs["model"])))
    assert summary["quantized_by_op_type"]["Conv"] == sum(op == "Conv" for op in consumers.values()) > 0
    assert "/layer3/conv2/Conv" in consumers and "/stem/stem.0/Conv" not in consumers


def test_int4_rtn_needs_no_data(tmp_path, tiny_mlp_onnx):
    result = quantize(tmp_path, tiny_mlp_onnx, mode="int4", calibration_method="rtn_dq", block_size=16)
    summary = result.summary
    assert summary["calibration_samples"] == 0 and summary["calibrated"] is False
    assert summary["calibration_data"] is None and summary["high_precision_dtype"] is None
    assert summary["quantized_by_op_type"] == {"Gemm": 2} and summary["quantize_linear"] == 0
    assert summary["quantized_dtypes"] == {"int4": 2}
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    reference = ort_run(tiny_mlp_onnx, {"input": x})
    assert np.abs(ort_run(result.outputs["model"], {"input": x}) - reference).max() < 0.2 * np.abs(reference).max()


def test_int4_awq_lite_on_the_transformer(tmp_path, tiny_transformer_onnx):
    np.savez(tmp_path / "ids.npz", input_ids=np.random.default_rng(0).integers(0, 1000, (8, 16)))
    result = quantize(tmp_path, tiny_transformer_onnx, mode="int4", calibration_method="awq_lite",
                      calibration_data={"path": "ids.npz"}, nodes_to_exclude=["/head/"])
    summary = result.summary
    assert summary["calibrated"] is True and summary["calibration_samples"] == 8
    assert summary["quantized_dtypes"] == {"int4": summary["dequantize_linear"]}
    consumers = dq_consumers(onnx.load(str(result.outputs["model"])))
    assert {"MatMul", "Gemm"} & set(consumers.values())
    assert not any(name.startswith("/head/") for name in consumers)


def test_external_data_goes_to_the_weights_output(tmp_path, tiny_cnn_onnx):
    result = quantize(tmp_path, tiny_cnn_onnx, mode="int8", use_external_data_format=True,
                      calibration_data={"random": {"num_samples": 2}})
    assert result.summary["external_data"] is True
    weights = result.outputs["weights"]
    assert weights.name == "model.onnx_data" and weights.parent == result.outputs["model"].parent
    assert weights.stat().st_size > result.outputs["model"].stat().st_size
    out = ort_run(result.outputs["model"], {"input": np.zeros((1, 3, 32, 32), np.float32)})
    assert out.shape == (1, 10)


def test_nvfp4_is_skipped_before_any_work_without_a_gpu(tmp_path, tiny_mlp_onnx):
    """nvfp4 takes ModelOpt's PyTorch route, which runs only on a CUDA GPU (tests/stages/test_quantize_torch_route)."""
    if gpus():
        pytest.skip("this machine has a GPU")
    with pytest.raises(StageSkipped, match="mode nvfp4 fake-quantizes the PyTorch model with ModelOpt, which runs only "
                       "on a CUDA GPU"):
        quantize(tmp_path, tiny_mlp_onnx, mode="nvfp4", calibration_data={"random": {"num_samples": 1}})
    assert not (tmp_path / "work" / "scratch" / "input").exists()


def test_supported_modes_match_modelopts_cli():
    from modelopt.onnx.quantization.__main__ import get_parser

    action = next(a for a in get_parser()._actions if a.dest == "quantize_mode")
    assert set(supported_modes()) == set(action.choices)


@pytest.mark.parametrize("data, fragments", [
    ({"image": np.zeros((2, 3, 32, 32), np.float32)},
     ["input 'input' is missing", "'image' that is not a model input",
      "model inputs: input: float32[batch, 3, 32, 32]"]),
    ({"input": np.zeros((2, 3, 32, 32), np.float64)}, ["input 'input': dtype float64, the model expects float32"]),
    ({"input": np.zeros((2, 3, 32), np.float32)}, ["input 'input': rank 3", "expects rank 4"]),
    ({"input": np.zeros((2, 3, 16, 32), np.float32)}, ["input 'input': dimension 2 is 16, the model expects 32"]),
    ({"input": np.zeros((0, 3, 32, 32), np.float32)}, ["the data set is empty"]),
])
def test_bad_calibration_data_is_named(tmp_path, tiny_cnn_onnx, data, fragments):
    np.savez(tmp_path / "bad.npz", **data)
    with pytest.raises(StageFailed) as caught:
        quantize(tmp_path, tiny_cnn_onnx, mode="int8", calibration_data={"path": "bad.npz"})
    for fragment in fragments:
        assert fragment in str(caught.value)
    assert not (tmp_path / "work" / "scratch" / "out" / "model.onnx").exists()


def test_node_pattern_matching_nothing_fails(tmp_path, tiny_cnn_onnx):
    with pytest.raises(StageFailed, match="nodes_to_exclude: '/stemm/' matches no node"):
        quantize(tmp_path, tiny_cnn_onnx, mode="int8", calibration_data={"path": cnn_data(tmp_path, 2)},
                 nodes_to_exclude=["/stemm/"])


@pytest.mark.parametrize("params, message", [
    ({"mode": "int8", "calibration_method": "awq_clip", "calibration_data": {"path": "x.npz"}},
     "does not apply to mode int8; choose one of ['entropy', 'max']"),
    ({"mode": "int4", "calibration_method": "entropy"}, "choose one of ['awq_clip', 'awq_lite'"),
    ({"mode": "int8"}, "mode int8 with calibration_method 'entropy' needs calibration_data"),
    ({"mode": "int4"}, "calibration_method 'awq_clip' needs calibration_data"),
    ({"mode": "int4", "calibration_method": "rtn", "op_types_to_quantize": ["MatMul"]},
     "op_types_to_quantize do not apply to int4"),
    ({"mode": "fp8", "calibration_data": {"path": "x.npz"}, "block_size": 64}, "block_size applies to int4"),
    ({"mode": "int8", "calibration_data": {"path": "x.npz"}, "calibration_eps": ["gpu"]},
     "unknown calibration_eps ['gpu']"),
    ({"mode": "int16", "calibration_data": {"path": "x.npz"}}, "'int8', 'fp8', 'int4', 'nvfp4' or 'mxfp8'"),
])
def test_params_are_validated(params, message):
    with pytest.raises(ValidationError) as caught:
        Params.model_validate(params)
    assert message in str(caught.value)


def test_declarations_follow_params():
    python_data = Params.model_validate({"mode": "int8", "calibration_data": {"callable": "python:d.py:f"}})
    assert stage.files_for(python_data) == ("d.py",)
    assert stage.resources_for(python_data).gpu == 0
    assert set(stage.environment_for(python_data)) >= {"modelopt", "onnx", "onnxruntime"}
    rtn = Params.model_validate({"mode": "int4", "calibration_method": "rtn", "calibration_data": {"path": "a"}})
    assert stage.files_for(rtn) == ()  # rtn reads no data, so the data is not part of its key
    on_gpu = Params.model_validate({"mode": "int8", "calibration_data": {"path": "a.npz"},
                                    "calibration_eps": ["cuda:0", "cpu"]})
    assert stage.resources_for(on_gpu).gpu == 1 and "gpu" in stage.environment_for(on_gpu)
    schema = Params.model_json_schema()
    assert all(field.get("description") for field in schema["properties"].values())


@pytest.mark.skipif(bool(gpus()), reason="this machine has a GPU")
def test_gpu_calibration_is_skipped_without_a_gpu():
    params = Params.model_validate({"mode": "int8", "calibration_data": {"path": "a.npz"},
                                    "calibration_eps": ["cuda:0"]})
    with pytest.raises(StageSkipped) as caught:
        quantize_stage.check(params)
    assert "need an NVIDIA GPU" in caught.value.reason


def test_module_is_cheap_to_import():
    code = ("import sys, trtflow_stages.quantize; "
            "print(sorted({'numpy', 'onnx', 'onnxruntime', 'modelopt'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- int8 defaults that hold on transformers and CNNs ------------------------------------------------------------


def synthetic_images(count: int, seed: int, size: int = 32) -> np.ndarray:
    """Smooth images normalised like ImageNet inputs: blocky low frequencies plus texture."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(0.0, 1.0, (count, 3, 4, 4)).astype(np.float32)
    images = coarse.repeat(size // 4, axis=2).repeat(size // 4, axis=3)
    return (images + rng.normal(0.0, 0.25, images.shape)).astype(np.float32)


@pytest.fixture(scope="module")
def small_vit_onnx(tmp_path_factory) -> Path:
    """ViT-like: 'input' float32 [batch, 3, 32, 32] -> 'logits' [batch, 10]; 17 tokens, 2 blocks, width 64."""
    import torch

    from examples.models import vit
    from tests.conftest import export_onnx

    path = tmp_path_factory.mktemp("vit") / "vit.onnx"
    return export_onnx(vit.build_small(), (torch.randn(2, 3, 32, 32),), path, ["input"], ["logits"],
                       {"input": {0: "batch"}, "logits": {0: "batch"}})


def int8_cosine(tmp_path: Path, model: Path, **params) -> tuple[float, dict]:
    """Quantize with real ModelOpt, then measure the output's cosine similarity with the validate stage."""
    from trtflow_stages import validate

    tmp_path.mkdir(parents=True, exist_ok=True)
    np.savez(tmp_path / "calib.npz", input=synthetic_images(32, 1))
    np.savez(tmp_path / "val.npz", input=synthetic_images(16, 2))
    result = quantize(tmp_path, model, mode="int8", calibration_data={"path": "calib.npz"}, **params)
    measured = run_stage(validate.stage, {"data": {"path": "val.npz"}, "expect": "int8", "batch_size": 4},
                         {"reference": model, "candidate": result.outputs["model"]},
                         workdir=tmp_path / "validate", recipe_dir=tmp_path)
    return measured.summary["outputs"]["logits"]["cosine_similarity"], result.summary


@pytest.mark.slow
def test_int8_default_keeps_a_vit_accurate(tmp_path, small_vit_onnx):
    cosine, summary = int8_cosine(tmp_path / "auto", small_vit_onnx)
    assert summary["quantize_ops"] == "weighted" and "MatMul(s) of two activations" in summary["quantize_ops_reason"]
    assert summary["unquantized_activation_matmuls"] == 4  # q @ k^T and attn @ v in both blocks
    assert summary["quantized_by_op_type"] == {"Conv": 1, "MatMul": 8}  # patch embedding, qkv, proj, mlp x2
    assert cosine > 0.999
    # ModelOpt's own placement also quantizes the attention MatMuls, LayerNorm inputs and residual Adds.
    modelopt_cosine, modelopt = int8_cosine(tmp_path / "modelopt", small_vit_onnx, quantize_ops="modelopt")
    assert {"Add", "LayerNormalization"} <= set(modelopt["quantized_by_op_type"])
    assert modelopt_cosine < cosine and 1 - modelopt_cosine > 10 * (1 - cosine)


@pytest.mark.slow
def test_int8_default_keeps_modelopts_placement_for_a_cnn(tmp_path, tiny_cnn_onnx):
    cosine, summary = int8_cosine(tmp_path, tiny_cnn_onnx)
    assert summary["quantize_ops"] == "modelopt" and "CNN" in summary["quantize_ops_reason"]
    assert summary["quantized_by_op_type"] == {"Add": 3, "Conv": 9, "GlobalAveragePool": 1}
    assert cosine > 0.999


def test_quantize_ops_cannot_be_combined_with_explicit_node_choices():
    with pytest.raises(ValidationError, match="give one of them"):
        Params.model_validate({"mode": "int8", "calibration_data": {"path": "x.npz"}, "quantize_ops": "weighted",
                               "op_types_to_quantize": ["Conv"]})
    explicit = Params.model_validate({"mode": "int8", "calibration_data": {"path": "x.npz"},
                                      "op_types_to_quantize": ["Conv"]})
    assert explicit.quantize_ops == "auto"


def test_calibration_reports_progress_per_batch(tmp_path, tiny_mlp_onnx, caplog):
    np.savez(tmp_path / "calib.npz", input=np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32))
    with caplog.at_level("INFO", logger="trtflow.test.quantize"):
        result = quantize(tmp_path, tiny_mlp_onnx, mode="int8", calibration_method="max",
                          calibration_data={"path": "calib.npz"}, calibration_batch_size=3)
    assert result.summary["calibration_batch_size"] == 3 and result.summary["calibration_samples"] == 6
    assert "calibrating: batch 1/2" in caplog.text and "calibrating: batch 2/2" in caplog.text


# -- a calibration that fails on the data is recovered with the other method (issue 25) -------------------------

def _square_root_model(path: Path) -> Path:
    """Conv(x) + sqrt(x[:, :1]): on inputs below zero an activation holds NaNs, on which ModelOpt's entropy
    calibrator fails ("Too many bins for data range. Cannot create 128 finite-sized bins.")."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.b = torch.nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x) + torch.sqrt(x[:, :1]))

    torch.onnx.export(Net().eval(), (torch.rand(2, 3, 16, 16),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)
    return path


def test_a_calibration_that_fails_on_the_data_is_retried_with_the_other_method(tmp_path):
    model = _square_root_model(tmp_path / "sqrt.onnx")
    data = {"random": {"seed": 0, "num_samples": 8, "shapes": {"x": [1, 3, 16, 16]}}}  # uniform in [-1, 1)
    result = quantize(tmp_path, model, mode="int8", quantize_ops="modelopt", calibration_data=data)
    summary = result.summary
    assert summary["calibration_method"] == "max"
    recovery = summary["calibration_recovery"]
    assert recovery["chosen"] == "max" and recovery["tried"][0]["method"] == "entropy"
    assert "Too many bins" in recovery["tried"][0]["error"]
    assert summary["quantized_nodes"] > 0
    with pytest.raises(StageFailed, match=r"\(entropy\) failed: ValueError: Too many bins"):  # chosen: kept, said
        quantize(tmp_path / "chosen", model, mode="int8", quantize_ops="modelopt", calibration_data=data,
                 calibration_method="entropy")


def test_agreement_tells_a_broken_calibration_from_a_lossy_one(tmp_path):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from trtflow_stages.accuracy.calibration import agreement

    def scaled(name: str, factor: float, noise: float = 0.0) -> ort.InferenceSession:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
        nodes = [helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Add", ["m", "n"], ["y"])]
        inits = [helper.make_tensor("k", TensorProto.FLOAT, [], [factor]),
                 helper.make_tensor("n", TensorProto.FLOAT, [8], [noise * (-1) ** i for i in range(8)])]
        model = helper.make_model(helper.make_graph(nodes, name, [x], [y], inits),
                                  opset_imports=[helper.make_opsetid("", 17)])
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, str(path))
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    batches = [{"x": np.random.default_rng(i).uniform(1, 2, (2, 8)).astype(np.float32)} for i in range(4)]
    reference = scaled("reference", 1.0)
    lossy = agreement("entropy", reference, scaled("lossy", 1.0, noise=0.05), batches)
    assert not lossy.failed and lossy.rows == 8 and 0 < lossy.relative_error < 0.1
    clipped = agreement("entropy", reference, scaled("clipped", 0.1), batches)  # the direction kept, the size not
    assert clipped.cosine > 0.99 and clipped.relative_error == pytest.approx(0.9, abs=1e-6) and clipped.failed
    assert "relative error 0.9" in clipped.describe()
