"""A model's inputs (`InputSpec`: name, dtype, shape with dynamic dims) and how data must fit them.

Heavy libraries (numpy, onnx) are imported inside functions: stage modules import this one at plan time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trtflow.stage import StageFailed


@dataclass(frozen=True)
class InputSpec:
    """One graph input of a model: name, numpy dtype name and shape (str/None entries are dynamic)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(d, int) for d in self.shape)

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


def onnx_input_specs(model_path: Path) -> list[InputSpec]:
    """The real inputs of an ONNX model (graph inputs that are not initializers), weights not loaded."""
    import numpy as np
    import onnx
    from onnx import helper

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError, OSError, ... for a bad file
        raise StageFailed(
            f"cannot read ONNX model {model_path}: {error}",
            hint="check that the file is a complete ONNX model (re-run the stage that produced it)",
        ) from error
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for graph_input in model.graph.input:
        if graph_input.name in initializers:
            continue
        tensor_type = graph_input.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
        except (KeyError, TypeError, ValueError):
            dtype = onnx.TensorProto.DataType.Name(tensor_type.elem_type).lower()
        dims: list[int | str | None] = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        specs.append(InputSpec(name=graph_input.name, dtype=dtype, shape=tuple(dims)))
    return specs


def batch_rows(specs: Sequence[InputSpec], requested: int | None) -> tuple[int, bool]:
    """(rows per model call, whether a short last batch is dropped): a static batch dimension fixes both.

    Default: the static batch dimension, or 1 when it is dynamic (the least memory per call). Raises
    ValueError when ``requested`` contradicts a static batch dimension.
    """
    static = {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0}
    if static:
        batch = static.pop()
        if requested is not None and requested != batch:
            raise ValueError(f"batch size {requested} but the model's batch dimension is fixed at {batch}")
        return batch, True
    return requested or 1, False


class Shaped(Protocol):
    """What `check_arrays` reads of an array: an ``np.ndarray``, or a header read without the data."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def ndim(self) -> int: ...

    @property
    def dtype(self) -> Any: ...


def check_arrays(arrays: Mapping[str, Shaped], specs: Sequence[InputSpec]) -> None:
    """Raise `StageFailed` listing every way ``arrays`` do not fit the model inputs ``specs``."""
    expected = {spec.name: spec for spec in specs}
    expected_list = ", ".join(spec.describe() for spec in specs)
    problems: list[str] = []
    missing = [name for name in expected if name not in arrays]
    extra = [name for name in arrays if name not in expected]
    problems += [f"input {name!r} is missing from the data" for name in missing]
    problems += [f"the data has an array {name!r} that is not a model input" for name in extra]
    for name, array in arrays.items():
        spec = expected.get(name)
        if spec is None:
            continue
        if array.dtype.name != spec.dtype:
            problems.append(
                f"input {name!r}: dtype {array.dtype.name}, the model expects {spec.dtype} "
                f"(convert it with array.astype('{spec.dtype}'))"
            )
        if array.ndim != spec.rank:
            problems.append(
                f"input {name!r}: rank {array.ndim} (shape {list(array.shape)}), the model expects rank "
                f"{spec.rank} {shape_text(spec.shape)} with samples stacked along axis 0"
            )
            continue
        if spec.rank == 0:
            problems.append(f"input {name!r} is a scalar: it cannot be stacked into samples along axis 0")
            continue
        if array.shape[0] == 0:
            problems.append(f"input {name!r}: the data set is empty (0 rows along axis 0)")
        first = spec.shape[0]
        if isinstance(first, int) and first > 0 and array.shape[0] % first:
            problems.append(
                f"input {name!r}: {array.shape[0]} rows along axis 0 is not a multiple of the model's "
                f"static batch {first}"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, array.shape, strict=True)):
            if axis and isinstance(want, int) and want != got:
                problems.append(
                    f"input {name!r}: dimension {axis} is {got}, the model expects {want} "
                    f"(got shape {list(array.shape)}, expected {shape_text(spec.shape)})"
                )
    lengths = {name: int(a.shape[0]) for name, a in arrays.items() if name in expected and a.ndim > 0}
    if not problems and len(set(lengths.values())) > 1:
        problems.append(f"inputs have different numbers of rows along axis 0: {lengths}")
    if not arrays and specs:
        problems.append("the data set is empty (no arrays)")
    if problems:
        raise StageFailed(
            "the data does not match the model inputs:\n  - " + "\n  - ".join(problems)
            + f"\n  model inputs: {expected_list}",
            hint="give one array per model input, named like it, with the model's dtype and rank, samples "
            "stacked along axis 0",
        )


def shape_text(shape: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


