"""Checking an exported model against the framework it came from, at several shapes.

The shapes (`check_shapes`): the sample's, then each dynamic dimension name at other sizes: the min and max of the
recipe profiles that cover it, else a size derived from the sample. `sample_inputs` makes the random inputs of a
shape from the export ``inputs:`` entries (``params``: a `CheckParams`, the export stage's params);
`torch_outputs` runs a PyTorch model on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .torch_source import SampleInput


class CheckParams(Protocol):
    """What the check reads of an export node's params (the export stage's ``Params``)."""

    @property
    def inputs(self) -> Mapping[str, SampleInput]: ...

    @property
    def seed(self) -> int: ...

    def dim_sizes(self) -> dict[str, int]: ...

    def dim_ranges(self) -> dict[str, tuple[int, int]]: ...



# ---------------------------------------------------------------------------------------------------------
# The shapes the model is checked at


@dataclass(frozen=True)
class CheckShape:
    """One set of input shapes to check, and which dim it changes (None: the sample itself)."""

    shapes: dict[str, list[int]]
    dim: str | None = None
    size: int | None = None
    origin: str = "sample"

    @property
    def label(self) -> str:
        shapes = ", ".join(f"{n} {s}" for n, s in self.shapes.items())
        if self.dim is None:
            return f"the {self.origin} shape ({shapes})"
        return f"{self.dim} = {self.size} ({self.origin}): {shapes}"


def _other_size(sample: int) -> int:
    return sample // 2 if sample >= 4 else sample * 2


def check_shapes(params: CheckParams) -> list[CheckShape]:
    """The sample shape, then each dynamic dim name at its other sizes (profile min/max, else derived)."""
    sample = {n: list(spec.shape) for n, spec in params.inputs.items()}
    checks = [CheckShape(sample)]
    ranges = params.dim_ranges()
    for dim, size in params.dim_sizes().items():
        if dim in ranges:
            others = [(ranges[dim][0], "profile min"), (ranges[dim][1], "profile max")]
        else:
            others = [(_other_size(size), "derived from the sample")]
        for other, origin in others:
            if other == size or any(c.dim == dim and c.size == other for c in checks):
                continue
            shapes = {n: [other if spec.dynamic_axes.get(axis) == dim else d for axis, d in enumerate(spec.shape)]
                      for n, spec in params.inputs.items()}
            checks.append(CheckShape(shapes, dim, other, origin))
    return checks


def size_one_warnings(params: CheckParams) -> list[str]:
    warnings = []
    for name, spec in params.inputs.items():
        for axis, dim in spec.dynamic_axes.items():
            if spec.shape[axis] == 1:
                warnings.append(
                    f"input {name!r}: axis {axis} ({dim!r}) is dynamic but its sample size is 1: torch.export "
                    "specialises sizes 0 and 1 (the axis may come out fixed), and a size-1 sample hides "
                    "broadcasting mistakes from the TorchScript tracer; use a sample size of 2 or more")
    return warnings


def sample_inputs(params: CheckParams, shapes: dict[str, list[int]]) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(params.seed)
    samples = {}
    for name, spec in params.inputs.items():
        shape = shapes[name]
        if spec.dtype in ("int64", "int32"):
            samples[name] = rng.integers(int(spec.low), max(int(spec.high), int(spec.low) + 1), size=shape,
                                         dtype=np.dtype(spec.dtype))
        elif spec.dtype == "bool":
            samples[name] = rng.random(shape) > 0.5
        else:
            samples[name] = rng.uniform(spec.low, spec.high, size=shape).astype("float32")
    return samples


def torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}[name]


def tensors(params: CheckParams, arrays: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {n: torch.from_numpy(arrays[n]).to(torch_dtype(params.inputs[n].dtype)) for n in params.inputs}


def _flatten(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flatten(item)]
    return []


def torch_result(model: Any, binding: Any, params: CheckParams, arrays: dict[str, Any]) -> Any:
    """What the model returns for ``arrays`` (a tensor, a tuple, a dict...)."""
    import torch

    args, kwargs = binding.call_arguments(tensors(params, arrays))
    with torch.no_grad():
        return model(*args, **kwargs)


def as_arrays(result: Any) -> list[Any]:
    """The tensors of a model's result, in order, as float numpy arrays."""
    return [t.float().numpy() if not t.is_nested else t.to_padded_tensor(0.0).float().numpy()
            for t in _flatten(result)]


