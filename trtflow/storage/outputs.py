"""Readable copies of a node's outputs under ``build/<recipe>/<node>/``, and the index that says which are ours.

The output folder is the user's territory, and it may come from elsewhere (a cloned repository can carry a
``build/`` folder). So trtflow acts there only within these rules:
- it writes and deletes only inside the node's folder, checked after resolving links: the folder itself must be
  a real folder (not a link to another place), and a file name (from a manifest or from the index) must be a
  plain relative name whose folder, links resolved, is still inside it;
- it deletes only a file it made: the index (``.trtflow.json``) records each copy's size, mtime and inode, and a
  file counts as ours only while all three still match (a planted index cannot know the inode and the
  nanosecond mtime of a file it did not create; a copy the user edited is no longer ours and is left alone);
- it reads the index only if it is a small regular file (never a link, a pipe or a device).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trtflow.storage.manifest import outputs_problem, safe_relative_name

INDEX = ".trtflow.json"
INDEX_FORMAT = 1  # indexes without a format are those of trtflow before 0.1: read, under the same rules
MAX_INDEX_BYTES = 1 << 20


class UnsafeOutputFolder(OSError):
    """An output folder (or a folder inside it) is a link or not a folder: trtflow puts nothing there."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def read_index(dest: Path) -> dict[str, Any]:
    """The index of ``dest``, or {} when it is absent, not a small regular file, not JSON, or of a newer format."""
    try:
        fd = os.open(dest / INDEX, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            fd = -1
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return {}
            raw = f.read(MAX_INDEX_BYTES + 1)
    except OSError:
        return {}
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > MAX_INDEX_BYTES:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("files", {}), dict):
        return {}
    written_as = data.get("format", INDEX_FORMAT)
    if not isinstance(written_as, int) or written_as > INDEX_FORMAT:
        return {}
    return data


def write_index(dest: Path, data: Mapping[str, Any]) -> None:
    """Replace the folder's index atomically (a link in its place is replaced, never followed); not fsynced: it
    only saves copies, and a lost one means a re-copy."""
    tmp = dest / f".{INDEX}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(dict(data, format=INDEX_FORMAT), f, indent=1)
    os.replace(tmp, dest / INDEX)


def real_folder(dest: Path, create: bool) -> Path | None:
    """``dest`` with links resolved, if it is a real folder (created when ``create``); None if absent.

    Raises UnsafeOutputFolder if ``dest`` is a link or not a folder: outputs never go through a link to another
    place."""
    if create:
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            dest.mkdir()
        except FileExistsError:
            pass
    try:
        st = dest.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeOutputFolder(f"{dest} is a symbolic link (to {os.readlink(dest)}); trtflow puts outputs only in "
                                 "real folders under the output directory: remove the link")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeOutputFolder(f"{dest} is not a folder; remove it so that trtflow can put the outputs there")
    return dest.resolve()


def confined(folder: Path, name: object) -> Path | None:
    """``folder / name`` if ``name`` is a plain relative name whose folder, links resolved, lies inside ``folder``
    (a real folder, see ``real_folder``); None otherwise."""
    if not safe_relative_name(name):
        return None
    assert isinstance(name, str)
    target = folder / name
    try:
        parent = target.parent.resolve()
    except (OSError, RuntimeError):
        return None
    if parent != folder and folder not in parent.parents:
        return None
    return parent / target.name


def made_by_us(path: Path, record: Any) -> bool:
    """``path`` is a regular file with the size, mtime, ctime and inode the index recorded when trtflow made it (a
    copy edited in place with its size and mtime restored has another ctime: it is the user's now)."""
    if not isinstance(record, Mapping):
        return False
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) == (
        record.get("size"), record.get("mtime_ns"), record.get("ctime_ns"), record.get("ino"))


def materialize(manifest: Mapping[str, Any], dest: Path, object_path: Callable[[str], Path]) -> dict[str, Path]:
    """Copy a node's outputs into ``dest`` (copies, never aliases: editing them cannot change the store).

    A copy that is still the one trtflow made for this key is kept; a file of the previous result that is still
    ours and no longer an output is removed. Raises UnsafeOutputFolder (an OSError) when ``dest`` or a folder in it
    leads elsewhere."""
    problem = outputs_problem(manifest.get("outputs"))
    if problem is not None:
        raise UnsafeOutputFolder(f"the outputs of node {manifest.get('node')} cannot be copied to {dest}: {problem}")
    folder = real_folder(dest, create=True)
    assert folder is not None
    index = read_index(dest)
    recorded = index.get("files", {})
    same_key = index.get("key") == manifest.get("key")
    paths: dict[str, Path] = {}
    files: dict[str, dict[str, Any]] = {}
    for name, out in manifest.get("outputs", {}).items():
        filename = out["filename"]
        target = _place(folder, filename)
        paths[name] = dest / filename
        if not (same_key and made_by_us(target, recorded.get(filename))):
            _copy_atomically(object_path(out["digest"]), target)
        st = target.lstat()
        files[filename] = {"digest": out["digest"], "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                           "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}
    for leftover, record in recorded.items():
        path = confined(folder, leftover) if leftover not in files else None
        if path is not None and made_by_us(path, record):
            path.unlink()
    current = {"format": INDEX_FORMAT, "key": manifest.get("key"), "node": manifest.get("node"), "status": "current",
               "files": files}
    if current != index:  # a re-run that found every copy intact writes nothing
        write_index(dest, current)
    return paths


def retract(dest: Path, reason: str) -> list[str]:
    """Remove the copies trtflow made in ``dest`` (they no longer match the node) and say why in its index.

    Returns the removed file names; anything else (a file the user made or edited, a name outside the folder)
    is left alone. A ``dest`` that is a link is not touched at all."""
    try:
        folder = real_folder(dest, create=False)
    except UnsafeOutputFolder:
        return []
    if folder is None:
        return []
    index = read_index(dest)
    removed = []
    for filename, record in index.get("files", {}).items():
        path = confined(folder, filename)
        if path is not None and made_by_us(path, record):
            path.unlink()
            removed.append(filename)
    if index:
        write_index(dest, {"key": None, "node": index.get("node"), "status": "stale", "reason": reason, "files": {}})
    return removed


def _place(folder: Path, filename: str) -> Path:
    """Where an output's copy goes: ``folder / filename``, creating the folders of the file name (``1/model.onnx``)
    as real folders; raises UnsafeOutputFolder for one that is a link or not a folder."""
    current = folder
    for part in filename.split("/")[:-1]:
        current = current / part
        real_folder(current, create=True)
    target = confined(folder, filename)
    if target is None:
        raise UnsafeOutputFolder(f"{folder / filename} would leave {folder}")
    return target


def _copy_atomically(source: Path, target: Path) -> None:
    """Copy (a reflink where the filesystem offers one: copy_file_range) to a temp name, then rename (a link in
    the target's place is replaced, never followed)."""
    if source.is_symlink():  # objects are regular files; a link may lead anywhere
        raise UnsafeOutputFolder(f"the stored object {source} is a symbolic link; run `trtflow verify --fix`")
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a link planted under the temporary name would be written through
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
