"""PyTorch -> ONNX with either exporter, and what we know about why an export goes wrong.

- `bind_inputs`: the recipe's input names onto ``forward()``'s parameters (by name when every recipe name is a
  parameter, else by position), or an error that says exactly what does not fit.
- `export_torchscript` / `export_dynamo`: the two exporters; the torch.export-based one gets one named
  ``torch.export.Dim`` per ``dynamic_axes`` name, so the ONNX inputs keep the recipe's dim names.
- `explain_export_error`, `specialised_axes`, `baked_sizes`: causes and fixes of known exporter failures.

Verified on torch 2.13 (CPU): PyTorch's attention fast path (``nn.TransformerEncoder`` in eval mode with a
padding mask, under ``no_grad``) calls ``aten::_nested_tensor_from_mask``, which the TorchScript exporter
cannot export; turning the fast path off (``torch.backends.mha.set_fastpath_enabled(False)``) lets it export,
but ``nn.MultiheadAttention``'s reshapes then hold the sample's batch and sequence sizes; the torch.export-based
exporter (``dynamo: true``) exports it and stays dynamic.
"""

from __future__ import annotations

import inspect
import keyword
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

FASTPATH_OP = "_nested_tensor_from_mask"
FASTPATH_CAUSE = (
    "PyTorch's attention fast path (nn.TransformerEncoder/nn.MultiheadAttention in eval mode with a padding "
    "mask, under no_grad) calls it, and the TorchScript exporter cannot export it"
)
FASTPATH_FIX = (
    "turning the fast path off (torch.backends.mha.set_fastpath_enabled(False) in the "
    "model factory) lets TorchScript export it, but nn.MultiheadAttention's reshapes then hold the sample's "
    "batch and sequence sizes: use that only for fixed shapes"
)
#: Ops whose shape-like input, when a constant, fixes an output size.
_SHAPE_INPUTS = {"Reshape": 1, "Expand": 1, "Tile": 1, "ConstantOfShape": 0, "Slice": 2, "Resize": 3,
                 "Range": 1, "Split": 1}


