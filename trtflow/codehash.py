"""Digests of code: a stage's module and the modules of its package it imports; a `python:` callable's file and the
project modules it imports. Part of every node key, so a result is never reused across a change of the code
that made it (no hand-bumped version strings to forget).

Imports are found by parsing the source (every ``import`` and ``from ... import`` statement anywhere in the file,
in any layout, and ``importlib.import_module`` / ``__import__`` of a literal name), never by importing it: `plan`
runs no user code. Only files inside the given roots are followed (the stage's package; the recipe's project,
minus the virtual environments and installed packages *inside* it, wherever the project itself lives: a checkout
in ``<venv>/src/`` is a project like any other), so installed libraries are covered by the environment facts
(their versions), not by hashing site-packages.

For a stage this scan is the key's code. For a `python:` reference it is only the first guess: the modules the
code really imports are recorded while it runs (`trtflow.depfile`) and those decide from then on (`plan`).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trtflow.fingerprint import StatCache, hash_file, hash_value
from trtflow.userfiles import read_file

_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+\(?([^#\n]*)|import[ \t]+([^#\n]+))", re.M)
_SKIP_DIRS = {"site-packages", "dist-packages", ".venv", "venv", ".tox", ".git", "__pycache__", "node_modules"}
#: A folder holding one of these is a Python environment (a virtual environment, a conda one) whatever its name.
_ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta")


def not_the_projects(root: str, below: Iterable[str]) -> bool:
    """Whether a file in the folders ``below`` (names, outermost first) of the project folder ``root`` is not the
    project's own: installed packages, a Python environment (by its usual names, or any folder with a
    ``pyvenv.cfg`` or ``conda-meta``: ``python3 -m venv .v`` inside the project), version control, caches. The one
    rule of the import scanner (here) and of the record of a node's reads (`depfile`)."""
    folder = root
    for name in below:
        folder = os.path.join(folder, name)
        if name in _SKIP_DIRS or _is_environment(folder):
            return True
    return False


@functools.lru_cache(maxsize=4096)
def _is_environment(folder: str) -> bool:
    return any(os.path.lexists(os.path.join(folder, marker)) for marker in _ENVIRONMENT_MARKERS)


@dataclass(frozen=True)
class CodeDigest:
    digest: str
    files: dict[str, str] = field(default_factory=dict)  # path (relative to ``base``) -> content digest


