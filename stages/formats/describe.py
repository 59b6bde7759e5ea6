"""The inputs a saved model declares, read without exporting it (for `trtflow init`).

Each input comes as (name, dtype, dims, value range): a dim is an int (static) or a name (dynamic), the range is
``(low, high)`` for inputs whose values must stay in one (token ids below the vocabulary size) or None. The same
declarations the export stage derives, so the recipe `trtflow init` writes agrees with what export produces.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from . import confinement
from .detect import ModelFormat
from .dim_names import input_dim_name


@dataclass(frozen=True)
class DeclaredInput:
    name: str
    dtype: str
    dims: tuple[int | str, ...]
    value_range: tuple[float, float] | None = None


def _from_entries(entries: dict[str, dict[str, Any]]) -> list[DeclaredInput]:
    """Export ``inputs:`` entries (shape, dtype, dynamic_axes, low, high) as declared inputs."""
    found = []
    for name, entry in entries.items():
        axes = {int(a): d for a, d in entry.get("dynamic_axes", {}).items()}
        dims = tuple(axes.get(axis, size) for axis, size in enumerate(entry["shape"]))
        value_range = (entry["low"], entry["high"]) if "low" in entry and entry["dtype"].startswith("int") else None
        found.append(DeclaredInput(name, entry["dtype"], dims, value_range))
    return found


@dataclass(frozen=True)
class HfPart:
    """One graph a Hugging Face folder exports as (an encoder-decoder: its encoder, then its decoder)."""

    task: str
    part: str | None
    inputs: list[DeclaredInput]
    #: (min, opt, max) proposed for each dynamic dim other than the batch, within what the model takes
    ranges: dict[str, tuple[int, int, int]]


def huggingface_parts(folder: Path, task: str | None) -> list[HfPart]:
    """The graphs of a Hugging Face folder's model (built on the meta device: no weights read)."""
    from .huggingface import default_ranges, describe_folder

    entries, found, chosen, parts = describe_folder(folder, task)
    described = [HfPart(chosen, parts[0] if parts else None, _from_entries(entries), default_ranges(found))]
    for part in parts[1:]:
        entries, found, _, _ = describe_folder(folder, chosen, part)
        described.append(HfPart(chosen, part, _from_entries(entries), default_ranges(found)))
    return described


def huggingface_inputs(folder: Path, task: str | None) -> tuple[list[DeclaredInput], dict[str, Any]]:
    """The inputs of a Hugging Face folder's model (its first part), and its config."""
    from .huggingface import read_config

    return huggingface_parts(folder, task)[0].inputs, read_config(folder)


def program_inputs(path: Path, confine_child: bool = True) -> list[DeclaredInput]:
    """A .pt2 program's inputs, read in a child process (loading a program may run code: `trust`)."""
    with _box() as box:
        answer = confinement.run(f"{__name__}:program_entries_in_child", {"source": str(path.absolute())}, box, [path],
                                 timeout=900.0, what=f"reading the inputs of {path.name}", confine_child=confine_child)
    entries = confinement.checked(answer, {"inputs": dict}, f"reading the inputs of {path.name}")["inputs"]
    try:
        return _from_entries(entries)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise StageFailed(f"reading the inputs of {path.name}: the child process answered invalid inputs "
                          f"({error!r})") from error


def program_entries_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """In the child: the program's export ``inputs:`` entries."""
    from .torch_archives import load_program

    path = Path(request["source"])
    return {"inputs": load_program(path, path.name).inputs}


def tensorflow_inputs(path: Path, keras: bool, confine_child: bool = True) -> list[DeclaredInput]:
    """The serving signature's inputs, read in a child process (TensorFlow stays out of this one)."""
    from .tensorflow import signature_inputs

    with _box() as box:
        specs = signature_inputs(path, keras, box, confine_child)["inputs"]
    found = []
    for name, spec in specs.items():
        dims = tuple(size if size is not None else input_dim_name(name, axis, spec["shape"])
                     for axis, size in enumerate(spec["shape"]))
        found.append(DeclaredInput(name, spec["dtype"], dims))
    return found


@contextmanager
def _box() -> Iterator[Path]:
    """A private folder for a child process (its box), removed afterwards."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="trtflow-describe-"))
    try:
        yield folder / "confined"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def declared_inputs(fmt: ModelFormat, path: Path, task: str | None = None, trusted: bool = False,
                    trust_word: str = "give --trust-code") -> list[DeclaredInput]:
    """The inputs a self-describing model declares (ONNX files are read by `trtflow init` itself); a model that
    runs its own code is read as `trust.decide` says (StageFailed where it may not be read)."""
    from .trust import decide

    permit = decide(fmt, path, path.name, trusted, trust_word)
    if fmt.name == "huggingface":
        return huggingface_inputs(path, task)[0]
    if fmt.name == "exported_program":
        return program_inputs(path, permit.confined)
    if fmt.name in ("tensorflow", "keras"):
        return tensorflow_inputs(path, fmt.name == "keras", permit.confined)
    raise StageFailed(f"a {fmt.label} does not declare its inputs")


def default_dim_ranges(fmt: ModelFormat, path: Path) -> dict[str, tuple[int, int, int]]:
    """Ranges (min, opt, max) proposed for dynamic dims other than the batch (a Hugging Face model's sequence
    length or audio length, within what its config allows)."""
    if fmt.name != "huggingface":
        return {}
    return huggingface_parts(path, None)[0].ranges
