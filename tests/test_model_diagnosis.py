"""End to end through the `trtflow` command: a BERT-like encoder from PyTorch to validated fp16 and int8 models and
audited engines, and `trtflow debug precision` / `trtflow debug layers` on models whose low precision fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import trtflow_cli, trtflow_in_process
from trtflow.environment import module_available

#: one worker (CI: `--dist loadgroup`): the module-scoped fp16_project and int8_project made once per run
pytestmark = pytest.mark.xdist_group("model_diagnosis")

REPO = Path(__file__).resolve().parent.parent


trtflow = trtflow_cli


ENCODER_RECIPE = """
name: encoder
profiles:
  text:
    input_ids: {min: [1, 8], opt: [4, 24], max: [8, 48]}
    attention_mask: {min: [1, 8], opt: [4, 24], max: [8, 48]}
nodes:
  - name: export
    stage: export
    params:
      model: python:tiny_bert.py:build
      dynamo: true
      opset: 18
      inputs:
        input_ids: {shape: [2, 16], dtype: int64, high: 1000, dynamic_axes: {0: batch, 1: seq}}
        attention_mask: {shape: [2, 16], dtype: int64, low: 1, high: 2, dynamic_axes: {0: batch, 1: seq}}
      outputs: [last_hidden_state, pooled]
      profiles: [text]
  - name: simplify
    stage: simplify
    params: {input_shapes: {input_ids: [4, 24], attention_mask: [4, 24]}}
  - name: convert
    stage: convert
    matrix: {dtype: [fp16]}
    params: {precision: "${{ matrix.dtype }}", calibration_data: {path: data.npz}}
  - name: quantize
    stage: quantize
    matrix: {dtype: [int8]}
    inputs: {model: simplify}
    params: {mode: "${{ matrix.dtype }}", calibration_data: {path: data.npz}}
  - name: validate
    stage: validate
    matrix: {dtype: [fp16, int8]}
    inputs: {reference: simplify, candidate: [convert, quantize]}
    params: {expect: "${{ matrix.dtype }}", data: {path: data.npz}, batch_size: 8}
  - name: build
    stage: build
    matrix: {dtype: [int8]}
    inputs: {model: quantize}
    params: {backend: tensorrt-rtx, precision: "${{ matrix.dtype }}", profile: text}
