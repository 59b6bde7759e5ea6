"""Known ONNX Runtime CPU numerics bugs that would make a model look worse than it is, and exact rewrites.

A model validated on ONNX Runtime stands in for the TensorRT engine built from it, so a runtime bug in
ONNX Runtime must not be reported as the model's error.

- ``QuantizeLinear`` with a float16 input: ONNX Runtime's CPU kernel truncates ``x / scale`` toward zero
  instead of rounding to nearest even (microsoft/onnxruntime#18576, #22741; fixed by PR #32452). On an int8
  model whose unquantized part is fp16 (ModelOpt's default), every activation loses up to one quantization
  step, always toward zero: attention probabilities of a ViT (about 1/197 each, scale 1/127) almost all
  become 0, and the output's cosine similarity to fp32 drops from 0.96 to 0.64. TensorRT rounds correctly.
  The rewrite casts the input (exactly) and the scale to float32 in front of each such node, which selects
  the correctly rounding float32 kernel; it is applied only when a probe shows the installed ONNX Runtime
  has the bug.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_FLOAT16 = 10  # onnx.TensorProto.FLOAT16
_FLOAT = 1


@dataclass(frozen=True)
class Rewrite:
    """What was changed in a model so that ONNX Runtime computes what the ONNX spec (and TensorRT) compute."""

    nodes: int
    reason: str


@functools.lru_cache(maxsize=1)
def truncates_fp16_quantize() -> bool:
    """Whether the installed ONNX Runtime's CPU QuantizeLinear rounds float16 inputs toward zero (a probe)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [2])],
        [numpy_helper.from_array(np.array(1.0, np.float16), "scale"),
         numpy_helper.from_array(np.array(0, np.int8), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    result = session.run(None, {"x": np.array([0.75, -0.75], np.float16)})[0]
    return result.tolist() != [1, -1]


def fp16_quantize_nodes(model: Any) -> list[Any]:
    """QuantizeLinear nodes whose scale (and so input) is float16."""
    scales = {init.name: init.data_type for init in model.graph.initializer}
    constants = {out: next((a.t.data_type for a in node.attribute if a.name == "value"), None)
                 for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    scales.update({name: dtype for name, dtype in constants.items() if dtype is not None})
    return [node for node in model.graph.node
            if node.op_type == "QuantizeLinear" and len(node.input) > 1 and scales.get(node.input[1]) == _FLOAT16]


def fix_for_onnxruntime(model_path: Path, workdir: Path) -> tuple[Path, list[Rewrite]]:
    """``model_path`` itself, or a rewritten copy in ``workdir`` that the installed ONNX Runtime computes right."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    nodes = fp16_quantize_nodes(model)
    if not nodes or not truncates_fp16_quantize():
        return model_path, []
    from onnx import helper

    rewritten = []
    for node in nodes:
        cast_x = helper.make_node("Cast", [node.input[0]], [f"{node.name or node.output[0]}__x_fp32"], to=_FLOAT,
                                  name=f"{node.name or node.output[0]}__cast_x_fp32")
        cast_scale = helper.make_node("Cast", [node.input[1]], [f"{node.name or node.output[0]}__scale_fp32"],
                                      to=_FLOAT, name=f"{node.name or node.output[0]}__cast_scale_fp32")
        node.input[0], node.input[1] = cast_x.output[0], cast_scale.output[0]
        rewritten.append((node, [cast_x, cast_scale]))
    order = []
    inserted = {id(node): casts for node, casts in rewritten}
    for node in model.graph.node:
        order.extend(inserted.get(id(node), []))
        order.append(node)
    del model.graph.node[:]
    model.graph.node.extend(order)
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / model_path.name
    _link_external_data(model, model_path.parent, workdir)
    onnx.save(model, str(target))
    import onnxruntime

    return target, [Rewrite(len(nodes), f"{len(nodes)} QuantizeLinear node(s) with float16 input run in float32: "
                            f"ONNX Runtime {onnxruntime.__version__} rounds float16 QuantizeLinear toward zero "
                            "on the CPU (microsoft/onnxruntime#18576); TensorRT rounds to nearest as ONNX "
                            "specifies")]


def _link_external_data(model: Any, source_dir: Path, workdir: Path) -> None:
    """Make the external data files ``model`` names (beside it in ``source_dir``) reachable from ``workdir``."""
    import os

    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            target = workdir / location
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink((source_dir / location).resolve(), target)
