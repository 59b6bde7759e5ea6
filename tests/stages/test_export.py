"""The export stage: real exports of small PyTorch models, checked at more than one shape on ONNX Runtime."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from trtflow.stage import StageFailed
from trtflow.testing import run_stage
from trtflow_stages import export
from trtflow_stages.formats.torch_check import check_shapes, size_one_warnings
from trtflow_stages.formats.torch_export import bind_inputs

REPO = Path(__file__).resolve().parents[2]
BERT = "python:examples/models/tiny_bert.py"
BERT_INPUTS = {
    "input_ids": {"shape": [2, 16], "dtype": "int64", "high": 1000, "dynamic_axes": {0: "batch", 1: "seq"}},
    "attention_mask": {"shape": [2, 16], "dtype": "int64", "low": 1, "high": 2, "dynamic_axes": {0: "batch", 1: "seq"}},
}
BERT_OUTPUTS = ["last_hidden_state", "pooled"]


def run_export(tmp_path: Path, **params):
    params = {"inputs": BERT_INPUTS, "outputs": BERT_OUTPUTS, **params}
    return run_stage(export.stage, params, workdir=tmp_path / "work", recipe_dir=REPO)


def input_dims(path: Path) -> dict[str, list]:
    model = onnx.load(str(path), load_external_data=False)
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


@pytest.mark.slow
def test_torchscript_export_that_bakes_the_sequence_length_fails_at_export_naming_the_shape(tmp_path):
    with pytest.raises(StageFailed) as info:
        run_export(tmp_path, model=f"{BERT}:build", factory_args={"bake_seq": True})
    message, hint = info.value.message, info.value.hint
    assert "fails at seq = 8" in message  # the shape, named
    assert "input_ids [2, 8], attention_mask [2, 8]" in message
    assert "Reshape node '/layers.0/attention/Reshape" in message  # where
    assert "recorded the sample's size of 'seq' (16) as a constant" in message  # why
    # What to do: the other exporter was tried (and cannot help: the int() reaches torch.export too).
    assert "dynamo: true does not help here" in hint and "came out fixed at 16" in hint
    assert "-1 in view/reshape" in hint and "remove 'seq' from dynamic_axes" in hint


@pytest.mark.slow
def test_dynamo_export_keeps_the_recipe_dim_names_and_is_checked_at_other_sizes(tmp_path):
    result = run_export(tmp_path, model=f"{BERT}:build", dynamo=True, opset=18)
    assert input_dims(result.outputs["model"]) == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    assert result.summary["outputs"]["last_hidden_state"] == ["batch", "seq", 64]
    checked = result.summary["checked_shapes"]
    assert [(c.get("dim"), c.get("size"), c["status"]) for c in checked] == [
        (None, None, "ok"), ("batch", 4, "ok"), ("seq", 8, "ok")]
    assert result.summary["max_abs_diff_vs_torch"] < 1e-4


@pytest.mark.slow
def test_dynamo_export_that_specialises_a_dynamic_axis_fails_naming_it(tmp_path):
    with pytest.raises(StageFailed) as info:
        run_export(tmp_path, model=f"{BERT}:build", dynamo=True, opset=18, factory_args={"bake_seq": True})
    assert "axis 1 ('seq') of input 'input_ids' came out fixed at 16" in info.value.message
    assert "int() on a size" in info.value.hint


@pytest.mark.slow
def test_attention_fast_path_gets_a_hint_that_was_tried(tmp_path):
    with pytest.raises(StageFailed) as info:
        run_export(tmp_path, model=f"{BERT}:build_torch_encoder")
    assert "aten::_nested_tensor_from_mask" in info.value.message
    assert "attention fast path" in info.value.message
    # dynamo: true was tried and works for this model; turning the fast path off is said to be for fixed shapes.
    assert info.value.hint.startswith("set `dynamo: true`: tried here")
    assert "set_fastpath_enabled(False)" in info.value.hint and "only for fixed shapes" in info.value.hint


@pytest.mark.slow
def test_profiles_min_and_max_are_checked_and_a_name_differing_from_forward_maps_by_position(tmp_path):
    profile = {"name": "text", "shapes": {"ids": {"min": [1, 4], "opt": [4, 16], "max": [8, 64]}}}
    result = run_stage(export.stage, {
        "model": "python:examples/models/tiny_transformer.py:build",
        "inputs": {"ids": {"shape": [2, 16], "dtype": "int64", "high": 1000, "dynamic_axes": {0: "batch", 1: "seq"}}},
        "outputs": ["logits"], "profiles": [profile],
    }, workdir=tmp_path / "work", recipe_dir=REPO)
    checked = {(c.get("dim"), c.get("size")): c for c in result.summary["checked_shapes"]}
    assert set(checked) == {(None, None), ("batch", 1), ("batch", 8), ("seq", 4), ("seq", 64)}
    assert checked[("seq", 64)]["origin"] == "profile max" and checked[("seq", 64)]["shapes"] == {"ids": [2, 64]}
    assert all(c["status"] == "ok" for c in checked.values())
    assert result.summary["inputs_bound_by"] == "position"
    assert input_dims(result.outputs["model"]) == {"ids": ["batch", "seq"]}


def test_check_shapes_vary_one_dim_name_at_a_time_over_all_inputs():
    params = export.Params(model="python:m.py:build", inputs=BERT_INPUTS, outputs=BERT_OUTPUTS)
    checks = check_shapes(params)
    assert [c.shapes for c in checks] == [
        {"input_ids": [2, 16], "attention_mask": [2, 16]},
        {"input_ids": [4, 16], "attention_mask": [4, 16]},  # batch 2 -> 4 (twice a sample below 4)
        {"input_ids": [2, 8], "attention_mask": [2, 8]},  # seq 16 -> 8 (half)
    ]
    assert checks[2].label == "seq = 8 (derived from the sample): input_ids [2, 8], attention_mask [2, 8]"


def test_a_dynamic_sample_size_of_one_is_warned_about():
    inputs = {"x": {"shape": [1, 3], "dynamic_axes": {0: "batch"}}}
    params = export.Params(model="python:m.py:build", inputs=inputs)
    (warning,) = size_one_warnings(params)
    assert "axis 0 ('batch') is dynamic but its sample size is 1" in warning
    assert "torch.export specialises sizes 0 and 1" in warning


@pytest.mark.parametrize("inputs, profiles, message", [
    ({"x": {"shape": [2, 3], "dynamic_axes": {2: "c"}}}, [], "dynamic_axes names axis 2, but the sample shape"),
    ({"a": {"shape": [2, 3], "dynamic_axes": {0: "b"}}, "c": {"shape": [4, 3], "dynamic_axes": {0: "b"}}}, [],
     "dim name 'b' has size 2 in the sample of 'a' but 4 in 'c'"),
    ({"x": {"shape": [2, 3], "dynamic_axes": {0: "b"}}},
     [{"name": "p", "shapes": {"x": {"min": [1, 1], "opt": [2, 3], "max": [4, 8]}}}],
     "profile 'p' varies axis 1 of 'x' (1..8) but inputs.x.dynamic_axes does not mark axis 1 dynamic"),
    ({"x": {"shape": [2, 3], "dynamic_axes": {0: "b"}}},
     [{"name": "p", "shapes": {"y": {"min": [1, 3], "opt": [2, 3], "max": [4, 3]}}}],
     "profile 'p' gives shapes for 'y', which is not one of the inputs ['x']"),
])
def test_inconsistent_shapes_are_recipe_errors(inputs, profiles, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        export.Params(model="python:m.py:build", inputs=inputs, profiles=profiles)


class TwoInputs(nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return input_ids


def test_inputs_bind_by_name_in_forward_order_and_skip_optional_parameters():
    binding = bind_inputs(TwoInputs(), ["token_type_ids", "input_ids"])
    assert binding.by == "name"
    assert binding.positional == ("input_ids",) and binding.keyword == ("token_type_ids",)
    assert binding.order == ["input_ids", "token_type_ids"]


def test_inputs_bind_by_position_when_names_differ_and_say_so():
    binding = bind_inputs(TwoInputs(), ["ids", "mask"])
    assert binding.by == "position" and binding.positional == ("ids", "mask")
    assert binding.notes == ("input 'ids' -> forward() argument 'input_ids' (by position)",
                             "input 'mask' -> forward() argument 'attention_mask' (by position)")


@pytest.mark.parametrize("names, message", [
    (["mask", "input_ids"], "input 'input_ids' is given at position #2 of 'inputs' but is argument #1"),
    (["a", "b", "c", "d"], "'inputs' gives 4 inputs (a, b, c, d) but forward(input_ids"),
    (["attention_mask"], "needs argument(s) ['input_ids'], which no input gives"),
])
def test_inputs_that_do_not_fit_forward_say_exactly_what_is_wrong(names, message):
    with pytest.raises(StageFailed, match=re.escape(message)):
        bind_inputs(TwoInputs(), names)
