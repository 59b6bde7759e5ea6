"""Paths a recipe or `trtflow init` names (the user's project): resolution inside the allowed roots, and the one
check of an input file (`input_path`) that `plan`, `run` and `init` make before anything opens it.

Files under the store and build/ are never touched here: `trtflow.storage.confined` owns them."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from trtflow import redact
from trtflow.errors import TrtflowError

MAX_RECIPE_BYTES = 16 << 20  # a recipe file (or an extends base) larger than this is refused
PROJECT_MARKERS = (".git", "pyproject.toml")
ALLOWED_PATHS_ENV = "TRTFLOW_ALLOWED_PATHS"


def resolve_user_path(path: str | Path, base: Path, allowed_roots: Sequence[Path]) -> Path:
    """Resolve a path from a recipe relative to ``base`` (the recipe's folder).

    Refuses, with a TrtflowError, a path that escapes ``allowed_roots`` (symbolic links followed), a folder
    that holds the recipe itself (its content would include the recipe, and usually the store), a folder
    whose files break the rule (``check_folder``), and a path that cannot be resolved or looked at (a NUL
    byte, a name too long, a symbolic link loop, no permission). A path that does not exist is returned: the
    caller says what it expected there.
    """
    _note_variables(str(path))
    try:
        candidate = Path(os.path.expandvars(str(path))).expanduser()
        if not candidate.is_absolute():
            candidate = base / candidate
        resolved = candidate.resolve()
        os.lstat(resolved)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except (OSError, RuntimeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TrtflowError(f"path {_shown(path)} cannot be used: {reason}", hint="check the path") from None
    roots = [Path(r).resolve() for r in allowed_roots]
    if roots and not any(resolved == r or r in resolved.parents for r in roots):
        raise TrtflowError(
            f"path {_shown(path)} resolves to {resolved}, outside the allowed directories "
            f"({', '.join(str(r) for r in roots)})",
            hint="keep the files inside the recipe's project (the nearest folder above the recipe holding a .git or "
            f"a pyproject.toml; without one, the recipe's own folder), or add their directory to {ALLOWED_PATHS_ENV} "
            "(os.pathsep-separated)",
        )
    recipe_dir = Path(base).resolve()
    if resolved == recipe_dir or resolved in recipe_dir.parents:
        raise TrtflowError(f"path {_shown(path)} resolves to {resolved}, a folder that holds the recipe itself",
                           hint="point at the model or data file, or at a folder of data, not at the project")
    if resolved.is_dir():
        check_folder(resolved, roots)
    return resolved


def input_path(ref: str | Path, base: Path, allowed_roots: Sequence[Path]) -> Path:
    """The one check of a file or folder a recipe or `trtflow init` names as an input (a model, its data, a
    factory's file), made before anything opens it: resolved inside ``allowed_roots`` (`resolve_user_path`; a
    folder's entries by `check_folder`: regular files, no link out), present, and a regular file or a folder: a
    named pipe (it would block its reader), a device (``/dev/zero`` never ends) or a socket is refused. What
    trtflow itself then reads of it (its digest, a model's configuration, an archive's listing) goes through
    `trtflow.userfiles` (bounded, regular files only). Raises TrtflowError naming ``ref``, the path and the fix."""
    path = resolve_user_path(ref, base, allowed_roots)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise TrtflowError(f"file {str(ref)!r} not found (looked at {path})",
                           hint="check the path; recipe paths are relative to the recipe file") from None
    except OSError as exc:
        raise TrtflowError(f"cannot read {str(ref)!r} ({path}): {exc.strerror or exc}", hint="check the path") from None
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise TrtflowError(f"{str(ref)!r} is not a regular file or directory ({path}: a named pipe, a device or a "
                           "socket)", hint="point at the model or data file itself")
    return path


_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _note_variables(path: str) -> None:
    """The values of the environment variables a path spells (``$VAR``, ``${VAR}``) are hidden where it is printed;
    one a recipe may not read (the signing key: `settings.refused_in_recipe`) is refused."""
    from trtflow.settings import refused_in_recipe

    for match in _VARIABLE.finditer(path):
        name = match.group(1) or match.group(2)
        refused = refused_in_recipe(name)
        if refused is not None:
            raise TrtflowError(f"path {_shown(path)} cannot be used: {refused}",
                               hint=f"remove ${name} from the path: trtflow reads its signing key itself")
        value = os.environ.get(name)
        if value:
            redact.note(name, value)


def _shown(path: str | Path, limit: int = 200) -> str:
    text = repr(str(path))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(path))} characters)"


def check_folder(folder: Path, allowed_roots: Sequence[Path]) -> None:
    """Refuse a folder a recipe points at when reading every file in it (as its digest does, walking it
    without following folder links) could block or leave the allowed roots: an entry that is not a regular
    file (a named pipe blocks whoever opens it; a device never ends) or a link to a file outside them."""
    roots = [Path(r).resolve() for r in allowed_roots]
    for top, _dirs, files in os.walk(folder):
        for name in files:
            entry = Path(top) / name
            try:
                info = entry.stat()
                target = entry.resolve() if entry.is_symlink() else entry
            except (OSError, RuntimeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise TrtflowError(f"{entry} in folder {folder} cannot be read: {reason}",
                                   hint="remove it or fix it") from None
            if not stat.S_ISREG(info.st_mode):
                raise TrtflowError(f"{entry} in folder {folder} is not a regular file (a named pipe, socket or "
                                   "device)", hint="remove it from the folder, or point at the files you mean")
            if roots and not any(target == r or r in target.parents for r in roots):
                raise TrtflowError(f"{entry} in folder {folder} links to {target}, outside the allowed "
                                   f"directories ({', '.join(str(r) for r in roots)})",
                                   hint=f"copy the file into the folder, or add its directory to {ALLOWED_PATHS_ENV}")


def project_root(start: str | Path) -> Path | None:
    """The nearest folder, from ``start`` upwards, that holds a ``.git`` (directory or file) or a
    ``pyproject.toml``; None when there is none."""
    current = os.path.realpath(start)  # os.path, not pathlib: asked for every recipe path
    while True:
        if any(os.path.exists(os.path.join(current, marker)) for marker in PROJECT_MARKERS):
            return Path(current)
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def project_root_of(recipe_path: str | Path) -> Path:
    """The project a recipe belongs to: ``project_root`` of the recipe's folder, or that folder itself when
    no folder above it is marked. Given a folder (a recipe's folder), the same search starts there.

    Recipe paths may point anywhere inside it (and into ``TRTFLOW_ALLOWED_PATHS``); the working directory
    plays no part, so a recipe means the same from wherever it is run.
    """
    path = Path(recipe_path).resolve()
    folder = path if path.is_dir() else path.parent
    return project_root(folder) or folder


def recipe_id(recipe_path: str | Path) -> str:
    """A recipe file's identity: its path relative to its project root, in POSIX form (the same in every clone
    of the project); its absolute path when no folder above it is marked (two loose recipes never share one)."""
    path = Path(recipe_path).resolve()
    root = project_root(path.parent)
    return path.relative_to(root).as_posix() if root is not None else path.as_posix()


def allowed_roots_for(recipe_dir: Path) -> list[Path]:
    """Directories the paths of a recipe in ``recipe_dir`` may point into: its project root, then the
    directories listed in ``TRTFLOW_ALLOWED_PATHS`` (the explicit escape hatch)."""
    roots = [project_root(recipe_dir) or Path(os.path.realpath(recipe_dir))]
    extra = os.environ.get(ALLOWED_PATHS_ENV, "")
    roots += [Path(p).expanduser().resolve() for p in extra.split(os.pathsep) if p]
    return list(dict.fromkeys(roots))

