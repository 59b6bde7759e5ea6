"""The triton stage: a model repository whose config.pbtxt parses as Triton's ModelConfig and agrees with the
model's I/O and optimization profiles (ONNX models from the recipe's profiles, engines from engine.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtflow.errors import RecipeError
from trtflow.stage import StageContext, StageFailed
from trtflow_stages.triton import Params, batching, build_config, config_text, engine_io, model_config_module, onnx_io
from trtflow_stages.triton import run as run_triton
from trtflow_stages.triton import stage as triton_stage

BATCH_1_TO_8 = {"name": "batch1to8", "shapes": {"input": {"min": [1, 16], "opt": [4, 16], "max": [8, 16]}}}


def parse(text: str):
    from google.protobuf import text_format

    return text_format.Parse(text, model_config_module().ModelConfig())


def test_onnx_model_repository_from_a_profile(tmp_path, tiny_mlp_onnx):
    model = tmp_path / "in" / "model.onnx"
    model.parent.mkdir()
    model.write_bytes(tiny_mlp_onnx.read_bytes())
    params = Params.model_validate({"profile": BATCH_1_TO_8, "gpus": [0, 1], "instances": 2})
    ctx = StageContext("triton", tmp_path / "scratch", tmp_path, triton_stage.outputs, tmp_path / "cache")
    summary = run_triton(ctx, {"model": model}, params)
    repository = ctx.out_dir
    assert (repository / "model" / "1" / "model.onnx").read_bytes() == tiny_mlp_onnx.read_bytes()
    config = parse((repository / "model" / "config.pbtxt").read_text())
    assert config.name == "model" and config.platform == "onnxruntime_onnx" and config.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in config.input] == [("input", [16])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [4])]
    assert model_config_module().DataType.Name(config.input[0].data_type) == "TYPE_FP32"
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert [(g.name, list(g.gpus), g.count, list(g.profile)) for g in config.instance_group] == [
        ("gpu0", [0], 2, []), ("gpu1", [1], 2, [])]  # profiles are a TensorRT notion
    assert summary["files"] == ["model/config.pbtxt", "model/1/model.onnx"]


def test_onnx_batching_needs_a_profile_that_covers_batch_one(tiny_mlp_onnx):
    with pytest.raises(RecipeError, match="no optimization profile says how large"):
        batching(onnx_io(tiny_mlp_onnx, Params()), Params())
    late = {"name": "big", "shapes": {"input": {"min": [4, 16], "opt": [8, 16], "max": [8, 16]}}}
    params = Params.model_validate({"profile": late})
    with pytest.raises(RecipeError, match=r"any batch from 1 to 8, but the profiles cover only 4..8 \(not 1..3\)"):
        batching(onnx_io(tiny_mlp_onnx, params), params)
    params = Params.model_validate({"profile": BATCH_1_TO_8, "max_batch_size": 16})
    with pytest.raises(RecipeError, match="profiles accept batches up to 8"):
        batching(onnx_io(tiny_mlp_onnx, params), params)
    off = Params.model_validate({"profile": BATCH_1_TO_8, "max_batch_size": 0})
    config = build_config(onnx_io(tiny_mlp_onnx, off), off)
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [-1, 16]
    assert not config.HasField("dynamic_batching")


def test_profile_must_fit_the_model(tiny_mlp_onnx):
    wrong = {"name": "p", "shapes": {"input": {"min": [1, 8], "opt": [1, 8], "max": [1, 8]}}}
    with pytest.raises(StageFailed, match="dimension 1 is fixed to 16"):
        onnx_io(tiny_mlp_onnx, Params.model_validate({"profile": wrong}))


def engine_json(tmp_path: Path, backend: str = "tensorrt", output_dtype: str = "float") -> Path:
    folder = tmp_path / "engine"
    folder.mkdir(exist_ok=True)
    (folder / "model.engine").write_bytes(b"serialized engine bytes")
    profiles = [{"name": "bs1", "shapes": {"input": {"min": [1, 3, 32, 32], "opt": [1, 3, 32, 32],
                                                     "max": [1, 3, 32, 32]}}},
                {"name": "bs32", "shapes": {"input": {"min": [1, 3, 32, 32], "opt": [16, 3, 32, 32],
                                                      "max": [32, 3, 32, 32]}}}]
    (folder / "engine.json").write_text(json.dumps({
        "backend": backend, "version": "10.13.0", "profiles": profiles,
        "network": {"inputs": [{"name": "input", "dtype": "half", "shape": [-1, 3, 32, 32]}],
                    "outputs": [{"name": "logits", "dtype": output_dtype, "shape": [-1, 10]}]}}))
    return folder / "model.engine"


def test_engine_repository_maps_every_profile_to_each_gpu_instance(tmp_path):
    engine = engine_json(tmp_path)
    ctx = StageContext("triton", tmp_path / "scratch", tmp_path, triton_stage.outputs, tmp_path / "cache")
    summary = run_triton(ctx, {"model": engine}, Params.model_validate({"gpus": [0, 1]}))
    assert summary["files"] == ["model/config.pbtxt", "model/1/model.plan", "model/1/engine.json"]
    assert (ctx.out_dir / "model" / "1" / "model.plan").read_bytes() == b"serialized engine bytes"
    config = parse((ctx.out_dir / "model" / "config.pbtxt").read_text())
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 32
    assert [list(i.dims) for i in config.input] == [[3, 32, 32]]
    assert model_config_module().DataType.Name(config.input[0].data_type) == "TYPE_FP16"
    assert list(config.dynamic_batching.preferred_batch_size) == [1, 16, 32]
    assert [(g.name, list(g.profile)) for g in config.instance_group] == [("gpu0", ["0", "1"]), ("gpu1", ["0", "1"])]
    with pytest.raises(RecipeError, match="TensorRT engines run on GPUs only"):
        build_config(engine_io(engine, Params()), Params.model_validate({"instance_kind": "cpu"}))


def test_engines_triton_cannot_serve_are_refused(tmp_path):
    with pytest.raises(StageFailed, match="TensorRT-RTX, which Triton's tensorrt_plan backend cannot load"):
        engine_io(engine_json(tmp_path, backend="tensorrt-rtx"), Params())
    with pytest.raises(StageFailed, match="'logits' has type fp8"):
        engine_io(engine_json(tmp_path, output_dtype="fp8"), Params())
    (tmp_path / "engine" / "engine.json").unlink()
    with pytest.raises(StageFailed, match="no engine.json beside it"):
        engine_io(tmp_path / "engine" / "model.engine", Params())


def test_scalar_outputs_get_a_reshape(tmp_path):
    from trtflow_stages.triton import ModelIO, Tensor

    io = ModelIO("onnxruntime_onnx", "model.onnx", (Tensor("x", "TYPE_FP32", (-1, 4)),),
                 (Tensor("score", "TYPE_FP32", (-1,)),), ())
    config = build_config(io, Params.model_validate({"max_batch_size": 4}))
    text = config_text(config)
    assert list(config.output[0].dims) == [1] and config.output[0].HasField("reshape")
    assert parse(text) == config
