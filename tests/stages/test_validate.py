"""The validate stage with real ONNX Runtime and real Polygraphy on tiny real models."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from trtflow.errors import RecipeError, StageFailed, StageSkipped
from trtflow.stage import GateContext
from trtflow.testing import run_stage
from trtflow_stages import validate
from trtflow_stages.accuracy import compare
from trtflow_stages.runtimes.trt_runtime import runtime_available

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
    """Run the stage, then apply its gates to the summary as the engine does: (run, gate failures)."""
    params.setdefault("data", RANDOM)
    params.setdefault("batch_size", 2)
    inputs = {"candidate": candidate}
    if reference is not None:
        inputs["reference"] = reference
    result = run_stage(validate.stage, params, inputs, workdir=tmp_path, recipe_dir=recipe_dir)
    return result, _judge(result.summary, **params)


def _judge(summary, **params) -> list[str]:
    from trtflow.verdicts import failures

    return failures(validate.stage.judge(validate.Params.model_validate(params), summary, GateContext()))


def test_fp32_model_against_itself_passes(tiny_cnn_onnx, tmp_path):
    result, failures = _validate(tmp_path, tiny_cnn_onnx, tiny_cnn_onnx)
    assert failures == []
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert metrics == json.loads(json.dumps(result.summary))
    logits = metrics["outputs"]["logits"]
    assert logits["max_abs_error"] == 0.0 and logits["cosine_similarity"] == pytest.approx(1.0)
    assert logits["nan_count"] == 0 and logits["inf_count"] == 0 and logits["error_front"] == [[0.0, 0.0]]
    assert logits["elements"] == 6 * 10 and metrics["rows"] == 6 and metrics["batches"] == 3
    assert metrics["onnxruntime_rewrites"] == [] and metrics["candidate_origin"] is None


def test_gate_params_are_left_out_of_the_key():
    assert set(validate.stage.gate_params) == {"expect", "tolerances", "output_tolerances", "task_thresholds"}
    assert set(validate.stage.gate_params) <= set(validate.Params.model_fields)


def test_perturbed_weights_fail_with_output_statistic_and_ratio(tiny_cnn_onnx, cnn_perturbed, tmp_path):
    result, failures = _validate(tmp_path, tiny_cnn_onnx, cnn_perturbed,
                                 tolerances={"check_error_stat": "max", "atol": 1e-3})
    message = "; ".join(failures)
    assert "logits: max abs error" in message and "> atol 0.001" in message and "x)" in message
    assert "likely cause:" in failures[-1] and "trtflow debug precision" in failures[-1]
    # The failed gate is a result: the measurements are written and returned all the same.
    logits = json.loads(result.outputs["metrics"].read_text())["outputs"]["logits"]
    assert logits["max_abs_error"] > 1e-3
    # A looser threshold re-judges the same measurements: it passes without running the models again.
    assert _judge(result.summary, data=RANDOM, tolerances={"check_error_stat": "max", "atol": 10.0,
                                                            "min_cosine_similarity": 0.9}) == []


def test_fp16_model_passes_fp16_defaults_and_fails_fp32_defaults(tiny_cnn_onnx, tiny_cnn_fp16_onnx, tmp_path):
    passed, failures = _validate(tmp_path / "fp16", tiny_cnn_onnx, tiny_cnn_fp16_onnx, expect="fp16")
    logits = json.loads(passed.outputs["metrics"].read_text())["outputs"]["logits"]
    assert failures == [] and 0 < logits["max_abs_error"] < 1e-2
    failures = _judge(passed.summary, data=RANDOM, expect="fp32")
    assert "elements exceed both atol 1e-05 and rtol 1e-05" in failures[0]
    assert "values beyond fp32" not in failures[-1] and "likely cause" in failures[-1]


def test_error_front_judges_any_tolerance_exactly():
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(5000)
    candidate = reference + rng.standard_normal(5000) * 10 ** rng.uniform(-6, -1, 5000)
    front, exact, nan_errors = compare.error_front(candidate, reference)
    assert exact and nan_errors == 0 and 1 < len(front) <= compare.MAX_FRONT_POINTS
    abs_err = np.abs(candidate - reference)
    rel_err = abs_err / np.abs(reference)
    for atol in (1e-6, 1e-4, 1e-3, 1e-2, 0.1, 1.0):
        for rtol in (1e-6, 1e-4, 1e-2, 1.0, 100.0):
            truth = bool(((abs_err > atol) & (rel_err > rtol)).any())
            assert any(a > atol and r > rtol for a, r in front) == truth, (atol, rtol)


def test_error_front_thinning_never_hides_a_failure():
    # Anti-correlated errors: every element is on the front, which must be thinned.
    abs_err = np.linspace(1.0, 0.001, 1000)
    reference = abs_err**2  # rel error 1 / abs error: the smaller the abs error, the larger the rel error
    front, exact, _ = compare.error_front(reference + abs_err, reference)
    assert not exact and len(front) == compare.MAX_FRONT_POINTS
    rel_err = abs_err / reference
    for atol in np.geomspace(1e-3, 1, 15):
        for rtol in np.geomspace(1e-3, 1e3, 15):
            if ((abs_err > atol) & (rel_err > rtol)).any():
                assert any(a > atol and r > rtol for a, r in front)


def test_per_output_override_loosens_only_that_output(tiny_cnn_onnx, cnn_perturbed, tmp_path):
    loose = {"logits": {"atol": 10.0, "min_cosine_similarity": 0.5}}
    result, failures = _validate(tmp_path / "loose", tiny_cnn_onnx, cnn_perturbed, output_tolerances=loose)
    assert failures == []
    assert compare.resolved_tolerance(validate.Params.model_validate(
        {"data": RANDOM, "output_tolerances": loose}), "logits")["rtol"] == 1e-5  # the rest from expect: fp32
    strict = _judge(result.summary, data=RANDOM, tolerances={"atol": 10.0})
    assert any(re.search(r"cosine similarity .* < min 0\.99999", failure) for failure in strict)


def test_task_metric_gate(tiny_cnn_onnx, cnn_perturbed, tmp_path):
    (tmp_path / "metrics.py").write_text(
        "import numpy as np\n"
        "def agreement(reference, candidate):\n"
        "    ref, cand = reference['logits'], candidate['logits']\n"
        "    return {'top1_agreement': float((ref.argmax(1) == cand.argmax(1)).mean()),\n"
        "            'rows': ref.shape[0]}\n"
    )
    params = {"task_metric": "python:metrics.py:agreement", "task_thresholds": {"top1_agreement": {"min": 0.99}}}
    result, failures = _validate(tmp_path / "same", tiny_cnn_onnx, tiny_cnn_onnx, recipe_dir=tmp_path, **params)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert failures == [] and metrics["task_metrics"] == {"top1_agreement": 1.0, "rows": 6.0}
    # A negated classifier head disagrees on every row: only the task gate is left to fail it.
    flipped = _scaled_copy(tiny_cnn_onnx, tmp_path / "flipped.onnx", "fc.", -1.0)
    _, failures = _validate(tmp_path / "flipped", tiny_cnn_onnx, flipped, recipe_dir=tmp_path,
                            tolerances={"atol": 100.0, "min_cosine_similarity": -1.0}, **params)
    assert failures[0] == "task metric top1_agreement 0 < min 0.99 (short by 0.99)"


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
    result, failures = _validate(tmp_path / "run", reference, candidate)
    y = result.summary["outputs"]["y"]
    assert y["nan_count"] > 0 and y["reference_nan_count"] == 0 and y["nan_errors"] == y["nan_count"]
    assert failures[0] == f"y: the candidate has {y['nan_count']} NaN and 0 Inf values (reference: 0 NaN, 0 Inf)"
    # Loose tolerances still fail it: NaN is never within tolerance.
    assert _judge(result.summary, data=RANDOM, tolerances={"atol": 1e9, "min_cosine_similarity": -1.0})


def test_saved_reference_outputs_replace_the_reference_model(tiny_mlp_onnx, tmp_path):
    import onnxruntime as ort

    data = np.random.default_rng(0).uniform(-1, 1, (5, 16)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", input=data)
    logits = ort.InferenceSession(str(tiny_mlp_onnx), providers=["CPUExecutionProvider"]).run(
        None, {"input": data})[0]
    np.savez(tmp_path / "expected.npz", logits=logits)
    result, failures = _validate(tmp_path, None, tiny_mlp_onnx, data={"path": "inputs.npz"},
                                 reference_outputs="expected.npz", batch_size=2)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert failures == [] and metrics["rows"] == 5 and metrics["reference"].startswith("saved outputs")
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


def _fp16_quantize_model(path: Path, scale: float) -> Path:
    """x float32 -> fp16 -> QuantizeLinear/DequantizeLinear (int8, fp16 scale) -> fp32: the int8 rounding alone."""
    from onnx import TensorProto

    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16, name="to_fp16"),
             helper.make_node("QuantizeLinear", ["x16", "scale", "zero"], ["q"], name="quantize"),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["d16"], name="dequantize"),
             helper.make_node("Cast", ["d16"], ["y"], to=TensorProto.FLOAT, name="to_fp32")]
    inits = [numpy_helper.from_array(np.array(scale, np.float16), "scale"),
             numpy_helper.from_array(np.array(0, np.int8), "zero")]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def test_onnxruntime_fp16_quantize_rounding_is_measured_as_tensorrt_computes_it(tmp_path):
    """ONNX Runtime's CPU QuantizeLinear truncates fp16 inputs; the candidate is rewritten to round as specified."""
    from onnx import TensorProto

    from trtflow_stages.accuracy.ort_fixes import fix_for_onnxruntime, truncates_fp16_quantize

    scale = 0.0078125  # 1/128: exact in fp16, so the only error left is the int8 rounding
    candidate = _fp16_quantize_model(tmp_path / "qdq.onnx", scale)
    identity = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])])
    onnx.save(helper.make_model(identity, opset_imports=[helper.make_opsetid("", 19)]), str(tmp_path / "id.onnx"))
    data = {"random": {"seed": 0, "num_samples": 4, "ranges": {"x": [-0.9, 0.9]}}}
    result, _ = _validate(tmp_path / "run", tmp_path / "id.onnx", candidate, data=data)
    # Rounding to nearest errs by at most half a step (plus the fp16 cast of x: under 5e-4 here); truncation
    # toward zero errs by up to a whole step.
    bound = scale / 2 + 5e-4
    assert result.summary["outputs"]["y"]["max_abs_error"] <= bound
    rewrites = result.summary["onnxruntime_rewrites"]
    assert bool(rewrites) == truncates_fp16_quantize()
    if rewrites:
        assert "1 QuantizeLinear node(s) with float16 input run in float32" in rewrites[0]
        assert "onnxruntime#18576" in rewrites[0]
        import onnxruntime as ort

        x = np.random.default_rng(1).uniform(-0.9, 0.9, (8, 64)).astype(np.float32)
        as_is = ort.InferenceSession(str(candidate), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        assert np.abs(as_is - x).max() > bound  # what validate would have reported without the rewrite
        fixed_path, _ = fix_for_onnxruntime(candidate, tmp_path / "fixed")
        fixed = ort.InferenceSession(str(fixed_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        assert np.abs(fixed - x).max() <= bound


def test_onnxruntime_session_options_are_applied(tiny_cnn_onnx, tmp_path):
    options = {"graph_optimization_level": "disable", "disabled_optimizers": ["NchwcTransformer"],
               "intra_op_threads": 1}
    result, failures = _validate(tmp_path, tiny_cnn_onnx, tiny_cnn_onnx, onnxruntime=options)
    assert failures == [] and result.summary["onnxruntime"]["graph_optimization_level"] == "disable"
    with pytest.raises(ValueError, match="graph_optimization_level"):
        validate.Params.model_validate({"data": RANDOM, "onnxruntime": {"graph_optimization_level": "max"}})


def test_a_failed_quantized_candidate_names_the_likely_cause(tiny_cnn_onnx, cnn_perturbed, tmp_path):
    """The producer's summary travels beside the candidate: the gate message uses it to point at the cause."""
    import shutil

    folder = tmp_path / "from-quantize"
    folder.mkdir()
    shutil.copyfile(cnn_perturbed, folder / "model.onnx")
    (folder / "quantize.json").write_text(json.dumps({"mode": "int8", "calibrated": False, "quantize_ops": "modelopt",
                                                      "calibration_data": "random"}))
    result, failures = _validate(tmp_path / "run", tiny_cnn_onnx, folder / "model.onnx", expect="int8",
                                 tolerances={"min_cosine_similarity": 0.99999})
    assert result.summary["candidate_origin"]["stage"] == "quantize"
    cause = failures[-1]
    assert "calibrated on random data" in cause and "quantize_ops: weighted" in cause
    assert "trtflow debug precision RECIPE validate" in cause
