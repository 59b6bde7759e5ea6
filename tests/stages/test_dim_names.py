"""Dim names (issue 25): an output axis takes the name of the input dim it follows, a size that follows none while
every input dim varied is fixed, a derived length is one name wherever it appears; the exporter's names are
replaced in the ONNX file."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from trtflow_stages.formats.dim_names import (
    Observation,
    dynamic_output_axes,
    input_dim_name,
    output_dim_names,
    rename_output_dims,
)


def test_input_dims_of_images_are_height_and_width():
    assert input_dim_name("image", 0, [None, 3, None, None]) == "batch"
    assert [input_dim_name("image", a, [None, 3, None, None]) for a in (2, 3)] == ["height", "width"]
    assert [input_dim_name("image", a, [None, None, None, 3]) for a in (1, 2)] == ["height", "width"]
    assert input_dim_name("tokens", 1, [None, None]) == "tokens_1"


def test_outputs_follow_the_input_dims_they_track():
    # sample (batch 2, sequence 16), then batch 4, then sequence 8: logits [batch, sequence, vocab], pooled
    # [batch, 32], frames = sequence // 2 in two outputs, queries fixed at 8
    observations = [Observation({"batch": b, "sequence": s}, {
        "logits": [b, s, 100], "pooled": [b, 32], "frames": [b, s // 2], "frames_mask": [b, s // 2],
        "boxes": [b, 8, 4]}) for b, s in ((2, 16), (4, 16), (2, 8))]
    dynamic = {"logits": [0, 1], "pooled": [0, 1], "frames": [0, 1], "frames_mask": [1], "boxes": [0, 1]}
    names = output_dim_names(observations, dynamic)
    assert names["logits"] == {0: "batch", 1: "sequence"}
    assert names["pooled"] == {0: "batch", 1: 32}  # dynamic in the file, fixed in the model
    assert names["frames"] == {0: "batch", 1: "frames_1"}
    assert names["frames_mask"] == {1: "frames_1"}  # the same derived length: one name
    assert names["boxes"] == {0: "batch", 1: 8}


def test_a_size_is_not_fixed_when_some_input_dim_never_varied():
    observations = [Observation({"batch": 2, "sequence": 16}, {"out": [2, 16]})]
    assert output_dim_names(observations, {"out": [0, 1]}) == {"out": {0: "batch", 1: "sequence"}}
    # one observation: nothing varied, so a constant size follows no dim and is named, not fixed
    assert output_dim_names([Observation({"batch": 2}, {"out": [2, 5]})], {"out": [1]}) == {"out": {1: "out_1"}}


def test_rename_writes_the_names_into_the_file(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["Gemmy_dim_0", "unk__3"])
    inner = helper.make_tensor_value_info("t", TensorProto.FLOAT, ["Gemmy_dim_0", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Identity", ["t"], ["y"])],
                              "g", [x], [y], value_info=[inner])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert dynamic_output_axes(path) == {"y": [0, 1]}
    assert rename_output_dims(path, {"y": {0: "batch", 1: 4}}) == {"Gemmy_dim_0": "batch"}
    model = onnx.load(str(path))
    assert [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == ["batch", 4]
    assert model.graph.value_info[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    onnx.checker.check_model(model, full_check=True)
