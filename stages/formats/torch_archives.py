"""Saved PyTorch models: TorchScript archives (``torch.jit.save``) and torch.export programs (``torch.export.save``).

A TorchScript archive holds its code but not its input shapes: ``inputs:`` names the shapes; the forward()
schema gives the names (inputs are bound by them) . A ``.pt2`` program holds everything: the inputs' names, the
example inputs it was exported with (their shapes and dtypes), and which dimensions are symbolic (each becomes a
dynamic axis named after its symbol, shared by every input that uses it), so ``inputs:`` may be omitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from . import confinement

_DTYPES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
           "torch.int64": "int64", "torch.int32": "int32", "torch.bool": "bool"}


def load_torchscript(path: Path, shown: str) -> Any:
    """The archive's module (its code runs when it is called: only in a confined or trusting process)."""
    confinement.guard(shown)
    import torch

    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as error:  # torch raises RuntimeError and others for a damaged archive
        raise StageFailed(f"torch.jit.load cannot read {shown!r}: {' '.join(str(error).split())[:300]}",
                          hint="save it again with torch.jit.save(torch.jit.script(model), path)") from error
    return module.eval()


def script_input_names(module: Any) -> list[str]:
    """forward()'s argument names from a TorchScript module's schema (self left out)."""
    try:
        return [argument.name for argument in module.forward.schema.arguments[1:]]
    except (AttributeError, RuntimeError):
        return []


@dataclass
class Program:
    """A loaded torch.export program: the program, a module that runs it, and its declared inputs and outputs."""

    program: Any
    module: Any
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    #: The program's symbol of each dynamic dimension -> the name the inputs give it (``batch`` for an axis 0)
    dim_names: dict[str, str] = field(default_factory=dict)


def load_program(path: Path, shown: str) -> Program:
    """The program (loading it may run code: only in a confined or trusting process)."""
    confinement.guard(shown)
    import torch

    try:
        program = torch.export.load(str(path))
    except Exception as error:  # torch raises several types for a damaged or foreign archive
        raise StageFailed(f"torch.export.load cannot read {shown!r}: {' '.join(str(error).split())[:300]}",
                          hint="save it again with torch.export.save(torch.export.export(model, args), path) with "
                          "this torch version") from error
    names = dim_names(program)
    return Program(program, program.module(), program_inputs(program, names), program_outputs(program), names)


def dim_names(program: Any) -> dict[str, str]:
    """A readable name per symbolic dimension: ``batch`` for the one every input has at axis 0, else the symbol."""
    import torch

    first: set[str] = set()
    symbols: list[str] = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in program.graph_signature.user_inputs:
            continue
        value = node.meta.get("val")
        for axis, dim in enumerate(getattr(value, "shape", ())):
            if isinstance(dim, torch.SymInt) and str(dim) not in symbols:
                symbols.append(str(dim))
                if axis == 0:
                    first.add(str(dim))
    return {symbol: "batch" if first == {symbol} else symbol for symbol in symbols}


def program_inputs(program: Any, names: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Export ``inputs:`` entries of the program's user inputs: its example inputs' shapes, symbolic dims dynamic."""
    import torch

    user_inputs = list(program.graph_signature.user_inputs)
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    examples = _example_tensors(program)
    inputs: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(user_inputs):
        value = placeholders[name].meta.get("val") if name in placeholders else None
        if value is None or not hasattr(value, "shape"):
            raise StageFailed(f"input {name!r} of the program is not a tensor; export supports tensor inputs only")
        dtype = _DTYPES.get(str(value.dtype))
        if dtype is None:
            raise StageFailed(f"input {name!r} of the program has dtype {value.dtype}, which export does not feed")
        example = examples[index] if index < len(examples) else None
        shape, axes = [], {}
        for axis, dim in enumerate(value.shape):
            if isinstance(dim, torch.SymInt):
                axes[axis] = (names or {}).get(str(dim), str(dim))
                size = int(example.shape[axis]) if example is not None else 2
                shape.append(max(size, 2))
            else:
                shape.append(int(dim))
        entry: dict[str, Any] = {"shape": shape, "dtype": dtype}
        if axes:
            entry["dynamic_axes"] = axes
        if dtype in ("int64", "int32"):
            entry.update(low=0, high=2)  # ids below 2 fit any embedding; give the real range in inputs:
        inputs[name] = entry
    return inputs


def _example_tensors(program: Any) -> list[Any]:
    examples = getattr(program, "example_inputs", None)
    if not examples:
        return []
    args, kwargs = examples if isinstance(examples, tuple) and len(examples) == 2 else (examples, {})
    return [*args, *dict(kwargs or {}).values()]


def program_outputs(program: Any) -> list[str]:
    names = [str(n) for n in program.graph_signature.user_outputs]
    return names if len(set(names)) == len(names) else [f"output_{i}" for i in range(len(names))]
