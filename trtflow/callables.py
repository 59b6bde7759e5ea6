"""Load user code named in a recipe: ``python:path/to/file.py:function`` or ``python:package.module:function``.

This is the only way a recipe runs code, and it is explicit: every such entry starts with ``python:``. A bare
``package.module:function`` is refused (``os:system`` would otherwise run a shell command from a recipe that
shows no sign of running code).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtflow import depfile
from trtflow.errors import RecipeError, StageFailed

PYTHON_PREFIX = "python:"


def is_callable_spec(spec: str) -> bool:
    """True for ``python:path/file.py:function`` and ``python:package.module:function``."""
    try:
        validate_spec(spec)
    except ValueError:
        return False
    return True


def validate_spec(spec: str) -> str:
    """Check the form of a code reference (for pydantic validators); returns it unchanged."""
    target, sep, attr = spec.rpartition(":")
    expected = "expected python:path/to/file.py:function or python:package.module:function"
    if not spec.startswith(PYTHON_PREFIX):
        raise ValueError(f"{spec!r}: {expected} (a recipe runs code only where it says python:; write "
                         f"'python:{spec}' if you mean to run it)")
    if not sep or not attr.isidentifier() or target in ("python", ""):
        raise ValueError(f"{spec!r}: {expected}")
    if _module_of(target) is None and not target.endswith(".py"):
        raise ValueError(f"{spec!r}: {expected} ({target[len(PYTHON_PREFIX):]!r} is neither a .py file nor a "
                         "dotted module name)")
    return spec


def split_spec(spec: str) -> tuple[str, str]:
    """('python:dir/file.py', 'fn') or ('pkg.module', 'fn'); raises RecipeError when malformed."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier() or target == "python":
        raise RecipeError(f"{spec!r} is not a callable reference",
                          hint="write python:path/to/file.py:function or python:package.module:function")
    return target, attr


def _require_python_prefix(spec: str, target: str, what: str) -> None:
    if not target.startswith(PYTHON_PREFIX):
        raise RecipeError(f"{what} {spec!r} would import and run module {target!r}; a recipe runs code only "
                          "where it says python:", hint=f"write 'python:{spec}' if you mean to run it")


def _module_of(target: str) -> str | None:
    """The dotted module named by a ``python:`` target, or None when it names a .py file."""
    body = target[len(PYTHON_PREFIX):]
    if body.endswith(".py") or "/" in body or "\\" in body:
        return None
    return body if body and all(part.isidentifier() for part in body.split(".")) else None


def module_origin(module: str) -> str | None:
    """The .py file of a dotted module name, found without importing it or its parent packages."""
    from importlib.machinery import PathFinder

    parts = module.split(".")
    top = sys.modules.get(parts[0])
    try:
        module_spec = top.__spec__ if top is not None else importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for i in range(1, len(parts)):  # walk down without importing the parent packages (plan runs no code)
        if module_spec is None or not module_spec.submodule_search_locations:
            return None
        module_spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(module_spec.submodule_search_locations))
    if module_spec is not None and module_spec.origin and module_spec.origin.endswith(".py"):
        return module_spec.origin
    return None


def callable_files(spec: str) -> list[str]:
    """Recipe paths whose content defines the callable (for node keys): its .py file. Imports nothing.

    The engine also hashes the project modules that file imports (see `trtflow.codehash`).
    """
    target, _ = split_spec(spec)
    _require_python_prefix(spec, target, "callable")
    module = _module_of(target)
    if module is None:
        return [target[len(PYTHON_PREFIX):]]
    origin = module_origin(module)
    return [origin] if origin else []


def load_callable(spec: str, resolve: Callable[[str], Path], what: str = "callable",
                  project_root: Path | None = None) -> Callable[..., Any]:
    """Import and return the callable named by ``spec`` (this runs the user's module code).

    ``resolve`` turns the file of a ``python:`` spec into a checked path (``StageContext.resolve``);
    ``what`` names the callable's role in error messages ("model factory", "data callable", ...);
    ``project_root``: where a ``python:package.module`` of the project is found (appended to the module path,
    after installed packages, so a project module never shadows one of them; never the working directory).
    """
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier() or target == "python":
        raise RecipeError(f"{what} {spec!r}: expected 'python:path/to/file.py:function' or "
                          "'python:package.module:function'")
    _require_python_prefix(spec, target, what)
    module_name = _module_of(target)
    if module_name is None:
        relative = target[len(PYTHON_PREFIX):]
        path = resolve(relative)
        if not path.is_file():
            raise StageFailed(f"{what} file {relative!r} not found (looked at {path})",
                               hint="paths are relative to the recipe file")
        name = f"_trtflow_user_{abs(hash(str(path)))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise StageFailed(f"cannot load {what} file {str(path)!r} as Python")
        module = importlib.util.module_from_spec(module_spec)
        depfile.note_entry(path)  # a python: file is executed, not imported: the node's depfile must still see it
        sys.modules[name] = module
        # the file's folder goes last on the module path: its own helper modules are found, but a numpy.py (or
        # any name of an installed or standard module) beside it never replaces the real one, for the callable
        # or for anything this process imports later
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise StageFailed(f"importing {relative} for the {what} failed: {type(exc).__name__}: {exc}",
                               hint="run the file with python to debug it") from exc
    else:
        if project_root is not None and str(project_root) not in sys.path:
            sys.path.append(str(project_root))
        origin = module_origin(module_name)
        if origin is not None:
            depfile.note_entry(origin)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise StageFailed(f"cannot import module {module_name!r} for the {what} {spec!r}: {exc}",
                               hint="install it, or use python:path/to/file.py:function") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        from trtflow.errors import did_you_mean

        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise StageFailed(f"{what} {spec!r}: {module_name or target} has no function {attr!r}",
                           hint=did_you_mean(attr, public) or f"functions there: {', '.join(public[:10]) or 'none'}")
    return fn


def code_references(value: Any) -> list[str]:
    """Every ``python:`` code reference among the strings of a parameter value (nested dicts and lists included),
    in order."""
    if isinstance(value, str):
        return [value] if value.startswith(PYTHON_PREFIX) else []
    if isinstance(value, dict):
        return [s for v in value.values() for s in code_references(v)]
    if isinstance(value, list):
        return [s for v in value for s in code_references(v)]
    return []
