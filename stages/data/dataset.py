"""Reading model-input data batch by batch: `Dataset` draws batches across files and in-memory parts, so a
stage's memory does not grow with the size of the data set (files are read from disk one batch at a time).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.stage import StageFailed

if TYPE_CHECKING:
    import numpy as np

from .specs import InputSpec, check_arrays


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


class Part:
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


class MemoryPart(Part):
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


class FilePart(Part):
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
                opened = archive.open(member)
                streams[member[: -len(".npy")]] = (opened, *_read_header(opened, self.path))
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

    def __init__(self, parts: Sequence[Part], specs: Sequence[InputSpec]) -> None:
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


