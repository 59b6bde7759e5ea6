"""Model files are data unless the recipe says otherwise: which formats run their own program, and where each is read.

Per format, what reading or tracing it runs, and where trtflow reads it:

- ONNX: nothing (standard operators; custom ones need a library only code registers). In the node's process.
- Hugging Face folder: nothing (config.json, ``auto_map`` custom code refused; safetensors; ``.bin`` pickles read by
  torch's ``weights_only`` unpickler, an allowlist of tensor types). In the node's process.
- TorchScript: its TorchScript code, when traced and checked (any operator: ``torch.from_file(path, shared=True)``
  writes a file). In a confined child.
- ``.pt2`` program: when loaded, pickled payloads (weights, constants, and sample inputs that torch unpickles with
  everything allowed when its allowlist fails), symbolic shapes evaluated by sympy (a Python ``eval``), AOTInductor
  libraries; when run, any ``torch.*`` callable its graph names. In a confined child; pickled payloads refused.
- TensorFlow SavedModel: its functions (``tf.io.write_file``, ``tf.io.read_file``, ...). In a confined child.
- Keras file: deserialisation imports the classes its config names (safe mode refuses lambdas), then its functions
  run. In a confined child.
- ``python:`` factory: the factory, which the recipe asked for. In the node's process.

"A confined child" is `confinement`: a process in a sandbox of its own (bubblewrap's namespaces: a file system
holding only the model, the interpreter and an empty folder; no network; a system-call allow-list; Landlock).
Where it is not available (not Linux, user namespaces disabled, no libseccomp, ``TRTFLOW_NO_CONFINEMENT``
set), such a model is refused, unless the recipe marks it as trusted code with
``trust_code: true`` on the export node (``trtflow init --trust-code``): then it is read as before this module
existed, in the node's process (PyTorch) or an unconfined child (TensorFlow), like a ``python:`` factory.
`decide` is the one place that chooses; the loaders of those formats call `confinement.guard`, which fails in a
process that is neither confined nor trusting.
"""

from __future__ import annotations

import io
import json
import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trtflow.stage import StageFailed

from . import confinement
from .detect import ModelFormat

#: What a format's own program can do when trtflow reads it (formats not listed are data).
RUNS_CODE = {
    "torchscript": "its TorchScript code runs when it is traced and checked (any operator, e.g. torch.from_file "
                   "with shared=True writes files)",
    "exported_program": "loading it unpickles payloads and evaluates symbolic shapes with sympy (Python eval), and "
                        "its graph may call any torch.* function when it runs",
    "tensorflow": "its functions run when it is converted and checked (tf.io.write_file writes files)",
    "keras": "loading it imports the classes its configuration names, and its functions run when it is converted",
}
_CONFIG_LIMIT = 16 << 20
_PICKLE_LIMIT = 64 << 20


@dataclass(frozen=True)
class Permit:
    """How a model file may be read: as data, in a confined child, or trusted (read like a ``python:`` factory)."""

    mode: Literal["data", "confined", "trusted"]
    fmt: str
    capability: confinement.Capability | None = None

    @property
    def confined(self) -> bool:
        return self.mode == "confined"

    def record(self) -> dict[str, str]:
        """What the summary says about it."""
        if self.mode == "confined" and self.capability is not None:
            return {"model_code": "confined", "confinement": self.capability.describe()}
        return {"model_code": self.mode}


def decide(fmt: ModelFormat, path: Path, shown: str, trusted: bool,
           trust_word: str = "set trust_code: true on the export node") -> Permit:
    """How ``path`` (of format ``fmt``, named ``shown`` in the recipe) may be read; StageFailed when it may not."""
    if fmt.name not in RUNS_CODE:
        return Permit("data", fmt.name)
    if trusted:
        return Permit("trusted", fmt.name)
    trust = (f"or, if you trust this file as you would a program you run, {trust_word} (it is then read "
             "unconfined, like a python: factory)")
    if fmt.name == "exported_program":
        found = pickled_payloads(path)
        if found:
            shown_found = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
            raise StageFailed(
                f"{fmt.label} {shown!r} holds payloads that torch.export.load would unpickle with every Python "
                f"object allowed (running whatever code they name): {shown_found}",
                hint="save the program again with plain tensors (torch.export.save of a program without tensor "
                f"subclasses, custom objects or AOTInductor code), {trust}")
    capability = confinement.probe()
    if not capability.available:
        raise StageFailed(
            f"{fmt.label} {shown!r} carries a program: {RUNS_CODE[fmt.name]}; trtflow converts such files only in a "
            f"process the kernel confines, and there is {capability.describe()}",
            hint=f"convert it on Linux with bubblewrap installed (apt-get install bubblewrap) and user "
            f"namespaces enabled, {trust}")
    return Permit("confined", fmt.name, capability)


