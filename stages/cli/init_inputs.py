"""The model's inputs for `trtflow init`: read from an ONNX file or parsed from --input, and the range of every
dynamic dimension (--batch, --dim)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from trtflow.errors import UsageError  # not trtflow.stage: `trtflow --help` imports this

DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")


@dataclass(frozen=True)
class Range:
    min: int
    opt: int
    max: int

    @classmethod
    def parse(cls, text: str, what: str) -> Range:
        parts = text.split(":")
        try:
            low, opt, high = (int(p) for p in parts)
        except ValueError:
            raise UsageError(f"{what}: {text!r} is not MIN:OPT:MAX (three integers, e.g. 1:8:32)") from None
        if not 1 <= low <= opt <= high:
            raise UsageError(f"{what}: need 1 <= MIN <= OPT <= MAX, got {text!r}")
        return cls(low, opt, high)


@dataclass(frozen=True)
class ModelInput:
    """A model input; a dimension is an int (static) or a name (dynamic)."""

    name: str
    dtype: str
    dims: tuple[int | str, ...]
    value_range: tuple[float, float] | None = None  # values the model accepts (token ids below the vocabulary)

    def describe(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(str(d) for d in self.dims)}]"


def read_onnx_inputs(path: Path) -> list[ModelInput]:
    """Inputs of an ONNX file; an unnamed dynamic dimension is named as export names one (`dim_names`: ``batch`` at
    axis 0, ``height``/``width`` of an image, else ``<input>_<axis>``)."""
    from ..data import onnx_input_specs
    from ..formats.dim_names import input_dim_name

    inputs = []
    for spec in onnx_input_specs(path):
        dims: list[int | str] = []
        static = [d if isinstance(d, int) and d > 0 else None for d in spec.shape]
        for axis, dim in enumerate(spec.shape):
            if (isinstance(dim, int) and dim > 0) or (isinstance(dim, str) and dim):
                dims.append(dim)
            else:
                dims.append(input_dim_name(spec.name, axis, static))
        inputs.append(ModelInput(spec.name, spec.dtype, tuple(dims)))
    return inputs


def parse_input_option(text: str) -> ModelInput:
    """``NAME:DIMS[:DTYPE]``, DIMS comma-separated; a name is a dynamic dimension (``input:batch,3,224,224``)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise UsageError(f"--input {text!r}: expected NAME:DIMS[:DTYPE], e.g. input:batch,3,224,224:float32")
    dtype = parts[2] if len(parts) == 3 else "float32"
    if dtype not in DTYPES:
        raise UsageError(f"--input {text!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    dims: list[int | str] = []
    for token in parts[1].split(","):
        token = token.strip()
        if token.isdigit() and int(token) > 0:
            dims.append(int(token))
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
            dims.append(token)
        else:
            raise UsageError(f"--input {text!r}: dimension {token!r} is neither a positive size nor a name")
    return ModelInput(parts[0], dtype, tuple(dims))


def dynamic_ranges(inputs: list[ModelInput], batch: Range, dims: dict[str, Range],
                   partial: bool = False) -> dict[str, Range]:
    """A range for every dynamic dimension name: axis 0 is the batch, others must be given with --dim (``partial``:
    ``dims`` may name dims of other inputs, as an encoder-decoder's chains share one --dim list)."""
    ranges: dict[str, Range] = {}
    missing: list[str] = []
    for spec in inputs:
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, int) or dim in ranges:
                continue
            if dim in dims:
                ranges[dim] = dims[dim]
            elif axis == 0:
                ranges[dim] = batch
            else:
                missing.append(f"{dim} (axis {axis} of {spec.name})")
    if missing:
        raise UsageError(
            "dynamic dimensions other than the batch need a range: " + ", ".join(missing),
            hint="give each one, e.g. " + " ".join(f"--dim {m.split()[0]}=1:128:512" for m in missing))
    unknown = sorted(set(dims) - set(ranges))
    if unknown and not partial:
        raise UsageError(f"--dim names no dynamic dimension of the model: {', '.join(unknown)}",
                           hint="dynamic dimensions: " + (", ".join(ranges) or "none"))
    return ranges
