"""The build stage: real TensorRT-RTX engine builds on the CPU through Polygraphy, and every check before them.

Full TensorRT cannot be installed here, so its paths are covered where they are pure logic (precision plan,
option checks, provenance checks); every engine built below is a real TensorRT-RTX build.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from trtflow.environment import module_available
from trtflow.fingerprint import hash_file_content
from trtflow.stage import RecipeError, StageContext, StageFailed, StageSkipped
from trtflow.testing import run_stage
from trtflow_stages import build
from trtflow_stages.formats.onnx_model import ModelFacts, inspect_model
from trtflow_stages.runtimes.profiles import check_profiles
from trtflow_stages.runtimes.tensorrt import installed_version

needs_rtx = pytest.mark.skipif(not module_available("tensorrt_rtx"), reason="needs tensorrt-rtx (pip install "
                               "tensorrt-rtx-cu13)")

RTX = {"backend": "tensorrt-rtx"}


def shapes(name: str, lo: list[int], opt: list[int], hi: list[int]) -> dict:
    return {name: {"min": lo, "opt": opt, "max": hi}}


def profile(name: str, **inputs: tuple[list[int], list[int], list[int]]) -> dict:
    spec: dict = {}
    for input_name, (lo, opt, hi) in inputs.items():
        spec.update(shapes(input_name, lo, opt, hi))
    return {"name": name, "shapes": spec}


CNN_DYNAMIC = profile("bs1-8", input=([1, 3, 32, 32], [4, 3, 32, 32], [8, 3, 32, 32]))


def build_engine(tmp_path: Path, model: Path, **params) -> tuple:
    result = run_stage(build.stage, {**RTX, **params}, {"model": model}, workdir=tmp_path)
    manifest = json.loads(result.outputs["provenance"].read_text())
    return result, manifest


# ---------------------------------------------------------------------------------------------------------
# Real builds


@needs_rtx
def test_cnn_strongly_typed_with_dynamic_batch_profile(tmp_path, tiny_cnn_onnx):
    result, manifest = build_engine(tmp_path, tiny_cnn_onnx, profile=CNN_DYNAMIC)

    engine = result.outputs["engine"]
    assert engine.stat().st_size > 10_000
    assert result.summary["engine_bytes"] == engine.stat().st_size == manifest["engine_bytes"]
    assert result.summary["backend"] == manifest["backend"] == "tensorrt-rtx"
    assert manifest["version"] == installed_version("tensorrt-rtx")
    assert result.summary["strongly_typed"] is True and result.summary["precision_flags"] == []
    assert result.summary["profiles"] == ["bs1-8"]
    assert manifest["profiles"] == [CNN_DYNAMIC]
    assert manifest["onnx"]["digest"] == hash_file_content(tiny_cnn_onnx) == result.summary["onnx_digest"]
    assert manifest["onnx"]["inputs"] == {"input": [None, 3, 32, 32]}
    assert manifest["network"]["inputs"] == [{"name": "input", "dtype": "float", "shape": [-1, 3, 32, 32]}]
    assert manifest["network"]["outputs"][0]["name"] == "logits"
    assert manifest["gpu"] == "none: built on CPU"
    assert manifest["builder"]["profiling_verbosity"] == "detailed"
    assert manifest["build_seconds"] > 0
    # TensorRT-RTX has no timing cache: said so, and no shared cache file appears.
    assert result.summary["timing_cache"] == "unsupported by tensorrt-rtx"
    assert manifest["timing_cache"] == {"status": "unsupported by tensorrt-rtx"}
    assert not list((tmp_path / "caches").rglob("*.cache"))


@needs_rtx
def test_two_profiles_in_one_engine(tmp_path, tiny_cnn_onnx, caplog):
    small = profile("bs1", input=([1, 3, 32, 32], [1, 3, 32, 32], [1, 3, 32, 32]))
    large = profile("bs8-32", input=([8, 3, 32, 32], [16, 3, 32, 32], [32, 3, 32, 32]))
    with caplog.at_level(logging.INFO, logger="trtflow.test.build"):
        result, manifest = build_engine(tmp_path / "two", tiny_cnn_onnx, profiles=[small, large])
    single, _ = build_engine(tmp_path / "one", tiny_cnn_onnx, profiles=[small])

    assert result.summary["profiles"] == ["bs1", "bs8-32"]
    assert [p["name"] for p in manifest["profiles"]] == ["bs1", "bs8-32"]
    log = caplog.text
    assert "Profile 0" in log and "Profile 1" in log and "max=[32, 3, 32, 32]" in log
    assert result.outputs["engine"].read_bytes() != single.outputs["engine"].read_bytes()


@needs_rtx
def test_transformer_with_dynamic_batch_and_sequence(tmp_path, tiny_transformer_onnx):
    # opt keeps the exported sequence length (16): the fixture's legacy export bakes it into an attention reshape.
    spec = profile("text", input_ids=([1, 8], [4, 16], [8, 64]))
    result, manifest = build_engine(tmp_path, tiny_transformer_onnx, profile=spec,
                                    optimization_level=1, workspace="256MiB")

    assert manifest["network"]["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": [-1, -1]}]
    assert manifest["builder"]["optimization_level"] == 1
    assert manifest["builder"]["memory_pool_limits"] == {"workspace": 256 * 1024 * 1024}
    assert result.summary["layers"] > 20
    assert result.outputs["engine"].stat().st_size > 100_000




@needs_rtx
def test_fp16_model_builds_strongly_typed(tmp_path, tiny_cnn_fp16_onnx, tiny_cnn_onnx):
    result, manifest = build_engine(tmp_path / "fp16", tiny_cnn_fp16_onnx, profile=CNN_DYNAMIC)
    fp32, _ = build_engine(tmp_path / "fp32", tiny_cnn_onnx, profile=CNN_DYNAMIC)

    assert manifest["network"]["inputs"][0]["dtype"] == "float"  # I/O kept in fp32 around fp16 compute
    assert result.summary["strongly_typed"] is True
    assert result.summary["engine_bytes"] < fp32.summary["engine_bytes"]  # fp16 weights take half the room


def qdq_matmul_model(path: Path, activations: bool = True, zero_point_type: int | None = None) -> Path:
    """x[batch, 16] -> (Q/DQ) -> MatMul with int8 weights through DequantizeLinear -> y[batch, 8]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    zp_type = zero_point_type or TensorProto.INT8
    zp_dtype = onnx.helper.tensor_dtype_to_np_dtype(zp_type)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((16, 8)).astype(np.float32)
    scale = np.float32(np.abs(weights).max() / 127)
    initializers = [
        numpy_helper.from_array(np.clip(np.round(weights / scale), -127, 127).astype(np.int8), "w_q"),
        numpy_helper.from_array(np.array(scale, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "w_zero"),
        numpy_helper.from_array(np.array(0.05, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(0, zp_dtype), "x_zero"),
    ]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"])]
    x = "x"
    if activations:
        nodes += [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"]),
                  helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"])]
        x = "x_dq"
    nodes.append(helper.make_node("MatMul", [x, "w"], ["y"]))
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


QDQ_PROFILE = profile("bs1-16", x=([1, 16], [4, 16], [16, 16]))


@needs_rtx
@pytest.mark.parametrize("activations", [True, False], ids=["activations-and-weights", "weight-only"])
def test_int8_qdq_model_builds(tmp_path, activations):
    model = qdq_matmul_model(tmp_path / "qdq.onnx", activations=activations)
    result, manifest = build_engine(tmp_path / "out", model, precision="int8", profile=QDQ_PROFILE)

    assert result.summary["precision"] == "int8"
    assert result.summary["strongly_typed"] is True  # TensorRT-RTX: the Q/DQ nodes carry the precision
    assert manifest["builder"]["precision_flags"] == []
    assert result.outputs["engine"].stat().st_size > 1000


@needs_rtx
def test_int8_on_a_model_without_qdq_points_to_the_quantize_stage(tmp_path, tiny_cnn_onnx):
    with pytest.raises(StageFailed) as info:
        build_engine(tmp_path, tiny_cnn_onnx, precision="int8", profile=CNN_DYNAMIC)
    assert "no QuantizeLinear/DequantizeLinear" in info.value.message or "has none" in info.value.message
    assert "quantize stage" in info.value.hint
    assert not (tmp_path / "scratch" / "out" / "model.engine").exists()


@needs_rtx
def test_fp8_on_an_int8_model_names_what_the_model_carries(tmp_path):
    model = qdq_matmul_model(tmp_path / "qdq.onnx")
    with pytest.raises(StageFailed, match=r"precision: fp8 was asked, but the model's Q/DQ nodes quantize to int8"):
        build_engine(tmp_path / "out", model, precision="fp8", profile=QDQ_PROFILE)


@needs_rtx
def test_rtx_asked_for_fp16_flags_fails_before_building(tmp_path, tiny_cnn_onnx, tiny_cnn_fp16_onnx):
    with pytest.raises(RecipeError) as info:
        build_engine(tmp_path / "a", tiny_cnn_onnx, precision="fp16", profile=CNN_DYNAMIC)
    assert "strongly typed networks only" in info.value.message
    assert "use the convert stage (precision: fp16) before build" in info.value.hint
    assert info.value.field == "precision"
    assert not (tmp_path / "a" / "scratch" / "out" / "model.engine").exists()

    # The stage's own check (what the runner calls before spawning it) refuses it too, without a model.
    with pytest.raises(RecipeError, match="builder flag"):
        build.stage.check(build.Params(backend="tensorrt-rtx", precision="bf16"))

    # The hint also covers a model that already computes in fp16.
    with pytest.raises(RecipeError) as info:
        build_engine(tmp_path / "b", tiny_cnn_fp16_onnx, precision="fp16", profile=CNN_DYNAMIC)
    assert "already computes in fp16 only needs precision: strongly-typed" in info.value.hint


@needs_rtx
def test_fp32_request_on_an_fp16_model_is_refused_on_rtx(tmp_path, tiny_cnn_fp16_onnx):
    with pytest.raises(StageFailed, match=r"carries fp16 tensors"):
        build_engine(tmp_path, tiny_cnn_fp16_onnx, precision="fp32", profile=CNN_DYNAMIC)


@needs_rtx
def test_rtx_compute_capability_targets(tmp_path, tiny_cnn_onnx):
    result, manifest = build_engine(tmp_path / "ok", tiny_cnn_onnx, profile=CNN_DYNAMIC,
                                    compute_capabilities=["8.6", "sm89", "120"])
    assert manifest["builder"]["compute_capabilities"] == ["8.6", "8.9", "12.0"]
    assert result.outputs["engine"].stat().st_size > 10_000

    with pytest.raises(RecipeError, match=r"compute_capabilities: 9.0 is not a target of tensorrt-rtx .*available: "
                                          r"7.5, 8.0, 8.6, 8.9, 12.0"):
        build_engine(tmp_path / "hopper", tiny_cnn_onnx, profile=CNN_DYNAMIC, compute_capabilities=["9.0"])

    # TensorRT-RTX refuses fp32 GEMMs for Turing: the builder's own error reaches the message.
    with pytest.raises(StageFailed, match=r"could not build cnn.onnx: .*Turing \(SM75\)"):
        build_engine(tmp_path / "turing", tiny_cnn_onnx, profile=CNN_DYNAMIC, compute_capabilities=["7.5"])


@needs_rtx
def test_option_missing_in_the_flavour_names_option_and_flavour(tmp_path, tiny_cnn_onnx):
    with pytest.raises(RecipeError) as info:
        build_engine(tmp_path, tiny_cnn_onnx, profile=CNN_DYNAMIC, tactic_sources=["cublas"])
    assert "tactic_sources: 'cublas' is not available in tensorrt-rtx" in str(info.value)
    assert "jit_convolutions" in info.value.message

    for option, value in [("hardware_compatibility", "ampere+"), ("version_compatible", True),
                          ("fail_on_timing_cache_miss", True)]:
        with pytest.raises(RecipeError) as info:
            build.stage.check(build.Params(backend="tensorrt-rtx", **{option: value}))
        assert info.value.field == option and "tensorrt-rtx" in info.value.message


@needs_rtx
def test_supported_builder_options_reach_the_build(tmp_path, tiny_cnn_onnx, caplog):
    with caplog.at_level(logging.INFO, logger="trtflow.test.build"):
        _, manifest = build_engine(
            tmp_path, tiny_cnn_onnx, profile=CNN_DYNAMIC, tactic_sources=["JIT_CONVOLUTIONS"],
            memory_pool_limits={"workspace": "1GiB", "tactic_shared_memory": 65536}, max_aux_streams=0,
            profiling_verbosity="detailed", sparsity=True, optimization_level=0,
        )
    assert manifest["builder"]["tactic_sources"] == ["jit_convolutions"]
    assert manifest["builder"]["memory_pool_limits"] == {"workspace": 1 << 30, "tactic_shared_memory": 65536}
    log = caplog.text
    assert "WORKSPACE: 1024.00 MiB" in log and "TACTIC_SHARED_MEMORY: 0.06 MiB" in log
    assert "Tactic Sources         | [JIT_CONVOLUTIONS]" in log
    assert "ProfilingVerbosity.DETAILED" in log and "SPARSE_WEIGHTS" in log


@needs_rtx
def test_cancelled_build_stops(tmp_path, tiny_cnn_onnx):
    params = build.Params(backend="tensorrt-rtx", profile=CNN_DYNAMIC)
    ctx = StageContext(node="build", scratch=tmp_path / "scratch", recipe_dir=tmp_path,
                       outputs=build.stage.outputs, cache_dir=tmp_path / "caches")
    ctx.cancel()
    with pytest.raises(StageFailed, match="cancelled"):
        build.stage.run(ctx, {"model": tiny_cnn_onnx}, params)
    assert not ctx.output("engine").exists()


# ---------------------------------------------------------------------------------------------------------
# Profile checks against the model (before any build)


@needs_rtx
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (profile("p", input=([1, 3, 32], [1, 3, 32], [1, 3, 32])),
         r"profile 'p', input 'input': the profile has rank 3 \(min=\[1, 3, 32\]\) but the model input has "
         r"rank 4 \[\?, 3, 32, 32\]"),
        (profile("p", inputs=([1, 3, 32, 32], [1, 3, 32, 32], [1, 3, 32, 32])),
         r"'inputs', which is not an input of the model; did you mean 'input'\?"),
        (profile("p", input=([1, 3, 64, 64], [1, 3, 64, 64], [1, 3, 64, 64])),
         r"input 'input': dimension 2 is fixed to 32 in the model \[\?, 3, 32, 32\] but the profile asks min=64"),
    ],
    ids=["wrong-rank", "unknown-input", "static-dim-mismatch"],
)
def test_bad_profile_against_the_model(tmp_path, tiny_cnn_onnx, spec, expected):
    with pytest.raises(StageFailed, match=expected):
        build_engine(tmp_path, tiny_cnn_onnx, profile=spec)
    assert not (tmp_path / "scratch" / "out" / "model.engine").exists()


@needs_rtx
def test_dynamic_inputs_must_be_covered(tmp_path, tiny_transformer_onnx, tiny_cnn_onnx):
    with pytest.raises(StageFailed, match=r"dynamic inputs \(input\[\?, 3, 32, 32\]\) but no optimization profile"):
        build_engine(tmp_path / "a", tiny_cnn_onnx)

    qdq = qdq_matmul_model(tmp_path / "qdq.onnx")
    covered = profile("p", x=([1, 16], [1, 16], [1, 16]))
    assert build_engine(tmp_path / "b", qdq, profile=covered)[0].summary["profiles"] == ["p"]
    with pytest.raises(StageFailed, match=r"profile 'p' gives no shapes for dynamic input\(s\) input_ids\[\?, \?\]"):
        check_profiles([build.ProfileSpec.model_validate(covered)], {"input_ids": [None, None], "x": [None, 16]})


def test_profile_ranges_are_checked_when_params_are_read():
    with pytest.raises(ValidationError, match=r"shapes.input\n.*need min <= opt <= max in every dimension, but "
                                              r"dimension 0 has min=4, opt=2, max=8"):
        build.Params(profile=profile("p", input=([4, 3], [2, 3], [8, 3])))
    with pytest.raises(ValidationError, match=r"min, opt and max must have the same rank"):
        build.Params(profile=profile("p", input=([1, 3], [1, 3, 1], [1, 3])))
    with pytest.raises(ValidationError, match="either 'profile' or 'profiles'"):
        build.Params(profile=CNN_DYNAMIC, profiles=[CNN_DYNAMIC])
    with pytest.raises(ValidationError, match="profile names must be unique; repeated: bs1-8"):
        build.Params(profiles=[CNN_DYNAMIC, CNN_DYNAMIC])


# ---------------------------------------------------------------------------------------------------------
# Pure logic: precision plans for every flavour, option checks, sizes, declarations


def test_precision_plan_on_tensorrt_10_uses_builder_flags():
    plain = ModelFacts(inputs={"x": [None, 4]})
    int8_model = ModelFacts(inputs={"x": [None, 4]}, quantized_types={"int8"})
    assert build.plan_precision("strongly-typed", "tensorrt", "10.13.0", plain) == build.PrecisionPlan(True)
    assert build.plan_precision("fp32", "tensorrt", "10.13.0", plain) == build.PrecisionPlan(False)
    assert build.plan_precision("fp16", "tensorrt", "10.13.0", plain) == build.PrecisionPlan(False, ("fp16",))
    assert build.plan_precision("bf16", "tensorrt", "10.13.0", plain) == build.PrecisionPlan(False, ("bf16",))
    assert build.plan_precision("int8", "tensorrt", "10.13.0", int8_model) == build.PrecisionPlan(False, ("int8",))
    assert build.plan_precision("best", "tensorrt", "10.13.0", plain).flags == ("fp16", "bf16")
    assert build.plan_precision("best", "tensorrt", "10.13.0", int8_model).flags == ("fp16", "bf16", "int8")
    with pytest.raises(StageFailed, match="quantize stage"):
        build.plan_precision("int8", "tensorrt", "10.13.0", plain)


def test_precision_plan_on_strongly_typed_flavours():
    for backend, version in [("tensorrt", "11.0.0"), ("tensorrt-rtx", "1.7.1")]:
        assert build.plan_precision("fp32", backend, version) == build.PrecisionPlan(True)
        assert build.plan_precision("int8", backend, version,
                                    ModelFacts(quantized_types={"int8"})) == build.PrecisionPlan(True)
        for precision in ("fp16", "bf16", "best"):
            with pytest.raises(RecipeError, match=f"{backend} {version} builds strongly typed"):
                build.plan_precision(precision, backend, version)


def test_flavour_options_on_full_tensorrt():
    with pytest.raises(RecipeError, match="compute_capabilities: a TensorRT-RTX option, not available in tensorrt 10"):
        build.check_flavour_options(build.Params(compute_capabilities=["8.6"]), "tensorrt", "10.13.0")
    build.check_flavour_options(
        build.Params(hardware_compatibility="ampere+", version_compatible=True, fail_on_timing_cache_miss=True,
                     precision="fp16"), "tensorrt", "10.13.0")


def test_sizes_and_capabilities_are_parsed():
    assert build.parse_size("4GiB", "w") == build.parse_size("4G", "w") == 4 << 30
    assert build.parse_size("1GB", "w") == 10**9
    assert build.parse_size("512MiB", "w") == 512 << 20
    assert build.parse_size(1024, "w") == 1024
    params = build.Params(workspace="2GiB", memory_pool_limits={"TACTIC_DRAM": "1MB"})
    assert params.pool_limits() == {"workspace": 2 << 30, "tactic_dram": 10**6}
    with pytest.raises(ValidationError, match=r"workspace: cannot read '4 gigs' as a size"):
        build.Params(workspace="4 gigs")
    with pytest.raises(ValidationError, match="workspace limit is given twice"):
        build.Params(workspace=1, memory_pool_limits={"workspace": 2})
    assert build.Params(compute_capabilities=["sm_120", "86", "8.9"]).compute_capabilities == ["12.0", "8.6", "8.9"]
    with pytest.raises(ValidationError, match=r"'current' .* cannot be combined"):
        build.Params(compute_capabilities=["current", "8.6"])
    with pytest.raises(ValidationError, match="needs timing_cache: use"):
        build.Params(timing_cache="off", fail_on_timing_cache_miss=True)


def test_every_param_is_described():
    from trtflow.stage import ProfileSpec, ShapeRange

    for model in (build.Params, ProfileSpec, ShapeRange):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"


@needs_rtx
def test_declarations_follow_the_flavour():
    rtx = build.Params(backend="tensorrt-rtx")
    assert build.stage.resources_for(rtx).gpu == 0
    assert build.stage.environment_for(rtx) == ("polygraphy", "tensorrt_rtx")
    on_gpu = build.Params(backend="tensorrt-rtx", compute_capabilities=["current"])
    assert build.stage.resources_for(on_gpu).gpu == 1
    assert build.stage.environment_for(on_gpu) == ("polygraphy", "tensorrt_rtx", "gpu")
    if not module_available("tensorrt"):
        assert build.stage.environment_for(build.Params()) == ("polygraphy", "tensorrt_rtx")
        full = build.Params(backend="tensorrt")
        assert build.stage.environment_for(full) == ("polygraphy", "tensorrt", "gpu")
        with pytest.raises(StageSkipped) as info:
            build.stage.check(full)
        assert "NVIDIA's index" in info.value.needs


@needs_rtx
def test_modelopt_int8_cnn_builds(tmp_path, tiny_cnn_onnx):
    """A CNN quantized by ModelOpt (per-channel conv weights, activation Q/DQ) builds as a strongly typed int8."""
    import numpy as np
    from modelopt.onnx.quantization import quantize

    quantized = tmp_path / "cnn_int8.onnx"
    calibration = {"input": np.random.default_rng(0).random((8, 3, 32, 32), dtype=np.float32)}
    quantize(onnx_path=str(tiny_cnn_onnx), quantize_mode="int8", calibration_data=calibration,
             output_path=str(quantized), calibration_eps=["cpu"])
    assert inspect_model(quantized).quantized_types == {"int8"}

    result, manifest = build_engine(tmp_path / "out", quantized, precision="int8", profile=CNN_DYNAMIC)
    assert result.summary["strongly_typed"] is True
    assert manifest["network"]["layers"] > 100  # the Q/DQ layers are in the network TensorRT-RTX compiled
    assert result.outputs["engine"].stat().st_size > 100_000


@needs_rtx
def test_unparseable_model_names_the_node_and_what_to_do(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MyCustomOp", ["x"], ["y"], domain="com.example")], "custom",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, str(tmp_path / "custom.onnx"))

    with pytest.raises(StageFailed) as info:
        build_engine(tmp_path / "out", tmp_path / "custom.onnx")
    assert "could not build custom.onnx" in info.value.message
    assert "operator: MyCustomOp" in info.value.message and "Could not parse ONNX correctly" in info.value.message
    assert "--- Begin node ---" not in info.value.message
    assert "ONNX parser of tensorrt-rtx" in info.value.hint
