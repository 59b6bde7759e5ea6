"""Diagnosis of model problems: the dim-name detector and fix, known-cause hints, and repro commands that run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtflow.stage import StageContext
from trtflow.testing import run_stage
from trtflow_stages import simplify
from trtflow_stages.accuracy import model_problems as _problems
from trtflow_stages.runtimes.ort import OrtOptions


def unk_model(path: Path | None = None) -> onnx.ModelProto:
    """x[batch, seq, 64] -> Relu -> MatMul(64x256) -> Relu -> MatMul(256x64), with AutoCast's dim name 'unk' on
    the intermediate tensors of sizes 64 and 256 alike (what ModelOpt leaves after clearing shapes)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.1, f"w{i}")
               for i, s in enumerate([(64, 256), (256, 64)])]
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
             helper.make_node("MatMul", ["a", "w0"], ["up"], name="up"),
             helper.make_node("Relu", ["up"], ["b"], name="relu_b"),
             helper.make_node("MatMul", ["b", "w1"], ["y"], name="down")]
    unk = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", "unk"]) for n in ("a", "up", "b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", "unk"])],
                              weights, value_info=unk)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if path is not None:
        onnx.save(model, str(path))
    return model


def shapes(model: onnx.ModelProto) -> dict[str, list]:
    values = [*model.graph.input, *model.graph.value_info, *model.graph.output]
    return {v.name: [d.dim_param or d.dim_value or None for d in v.type.tensor_type.shape.dim] for v in values}


def test_a_dim_name_on_dims_of_different_sizes_is_found():
    assert _problems.inconsistent_dim_names(unk_model()) == {"unk": [64, 256]}


def test_cleaning_removes_the_name_and_refills_sizes_from_shape_inference():
    model = unk_model()
    report = _problems.clean_dim_names(model)
    assert report == {"removed": {"unk": [64, 256]}, "cleared_dims": 4, "refilled_dims": 4, "still_inconsistent": {}}
    assert shapes(model) == {"x": ["batch", "seq", 64], "a": ["batch", "seq", 64], "up": ["batch", "seq", 256],
                             "b": ["batch", "seq", 256], "y": ["batch", "seq", 64]}
    onnx.checker.check_model(model, full_check=True)


def test_consistent_names_are_left_alone(tiny_transformer_onnx):
    model = onnx.load(str(tiny_transformer_onnx))
    before = shapes(model)
    assert _problems.clean_dim_names(model)["removed"] == {}
    assert shapes(model) == before


def test_the_finding_names_the_sizes_and_the_fix(tmp_path):
    (finding,) = _problems.dim_name_findings(unk_model(tmp_path / "m.onnx"))
    assert "'unk' (sizes 64, 256)" in finding.message
    assert "Shape mismatch attempting to re-use buffer" in finding.message
    assert "re-run the convert stage" in finding.fix


def test_fp16_convolutions_with_layout_optimisations_point_to_the_nchwc_optimizer(tiny_cnn_fp16_onnx, tiny_cnn_onnx):
    (finding,) = _problems.ort_optimizer_findings(tiny_cnn_fp16_onnx, None, None)
    assert "disabled_optimizers: [NchwcTransformer]" in finding.fix
    assert _problems.ort_optimizer_findings(tiny_cnn_fp16_onnx, OrtOptions(graph_optimization_level="extended"),
                                             None) == []
    assert _problems.ort_optimizer_findings(tiny_cnn_onnx, None, None) == []


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TMPDIR=str(cwd), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_onnx_runtime_repro_commands_run_the_same_session(tmp_path, tiny_mlp_onnx):
    options = OrtOptions(graph_optimization_level="extended", disabled_optimizers=["NchwcTransformer"])
    created = shell(_problems.ort_session_repro(tiny_mlp_onnx, options), tmp_path)
    assert created.returncode == 0, created.stderr
    feed = {"input": np.ones((3, 16), np.float32)}
    ran = shell(_problems.ort_run_repro(tiny_mlp_onnx, feed, options), tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[(3, 4)]"


@pytest.mark.slow
def test_onnxsim_and_autocast_repro_commands_run(tmp_path, tiny_mlp_onnx):
    simplified = shell(_problems.onnxsim_repro(tiny_mlp_onnx, {"input": [2, 16]}), tmp_path)
    assert simplified.returncode == 0, simplified.stderr
    assert (tmp_path / "simplified.onnx").exists()
    converted = shell(_problems.autocast_repro(tiny_mlp_onnx, "fp16", None, {"keep_io_types": True,
                                                                                 "data_max": 512.0}), tmp_path)
    assert converted.returncode == 0, converted.stderr
    assert (tmp_path / "converted.onnx").exists()


@pytest.fixture
def native_steps(monkeypatch) -> list[dict]:
    """Records every ctx.native_step a stage opens (the real context manager still runs)."""
    recorded: list[dict] = []
    original = StageContext.native_step

    def spy(self, library, what, repro=None, hint=None):
        recorded.append({"library": library, "what": what, "repro": repro, "hint": hint,
                         "file": self.scratch / "native_step.json"})
        return original(self, library, what, repro=repro, hint=hint)

    monkeypatch.setattr(StageContext, "native_step", spy)
    return recorded


def test_simplify_marks_onnxsim_as_a_native_step_with_a_repro(tmp_path, tiny_mlp_onnx, native_steps):
    run_stage(simplify.stage, {"input_shapes": {"input": [2, 16]}}, {"model": tiny_mlp_onnx}, workdir=tmp_path)
    (step,) = [s for s in native_steps if s["library"] == "onnxsim"]
    assert step["what"] == f"simplifying {tiny_mlp_onnx.name}"
    assert step["repro"].startswith(f"onnxsim {tiny_mlp_onnx}") and "--test-input-shape input:2,16" in step["repro"]
    assert not step["file"].exists()  # removed when the step ended normally


@pytest.mark.slow
def test_convert_cleans_dim_names_and_runs_the_model_in_a_native_step(tmp_path, native_steps):
    from trtflow_stages import convert

    source = unk_model(tmp_path / "unk.onnx")
    onnx.save(source, str(tmp_path / "unk.onnx"))
    result = run_stage(convert.stage, {"precision": "fp16", "data_max": None}, {"model": tmp_path / "unk.onnx"},
                       workdir=tmp_path / "work")
    assert result.summary["dim_names"]["still_inconsistent"] == {}
    assert result.summary["onnxruntime_check"]["status"] == "ok"
    assert "unk" not in {d for dims in shapes(onnx.load(str(result.outputs["model"]))).values() for d in dims}
    libraries = [(s["library"], s["what"]) for s in native_steps]
    assert ("modelopt", "converting to fp16 (AutoCast)") in libraries
    (check,) = [s for s in native_steps if s["what"] == "checking the fp16 model on ONNX Runtime"]
    assert "onnxruntime" in check["repro"] and "np.zeros((2, 2, 64), \"float32\")" in check["repro"]