"""


def encoder_data(path: Path) -> None:
    rng = np.random.default_rng(0)
    mask = np.ones((32, 24), dtype=np.int64)
    for row, length in enumerate(rng.integers(12, 25, 32)):
        mask[row, length:] = 0
    np.savez(path, input_ids=rng.integers(0, 1000, (32, 24)), attention_mask=mask)


@pytest.mark.slow
@pytest.mark.skipif(not module_available("tensorrt_rtx"), reason="needs tensorrt-rtx")
def test_bert_like_encoder_exports_converts_quantizes_validates_and_builds(tmp_path):
    shutil.copy(REPO / "examples" / "models" / "tiny_bert.py", tmp_path / "tiny_bert.py")
    encoder_data(tmp_path / "data.npz")
    (tmp_path / "encoder.yaml").write_text(ENCODER_RECIPE)
    trtflow("run", "encoder.yaml", cwd=tmp_path)
    out = tmp_path / "build" / "encoder"

    exported = onnx.load(str(out / "export" / "model.onnx"))
    dims = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in exported.graph.input}
    assert dims == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    for dtype in ("fp16", "int8"):
        report = json.loads((out / f"validate-{dtype}" / "validate.json").read_text())
        assert report["passed"], report["failures"]
        assert all(o["cosine_similarity"] > 0.999 for o in report["outputs"].values())
    converted = json.loads((out / "convert-fp16" / "convert.json").read_text())
    assert converted["onnxruntime_check"]["status"] == "ok"
    assert converted["dim_names"]["still_inconsistent"] == {}
    engine = json.loads((out / "build-int8" / "engine.json").read_text())
    assert engine["precision"]["network"]["heavy_layers_by_precision"].get("int8", 0) >= 8


def cancellation_model(path: Path) -> None:
    """MatMul/Tanh layers, then (t + 300.1) - 300: in fp16 the constant 300.1 becomes 300.0 and every output
    shifts by 0.1. Only the Add node ('shift_up') must stay in fp32."""
    rng = np.random.default_rng(0)
    shapes = [(16, 32), (32, 32), (32, 32), (32, 8)]
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32), f"W{i}")
             for i, s in enumerate(shapes)]
    inits += [numpy_helper.from_array(np.array(300.1, np.float32), "up"),
              numpy_helper.from_array(np.array(300.0, np.float32), "down")]
    node = helper.make_node
    nodes = [node("MatMul", ["x", "W0"], ["h0"], name="mm0"), node("Relu", ["h0"], ["r0"], name="relu0"),
             node("MatMul", ["r0", "W1"], ["h1"], name="mm1"), node("Tanh", ["h1"], ["t1"], name="tanh1"),
             node("Add", ["t1", "up"], ["a"], name="shift_up"), node("Sub", ["a", "down"], ["s"], name="shift_down"),
             node("MatMul", ["s", "W2"], ["h2"], name="mm2"), node("Relu", ["h2"], ["r2"], name="relu2"),
             node("MatMul", ["r2", "W3"], ["y"], name="mm3")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    np.savez(path.with_name("data.npz"), x=rng.standard_normal((32, 16)).astype(np.float32))


def outlier_model(path: Path) -> None:
    """Four MatMuls on [batch, 8, 16]; channel 0 of the third one's input is 1000x larger (its weights compensate),
    so a per-tensor int8 scale for that input wipes out the other channels. Only 'mm2' must stay unquantized."""
    rng = np.random.default_rng(0)
    shapes = [(16, 64), (64, 64), (64, 64), (64, 8)]
    weights = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]
    weights[2][0, :] /= 1000.0
    scale = np.ones(64, np.float32)
    scale[0] = 1000.0
    inits = [numpy_helper.from_array(w, f"W{i}") for i, w in enumerate(weights)]
    inits.append(numpy_helper.from_array(scale, "outlier"))
    node = helper.make_node
    nodes = [node("MatMul", ["x", "W0"], ["h0"], name="mm0"), node("Relu", ["h0"], ["r0"], name="relu0"),
             node("MatMul", ["r0", "W1"], ["h1"], name="mm1"), node("Relu", ["h1"], ["r1"], name="relu1"),
             node("Mul", ["r1", "outlier"], ["o"], name="make_outlier"),
             node("MatMul", ["o", "W2"], ["h2"], name="mm2"), node("Relu", ["h2"], ["r2"], name="relu2"),
             node("MatMul", ["r2", "W3"], ["y"], name="mm3")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    np.savez(path.with_name("data.npz"), x=rng.standard_normal((64, 8, 16)).astype(np.float32))


LOWERING = {
    "fp16": "{name: lower, stage: convert, params: {precision: fp16, calibration_data: {path: data.npz}}}",
    "int8": "{name: lower, stage: quantize, params: {mode: int8, calibration_data: {path: data.npz}}}",
}


def failing_project(tmp_path: Path, dtype: str) -> Path:
    (cancellation_model if dtype == "fp16" else outlier_model)(tmp_path / "model.onnx")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""name: lowp
nodes:
  - {{name: export, stage: export, params: {{model: model.onnx}}}}
  - {LOWERING[dtype]}
  - name: check
    stage: validate
    inputs: {{reference: export, candidate: lower}}
    params: {{expect: {dtype}, data: {{path: data.npz}}, batch_size: 8}}
""")
    failed = trtflow("run", "r.yaml", cwd=tmp_path, check=1)
    assert "quality gate failed" in failed.stdout + failed.stderr
    return tmp_path


@pytest.fixture(scope="module")
def fp16_project(tmp_path_factory) -> Path:
    """A project whose fp16 model fails its gate (run once for this module's tests)."""
    return failing_project(tmp_path_factory.mktemp("fp16"), "fp16")


