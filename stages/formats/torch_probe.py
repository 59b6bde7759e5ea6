"""What a TorchScript archive takes, found before export (for `trtflow init`): the earliest point a mistake in
``--input`` can be named.

- `forward_names`: forward()'s argument names, read from the archive's serialized code (``code/__torch__*.py``)
  and the root class named in ``data.pkl`` (read with `pickletools`, which decodes the opcodes and runs nothing),
  without loading the archive;
- `probe`: the archive run once at the given shapes in a child process (the model's code stays out of this
  process); a failure is explained as export explains it (`torch_check.explain_input_error`: rank, channels, dtype,
  id range), with the expected and the given value.
"""

from __future__ import annotations

import ast
import json
import os
import pickletools
import subprocess
import sys
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


def probe(path: Path, inputs: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """Run the archive once on random inputs (``inputs``: export ``inputs:`` entries) in a child process:
    (what, fix) when it cannot take them, else None (also when the child could not tell)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    try:
        proc = subprocess.run([sys.executable, "-m", __name__, str(path), json.dumps(inputs)], capture_output=True,
                              text=True, env=env, timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            found = json.loads(line)
            return (found["what"], found["fix"]) if found.get("what") else None
    return None


def _main(argv: list[str]) -> int:
    from types import SimpleNamespace

    import torch

    from trtflow_stages.formats.torch_check import explain_input_error, sample_inputs, torch_outputs
    from trtflow_stages.formats.torch_export import Binding

    path, entries = Path(argv[0]), json.loads(argv[1])
    specs = {name: SimpleNamespace(shape=list(e["shape"]), dtype=e.get("dtype", "float32"), low=e.get("low", 0.0),
                                   high=e.get("high", 1.0), dynamic_axes={}) for name, e in entries.items()}
    params = SimpleNamespace(inputs=specs, seed=0)
    model = torch.jit.load(str(path), map_location="cpu").eval()
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
        print(json.dumps({"what": what, "fix": fix}), flush=True)
        return 0
    print(json.dumps({}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
