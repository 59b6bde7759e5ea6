"""The model a recipe names (`export`'s ``model:``): which format it is, found by extension or folder layout.

| format | what the recipe names | how it becomes ONNX |
|---|---|---|
| ``python`` | ``python:file.py:factory`` (a function returning a ``torch.nn.Module``) | torch.onnx (either exporter) |
| ``onnx`` | an ``.onnx`` file | copied, checked |
| ``torchscript`` | a ``torch.jit.save`` archive (``.pt .pth .ts .jit .torchscript``) | TorchScript exporter |
| ``exported_program`` | a ``torch.export.save`` file (``.pt2``) | torch.export-based exporter |
| ``huggingface`` | a ``save_pretrained`` folder (``config.json`` and weights) | `huggingface` builds the model |
| ``tensorflow`` | a TensorFlow SavedModel folder (``saved_model.pb``) | tf2onnx, in a child process |
| ``keras`` | a Keras file (``.keras``, ``.h5``) | saved as a SavedModel, then tf2onnx |

`detect` reads only names (cheap: the planner calls it for the files the key covers); `check_content` looks
inside and says what a damaged or unknown file is.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed
from trtflow.storage import records
from trtflow.userfiles import open_file, read_file

TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript")
KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")
#: Formats whose inputs (names, dtypes, shapes, dynamic axes) the model itself declares: ``inputs:`` may be omitted.
SELF_DESCRIBING = ("onnx", "exported_program", "huggingface", "tensorflow", "keras")
TORCH_FORMATS = ("python", "torchscript", "exported_program", "huggingface")
LABELS = {
    "python": "PyTorch factory", "onnx": "ONNX file", "torchscript": "TorchScript archive",
    "exported_program": "torch.export program (.pt2)", "huggingface": "Hugging Face model folder",
    "tensorflow": "TensorFlow SavedModel", "keras": "Keras model file",
}
_KNOWN = ("an .onnx file, a TorchScript archive (.pt/.pth/.ts), a torch.export program (.pt2), a Hugging Face "
          "folder (config.json + weights), a TensorFlow SavedModel folder (saved_model.pb), a Keras file "
          "(.keras/.h5), or python:file.py:factory")


#: A model folder's JSON configuration (config.json, preprocessor_config.json), read as a typed record: a mapping,
#: at most 16 MiB, nested at most 32 deep (transformers' own configurations nest 4 or 5 deep).
MODEL_CONFIG = records.RecordKind("model configuration", dict[str, Any],
                                  limits=records.Limits(bytes=16 * records.MiB, depth=32),
                                  fix="save the model again with model.save_pretrained(folder)")


@dataclass(frozen=True)
class ModelFormat:
    name: str

    @property
    def label(self) -> str:
        return LABELS[self.name]

    @property
    def self_describing(self) -> bool:
        return self.name in SELF_DESCRIBING

    @property
    def is_torch(self) -> bool:
        return self.name in TORCH_FORMATS


def detect_by_name(model: str) -> ModelFormat | None:
    """The format a ``model:`` value names, from its prefix or extension alone (None: a folder, or unknown)."""
    if model.startswith("python:"):
        return ModelFormat("python")
    suffix = Path(model.rstrip("/")).suffix.lower()
    if suffix == ".onnx":
        return ModelFormat("onnx")
    if suffix == ".pt2":
        return ModelFormat("exported_program")
    if suffix in TORCHSCRIPT_SUFFIXES:
        return ModelFormat("torchscript")
    if suffix in KERAS_SUFFIXES:
        return ModelFormat("keras")
    return None


def detect(model: str, path: Path | None) -> ModelFormat:
    """The format of ``model`` (``path``: where it resolves, for folders); StageFailed for an unknown one."""
    found = detect_by_name(model)
    if found is not None:
        return found
    if path is not None and path.is_dir():
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            return ModelFormat("tensorflow")
        if (path / "config.json").is_file():
            return ModelFormat("huggingface")
        listing = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
        raise StageFailed(f"the folder {model!r} is neither a Hugging Face model folder (no config.json) nor a "
                          f"TensorFlow SavedModel (no saved_model.pb); it holds {listing}",
                          hint=f"point model: at {_KNOWN}")
    raise StageFailed(f"cannot tell the format of {model!r} from its name", hint=f"point model: at {_KNOWN}")


def check_content(fmt: ModelFormat, path: Path, shown: str) -> None:
    """StageFailed naming what is wrong with a file that does not hold what its name says."""
    if not path.exists():
        raise StageFailed(f"{fmt.label} {shown!r} not found (looked at {path})",
                          hint="paths are relative to the recipe file")
    if fmt.name in ("torchscript", "exported_program"):
        _check_torch_archive(fmt, path, shown)
    elif fmt.name == "huggingface":
        _check_huggingface(path, shown)
    elif fmt.name == "keras" and path.suffix == ".keras" and not _is_zip(path, shown):
        raise StageFailed(f"{shown!r} is not a Keras file (.keras files are zip archives; this one is not, or it is "
                          "truncated)", hint="save it again with model.save('model.keras')")


def _is_zip(path: Path, shown: str) -> bool:
    """Whether the regular file ``path`` is a zip archive (a named pipe or a device is refused, never opened to
    block or to read without end)."""
    try:
        with open_file(path) as f:
            return zipfile.is_zipfile(f)
    except OSError as error:
        raise StageFailed(f"cannot read {shown!r}: {error}", hint="point at the model file itself") from None


def _check_torch_archive(fmt: ModelFormat, path: Path, shown: str) -> None:
    if not _is_zip(path, shown):
        raise StageFailed(f"{shown!r} is not a {fmt.label}: not a zip archive (truncated, or another kind of file)",
                          hint="save it again with " + ("torch.export.save(program, path)"
                                                        if fmt.name == "exported_program" else "torch.jit.save"))
    try:
        with open_file(path) as f, zipfile.ZipFile(f) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as error:
        raise StageFailed(f"{shown!r} is a damaged zip archive: {error}") from error
    scripted = any(n.endswith("/constants.pkl") or "/code/" in n for n in names)
    exported = any("/models/" in n and n.endswith(".json") for n in names) or any(
        n.endswith("serialized_exported_program.json") for n in names)
    if fmt.name == "torchscript" and not scripted:
        if exported:
            raise StageFailed(f"{shown!r} is a torch.export program, not a TorchScript archive",
                              hint="name it with the .pt2 extension")
        raise StageFailed(
            f"{shown!r} is a torch.save pickle (a state_dict or a whole pickled module), not a TorchScript archive: "
            "it holds weights, not the model's code",
            hint="export needs the code: give model: python:file.py:factory with checkpoint: this file, or save "
            "the model with torch.jit.save(torch.jit.script(model), path)")
    if fmt.name == "exported_program" and not exported:
        raise StageFailed(f"{shown!r} is not a torch.export program (no serialized program inside)",
                          hint="save it with torch.export.save(torch.export.export(model, args), 'model.pt2')"
                          + ("; it looks like a TorchScript archive: name it .pt" if scripted else ""))


def read_json_config(folder: Path, name: str = "config.json", shown: str | None = None) -> dict[str, Any]:
    """The JSON configuration ``name`` of the model folder ``folder``: a regular file (a named pipe or a link to a
    device is refused, never read), at most 16 MiB, parsed as the typed record `MODEL_CONFIG` (a mapping nested at
    most 32 deep). The one reader of a model's configuration: `trtflow init`, plan's checks and export all read it
    here. Raises StageFailed naming the file, what is wrong and the fix (FileNotFoundError when it is absent)."""
    where = f"{shown or folder}/{name}"
    try:
        raw = read_file(folder / name, MODEL_CONFIG.limits.bytes)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise StageFailed(f"cannot read {where}: {error}", hint=MODEL_CONFIG.fix) from None
    try:
        return dict(records.parse(MODEL_CONFIG, raw, where))
    except records.Damaged as error:
        raise StageFailed(error.message, hint=error.hint) from None


def _check_huggingface(path: Path, shown: str) -> None:
    try:
        config = read_json_config(path, shown=shown)
    except FileNotFoundError as error:
        raise StageFailed(f"{shown}/config.json is not readable JSON: {error}",
                          hint="save the model again with model.save_pretrained(folder)") from error
    if "model_type" not in config:
        raise StageFailed(f"{shown}/config.json has no model_type: not a transformers model configuration",
                          hint="save the model with model.save_pretrained(folder)")
    weights = [p for p in path.iterdir() if p.suffix in (".safetensors", ".bin")]
    if not weights:
        raise StageFailed(f"the Hugging Face folder {shown!r} has a config but no weights (*.safetensors, *.bin)",
                          hint="save the model with model.save_pretrained(folder), which writes both")
