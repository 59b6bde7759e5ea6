"""The validate stage with real ONNX Runtime and real Polygraphy on tiny real models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from trtflow.errors import GateFailed, RecipeError, StageFailed, StageSkipped
from trtflow.testing import run_stage
from trtflow_stages import validate
from trtflow_stages._trt_runtime import runtime_available

RANDOM = {"random": {"seed": 3, "num_samples": 6}}


def _scaled_copy(source: Path, target: Path, match: str, factor: float) -> Path:
    """A copy of the model whose initializers with ``match`` in their name are multiplied by ``factor``."""
    model = onnx.load(str(source))
    changed = 0
    for init in model.graph.initializer:
        if match in init.name:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * factor, init.name))
            changed += 1
    assert changed, f"no initializer named like {match!r}"
    onnx.save(model, str(target))
    return target


@pytest.fixture(scope="module")
def cnn_perturbed(tiny_cnn_onnx, tmp_path_factory) -> Path:
    return _scaled_copy(tiny_cnn_onnx, tmp_path_factory.mktemp("perturbed") / "cnn_scaled.onnx", "fc.weight", 1.5)




def _validate(tmp_path, reference, candidate, recipe_dir=None, **params):
    params.setdefault("data", RANDOM)
    params.setdefault("batch_size", 2)
    inputs = {"candidate": candidate}
    if reference is not None:
        inputs["reference"] = reference
    return run_stage(validate.stage, params, inputs, workdir=tmp_path, recipe_dir=recipe_dir)


def _metrics_after_gate(tmp_path) -> dict:
    return json.loads((tmp_path / "scratch" / "out" / "validate.json").read_text())


def test_fp32_model_against_itself_passes(tiny_cnn_onnx, tmp_path):
    result = _validate(tmp_path, tiny_cnn_onnx, tiny_cnn_onnx)
    metrics = json.loads(result.outputs["metrics"].read_text())
    logits = metrics["outputs"]["logits"]
    assert metrics["passed"] and logits["passed"]
    assert logits["max_abs_error"] == 0.0 and logits["cosine_similarity"] == pytest.approx(1.0)
    assert logits["nan_count"] == 0 and logits["inf_count"] == 0
    assert logits["elements"] == 6 * 10 and metrics["rows"] == 6 and metrics["batches"] == 3
    assert logits["tolerance"] == {"atol": 1e-5, "rtol": 1e-5, "check_error_stat": "elemwise",
                                   "min_cosine_similarity": 0.99999}
    assert result.summary["passed"] is True


def test_perturbed_weights_fail_with_output_statistic_and_ratio(tiny_cnn_onnx, cnn_perturbed, tmp_path):
    with pytest.raises(GateFailed) as failure:
        _validate(tmp_path, tiny_cnn_onnx, cnn_perturbed, tolerances={"check_error_stat": "max", "atol": 1e-3})
    message = str(failure.value)
    assert "logits: max abs error" in message and "> atol 0.001" in message and "x)" in message
    logits = failure.value.metrics["outputs"]["logits"]
    assert not logits["passed"] and logits["max_abs_error"] > 1e-3
    assert logits["worst_ratio"] == pytest.approx(
        min(logits["max_abs_error"] / 1e-3, logits["max_rel_error"] / 1e-5), rel=1e-6)
    assert not _metrics_after_gate(tmp_path)["passed"]


def test_fp16_model_passes_fp16_defaults_and_fails_fp32_defaults(tiny_cnn_onnx, tiny_cnn_fp16_onnx, tmp_path):
    passed = _validate(tmp_path / "fp16", tiny_cnn_onnx, tiny_cnn_fp16_onnx, expect="fp16")
    logits = json.loads(passed.outputs["metrics"].read_text())["outputs"]["logits"]
    assert logits["passed"] and 0 < logits["max_abs_error"] < 1e-2
    with pytest.raises(GateFailed) as failure:
        _validate(tmp_path / "fp32", tiny_cnn_onnx, tiny_cnn_fp16_onnx, expect="fp32")
    assert "elements exceed both atol 1e-05 and rtol 1e-05" in str(failure.value)
    assert failure.value.metrics["outputs"]["logits"]["mismatched_elements"] > 0


def test_per_output_override_loosens_only_that_output(tiny_cnn_onnx, cnn_perturbed, tmp_path):
    loose = {"logits": {"atol": 10.0, "min_cosine_similarity": 0.5}}
    result = _validate(tmp_path / "loose", tiny_cnn_onnx, cnn_perturbed, output_tolerances=loose)
    logits = json.loads(result.outputs["metrics"].read_text())["outputs"]["logits"]
    assert logits["passed"] and logits["tolerance"]["atol"] == 10.0
    assert logits["tolerance"]["rtol"] == 1e-5  # the rest still comes from expect: fp32
    with pytest.raises(GateFailed, match=r"cosine similarity .* < min 0\.99999"):
        _validate(tmp_path / "strict", tiny_cnn_onnx, cnn_perturbed, tolerances={"atol": 10.0})


def test_task_metric_gate(tiny_cnn_onnx, cnn_perturbed, tmp_path):
    (tmp_path / "metrics.py").write_text(
        "import numpy as np\n"
        "def agreement(reference, candidate):\n"
        "    ref, cand = reference['logits'], candidate['logits']\n"
        "    return {'top1_agreement': float((ref.argmax(1) == cand.argmax(1)).mean()),\n"
        "            'rows': ref.shape[0]}\n"
    )
    params = {"task_metric": "python:metrics.py:agreement", "task_thresholds": {"top1_agreement": {"min": 0.99}}}
    result = _validate(tmp_path / "same", tiny_cnn_onnx, tiny_cnn_onnx, recipe_dir=tmp_path, **params)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert metrics["task_metrics"]["top1_agreement"] == {"value": 1.0, "min": 0.99, "max": None, "passed": True}
    assert metrics["task_metrics"]["rows"] == {"value": 6.0}
    # A negated classifier head disagrees on every row: only the task gate is left to fail it.
    flipped = _scaled_copy(tiny_cnn_onnx, tmp_path / "flipped.onnx", "fc.", -1.0)
    with pytest.raises(GateFailed) as failure:
        _validate(tmp_path / "flipped", tiny_cnn_onnx, flipped, recipe_dir=tmp_path,
                  tolerances={"atol": 100.0, "min_cosine_similarity": -1.0}, **params)
    assert "task metric top1_agreement 0 < min 0.99 (short by 0.99)" in str(failure.value)


def test_nan_in_candidate_is_detected(tmp_path):
    def model(path: Path, with_nan: bool) -> Path:
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 8])
        y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 8])
        if with_nan:  # sqrt(x) * 0 + relu(x): NaN wherever x < 0
            nodes = [helper.make_node("Sqrt", ["x"], ["s"]), helper.make_node("Mul", ["s", "zero"], ["z"]),
                     helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["z", "r"], ["y"])]
            inits = [numpy_helper.from_array(np.zeros((1,), np.float32), "zero")]
        else:
            nodes, inits = [helper.make_node("Relu", ["x"], ["y"])], []
        graph = helper.make_graph(nodes, "g", [x], [y], inits)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    reference, candidate = model(tmp_path / "relu.onnx", False), model(tmp_path / "nan.onnx", True)
    with pytest.raises(GateFailed) as failure:
        _validate(tmp_path / "run", reference, candidate)
    logits = failure.value.metrics["outputs"]["y"]
    assert logits["nan_count"] > 0 and logits["reference_nan_count"] == 0
    assert f"y: the candidate has {logits['nan_count']} NaN and 0 Inf values" in str(failure.value)


def test_saved_reference_outputs_replace_the_reference_model(tiny_mlp_onnx, tmp_path):
    import onnxruntime as ort

    data = np.random.default_rng(0).uniform(-1, 1, (5, 16)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", input=data)
    logits = ort.InferenceSession(str(tiny_mlp_onnx), providers=["CPUExecutionProvider"]).run(
        None, {"input": data})[0]
    np.savez(tmp_path / "expected.npz", logits=logits)
    result = _validate(tmp_path, None, tiny_mlp_onnx, data={"path": "inputs.npz"},
                       reference_outputs="expected.npz", batch_size=2)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert metrics["passed"] and metrics["rows"] == 5 and metrics["reference"].startswith("saved outputs")
    assert validate.stage.files_for(validate.Params.model_validate(
        {"data": {"path": "inputs.npz"}, "reference_outputs": "expected.npz"})) == ("inputs.npz", "expected.npz")

    np.savez(tmp_path / "short.npz", logits=logits[:3])
    with pytest.raises(StageFailed, match="has 3 rows but the candidate produced 5"):
        _validate(tmp_path / "short", None, tiny_mlp_onnx, recipe_dir=tmp_path, data={"path": "inputs.npz"},
                  reference_outputs="short.npz")


def test_needs_exactly_one_reference(tiny_mlp_onnx, tmp_path):
    with pytest.raises(RecipeError, match="exactly one reference"):
        _validate(tmp_path, None, tiny_mlp_onnx)


def test_params_are_checked_before_running():
    with pytest.raises(ValueError, match="task_thresholds are set but no task_metric"):
        validate.Params.model_validate({"data": RANDOM, "task_thresholds": {"acc": {"min": 0.9}}})
    with pytest.raises(ValueError, match="give 'min', 'max' or both"):
        validate.Params.model_validate({"data": RANDOM, "task_metric": "m:f", "task_thresholds": {"acc": {}}})
    with pytest.raises(ValueError):
        validate.Params.model_validate({"data": RANDOM, "expect": "fp64"})


@pytest.mark.skipif(runtime_available("auto") is None, reason="a TensorRT runtime can execute engines here")
def test_engine_candidate_is_skipped_without_a_runtime(tiny_mlp_onnx, tmp_path):
    """Real check: no engine executes on this machine (no GPU, or no supported GPU for TensorRT-RTX)."""
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not executed: the stage skips before reading it")
    with pytest.raises(StageSkipped) as skipped:
        _validate(tmp_path / "auto", tiny_mlp_onnx, engine)
    assert "cannot run the engine candidate" in skipped.value.reason and skipped.value.needs
    # Naming the flavour lets Stage.check skip before the stage starts.
    params = validate.Params.model_validate({"data": RANDOM, "backend": "tensorrt-rtx"})
    with pytest.raises(StageSkipped) as checked:
        validate.stage.check(params)
    assert "GPU" in checked.value.reason or "not installed" in checked.value.reason
    assert validate.stage.resources_for(params).gpu == 1
