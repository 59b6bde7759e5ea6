"""Load user code named in a recipe: ``python:path/to/file.py:function`` or ``package.module:function``.

This is the only way a recipe runs code, and it is explicit: the recipe names the file or module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trtflow.errors import RecipeError, TrtflowError
from trtflow.fsutil import resolve_user_path

PYTHON_PREFIX = "python:"


def is_callable_spec(spec: str) -> bool:
    if spec.startswith(PYTHON_PREFIX):
        return True
    module, sep, attr = spec.rpartition(":")
    return bool(sep and module and attr.isidentifier() and all(p.isidentifier() for p in module.split(".")))


def split_spec(spec: str) -> tuple[str, str]:
    """('python:dir/file.py', 'fn') or ('pkg.module', 'fn'); raises RecipeError when malformed."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier() or target == "python":
        raise RecipeError(f"{spec!r} is not a callable reference",
                          hint="write python:path/to/file.py:function or package.module:function")
    return target, attr


def callable_files(spec: str) -> list[str]:
    """Recipe paths whose content defines the callable (for node keys): the .py file of a python: spec."""
    target, _ = split_spec(spec)
    if target.startswith(PYTHON_PREFIX):
        return [target[len(PYTHON_PREFIX):]]
    found = importlib.util.find_spec(target.split(".")[0])
    if found is None:
        return []
    try:
        module_spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return []
    if module_spec is not None and module_spec.origin and module_spec.origin.endswith(".py"):
        return [module_spec.origin]
    return []


def load_callable(spec: str, base_dir: Path, allowed_roots: Sequence[Path]) -> Callable[..., Any]:
    """Import and return the callable named by ``spec`` (runs the user's module code)."""
    target, attr = split_spec(spec)
    if target.startswith(PYTHON_PREFIX):
        path = resolve_user_path(target[len(PYTHON_PREFIX):], base_dir, allowed_roots)
        if not path.is_file():
            raise TrtflowError(f"python file {str(path)!r} named by {spec!r} does not exist")
        name = f"trtflow_user_{abs(hash(str(path)))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise TrtflowError(f"cannot load python file {str(path)!r}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        module_spec.loader.exec_module(module)
    else:
        cwd = str(Path.cwd())
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise TrtflowError(f"cannot import module {target!r} named by {spec!r}: {exc}",
                               hint="install it, or use python:path/to/file.py:function") from None
    try:
        fn = getattr(module, attr)
    except AttributeError:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        from trtflow.errors import did_you_mean

        raise TrtflowError(f"{target!r} has no attribute {attr!r}",
                           hint=did_you_mean(attr, public) or f"callables there: {', '.join(public[:10])}") from None
    if not callable(fn):
        raise TrtflowError(f"{spec!r} is not callable")
    return fn