@pytest.fixture(scope="module")
def int8_project(tmp_path_factory) -> Path:
    return failing_project(tmp_path_factory.mktemp("int8"), "int8")


@pytest.mark.slow
@pytest.mark.parametrize("dtype, culprit, stage_word", [("fp16", "shift_up", "to keep in fp32"),
                                                         ("int8", "mm2", "to leave unquantized")])
def test_debug_precision_finds_the_node_to_keep_and_the_recipe_change_works(request, dtype, culprit, stage_word):
    tmp_path = request.getfixturevalue(f"{dtype}_project")
    proc = trtflow_in_process("debug", "precision", "r.yaml", "check", cwd=tmp_path)
    assert f"1 node(s) {stage_word}: {culprit}" in proc.stdout
    report = json.loads((tmp_path / "build" / "lowp" / "debug" / "check-precision.json").read_text())
    assert report["passed_before"] is False and report["passed_after"] is True
    assert report["nodes_to_exclude"] == [culprit]
    assert report["accuracy_after"]["y"]["cosine_similarity"] > report["accuracy_before"]["y"]["cosine_similarity"]

    # The printed recipe change, applied, makes the gate pass.
    trtflow("run", "r.yaml", "--set", f'nodes.lower.params.nodes_to_exclude=["{culprit}$"]', cwd=tmp_path)


@pytest.mark.slow
def test_debug_layers_reports_where_the_error_starts(fp16_project):
    tmp_path = fp16_project
    proc = trtflow_in_process("debug", "layers", "r.yaml", "lower", "--top", "3", cwd=tmp_path)
    assert "first layers above 0.01 relative error" in proc.stdout
    report = json.loads((tmp_path / "build" / "lowp" / "debug" / "lower-layers.json").read_text())
    first = report["first_above_threshold"][0]
    assert (first["node"], first["op_type"]) == ("shift_down", "Sub")  # the cancellation shows the lost 0.1
    assert first["input_rel_error"] < 0.01 < first["rel_error"]
    assert report["largest_added_error"][0]["node"] == "shift_down"
    assert report["tensors_compared"] == 9


@pytest.mark.slow
def test_debug_precision_explains_a_node_that_is_not_debuggable(fp16_project):
    proc = trtflow_in_process("debug", "precision", "r.yaml", "export", cwd=fp16_project, check=1)
    assert "'export' runs the export stage; give a validate node" in proc.stderr


def test_debug_precision_prints_no_after_row_when_the_candidate_already_passes():
    from rich.console import Console

    from trtflow_stages.accuracy.precision_debug import Evaluation
    from trtflow_stages.cli.debug import _accuracy_table

    entry = {"max_abs_error": 2e-4, "mean_abs_error": 1e-5, "cosine_similarity": 0.99999994, "passed": True}
    console = Console(record=True, width=200)
    console.print(_accuracy_table(Evaluation((), True, {"y": entry}, []), None))
    text = console.export_text()
    assert "after" not in text and "nan" not in text
    assert "0.9999999" in text and "yes" in text  # not "1.000000": it is not exactly the reference
    fixed = Evaluation(("mm2",), True, {"y": dict(entry, cosine_similarity=1.0)}, [])
    console.print(_accuracy_table(Evaluation((), False, {"y": dict(entry, passed=False)}, ["y: too far"]), fixed))
    assert "after: cosine" in console.export_text()


@pytest.mark.slow
def test_debug_precision_on_a_candidate_that_already_passes_says_so_without_an_after_row(fp16_project):
    keep = ["--set", 'nodes.lower.params.nodes_to_exclude=["shift_up$"]']
    trtflow("run", "r.yaml", *keep, cwd=fp16_project)
    proc = trtflow_in_process("debug", "precision", "r.yaml", "check", *keep, cwd=fp16_project)
    assert "the candidate already passes its accuracy gate: nothing to change" in proc.stdout
    assert "after" not in proc.stdout and "nan" not in proc.stdout, proc.stdout
