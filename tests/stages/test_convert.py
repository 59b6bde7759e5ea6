"""The convert stage: real ModelOpt AutoCast fp16/bf16 conversion, checked on ONNX Runtime CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from pydantic import ValidationError

from trtflow.stage import StageFailed
from trtflow.testing import run_stage
from trtflow_stages.convert import Params, stage


def convert(tmp_path: Path, model: Path, **params):
    return run_stage(stage, params, {"model": model}, workdir=tmp_path / "work", recipe_dir=tmp_path)


def ort_run(path: Path, feed: dict) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def output_types(model: onnx.ModelProto) -> dict[str, int]:
    typed = onnx.shape_inference.infer_shapes(model)
    values = [*typed.graph.value_info, *typed.graph.output]
    return {v.name: v.type.tensor_type.elem_type for v in values}


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def test_fp16_tiny_cnn_runs_close_to_fp32(tmp_path, tiny_cnn_onnx):
    np.savez(tmp_path / "ref.npz", input=np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype("f4"))
    result = convert(tmp_path, tiny_cnn_onnx, precision="fp16", calibration_data={"path": "ref.npz"})
    model = onnx.load(str(result.outputs["model"]))
    weights = [init for init in model.graph.initializer if init.dims and np.prod(init.dims) > 1]
    assert weights and all(init.data_type == TensorProto.FLOAT16 for init in weights)
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT

    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    reference, converted = ort_run(tiny_cnn_onnx, {"input": x}), ort_run(result.outputs["model"], {"input": x})
    assert converted.dtype == np.float32
    np.testing.assert_allclose(converted, reference, atol=1e-2 * np.abs(reference).max() + 1e-3)

    summary = result.summary
    assert summary["precision"] == "fp16" and summary["reference_data"] == "path"
    assert summary["reference_samples"] == 4
    assert summary["fp32_nodes"] == 0 and summary["converted_by_op_type"]["Conv"] == 9
    assert summary["inputs"] == {"input": "float"} and summary["outputs"] == {"logits": "float"}
    assert summary["size_bytes"]["after"] < summary["size_bytes"]["before"]
    assert summary["cast_nodes"]["after"] >= 2  # I/O kept fp32 through casts inside the graph


def test_exclusions_stay_fp32(tmp_path, tiny_cnn_onnx):
    result = convert(tmp_path, tiny_cnn_onnx, nodes_to_exclude=["/layer1/conv1/"], op_types_to_exclude=["Gemm"])
    model = onnx.load(str(result.outputs["model"]))
    types = output_types(model)
    assert types[node(model, "/layer1/conv1/Conv").output[0]] == TensorProto.FLOAT
    assert types[node(model, "/fc/Gemm").output[0]] == TensorProto.FLOAT
    assert types[node(model, "/layer1/conv2/Conv").output[0]] == TensorProto.FLOAT16
    summary = result.summary
    assert summary["fp32_by_op_type"] == {"Conv": 1, "Gemm": 1}
    assert set(summary["fp32_node_names"]) == {"/layer1/conv1/Conv", "/fc/Gemm"}
    assert summary["reference_data"] == "autocast-random"
    x = np.ones((1, 3, 32, 32), np.float32)
    assert ort_run(result.outputs["model"], {"input": x}).shape == (1, 10)


def test_data_max_keeps_large_activations_fp32(tmp_path, tiny_cnn_onnx):
    """With inputs of magnitude 1000, tensors exceed data_max=512 and AutoCast keeps their nodes fp32."""
    np.savez(tmp_path / "big.npz", input=np.full((2, 3, 32, 32), 1000, np.float32))
    result = convert(tmp_path, tiny_cnn_onnx, calibration_data={"path": "big.npz"})
    assert result.summary["fp32_nodes"] > 0
    assert "/stem/stem.0/Conv" in result.summary["fp32_node_names"]
    relaxed = convert(tmp_path / "relaxed", tiny_cnn_onnx, data_max=None, calibration_data={"path": "big.npz"})
    assert relaxed.summary["fp32_nodes"] == 0 and relaxed.summary["reference_data"] is None
    assert relaxed.summary["reference_samples"] == 0


def test_streamed_reference_run_decides_as_autocasts_own(tmp_path, tiny_cnn_onnx):
    """The batch-by-batch reference run gives AutoCast the statistics its own runner computes from all batches."""
    from modelopt.onnx.autocast import convert_to_mixed_precision

    rng = np.random.default_rng(3)
    images = rng.standard_normal((6, 3, 32, 32)).astype(np.float32) * np.array([1, 40, 300], "f4")[:, None, None]
    for folder in ("streamed", "by3"):
        (tmp_path / folder).mkdir()
        np.savez(tmp_path / folder / "ref.npz", input=images)
    params = {"data_max": 64.0, "calibration_data": {"path": "ref.npz"}}
    streamed = convert(tmp_path / "streamed", tiny_cnn_onnx, **params)
    own = convert_to_mixed_precision(onnx_path=str(tiny_cnn_onnx), low_precision_type="fp16", data_max=64.0,
                                     keep_io_types=True, calibration_data=str(tmp_path / "by3" / "ref.npz"))
    assert 0 < streamed.summary["fp32_nodes"] < streamed.summary["fp32_nodes"] + streamed.summary["converted_nodes"]
    assert streamed.summary["reference_samples"] == 6 and streamed.summary["reference_batch_size"] == 1
    assert onnx.load(str(streamed.outputs["model"])).graph == own.graph
    # Batches of 3 measure the same ranges.
    by_three = convert(tmp_path / "by3", tiny_cnn_onnx, calibration_batch_size=3, **params)
    assert by_three.outputs["model"].read_bytes() == streamed.outputs["model"].read_bytes()


def test_reference_run_reports_progress_per_batch(tmp_path, tiny_cnn_onnx, caplog):
    np.savez(tmp_path / "ref.npz", input=np.zeros((4, 3, 32, 32), np.float32))
    with caplog.at_level("INFO", logger="trtflow.test.convert"):
        result = convert(tmp_path, tiny_cnn_onnx, calibration_data={"path": "ref.npz"}, calibration_batch_size=2)
    assert result.summary["reference_batch_size"] == 2
    assert "reference run: batch 1/2" in caplog.text and "reference run: batch 2/2" in caplog.text


def test_io_types_follow_keep_io_types(tmp_path, tiny_cnn_onnx):
    result = convert(tmp_path, tiny_cnn_onnx, keep_io_types=False, data_max=None)
    model = onnx.load(str(result.outputs["model"]))
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert result.summary["inputs"] == {"input": "float16"}
    out = ort_run(result.outputs["model"], {"input": np.zeros((1, 3, 32, 32), np.float16)})
    assert out.dtype == np.float16


def test_bf16_transformer_with_random_reference(tmp_path, tiny_transformer_onnx):
    result = convert(tmp_path, tiny_transformer_onnx, precision="bf16",
                     calibration_data={"random": {"num_samples": 2, "shapes": {"input_ids": [1, 16]}}})
    model = onnx.load(str(result.outputs["model"]))
    weights = [init for init in model.graph.initializer if init.data_type != TensorProto.INT64]
    assert weights and all(init.data_type == TensorProto.BFLOAT16 for init in weights)
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 22
    assert result.summary["reference_data"] == "random" and result.summary["inputs"] == {"input_ids": "int64"}
    assert result.summary["converted_by_op_type"]["MatMul"] > 0


def reshape_needs_even_batch(path: Path) -> Path:
    """x [batch, 6] -> Reshape [-1, 4]: only even batches work, so a reference run at batch 1 fails."""
    from onnx import helper

    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 4])
    graph = helper.make_graph(nodes, "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_reference_run_failure_is_explained(tmp_path):
    """AutoCast's own random inputs set every dynamic dim to 1, which this model's Reshape rejects."""
    with pytest.raises(StageFailed) as caught:
        convert(tmp_path, reshape_needs_even_batch(tmp_path / "reshape.onnx"))
    assert "AutoCast fp16 conversion failed" in str(caught.value)
    assert "give calibration_data with real input shapes, or set data_max: null" in caught.value.hint


def test_bad_reference_data_is_named(tmp_path, tiny_cnn_onnx):
    np.savez(tmp_path / "bad.npz", input=np.zeros((2, 3, 32, 32), np.float64))
    with pytest.raises(StageFailed, match="input 'input': dtype float64, the model expects float32"):
        convert(tmp_path, tiny_cnn_onnx, calibration_data={"path": "bad.npz"})


def test_bad_node_pattern_is_named(tmp_path, tiny_cnn_onnx):
    with pytest.raises(StageFailed, match="nodes_to_include: '/nope' matches no node"):
        convert(tmp_path, tiny_cnn_onnx, nodes_to_include=["/nope"])


def test_params():
    with pytest.raises(ValidationError, match="'fp16' or 'bf16'"):
        Params.model_validate({"precision": "fp8"})
    with pytest.raises(ValidationError, match="unknown calibration_eps"):
        Params.model_validate({"calibration_eps": ["tensorrt"]})
    with_file = Params.model_validate({"calibration_data": {"callable": "python:gen.py:make"}})
    assert stage.files_for(with_file) == ("gen.py",) and stage.resources_for(with_file).gpu == 0
    no_reference = Params.model_validate({"calibration_data": {"path": "a.npz"}, "data_max": None})
    assert stage.files_for(no_reference) == ()
    assert stage.resources_for(Params.model_validate({"calibration_eps": ["cuda:0"]})).gpu == 1
    schema = Params.model_json_schema()
    assert all(field.get("description") for field in schema["properties"].values())


def test_module_is_cheap_to_import():
    code = ("import sys, trtflow_stages.convert; "
            "print(sorted({'numpy', 'onnx', 'onnxruntime', 'modelopt'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_memory_estimate_covers_the_measured_peak(tmp_path):
    """convert's declared memory is an upper bound of a real run's peak RSS (measured in a fresh process)."""
    import textwrap

    import torch

    from examples.models import vit
    from tests.conftest import export_onnx

    model = export_onnx(vit.build(image_size=64, patch=16, dim=256, depth=4, heads=4, mlp_dim=1024, num_classes=100),
                        (torch.randn(2, 3, 64, 64),), tmp_path / "vit.onnx", ["images"], ["logits"],
                        {"images": {0: "batch"}})
    np.savez(tmp_path / "ref.npz", images=np.random.default_rng(0).standard_normal((8, 3, 64, 64)).astype("f4"))
    # VmHWM, not ru_maxrss: Linux carries the forked copy of this (large) pytest process into the child's
    # ru_maxrss across exec, so ru_maxrss would measure the test runner, not the stage.
    script = textwrap.dedent("""
        from trtflow.testing import run_stage
        from trtflow_stages.convert import stage
        run_stage(stage, {"calibration_data": {"path": "ref.npz"}}, {"model": "vit.onnx"}, workdir="work",
                  recipe_dir=".")
        status = open("/proc/self/status").read().split("VmHWM:")[1].split()
        print(int(status[0]) * 1024)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stdout.split()[-1])
    estimate = stage.memory(Params(), {"model": model.stat().st_size})
    print(f"peak {peak / 2**30:.3f} GiB, estimate {estimate / 2**30:.3f} GiB")
    assert peak < estimate, f"peak {peak / 2**30:.2f} GiB > estimate {estimate / 2**30:.2f} GiB"