def torch_outputs(model: Any, binding: Any, params: CheckParams, arrays: dict[str, Any]) -> list[Any]:
    return as_arrays(torch_result(model, binding, params, arrays))


def output_names(result: Any) -> list[str]:
    """Names for the tensors of a model's result, in `as_arrays`' order: a dict's keys (``key_i`` for a list under
    one), a named tuple's fields, else ``output`` for one tensor and ``output_0``, ``output_1``... for several."""
    import torch

    def names_of(value: Any, prefix: str) -> list[str]:
        if isinstance(value, torch.Tensor):
            return [prefix]
        if isinstance(value, dict):
            return [n for key, item in value.items() for n in names_of(item, f"{prefix}.{key}" if prefix else str(key))]
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return [n for key, item in zip(value._fields, value, strict=True)
                    for n in names_of(item, f"{prefix}.{key}" if prefix else key)]
        if isinstance(value, (list, tuple)):
            return [n for i, item in enumerate(value) for n in names_of(item, f"{prefix}_{i}" if prefix else
                                                                        f"output_{i}")]
        return []

    if isinstance(result, torch.Tensor):
        return ["output"]
    names = names_of(result, "")
    return names if len(set(names)) == len(names) and names else [f"output_{i}" for i in range(len(_flatten(result)))]


# ---------------------------------------------------------------------------------------------------------
# Checking the ONNX model at several shapes


@dataclass
class ShapeResult:
    check: CheckShape
    status: Literal["ok", "skipped", "failed", "deviates"]
    detail: str = ""
    max_abs_diff: float | None = None
    node: str | None = None
    #: the framework's output shapes at this check (for naming the outputs' dims)
    output_shapes: list[list[int]] | None = None
    #: "framework": the model itself fails at this shape (no ONNX question); else the ONNX model is at fault
    cause: str = "onnx"

    def record(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"shapes": self.check.shapes, "status": self.status}
        if self.check.dim is not None:
            entry.update(dim=self.check.dim, size=self.check.size, origin=self.check.origin)
        if self.max_abs_diff is not None:
            entry["max_abs_diff_vs_torch"] = self.max_abs_diff
        if self.detail:
            entry["detail"] = self.detail
        return entry


def ort_error(error: Exception) -> tuple[str, str | None]:
    """ONNX Runtime's message without its source locations, and the node it names."""
    import re

    text = " ".join(str(error).split())
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
    detail = re.sub(r"/onnxruntime_src/\S+ onnxruntime::.*?\) ", "", text)
    detail = re.sub(r"\S+ [=!<>]=? \S+ was false\. ", "", detail)
    detail = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", detail)
    return detail[:400], (f"{node.group(1)} node {node.group(2)!r}" if node else None)


# ---------------------------------------------------------------------------------------------------------
# Inputs that do not fit the model


def _embedding_rows(model: Any) -> int | None:
    import torch

    rows = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    return rows[0] if rows else None


