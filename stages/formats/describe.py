"""The inputs a saved model declares, read without exporting it (for `trtflow init`).

Each input comes as (name, dtype, dims, value range): a dim is an int (static) or a name (dynamic), the range is
``(low, high)`` for inputs whose values must stay in one (token ids below the vocabulary size) or None. The same
declarations the export stage derives, so the recipe `trtflow init` writes agrees with what export produces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from .dim_names import input_dim_name
from .sources import ModelFormat


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


def program_inputs(path: Path) -> list[DeclaredInput]:
    from .torch_archives import load_program

    return _from_entries(load_program(path, path.name).inputs)


def tensorflow_inputs(path: Path, keras: bool) -> list[DeclaredInput]:
    """The serving signature's inputs, read in a child process (TensorFlow stays out of this one)."""
    code = ("import json, sys, tempfile\nfrom pathlib import Path\nimport tensorflow as tf\n"
            "from trtflow_stages.formats.tensorflow import _load\n"
            "with tempfile.TemporaryDirectory() as folder:\n"
            "    function, loaded = _load(tf, sys.argv[1], sys.argv[2] == 'keras', Path(folder))\n"
            "    specs = function.structured_input_signature[1]\n"
            "    print(json.dumps({n: {'shape': [d for d in s.shape.as_list()], 'dtype': s.dtype.name}"
            " for n, s in specs.items()}))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", code, str(path), "keras" if keras else "saved"], capture_output=True,
                          text=True, env=env, timeout=900, check=False)
    if proc.returncode != 0:
        raise StageFailed(f"cannot read the inputs of {path.name}: {' '.join(proc.stderr.strip().splitlines()[-2:])}")
    found = []
    for name, spec in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        dims = tuple(size if size is not None else input_dim_name(name, axis, spec["shape"])
                     for axis, size in enumerate(spec["shape"]))
        found.append(DeclaredInput(name, spec["dtype"], dims))
    return found


def declared_inputs(fmt: ModelFormat, path: Path, task: str | None = None) -> list[DeclaredInput]:
    """The inputs a self-describing model declares (ONNX files are read by `trtflow init` itself)."""
    if fmt.name == "huggingface":
        return huggingface_inputs(path, task)[0]
    if fmt.name == "exported_program":
        return program_inputs(path)
    if fmt.name in ("tensorflow", "keras"):
        return tensorflow_inputs(path, fmt.name == "keras")
    raise StageFailed(f"a {fmt.label} does not declare its inputs")


def default_dim_ranges(fmt: ModelFormat, path: Path) -> dict[str, tuple[int, int, int]]:
    """Ranges (min, opt, max) proposed for dynamic dims other than the batch (a Hugging Face model's sequence
    length or audio length, within what its config allows)."""
    if fmt.name != "huggingface":
        return {}
    return huggingface_parts(path, None)[0].ranges
