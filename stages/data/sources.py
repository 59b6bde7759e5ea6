"""Where a recipe's model-input data comes from (`DataSource`: files, a Python callable, or random data) and
how it is opened: `open_dataset` checks it against the model's inputs and reads it batch by batch,
`load_arrays` reads it whole (one array per input, stacked along axis 0).

Heavy libraries (numpy, onnx) are imported inside functions: stage modules import this one at plan time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from trtflow.stage import CodeReference, StageFailed, StageParams

if TYPE_CHECKING:
    import numpy as np

from .dataset import Dataset, FilePart, MemoryPart, Part
from .specs import InputSpec, shape_text

_LOG = logging.getLogger(__name__)

DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
DEFAULT_INT_RANGE = (0.0, 100.0)


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
            if (shape and shape[0] < 1) or any(d < 0 for d in shape):
                raise ValueError(f"shapes[{name!r}] = {shape}: the first dimension must be >= 1 and the others "
                                 ">= 0 (0: an empty tensor, e.g. a KV cache before the first token)")
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
        parts: list[Part] = [MemoryPart(_random_arrays(source.random, specs, log), "random data")]
    elif source.path is not None:
        parts = _parts_from_path(ctx_resolve(source.path), specs, source.path)
    else:
        assert source.callable is not None
        parts = [MemoryPart(arrays, origin) for arrays, origin in _arrays_from_callable(source.callable,
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
                         "to choose)", spec.name, shape_text(spec.shape), shape)
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


def _parts_from_path(path: Path, specs: Sequence[InputSpec], shown: str) -> list[Part]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".npz", ".npy"))
        if not files:
            raise StageFailed(f"data directory {shown} ({path}) holds no .npz or .npy file",
                              hint="put the input arrays there as .npz (one array per input) or .npy")
        return [FilePart(f, specs) for f in files]
    if not path.exists():
        raise StageFailed(f"data file {shown} not found (looked at {path})",
                          hint="paths are relative to the recipe file")
    if path.suffix not in (".npz", ".npy"):
        raise StageFailed(f"data file {path} is neither .npz nor .npy",
                          hint="save arrays with numpy.savez (several inputs) or numpy.save (one input)")
    return [FilePart(path, specs)]


def _arrays_from_callable(reference: str, ctx_resolve: Callable[[str], Path]) -> list[tuple[dict[str, Any], str]]:
    import numpy as np

    from trtflow.callables import load_callable

    function = load_callable(reference, ctx_resolve, "data callable")
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