def explain_input_error(error: BaseException, params: CheckParams, model: Any) -> tuple[str, str] | None:
    """(what, fix) when the model rejects the sample inputs because of their dtype, range or rank; else None."""
    import re

    text = " ".join(str(error).split())
    inputs = params.inputs
    shown = ", ".join(f"{n}: {s.dtype}{list(s.shape)}" for n, s in inputs.items())
    if "'indices'" in text or "IndexError: tensors used as indices" in text or (
            "Expected tensor for argument" in text and "Long" in text):
        floats = [n for n, s in inputs.items() if not s.dtype.startswith("int")] or list(inputs)
        rows = _embedding_rows(model)
        high = f", and the range of ids: low: 0, high: {rows} (the embedding has {rows} rows)" if rows else \
            ", and the range of ids (low, high)"
        return (f"the model uses {', '.join(repr(n) for n in floats)} as indices (an embedding lookup), but the "
                f"recipe gives {'it' if len(floats) == 1 else 'them'} as floats ({shown}); PyTorch says: {text[:200]}",
                f"set `dtype: int64` for {', '.join(floats)} in inputs{high}")
    if "index out of range in self" in text:
        rows = _embedding_rows(model)
        ints = {n: s for n, s in inputs.items() if s.dtype.startswith("int")}
        too_high = [n for n, s in ints.items() if rows is not None and s.high > rows]
        names = too_high or list(ints) or list(inputs)
        return (f"ids of {', '.join(repr(n) for n in names)} reach past the model's embedding"
                + (f" of {rows} rows" if rows else "") + f" ({shown})",
                f"set high: {rows if rows else 'the vocabulary size'} (exclusive) for {', '.join(names)} in inputs")
    conv = re.search(r"weight of size \[([\d, ]+)\], expected input\[([\d, ]+)\] to have (\d+) channels, but got "
                     r"(\d+) channels", text)
    if conv:
        weight = [int(d) for d in conv.group(1).split(",")]
        seen = [int(d) for d in conv.group(2).split(",")]
        wanted = int(conv.group(3))
        rank = len(weight)  # a conv's weight [out, in, *kernel]: its batched input has the same rank
        matches = [n for n, s in inputs.items() if list(s.shape) == seen]
        if matches:  # the right rank, the wrong number of channels
            name = matches[0]
            fixed = [*seen[:1], wanted, *seen[2:]]
            return (f"input {name!r} has {seen[1]} channels (axis 1 of {seen}), but the model's first convolution "
                    f"takes {wanted}", f"give {name} a shape with {wanted} channels at axis 1, e.g. {fixed}")
        unbatched = [n for n, s in inputs.items() if [1, *s.shape] == seen or list(s.shape) == seen[1:]]
        names = unbatched or list(inputs)
        shape = list(inputs[names[0]].shape) if names[0] in inputs else seen
        example = [shape[0] if shape else 1, wanted, *(["H", "W", "D"][:rank - 2])]
        return (f"input {names[0]!r} has rank {len(shape)} (shape {shape}), but the model's first convolution takes "
                f"rank {rank} ([batch, {wanted} channels, then {rank - 2} spatial dims])",
                f"give {names[0]} a shape of rank {rank}, e.g. {example}".replace("'", ""))
    norm = re.search(r"expected (\d+)D input \(got (\d+)D input\)", text)
    if norm:
        wanted, got = int(norm.group(1)), int(norm.group(2))
        names = [n for n, s in inputs.items() if len(s.shape) == got] or list(inputs)
        return (f"input {', '.join(repr(n) for n in names)} has rank {got}, but the model's first normalisation "
                f"layer takes rank {wanted}", f"give {', '.join(names)} a shape of rank {wanted}")
    batched = re.search(r"Expected (\d+)D \(unbatched\) or (\d+)D \(batched\) input to (\w+), but got input of size: "
                        r"\[([\d, ]*)\]", text)
    if batched:
        size = [int(d) for d in batched.group(4).split(",") if d.strip()]
        names = [n for n, s in inputs.items() if list(s.shape) == size] or list(inputs)
        return (f"input {', '.join(repr(n) for n in names)} has rank {len(size)} (shape {size}), but the model's "
                f"first {batched.group(3)} takes rank {batched.group(2)} (batched) or {batched.group(1)}",
                f"give {', '.join(names)} a shape of rank {batched.group(2)}, e.g. [batch, channels, height, width] "
                "for a 2-D convolution")
    product = re.search(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", text)
    if product:
        return (f"an input's last dimension ({product.group(2)}) does not fit the model's first linear layer, which "
                f"takes {product.group(3)} features ({shown})",
                f"set the last dimension of the input's shape to {product.group(3)}")
    return None