_DYNAMIC = {"import_module", "__import__"}
MAX_SOURCE = 64 << 20  # a Python source larger than this is not scanned for imports (its digest still counts)
_PARSED: dict[tuple[str, int, int, int, int], list[tuple[int, str, list[str]]]] = {}


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(relative level, module, imported names) for every import in ``path`` (parsed once per file version)."""
    try:
        st = path.stat()
        text = read_file(path, MAX_SOURCE).decode("utf-8", "replace")  # a regular file only, bounded
    except OSError:
        return []
    memo = (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if memo not in _PARSED:
        try:
            _PARSED[memo] = _parsed_imports(ast.parse(text, str(path)))
        except (SyntaxError, ValueError):  # not Python we can parse: the line scan finds what it can
            _PARSED[memo] = _scanned_imports(text)
    return _PARSED[memo]


def _parsed_imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(0, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or "", [a.name for a in node.names if a.name != "*"]))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _called_name(node.func) in _DYNAMIC):
            name = node.args[0].value
            if name and all(part.isidentifier() for part in name.split(".")):
                found.append((0, name, []))
    return found


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _scanned_imports(text: str) -> list[tuple[int, str, list[str]]]:
    found: list[tuple[int, str, list[str]]] = []
    for match in _IMPORT.finditer(text):
        source, names, plain = match.groups()
        if plain is not None:
            for part in plain.split(","):
                module = part.strip().split(" as ")[0].strip()
                if module and all(p.isidentifier() for p in module.split(".")):
                    found.append((0, module, []))
            continue
        level = len(source) - len(source.lstrip("."))
        module = source[level:]
        imported = [n.strip().split(" as ")[0].strip(" ()\\") for n in names.split(",")]
        found.append((level, module, [n for n in imported if n.isidentifier()]))
    return found


def _module_file(base: Path) -> Path | None:
    """``base.py`` or ``base/__init__.py``."""
    as_file = base.with_name(base.name + ".py")
    if as_file.is_file():
        return as_file
    init = base / "__init__.py"
    return init if init.is_file() else None


def _within(path: Path, roots: Iterable[Path]) -> bool:
    """Inside one of ``roots``, and not in a virtual environment or installed package *below* that root (the
    folders above a root do not matter: a project may itself live in ``<venv>/src/``)."""
    for root in roots:
        if path == root or root in path.parents:
            return not not_the_projects(str(root), path.relative_to(root).parts[:-1])
    return False


def _resolve(entry: Path, level: int, module: str, names: list[str], search: list[Path]) -> list[Path]:
    """Files an import statement in ``entry`` refers to, among ``search`` directories (for absolute imports)."""
    parts = module.split(".") if module else []
    if level:
        base_dir = entry.parent
        for _ in range(level - 1):
            base_dir = base_dir.parent
        bases = [base_dir]
    else:
        bases = search
    found: list[Path] = []
    for base_dir in bases:
        target = base_dir.joinpath(*parts) if parts else base_dir
        # every package on the way is imported too (its __init__.py runs)
        for i in range(1, len(parts)):
            init = base_dir.joinpath(*parts[:i], "__init__.py")
            if init.is_file():
                found.append(init)
        module_file = _module_file(target) if parts else (target / "__init__.py" if (target / "__init__.py").is_file()
                                                          else None)
        if module_file is not None:
            found.append(module_file)
        for name in names:  # `from pkg import sub` may import the submodule pkg/sub.py
            sub = _module_file(target / name)
            if sub is not None:
                found.append(sub)
        if found:
            break
    return found


def closure(entries: Iterable[Path], roots: list[Path], search: list[Path]) -> list[Path]:
    """``entries`` and every file they import (transitively) that lies inside ``roots``, sorted."""
    roots = [r.resolve() for r in roots]
    seen: set[Path] = set()
    stack = [e.resolve() for e in entries]
    while stack:
        path = stack.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for level, module, names in _imports(path):
            for target in _resolve(path, level, module, names, search):
                target = target.resolve()
                if target not in seen and _within(target, roots):
                    stack.append(target)
    return sorted(seen)


def digest_files(files: Iterable[Path], base: Path, stat_cache: StatCache | None = None) -> CodeDigest:
    entries: dict[str, str] = {}
    for path in files:
        try:
            label = path.relative_to(base).as_posix()
        except ValueError:
            label = path.as_posix()
        entries[label] = hash_file(path, stat_cache)
    return CodeDigest(hash_value(entries), entries)


_STAGE_CODE: dict[str, CodeDigest] = {}


def stage_code(module_name: str, stat_cache: StatCache | None = None) -> CodeDigest:
    """Digest of a stage's module and the modules of its own top-level package that it imports."""
    if module_name in _STAGE_CODE:
        return _STAGE_CODE[module_name]
    place = stage_module_place(module_name)
    if place is None:
        return CodeDigest(hash_value({"module": module_name}))
    origin, package_dir = place
    files = stage_files(origin, module_name.split(".")[0], package_dir)
    result = digest_files(files, package_dir.parent, stat_cache)
    _STAGE_CODE[module_name] = result
    return result


def stage_module_place(module_name: str) -> tuple[Path, Path] | None:
    """The file of an imported stage module and the folder of its top-level package (None: no file)."""
    module = sys.modules.get(module_name)
    origin = getattr(module, "__file__", None)
    if not origin:
        return None
    top = sys.modules.get(module_name.split(".")[0])
    top_file = getattr(top, "__file__", None) or origin
    return Path(origin), Path(top_file).resolve().parent


def stage_files(origin: Path, package: str, package_dir: Path) -> list[Path]:
    """A stage module's file and the files of its own package it imports, sorted (what `stage_code` digests)."""
    files = closure([origin], [package_dir], [package_dir.parent])
    # absolute imports of the package by its own name (``from trtflow_stages import x``) resolve under the
    # package directory whatever the directory is called (``stages/`` is installed as ``trtflow_stages``)
    return sorted(set(files) | set(_own_package_imports(files, package, package_dir)))


def _own_package_imports(files: list[Path], package: str, package_dir: Path) -> list[Path]:
    extra: list[Path] = []
    stack = list(files)
    seen = set(files)
    while stack:
        path = stack.pop()
        for level, module, names in _imports(path):
            if level or not module or module.split(".")[0] != package:
                continue
            rest = module.split(".")[1:]
            targets = _resolve(package_dir / "__init__.py", 1, ".".join(rest), names, [])
            for target in targets:
                target = target.resolve()
                if target not in seen:
                    seen.add(target)
                    extra.append(target)
                    stack.append(target)
    return extra


def callable_code(entry: Path, project_root: Path, stat_cache: StatCache | None = None) -> CodeDigest:
    """Digest of a `python:` callable's file and the project files it imports (paths relative to the project)."""
    return digest_files(callable_files(entry, project_root), project_root, stat_cache)


def callable_files(entry: Path, project_root: Path) -> list[Path]:
    """A `python:` callable's file and the project files it imports, sorted (what `callable_code` digests)."""
    entry = entry.resolve()
    return closure([entry], [project_root, entry.parent], [entry.parent, project_root])
