"""What a TorchScript archive takes, found before export (for `trtflow init`): the earliest point a mistake in
``--input`` can be named.

- `forward_names`: forward()'s argument names, read from the archive's serialized code (``code/__torch__*.py``)
  and the root class named in ``data.pkl`` (read with `pickletools`, which decodes the opcodes and runs nothing),
  without loading the archive;
- `probe`: the archive run once at the given shapes in a child process confined by the kernel (the model's code
  stays out of this process and writes nothing outside its folder; `confinement.run`); a failure is explained as
  export explains it (`torch_check.explain_input_error`: rank, channels, dtype, id range), with the expected and
  the given value.
"""

from __future__ import annotations

import ast
import pickletools
import zipfile
from pathlib import Path
from typing import Any

_TIMEOUT_S = 300


def _root_class(archive: zipfile.ZipFile, prefix: str) -> tuple[str, str] | None:
    """(module, class) of the archive's root module: the first global ``data.pkl`` names."""
    try:
        data = archive.read(f"{prefix}data.pkl")
    except KeyError:
        return None
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL" and isinstance(arg, str):
                module, _, name = arg.partition(" ")
                return module, name
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                strings.append(str(arg))
            if op.name == "STACK_GLOBAL" and len(strings) >= 2:
                return strings[-2], strings[-1]
    except (ValueError, EOFError):
        return None
    return None


def forward_names(path: Path) -> list[str] | None:
    """forward()'s argument names (self left out), or None when the archive does not say."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            prefix = next((n[: -len("data.pkl")] for n in names if n.endswith("data.pkl") and n.count("/") == 1), "")
            root = _root_class(archive, prefix)
            if root is None:
                return None
            module, cls = root
            code_name = f"{prefix}code/{module.replace('.', '/')}.py"
            if code_name not in names:
                return None
            tree = ast.parse(archive.read(code_name).decode("utf-8", errors="replace"))
    except (OSError, zipfile.BadZipFile, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    return [a.arg for a in item.args.args[1:]] + [a.arg for a in item.args.kwonlyargs]
    return None


def probe(path: Path, inputs: dict[str, dict[str, Any]], confined: bool = True) -> tuple[str, str] | None:
    """Run the archive once on random inputs (``inputs``: export ``inputs:`` entries) in a child process, confined
    by the kernel unless the model is trusted (`confinement.run`): (what, fix) when it cannot take them, else None
    (also when the child could not tell)."""
    import tempfile

    from trtflow.errors import StageFailed

    from . import confinement

    with tempfile.TemporaryDirectory(prefix="trtflow-probe-") as folder:
        try:
            found = confinement.run(f"{__name__}:probe_in_child", {"source": str(path.absolute()), "inputs": inputs},
                                    Path(folder) / "box", [path], timeout=_TIMEOUT_S,
                                    what=f"running {path.name} once on the given inputs", confine_child=confined)
        except StageFailed:
            return None
    what, fix = found.get("what"), found.get("fix")
    return (what, fix) if isinstance(what, str) and isinstance(fix, str) and what else None


def probe_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """In the child (`confinement.child_main`): load the archive and run it once; {what, fix} when it fails."""
    from types import SimpleNamespace

    from .torch_archives import load_torchscript
    from .torch_check import explain_input_error, sample_inputs, torch_outputs
    from .torch_export import Binding

    path, entries = Path(request["source"]), request["inputs"]
    specs = {name: SimpleNamespace(shape=list(e["shape"]), dtype=e.get("dtype", "float32"), low=e.get("low", 0.0),
                                   high=e.get("high", 1.0), dynamic_axes={}) for name, e in entries.items()}
    params = SimpleNamespace(inputs=specs, seed=0)
    model = load_torchscript(path, path.name)
    try:
        torch_outputs(model, Binding(tuple(specs), by="name"), params, sample_inputs(params, {
            n: s.shape for n, s in specs.items()}))
    except Exception as error:  # the model's own code: any exception type
        explained = explain_input_error(error, params, model)
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        given = ", ".join(f"{n}: {s.dtype}{s.shape}" for n, s in specs.items())
        what, fix = explained or (f"the model fails on the inputs ({given}): {type(error).__name__}: "
                                  f"{lines[-1] if lines else ''}",
                                  "give --input with the names, ranks, sizes and dtypes forward() takes")
        return {"what": what, "fix": fix}
    return {}