# ---------------------------------------------------------------------------------------------------------
# Pickled payloads of a .pt2 archive, found without unpickling anything


def pickled_payloads(path: Path) -> list[str]:
    """What in a ``.pt2`` archive torch.export.load would unpickle beyond tensors, read from its zip entries and
    configuration files, and from the opcodes of the pickles it reads (nothing is unpickled)."""
    found: list[str] = []
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as error:
        return [f"an unreadable archive ({error})"]
    with archive:
        names = archive.namelist()
        allowed = _allowed_globals()
        for name in names:
            inner = name.split("/", 1)[1] if "/" in name else name
            if inner.startswith("data/aotinductor/"):
                found.append(f"{name}: compiled AOTInductor code")
            elif inner.startswith(("data/weights/", "data/constants/")) and inner.endswith("_config.json"):
                found += _config_pickles(archive, name)
            elif inner.startswith(("data/weights/", "data/constants/")) and inner.endswith(".pt"):
                found.append(f"{name}: weights in the legacy pickled format")
            elif inner.startswith("data/sample_inputs/") or (inner.startswith("serialized_")
                                                             and inner.endswith(".pt")):
                found += [f"{name}: {what}" for what in _foreign_globals(archive, name, allowed)]
    return found


def _config_pickles(archive: zipfile.ZipFile, name: str) -> list[str]:
    if archive.getinfo(name).file_size > _CONFIG_LIMIT:
        return [f"{name}: a configuration of {archive.getinfo(name).file_size} bytes"]
    try:
        config = json.loads(archive.read(name))
        entries = config["config"].items()
    except (ValueError, KeyError, AttributeError, TypeError):
        return [f"{name}: not a payload configuration"]
    found = []
    for fqn, meta in entries:
        if not isinstance(meta, dict):
            found.append(f"{fqn}: an entry that is not a payload description")
        elif meta.get("use_pickle") or not str(meta.get("path_name", "")).startswith(("weight_", "tensor_")):
            found.append(f"{fqn} is stored as a pickle ({name})")
    return found


def _foreign_globals(archive: zipfile.ZipFile, name: str, allowed: set[str]) -> list[str]:
    """Python objects a pickled member (a torch.save file) names beyond torch's weights-only allowlist."""
    if archive.getinfo(name).file_size > _PICKLE_LIMIT:
        return [f"a pickle of {archive.getinfo(name).file_size} bytes"]
    data = archive.read(name)
    pickles: list[bytes] = []
    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            pickles = [inner.read(n) for n in inner.namelist() if n.endswith(".pkl")
                       and inner.getinfo(n).file_size <= _PICKLE_LIMIT]
    else:
        pickles = [data]
    found: list[str] = []
    for blob in pickles:
        for ref in pickle_globals(blob):
            if ref not in allowed:
                found.append(f"names {ref}" if ref != "?" else "names an object it hides from a reader")
    return sorted(set(found))


def pickle_globals(data: bytes) -> list[str]:
    """Every ``module.name`` a pickle imports, from its opcodes (nothing is executed); ``?`` for one that cannot be
    told without running it (a STACK_GLOBAL on computed strings, the extension registry, a damaged pickle)."""
    refs: list[str] = []
    memo: dict[int, str | None] = {}
    recent: list[str | None] = []  # what the last opcodes pushed: a string, or None for anything else
    try:
        for opcode, arg, _ in pickletools.genops(data):
            name = opcode.name
            if name in ("GLOBAL", "INST"):
                refs.append(str(arg).replace(" ", "."))
                recent.append(None)
            elif name == "STACK_GLOBAL":
                if len(recent) >= 2 and isinstance(recent[-1], str) and isinstance(recent[-2], str):
                    refs.append(f"{recent[-2]}.{recent[-1]}")
                else:
                    refs.append("?")
                recent.append(None)
            elif name.startswith("EXT"):
                refs.append("?")
                recent.append(None)
            elif name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
                          "SHORT_BINSTRING"):
                recent.append(str(arg))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT") and isinstance(arg, int):
                memo[arg] = recent[-1] if recent else None
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
            elif name in ("GET", "BINGET", "LONG_BINGET") and isinstance(arg, int):
                recent.append(memo.get(arg))
            else:
                recent.append(None)
            del recent[:-2]
    except Exception:  # pickletools raises ValueError and others on a damaged pickle
        refs.append("?")
    return refs


def _allowed_globals() -> set[str]:
    """The objects torch's weights-only unpickler accepts (what torch.export.load tries first)."""
    import torch
    from torch import _weights_only_unpickler as weights_only

    allowed = set(weights_only._get_allowed_globals())
    allowed.update(f"{getattr(g, '__module__', '')}.{getattr(g, '__name__', '')}"
                   for g in torch.serialization.get_safe_globals() if not isinstance(g, tuple))
    return allowed
