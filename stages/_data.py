"""Model-input data shared by the stages that feed a model: quantize calibration, validate and benchmark.

A recipe names where the data comes from with a `DataSource`: a ``.npz``/``.npy`` file or a directory of
them, a Python callable, or explicitly requested random data. `open_dataset` checks it against the model's
inputs (`check_arrays`: a mismatch is reported by name before any library sees it) and gives a `Dataset`
that is read batch by batch, so a stage's memory does not grow with the size of the data set (files are
read from disk one batch at a time). `load_arrays` reads it whole: one array per model input, stacked along
axis 0.

Heavy libraries (numpy, onnx) are imported inside functions: stage modules import this one at plan time.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from trtflow.stage import CodeReference, StageFailed, StageParams

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ArrayHeader",
    "DataSource",
    "Dataset",
    "InputSpec",
    "RandomData",
    "batch_rows",
    "check_arrays",
    "data_files",
    "iter_batches",
    "load_arrays",
    "num_rows",
    "onnx_input_specs",
    "open_dataset",
]

_LOG = logging.getLogger(__name__)

DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
DEFAULT_INT_RANGE = (0.0, 100.0)



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


class RandomData(StageParams):
    """Random inputs generated from the model's input specs: for smoke tests, never for real calibration."""

    seed: int = Field(0, description="Seed of the random generator, so the data (and the result) repeat.")
    num_samples: int = Field(
        ..., ge=1, description="Number of samples (model calls) to generate; each sample is one batch."
    )
    ranges: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="Per input name, the [low, high) range of values. Defaults: floating inputs "
        f"{list(DEFAULT_FLOAT_RANGE)}, integer inputs {[int(v) for v in DEFAULT_INT_RANGE]} "
        "(token ids, indices), bool inputs {0, 1}.",
    )
    shapes: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Per input name, the concrete shape of one sample (batch included). Needed for inputs "
        "with dynamic dimensions; a dynamic dimension without one here is set to 1 (and logged).",
    )

    @field_validator("ranges")
    @classmethod
    def _ranges_ordered(cls, ranges: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for name, (low, high) in ranges.items():
            if not low < high:
                raise ValueError(f"ranges[{name!r}] = [{low}, {high}]: low must be smaller than high")
        return ranges

    @field_validator("shapes")
    @classmethod
    def _shapes_positive(cls, shapes: dict[str, list[int]]) -> dict[str, list[int]]:
        for name, shape in shapes.items():
            if any(d < 1 for d in shape):
                raise ValueError(f"shapes[{name!r}] = {shape}: every dimension must be >= 1")
        return shapes


class DataSource(StageParams):
    """Where model inputs come from. Set exactly one of ``path``, ``callable`` or ``random``."""

    path: str | None = Field(
        None,
        description="A .npz file whose arrays are named like the model inputs (axis 0 = samples x batch), "
        "a .npy file for a single-input model, or a directory of such files (read in sorted order and "
        "concatenated). Relative to the recipe. Files are read with allow_pickle=False.",
    )
    callable: CodeReference | None = Field(
        None,
        description="A function returning a dict {input name: numpy array} (axis 0 = samples x batch) or a "
        "list of such dicts (concatenated). Either 'python:package.module:function' (an importable module) "
        "or 'python:path/to/file.py:function' (a file relative to the recipe). THIS RUNS YOUR CODE: it is "
        "the only place where a data source executes Python, and only when you write it here.",
    )
    random: RandomData | None = Field(
        None,
        description="Generate random inputs from the model's input specs. Only when asked for explicitly: "
        "results computed from random data are marked as not calibrated / not representative.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> DataSource:
        chosen = [name for name in ("path", "callable", "random") if getattr(self, name) is not None]
        if len(chosen) != 1:
            got = "none of them" if not chosen else " and ".join(chosen)
            raise ValueError(
                f"a data source needs exactly one of 'path', 'callable' or 'random'; got {got}"
            )
        return self

    @property
    def is_random(self) -> bool:
        return self.random is not None

    @property
    def uncalibrated(self) -> bool:
        """True when the data says nothing about real inputs (random), so results are not calibrated."""
        return self.is_random

    @property
    def kind(self) -> str:
        return "path" if self.path is not None else "callable" if self.callable is not None else "random"

    def describe(self) -> str:
        if self.path is not None:
            return f"path {self.path}"
        if self.callable is not None:
            return f"callable {self.callable}"
        assert self.random is not None
        return f"random (seed {self.random.seed}, {self.random.num_samples} samples)"


def data_files(source: DataSource | None) -> list[str]:
    """Recipe paths whose content the data depends on (hashed into node keys)."""
    if source is None:
        return []
    if source.path is not None:
        return [source.path]
    if source.callable is not None:
        from trtflow.callables import callable_files

        return callable_files(source.callable)
    return []


def num_rows(arrays: Mapping[str, np.ndarray]) -> int:
    """Length of the shared sample axis (axis 0); 0 for no arrays."""
    return min((int(a.shape[0]) for a in arrays.values() if a.ndim > 0), default=0)


def load_arrays(
    source: DataSource,
    specs: Sequence[InputSpec],
    ctx_resolve: Callable[[str], Path],
    log: logging.Logger | None = None,
) -> dict[str, np.ndarray]:
    """One array per model input, stacked along axis 0, checked against ``specs`` (see `check_arrays`).

    This holds the whole data set in memory; stages that feed a model batch by batch use `open_dataset`.
    """
    return open_dataset(source, specs, ctx_resolve, log).read_all()


def open_dataset(
    source: DataSource,
    specs: Sequence[InputSpec],
    ctx_resolve: Callable[[str], Path],
    log: logging.Logger | None = None,
) -> Dataset:
    """The data of ``source`` checked against ``specs``, to be read batch by batch (see `Dataset`).

    Files are checked from their headers and read only when batches are drawn; a callable's result and
    random data are held in memory.
    """
    log = log or _LOG
    if source.random is not None:
        parts: list[_Part] = [_MemoryPart(_random_arrays(source.random, specs, log), "random data")]
    elif source.path is not None:
        parts = _parts_from_path(ctx_resolve(source.path), specs, source.path)
    else:
        assert source.callable is not None
        parts = [_MemoryPart(arrays, origin) for arrays, origin in _arrays_from_callable(source.callable,
                                                                                         ctx_resolve)]
    return Dataset(parts, specs)


def iter_batches(
    arrays: Mapping[str, np.ndarray], batch_size: int, drop_last: bool = False
) -> Iterator[dict[str, np.ndarray]]:
    """Consecutive slices of ``batch_size`` rows of every input (the last one may be shorter)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    lengths = {name: int(a.shape[0]) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise StageFailed(
            f"inputs have different numbers of rows along axis 0: {lengths}",
            hint="give every input the same number of samples",
        )
    total = num_rows(arrays)
    for start in range(0, total, batch_size):
        if drop_last and start + batch_size > total:
            return
        yield {name: a[start : start + batch_size] for name, a in arrays.items()}


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


def check_arrays(arrays: Mapping[str, np.ndarray], specs: Sequence[InputSpec]) -> None:
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
                f"{spec.rank} {_shape_text(spec.shape)} with samples stacked along axis 0"
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
                    f"(got shape {list(array.shape)}, expected {_shape_text(spec.shape)})"
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


def _shape_text(shape: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _random_arrays(random: RandomData, specs: Sequence[InputSpec], log: logging.Logger) -> dict[str, Any]:
    import numpy as np

    unknown = sorted((set(random.ranges) | set(random.shapes)) - {s.name for s in specs})
    if unknown:
        raise StageFailed(
            f"random data names inputs the model does not have: {unknown}; model inputs: "
            f"{[s.name for s in specs]}",
            hint="fix the names under random.ranges / random.shapes",
        )
    generator = np.random.default_rng(random.seed)
    arrays: dict[str, Any] = {}
    for spec in specs:
        if spec.name in random.shapes:
            shape = list(random.shapes[spec.name])
        else:
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
            if spec.is_dynamic:
                log.info("random data: input %r has dynamic dims %s; using shape %s (set random.shapes "
                         "to choose)", spec.name, _shape_text(spec.shape), shape)
        if not shape:
            raise StageFailed(f"input {spec.name!r} is a scalar: random data needs a sample axis",
                              hint="give this model's data with 'path' or 'callable'")
        full_shape = (shape[0] * random.num_samples, *shape[1:])
        try:
            dtype = np.dtype(spec.dtype)
        except TypeError:
            raise StageFailed(
                f"input {spec.name!r} has dtype {spec.dtype}, which numpy cannot generate",
                hint="give this model's data with 'path' or 'callable'",
            ) from None
        if dtype == np.bool_:
            arrays[spec.name] = generator.integers(0, 2, size=full_shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            low, high = random.ranges.get(spec.name, DEFAULT_INT_RANGE)
            arrays[spec.name] = generator.integers(int(low), int(high), size=full_shape).astype(dtype)
        elif np.issubdtype(dtype, np.floating):
            low, high = random.ranges.get(spec.name, DEFAULT_FLOAT_RANGE)
            arrays[spec.name] = generator.uniform(low, high, size=full_shape).astype(dtype)
        else:
            raise StageFailed(
                f"input {spec.name!r} has dtype {spec.dtype}, which random data does not generate",
                hint="give this model's data with 'path' or 'callable'",
            )
    return arrays


def _parts_from_path(path: Path, specs: Sequence[InputSpec], shown: str) -> list[_Part]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".npz", ".npy"))
        if not files:
            raise StageFailed(f"data directory {shown} ({path}) holds no .npz or .npy file",
                              hint="put the input arrays there as .npz (one array per input) or .npy")
        return [_FilePart(f, specs) for f in files]
    if not path.exists():
        raise StageFailed(f"data file {shown} not found (looked at {path})",
                          hint="paths are relative to the recipe file")
    if path.suffix not in (".npz", ".npy"):
        raise StageFailed(f"data file {path} is neither .npz nor .npy",
                          hint="save arrays with numpy.savez (several inputs) or numpy.save (one input)")
    return [_FilePart(path, specs)]


def _arrays_from_callable(reference: str, ctx_resolve: Callable[[str], Path]) -> list[tuple[dict[str, Any], str]]:
    import numpy as np

    function = _load_function(reference, ctx_resolve)
    try:
        result = function()
    except StageFailed:
        raise
    except Exception as error:
        raise StageFailed(f"data callable {reference} raised {type(error).__name__}: {error}",
                          hint="run the function by hand to debug it") from error
    if isinstance(result, Mapping):
        parts = [result]
    elif isinstance(result, Sequence | Iterator) and not isinstance(result, str | bytes):
        parts = list(result)
    else:
        raise StageFailed(
            f"data callable {reference} returned {type(result).__name__}; expected a dict "
            "{input name: numpy array} or a list of such dicts",
        )
    for index, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise StageFailed(f"data callable {reference}: item {index} is {type(part).__name__}, not a dict "
                              "{input name: numpy array}")
    if not parts:
        raise StageFailed(f"data callable {reference} returned no data (an empty list)",
                          hint="return at least one sample")
    return [({str(k): np.asarray(v) for k, v in part.items()}, f"{reference} item {index}")
            for index, part in enumerate(parts)]


# -- reading data batch by batch -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayHeader:
    """The shape and dtype of an array, known without reading its data (duck-types what `check_arrays` reads)."""

    shape: tuple[int, ...]
    dtype: Any

    @property
    def ndim(self) -> int:
        return len(self.shape)


class _RowReader:
    """Reads consecutive rows (slices along axis 0) of one array."""

    def read(self, count: int) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """Release the file the rows come from (nothing for arrays in memory)."""


class _Part:
    """One source of rows for every input: an .npz/.npy file or a dict of arrays."""

    origin: str
    headers: dict[str, ArrayHeader]

    def open(self) -> dict[str, _RowReader]:
        raise NotImplementedError


class _ArrayRows(_RowReader):
    def __init__(self, array: Any) -> None:
        self.array = array
        self.position = 0

    def read(self, count: int) -> Any:
        rows = self.array[self.position : self.position + count]
        self.position += len(rows)
        return rows


class _MemoryPart(_Part):
    def __init__(self, arrays: Mapping[str, Any], origin: str) -> None:
        self.arrays = dict(arrays)
        self.origin = origin
        self.headers = {name: ArrayHeader(tuple(a.shape), a.dtype) for name, a in self.arrays.items()}

    def open(self) -> dict[str, _RowReader]:
        return {name: _ArrayRows(array) for name, array in self.arrays.items()}


class _StreamRows(_RowReader):
    """Rows of a C-ordered .npy stream (a file or an archive member), read sequentially."""

    def __init__(self, stream: Any, header: ArrayHeader) -> None:
        self.stream = stream
        self.header = header
        self.row_bytes = header.dtype.itemsize * int(_product(header.shape[1:]))
        self.remaining = header.shape[0]

    def read(self, count: int) -> Any:
        import numpy as np

        count = min(count, self.remaining)
        data = self.stream.read(count * self.row_bytes)
        if len(data) != count * self.row_bytes:
            raise StageFailed(f"data file ended early: {len(data)} of {count * self.row_bytes} bytes read",
                              hint="the file is truncated; save it again")
        self.remaining -= count
        return np.frombuffer(data, dtype=self.header.dtype).reshape((count, *self.header.shape[1:])).copy()

    def close(self) -> None:
        self.stream.close()


class _FilePart(_Part):
    """A .npy file (for a single-input model) or an .npz archive (one array per input), read by rows."""

    def __init__(self, path: Path, specs: Sequence[InputSpec]) -> None:
        self.path = path
        self.origin = str(path)
        self.specs = specs
        if path.suffix == ".npy" and len(specs) != 1:
            raise StageFailed(
                f"{path} holds a single array but the model has {len(specs)} inputs {[s.name for s in specs]}",
                hint="save the data as .npz with one array per input: np.savez(path, "
                + ", ".join(f"{s.name}=..." for s in specs) + ")",
            )
        self.headers = {}
        for name, (stream, header, _) in self._streams().items():
            stream.close()
            self.headers[name] = header

    def _streams(self) -> dict[str, tuple[Any, ArrayHeader, bool]]:
        """name -> (open stream positioned after the header, header, fortran order)."""
        import zipfile

        try:
            if self.path.suffix == ".npy":
                stream = open(self.path, "rb")  # noqa: SIM115 (the row reader closes it)
                return {self.specs[0].name: (stream, *_read_header(stream, self.path))}
            archive = zipfile.ZipFile(self.path)
            streams = {}
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                stream = archive.open(member)
                streams[member[: -len(".npy")]] = (stream, *_read_header(stream, self.path))
            return streams
        except StageFailed:
            raise
        except (ValueError, OSError, zipfile.BadZipFile) as error:
            raise StageFailed(f"cannot read data file {self.path}: {error}",
                              hint="save arrays with numpy.savez / numpy.save (no pickled objects)") from error

    def open(self) -> dict[str, _RowReader]:
        readers: dict[str, _RowReader] = {}
        for name, (stream, header, fortran_order) in self._streams().items():
            if fortran_order:  # rows are not contiguous on disk: read the array whole
                import numpy as np

                stream.close()
                with np.load(self.path, allow_pickle=False) as data:
                    array = data if self.path.suffix == ".npy" else data[name]
                    readers[name] = _ArrayRows(np.ascontiguousarray(array))
            else:
                readers[name] = _StreamRows(stream, header)
        return readers


def _read_header(stream: Any, path: Path) -> tuple[ArrayHeader, bool]:
    import numpy as np
    from numpy.lib import format as npy

    version = npy.read_magic(stream)
    reader = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(version)
    if reader is None:
        raise StageFailed(f"cannot read data file {path}: .npy format version {version} is not supported",
                          hint="save arrays with numpy.savez / numpy.save")
    shape, fortran_order, dtype = reader(stream)
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise StageFailed(f"cannot read data file {path}: it holds Python objects (pickled), which are refused",
                          hint="save arrays with numpy.savez / numpy.save (no pickled objects)")
    return ArrayHeader(tuple(int(d) for d in shape), dtype), bool(fortran_order)


def _product(values: Sequence[int]) -> int:
    result = 1
    for value in values:
        result *= value
    return result


class Dataset:
    """Model inputs drawn batch by batch: only the batch being used is in memory (for file sources).

    Checked against the model's input specs when opened (names, dtypes, ranks, static dimensions, row counts);
    every call of `batches` reads the data again from its start.
    """

    def __init__(self, parts: Sequence[_Part], specs: Sequence[InputSpec]) -> None:
        self.parts = list(parts)
        self.specs = list(specs)
        first = self.parts[0]
        for part in self.parts[1:]:
            if sorted(part.headers) != sorted(first.headers):
                raise StageFailed(
                    f"{part.origin} holds arrays {sorted(part.headers)} but {first.origin} holds "
                    f"{sorted(first.headers)}",
                    hint="every data file must hold the same inputs",
                )
            for name, header in part.headers.items():
                reference = first.headers[name]
                if header.dtype != reference.dtype or header.shape[1:] != reference.shape[1:]:
                    raise StageFailed(
                        f"cannot stack data from {len(self.parts)} parts along axis 0: {name!r} is "
                        f"{header.dtype}{list(header.shape)} in {part.origin} but {reference.dtype}"
                        f"{list(reference.shape)} in {first.origin}",
                        hint="every part must give each input the same dtype and non-batch shape",
                    )
        combined = {
            name: ArrayHeader((sum(p.headers[name].shape[0] for p in self.parts), *header.shape[1:])
                              if header.ndim else header.shape, header.dtype)
            for name, header in first.headers.items()
        }
        check_arrays(combined, specs)
        for part in self.parts:
            rows = {name: h.shape[0] for name, h in part.headers.items() if h.ndim}
            if len(set(rows.values())) > 1:
                raise StageFailed(f"{part.origin}: inputs have different numbers of rows along axis 0: {rows}",
                                  hint="give every input the same number of samples in each file")
        self.rows = sum(next(iter(p.headers.values())).shape[0] for p in self.parts)
        self.nbytes = sum(h.dtype.itemsize * _product(h.shape) for p in self.parts for h in p.headers.values())

    def row_bytes(self) -> int:
        """Bytes of one row of every input together."""
        return self.nbytes // max(self.rows, 1)

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        return self.rows // batch_size if drop_last else -(-self.rows // batch_size)

    def batches(self, batch_size: int, drop_last: bool = False) -> Iterator[dict[str, np.ndarray]]:
        """Consecutive batches of ``batch_size`` rows of every input (the last one may be shorter)."""
        import numpy as np

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        pending: list[dict[str, Any]] = []
        pending_rows = 0
        for part in self.parts:
            readers = part.open()
            try:
                while True:
                    chunk = {name: reader.read(batch_size - pending_rows) for name, reader in readers.items()}
                    rows = len(next(iter(chunk.values())))
                    if rows == 0:
                        break
                    pending.append(chunk)
                    pending_rows += rows
                    if pending_rows == batch_size:
                        yield _join_chunks(pending, np)
                        pending, pending_rows = [], 0
            finally:
                for reader in readers.values():
                    reader.close()
        if pending and not drop_last:
            yield _join_chunks(pending, np)

    def read_all(self) -> dict[str, np.ndarray]:
        """Every row of every input in memory (one array per input)."""
        return next(self.batches(self.rows))


def _join_chunks(chunks: Sequence[Mapping[str, Any]], np: Any) -> dict[str, Any]:
    if len(chunks) == 1:
        return dict(chunks[0])
    return {name: np.concatenate([chunk[name] for chunk in chunks], axis=0) for name in chunks[0]}


def _load_function(reference: str, ctx_resolve: Callable[[str], Path]) -> Callable[[], Any]:
    from trtflow.callables import load_callable

    return load_callable(reference, ctx_resolve, "data callable")


# Model-file helpers shared by the stages that hand a model to ModelOpt.


def private_model_copy(model: Path, directory: Path) -> Path:
    """Copy ``model`` (and the external data files it names) into ``directory``; return the copy's path.

    ModelOpt writes intermediate files beside the model it reads: it must never write into the store.
    """
    import shutil

    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "model.onnx"
    shutil.copyfile(model, target)
    proto = onnx.load(str(model), load_external_data=False)
    for tensor in proto.graph.initializer:
        if not uses_external_data(tensor):
            continue
        location = ExternalDataInfo(tensor).location
        copied = directory / location
        if copied.exists():
            continue
        source = model.parent / location
        if not source.is_file():
            raise StageFailed(
                f"the input model refers to external data {location!r}, which is missing beside {model}",
                hint="keep the model's external data file next to it",
            )
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copied)
    return target


def check_node_patterns(model_path: Path, patterns: Mapping[str, Sequence[str] | None]) -> None:
    """Fail on node-name patterns (ModelOpt's ``re.match`` semantics) that are invalid or match no node."""
    import onnx

    if not any(patterns.values()):
        return
    names = [node.name for node in onnx.load(str(model_path), load_external_data=False).graph.node]
    for field, values in patterns.items():
        for pattern in values or ():
            try:
                compiled = re.compile(pattern)
            except re.error as error:
                raise StageFailed(f"{field}: {pattern!r} is not a valid regular expression: {error}") from None
            if not any(compiled.match(name) for name in names):
                raise StageFailed(
                    f"{field}: {pattern!r} matches no node of the model (patterns match the start of node "
                    f"names, e.g. {names[:3]})",
                    hint="list the names with: python -c \"import onnx; print([n.name for n in "
                    "onnx.load('model.onnx').graph.node])\"",
                )


def check_op_types(model_path: Path, field: str, op_types: Sequence[str] | None) -> list[str]:
    """Op types from ``op_types`` that the model does not contain (to warn about likely misspellings)."""
    import onnx

    if not op_types:
        return []
    present = {node.op_type for node in onnx.load(str(model_path), load_external_data=False).graph.node}
    return [op for op in op_types if op not in present]
