"""Small filesystem helpers: atomic writes and safe path resolution."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trtflow.errors import TrtflowError


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def resolve_user_path(path: str | Path, base: Path, allowed_roots: Sequence[Path]) -> Path:
    """Resolve a path from a recipe relative to ``base``; refuse one that escapes ``allowed_roots``."""
    candidate = Path(os.path.expandvars(str(path))).expanduser()
    if not candidate.is_absolute():
        candidate = base / candidate
    resolved = candidate.resolve()
    roots = [Path(r).resolve() for r in allowed_roots]
    if roots and not any(resolved == r or r in resolved.parents for r in roots):
        raise TrtflowError(
            f"path {str(path)!r} resolves to {resolved}, outside the allowed directories "
            f"({', '.join(str(r) for r in roots)})",
            hint="keep model and data files under the project directory, or add the directory to "
            "TRTFLOW_ALLOWED_PATHS (os.pathsep-separated)",
        )
    return resolved


def allowed_roots_for(recipe_dir: Path) -> list[Path]:
    """Directories recipe paths may point into: the recipe's folder, the working directory, extras."""
    roots = [recipe_dir.resolve(), Path.cwd().resolve()]
    project = project_root(recipe_dir)
    if project is not None:
        roots.append(project)
    extra = os.environ.get("TRTFLOW_ALLOWED_PATHS", "")
    roots += [Path(p).resolve() for p in extra.split(os.pathsep) if p]
    return list(dict.fromkeys(roots))


def project_root(start: Path) -> Path | None:
    """The nearest ancestor of ``start`` that holds a .git directory or a pyproject.toml."""
    current = start.resolve()
    for folder in (current, *current.parents):
        if (folder / ".git").exists() or (folder / "pyproject.toml").exists():
            return folder
    return None


def project_root_of(recipe_path: Path) -> Path:
    """The recipe's project: the nearest ancestor with .git or pyproject.toml, else the recipe's own folder."""
    folder = Path(recipe_path).resolve().parent
    return project_root(folder) or folder


def recipe_id(recipe_path: Path) -> str:
    """A recipe file's identity: its path relative to its project root, in POSIX form (so it is the same in every
    clone of the project); the absolute path for a recipe outside any project."""
    path = Path(recipe_path).resolve()
    root = project_root(path.parent)
    return path.relative_to(root).as_posix() if root is not None else path.as_posix()