@dataclass(frozen=True)
class Binding:
    """How the recipe's inputs are passed to ``forward()``: positional ones, then keyword ones."""

    positional: tuple[str, ...]
    keyword: tuple[str, ...] = ()
    by: str = "name"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def order(self) -> list[str]:
        """The inputs in the order the exporters see them (the ONNX graph inputs' order)."""
        return [*self.positional, *self.keyword]

    def call_arguments(self, tensors: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(tensors[n] for n in self.positional), {n: tensors[n] for n in self.keyword}


def _signature(model: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or scripted forward without a Python signature
        return None


def bind_inputs(model: Any, names: Sequence[str]) -> Binding:
    """Map the recipe's input names onto ``model.forward``'s parameters, or fail saying what does not fit."""
    signature = _signature(model)
    if signature is None:
        return Binding(tuple(names), by="position")
    params = list(signature.parameters.values())
    kinds = inspect.Parameter
    positional = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    named = {p.name: p for p in params if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)}
    var_positional = any(p.kind == kinds.VAR_POSITIONAL for p in params)
    shown = f"forward({', '.join(str(p) for p in params)})"
    if names and all(n in named for n in names):
        return _bind_by_name(positional, named, names, shown)
    misplaced = [(n, i) for i, n in enumerate(names) if n in named
                 and (i >= len(positional) or positional[i].name != n)]
    if misplaced:
        name, index = misplaced[0]
        where = (f"argument #{[p.name for p in positional].index(name) + 1}" if name in [p.name for p in positional]
                 else "a keyword-only argument")
        raise StageFailed(
            f"input {name!r} is given at position #{index + 1} of 'inputs' but is {where} of {shown}; the other "
            f"inputs {[n for n in names if n not in named]} are not parameters of forward(), so they cannot be "
            "passed by name either",
            hint="name every input like its forward() parameter (then order does not matter), or list them in "
            "forward()'s order",
        )
    if len(names) > len(positional) and not var_positional:
        raise StageFailed(
            f"'inputs' gives {len(names)} inputs ({', '.join(names)}) but {shown} takes {len(positional)}",
            hint="give one input per forward() argument, in forward()'s order",
        )
    required = [p.name for p in positional[len(names):] if p.default is inspect.Parameter.empty]
    required += [p.name for p in params if p.kind == kinds.KEYWORD_ONLY and p.default is inspect.Parameter.empty]
    if required:
        raise StageFailed(
            f"{shown} needs argument(s) {required}, which no input gives ('inputs' has {list(names)})",
            hint="add an input for each, named like the forward() parameter",
        )
    notes = tuple(f"input {n!r} -> forward() argument {p.name!r} (by position)"
                  for n, p in zip(names, positional, strict=False) if n != p.name)
    return Binding(tuple(names), by="position", notes=notes)


def _bind_by_name(positional: list[Any], named: Mapping[str, Any], names: Sequence[str], shown: str) -> Binding:
    given = set(names)
    missing = [p.name for p in named.values() if p.name not in given and p.default is inspect.Parameter.empty]
    if missing:
        raise StageFailed(
            f"{shown} needs argument(s) {missing}, which no input gives ('inputs' has {list(names)})",
            hint="add an input for each, named like the forward() parameter",
        )
    args: list[str] = []
    kwargs: list[str] = []
    for param in positional:
        if param.name in given and not kwargs and len(args) == positional.index(param):
            args.append(param.name)
        elif param.name in given:
            kwargs.append(param.name)
    kwargs += [n for n in names if n not in args and n not in kwargs]
    notes: tuple[str, ...] = ()
    if [*args, *kwargs] != list(names):
        notes = (f"inputs passed to forward() by name, in forward()'s order: {[*args, *kwargs]}",)
    return Binding(tuple(args), tuple(kwargs), by="name", notes=notes)


# ---------------------------------------------------------------------------------------------------------
# The exporters


def export_torchscript(model: Any, binding: Binding, tensors: Mapping[str, Any], target: Path,
                       dynamic_axes: Mapping[str, Mapping[int, str]], output_names: Sequence[str], opset: int) -> None:
    import torch

    args, kwargs = binding.call_arguments(tensors)
    torch.onnx.export(model, args, str(target), kwargs=kwargs or None, input_names=binding.order,
                      output_names=list(output_names), opset_version=opset,
                      dynamic_axes={n: dict(a) for n, a in dynamic_axes.items() if a} or None,
                      do_constant_folding=True, dynamo=False)


def _identifier(name: str) -> str:
    text = re.sub(r"\W", "_", name)
    if not text or text[0].isdigit() or keyword.iskeyword(text):
        text = f"d_{text}"
    return text


def export_dynamo(model: Any, binding: Binding, tensors: Mapping[str, Any], target: Path,
                  dynamic_axes: Mapping[str, Mapping[int, str]], output_names: Sequence[str], opset: int,
                  ranges: Mapping[str, tuple[int, int]] | None = None) -> None:
    """torch.export-based export with one named ``torch.export.Dim`` per dim name (shared across inputs)."""
    import torch

    dims: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    for axes in dynamic_axes.values():
        for name in axes.values():
            if name in dims:
                continue
            identifier = _identifier(name)
            renamed[identifier] = name
            low, high = (ranges or {}).get(name, (None, None))
            bounds = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
            dims[name] = torch.export.Dim(identifier, **bounds)
    per_input = [{axis: dims[name] for axis, name in dynamic_axes.get(n, {}).items()} or None
                 for n in binding.order]
    if binding.by == "name":
        dynamic_shapes: Any = dict(zip(binding.order, per_input, strict=True))
    else:
        dynamic_shapes = tuple(per_input)
    if all(shape is None for shape in per_input) or isinstance(model, torch.export.ExportedProgram):
        dynamic_shapes = None  # a torch.export program carries its own
    args, kwargs = binding.call_arguments(tensors)
    program = torch.onnx.export(model, args, kwargs=kwargs or None, dynamo=True, input_names=binding.order,
                                output_names=list(output_names), opset_version=opset,
                                dynamic_shapes=dynamic_shapes)
    program.save(str(target))
    if any(identifier != name for identifier, name in renamed.items()):
        rename_dims(target, renamed)


def rename_dims(path: Path, renamed: Mapping[str, str]) -> None:
    """Give dims the recipe's names back where a name had to be made a Python identifier for torch.export."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in renamed:
                dim.dim_param = renamed[dim.dim_param]
    onnx.save(model, str(path))


# ---------------------------------------------------------------------------------------------------------
# Why an export went wrong


def explain_export_error(error: BaseException, dynamo: bool) -> tuple[str, str]:
    """(what happened, what to do) for an exception raised by torch.onnx.export."""
    text = f"{type(error).__name__}: {error}"
    if FASTPATH_OP in text:
        return f"the TorchScript exporter cannot export aten::{FASTPATH_OP}: {FASTPATH_CAUSE}", FASTPATH_FIX
    violated = re.search(r"Constraints violated \(([^)]*)\)", text)
    if violated:
        specialised = re.findall(r"specialized it to be a constant \((\d+)\)", text)
        fixes = re.findall(r"Suggested fixes:\s*(.+?)(?:\n\n|$)", text, flags=re.S)
        what = f"torch.export found that the model's code does not keep {violated.group(1)} dynamic"
        if specialised:
            what += f": it fixes it to {specialised[0]}"
        fix = ("keep sizes symbolic in the model's code (no int() on a size, no Python branch on it), or drop "
               "that name from dynamic_axes if it never changes")
        if specialised and specialised[0] in ("0", "1"):
            fix = ("use a sample size of 2 or more for that axis (torch.export specialises sizes 0 and 1), or "
                   + fix)
        if fixes:
            fix += f"; torch suggests: {' '.join(fixes[0].split())}"
        return what, fix
    unsupported = re.search(r"operator '([\w:.]+)' to ONNX opset version (\d+)", text)
    if unsupported and not dynamo:
        return (f"the TorchScript exporter has no ONNX conversion of {unsupported.group(1)} at opset "
                f"{unsupported.group(2)}",
                "set `dynamo: true` (the torch.export-based exporter covers more operators), or a higher opset "
                "if the operator appeared in one")
    first = " ".join(str(error).split())[:500]
    if dynamo:
        return (f"the torch.export-based exporter failed: {type(error).__name__}: {first}",
                "see the node's log for the full trace; `dynamo: false` uses the TorchScript exporter instead")
    return (f"the TorchScript exporter failed: {type(error).__name__}: {first}",
            "see the node's log for the full trace; `dynamo: true` uses the torch.export-based exporter")


def specialised_axes(path: Path, dynamic_axes: Mapping[str, Mapping[int, str]]) -> list[tuple[str, int, str, int]]:
    """(input, axis, dim name, size) of every axis asked to be dynamic that came out with a fixed size."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    found = []
    shapes = {v.name: v.type.tensor_type.shape.dim for v in model.graph.input}
    for name, axes in dynamic_axes.items():
        dims = shapes.get(name)
        if dims is None:
            continue
        for axis, dim_name in axes.items():
            if axis < len(dims) and dims[axis].HasField("dim_value"):
                found.append((name, axis, dim_name, int(dims[axis].dim_value)))
    return found


def baked_sizes(path: Path, sizes: Sequence[int], limit: int = 3) -> list[str]:
    """Nodes whose shape-like input is a constant holding one of ``sizes`` (a size the exporter fixed)."""
    import onnx
    from onnx import numpy_helper

    wanted = {int(s) for s in sizes if s > 1}
    if not wanted:
        return []
    model = onnx.load(str(path), load_external_data=False)
    constants = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = attr.t
    producers = {out: node for node in model.graph.node for out in node.output}

    def constant_values(name: str, depth: int = 0) -> set[int]:
        """Integers in the constants a shape tensor is assembled from (through Concat, Unsqueeze, Cast...)."""
        tensor = constants.get(name)
        if tensor is not None:
            if tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
                return {int(v) for v in numpy_helper.to_array(tensor).ravel()}
            return set()
        node = producers.get(name)
        if node is None or depth > 3 or node.op_type not in ("Concat", "Unsqueeze", "Cast", "Reshape", "Squeeze"):
            return set()
        inputs = node.input if node.op_type == "Concat" else node.input[:1]
        return set().union(*(constant_values(i, depth + 1) for i in inputs if i))

    found: list[str] = []
    for node in model.graph.node:
        index = _SHAPE_INPUTS.get(node.op_type)
        if index is None or index >= len(node.input) or not node.input[index]:
            continue
        values = constant_values(node.input[index])
        if values & wanted:
            found.append(f"{node.op_type} {node.name or node.output[0]!r}")
            if len(found) >= limit:
                break
    return found
