"""quantize's nvfp4/mxfp8 (ModelOpt's PyTorch route): the schema offers them, wrong settings are refused up front,
a machine without a GPU skips them saying so; export's source.json names the PyTorch model; validate refuses to run
such a model on ONNX Runtime and skips backend fake-quant without a GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from trtflow.environment import gpus
from trtflow.errors import RecipeError, StageSkipped
from trtflow.testing import run_stage
from trtflow_stages import export, quantize, validate
from trtflow_stages.accuracy.fake_quant import refuse_onnxruntime
from trtflow_stages.formats.torch_source import read_source

REPO = Path(__file__).resolve().parents[2]
DATA = {"random": {"num_samples": 4}}
no_gpu = pytest.mark.skipif(bool(gpus()), reason="checks the behaviour without a GPU")


def test_the_schema_offers_nvfp4_and_mxfp8():
    modes = quantize.Params.model_json_schema()["properties"]["mode"]["enum"]
    assert {"nvfp4", "mxfp8"} <= set(modes)
    assert quantize.Params.model_validate({"mode": "nvfp4", "calibration_method": "awq_lite",
                                           "calibration_data": DATA}).method == "awq_lite"
    assert quantize.Params.model_validate({"mode": "mxfp8", "calibration_data": DATA}).uses_gpu


@pytest.mark.parametrize(("params", "message"), [
    ({"mode": "mxfp8", "calibration_method": "awq_lite"}, "calibration_method 'awq_lite' does not apply to mode mxfp8"),
    ({"mode": "nvfp4", "nodes_to_exclude": ["head"]}, "nodes_to_exclude do not apply to nvfp4"),
    ({"mode": "nvfp4", "calibration_eps": ["cuda:0"]}, "calibration_eps do not apply to nvfp4"),
    ({"mode": "mxfp8", "high_precision_dtype": "bf16"}, "ModelOpt 0.47 exports mxfp8 models with fp16 or fp32"),
    ({"mode": "int8", "exclude_modules": ["head"]}, "exclude_modules applies to nvfp4/mxfp8"),
])
def test_settings_the_pytorch_route_cannot_honour_are_refused(params, message):
    with pytest.raises(ValidationError, match=message):
        quantize.Params.model_validate({"calibration_data": DATA, **params})


@no_gpu
def test_without_a_gpu_nvfp4_is_skipped_naming_the_gpu_need():
    params = quantize.Params.model_validate({"mode": "nvfp4", "calibration_data": DATA})
    assert quantize.stage.resources_for(params).gpu == 1
    with pytest.raises(StageSkipped) as skipped:
        quantize.stage.check(params)
    assert "needs a CUDA GPU" not in skipped.value.reason  # the reason says what runs where, the need says what
    assert skipped.value.reason == ("mode nvfp4 fake-quantizes the PyTorch model with ModelOpt, which runs only on "
                                    "a CUDA GPU, and this machine has none")
    assert "CUDA GPU" in skipped.value.needs


@pytest.mark.slow
def test_export_writes_the_pytorch_source_with_code_and_weight_digests(tmp_path):
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    shutil.copyfile(REPO / "examples" / "models" / "vit.py", project / "models" / "vit.py")
    params = {"model": "python:models/vit.py:build_small", "factory_args": {},
              "inputs": {"images": {"shape": [2, 3, 32, 32], "dynamic_axes": {0: "batch"}}}, "outputs": ["logits"]}
    first = run_stage(export.stage, params, {}, tmp_path / "a", recipe_dir=project)
    source = read_source(first.outputs["source"])
    assert source.model == "python:models/vit.py:build_small" and source.outputs == ["logits"]
    assert source.dynamic_axes == {"images": {0: "batch"}} and source.inputs["images"]["shape"] == [2, 3, 32, 32]
    with (project / "models" / "vit.py").open("a") as code:
        code.write("\n# a change to the factory's code\n")
    second = run_stage(export.stage, params, {}, tmp_path / "b", recipe_dir=project)
    assert read_source(second.outputs["source"]).code_digest != source.code_digest


def test_validate_refuses_onnxruntime_for_a_model_with_tensorrt_domain_ops(tmp_path):
    candidate = tmp_path / "model.onnx"
    candidate.write_bytes(b"")
    refuse_onnxruntime(candidate)  # no checkpoint beside it: an ordinary ONNX model
    (tmp_path / "modelopt.pth").write_bytes(b"")
    with pytest.raises(RecipeError, match="TensorRT-domain ops") as refused:
        refuse_onnxruntime(candidate)
    assert "backend: fake-quant" in refused.value.hint


@no_gpu
def test_validate_backend_fake_quant_is_skipped_without_a_gpu():
    params = validate.Params.model_validate({"data": DATA, "backend": "fake-quant", "expect": "fp4"})
    assert validate.stage.resources_for(params).gpu == 1
    with pytest.raises(StageSkipped, match="runs the fake-quantized PyTorch model on a CUDA GPU"):
        validate.stage.check(params)
    assert json.loads(json.dumps(validate.stage.environment_for(params)))[-2:] == ["torch", "modelopt"]
