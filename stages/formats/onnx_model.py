"""What an ONNX file holds, read without running it: its inputs, reduced float types and quantized types
(`inspect_model`), and whether a stage's input is an ONNX model or an engine (`candidate_kind`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed


def candidate_kind(path: Path) -> str:
    """'onnx' or 'engine': by file name (the runner keeps producers' file names), else by content."""
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix in (".engine", ".plan", ".trt"):
        return "engine"
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a protobuf ONNX model
        return "engine"
    return "onnx" if model.ir_version > 0 and len(model.graph.node) > 0 else "engine"


_QUANTIZED_TYPES = {
    "INT8": "int8", "UINT8": "int8", "INT4": "int4", "UINT4": "int4", "FLOAT4E2M1": "fp4",
    "FLOAT8E4M3FN": "fp8", "FLOAT8E4M3FNUZ": "fp8", "FLOAT8E5M2": "fp8", "FLOAT8E5M2FNUZ": "fp8",
}


_REDUCED_FLOATS = {"FLOAT16": "fp16", "BFLOAT16": "bf16"}


@dataclass
class ModelFacts:
    """The model's graph inputs (dims: int static, None dynamic; None for unknown rank) and its precisions."""

    inputs: dict[str, list[int | None] | None] = field(default_factory=dict)
    quantized_types: set[str] = field(default_factory=set)
    reduced_floats: set[str] = field(default_factory=set)

    @property
    def has_qdq(self) -> bool:
        return bool(self.quantized_types)


def inspect_model(path: Path) -> ModelFacts:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and others for a bad file
        raise StageFailed(f"cannot read the ONNX model {path}: {exc}",
                          hint="check that the upstream stage wrote a valid .onnx file") from exc
    graph = model.graph
    type_name = onnx.TensorProto.DataType.Name
    initializers = {init.name: init for init in graph.initializer}
    constants = {
        node.output[0]: attr.t
        for node in graph.node if node.op_type == "Constant"
        for attr in node.attribute if attr.name == "value"
    }
    facts = ModelFacts()
    for value in graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            facts.inputs[value.name] = None
            continue
        facts.inputs[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]

    def note_float(elem_type: int) -> None:
        name = type_name(elem_type) if elem_type else ""
        if name in _REDUCED_FLOATS:
            facts.reduced_floats.add(_REDUCED_FLOATS[name])

    for init in graph.initializer:
        note_float(init.data_type)
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.HasField("tensor_type"):
            note_float(value.type.tensor_type.elem_type)
    for node in graph.node:
        if node.op_type == "Cast":
            for attr in node.attribute:
                if attr.name == "to":
                    note_float(attr.i)
        elif node.op_type == "Constant" and node.output[0] in constants:
            note_float(constants[node.output[0]].data_type)
        elif node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            facts.quantized_types.add(_qdq_type(node, initializers, constants, type_name))
    return facts


def _qdq_type(node: Any, initializers: Mapping[str, Any], constants: Mapping[str, Any], type_name: Any) -> str:
    """The quantized type of a Q/DQ node: its zero point's type, else output_dtype, else the DQ input's."""
    candidates = []
    if len(node.input) > 2 and node.input[2]:
        candidates.append(node.input[2])
    for attr in node.attribute:
        if attr.name == "output_dtype" and attr.i:
            return _QUANTIZED_TYPES.get(type_name(attr.i), type_name(attr.i).lower())
    if node.op_type == "DequantizeLinear":
        candidates.append(node.input[0])
    for name in candidates:
        tensor = initializers.get(name)
        if tensor is None:
            tensor = constants.get(name)
        if tensor is not None:
            return _QUANTIZED_TYPES.get(type_name(tensor.data_type), type_name(tensor.data_type).lower())
    return "int8"  # ONNX's default quantized type (uint8) when no zero point says otherwise
