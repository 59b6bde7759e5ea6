"""The names of a model's dynamic dimensions: one name per size the model has, the same in every input and output.

An exporter names the dims of the outputs as it likes (the TorchScript exporter ``Gemmoutput_dim_0``, tf2onnx
``unk__17``); the recipe's profiles, the engine's I/O and the Triton configuration should all say ``batch`` and
``sequence``. So:
- `input_dim_name`: the name of an unnamed dynamic input dim: ``batch`` for axis 0, ``height`` and ``width`` for
  the spatial axes of an image (rank 4 with 1, 3 or 4 channels first or last), else ``<input>_<axis>``;
- `output_dim_names`: from the output shapes the framework gave at several input shapes (each check varies one
  dim), an output axis whose size follows an input dim at every shape takes that dim's name; one whose size stayed
  the same while every dynamic input dim was varied is fixed at that size (DETR's queries, a segmentation map of a
  fixed-size image); one that follows none is ``<output>_<axis>``, shared by every output axis whose sizes are the
  same at every shape (a derived length, such as audio frames, is one dim wherever it appears);
- `rename_output_dims`: writes those names into the ONNX file (its outputs, and the inner shapes that used the
  exporter's names).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_CHANNELS = (1, 3, 4)


def input_dim_name(name: str, axis: int, dims: Sequence[int | str | None]) -> str:
    """The name of dynamic axis ``axis`` of input ``name`` (``dims``: its dims, ints where static)."""
    if axis == 0:
        return "batch"
    if len(dims) == 4:
        if dims[1] in _CHANNELS and axis in (2, 3):  # NCHW
            return "height" if axis == 2 else "width"
        if dims[3] in _CHANNELS and axis in (1, 2):  # NHWC
            return "height" if axis == 1 else "width"
    return f"{name}_{axis}"


@dataclass(frozen=True)
class Observation:
    """The size of every dynamic input dim at one set of input shapes, and the framework's output shapes there."""

    dims: Mapping[str, int]
    outputs: Mapping[str, Sequence[int]]


def output_dim_names(observations: Sequence[Observation], dynamic: Mapping[str, Sequence[int]]) -> dict[
        str, dict[int, str | int]]:
    """A name (or a fixed size) for each dynamic output axis (``dynamic``: output -> its axes without a fixed size in
    the ONNX file)."""
    if not observations:
        return {}
    dims = list(observations[0].dims)
    varied = {d for d in dims if len({o.dims.get(d) for o in observations}) > 1}
    every_dim_varied = bool(dims) and varied == set(dims)
    named: dict[str, dict[int, str | int]] = {}
    derived: dict[tuple[int, ...], str] = {}
    for output, axes in dynamic.items():
        if any(output not in o.outputs for o in observations):
            continue
        for axis in axes:
            if any(axis >= len(o.outputs[output]) for o in observations):
                continue
            sizes = tuple(int(o.outputs[output][axis]) for o in observations)
            if every_dim_varied and len(set(sizes)) == 1 and not any(
                    all(int(o.dims[d]) == sizes[0] for o in observations) for d in dims):
                named.setdefault(output, {})[axis] = sizes[0]  # follows no input dim: a fixed size
                continue
            # a dim that was varied first (then one whose size is constant over the checks, such as a fixed batch)
            match = next((d for d in sorted(dims, key=lambda d: d not in varied)
                          if tuple(int(o.dims[d]) for o in observations) == sizes), None)
            named.setdefault(output, {})[axis] = match if match is not None else derived.setdefault(
                sizes, f"{output}_{axis}")
    return named


def dynamic_output_axes(path: Path) -> dict[str, list[int]]:
    """The axes of each output of an ONNX file that have no fixed size."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {value.name: [axis for axis, dim in enumerate(value.type.tensor_type.shape.dim)
                         if not dim.HasField("dim_value")] for value in model.graph.output}


def rename_output_dims(path: Path, names: Mapping[str, Mapping[int, str | int]]) -> dict[str, str]:
    """Write ``names`` (or fixed sizes) into the outputs' dims; the exporter's old names are replaced in inner
    shapes too (where an old name maps to one new name). Returns old -> new."""
    import onnx

    if not names:
        return {}
    model = onnx.load(str(path), load_external_data=False)
    renamed: dict[str, set[str]] = {}
    for value in model.graph.output:
        for axis, name in names.get(value.name, {}).items():
            dim = value.type.tensor_type.shape.dim[axis]
            if isinstance(name, int):
                dim.dim_value = name
                continue
            if dim.HasField("dim_param") and dim.dim_param and dim.dim_param != name:
                renamed.setdefault(dim.dim_param, set()).add(name)
            dim.dim_param = name
    unique = {old: next(iter(new)) for old, new in renamed.items() if len(new) == 1}
    inputs = {d.dim_param for v in model.graph.input for d in v.type.tensor_type.shape.dim if d.HasField("dim_param")}
    unique = {old: new for old, new in unique.items() if old not in inputs}  # an input's name is never taken away
    for value in model.graph.value_info:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in unique:
                dim.dim_param = unique[dim.dim_param]
    _save(model, path)
    return unique


def _save(model: object, path: Path) -> None:
    """Save in place, keeping external weights where they are (only the graph's metadata changed)."""
    import onnx

    onnx.save(model, str(path))
