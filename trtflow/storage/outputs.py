"""Readable copies of a node's outputs under ``build/<recipe>/<node>/``, and the index that says which are ours.

The output folder is the user's territory, and it may come from elsewhere (a cloned repository can carry a
``build/`` folder). So trtflow acts there only within these rules:
- it writes and deletes only inside the node's folder, walked from the folder the user chose (the working folder
  for the default ``build/<recipe>``, the ``--output-dir``) without following links (`Tree`): ``build/``,
  ``build/<recipe>``, the node's folder and every folder in a file name must be real folders, and a file name
  (from a manifest or from the index) must be a plain relative name;
- it deletes only a file it made: the index (``.trtflow.json``) records each copy's size, mtime, ctime and inode, and a
  file counts as ours only while all four still match (a planted index cannot know the inode and the
  nanosecond mtime of a file it did not create; a copy the user edited is no longer ours and is left alone);
- it reads the index only if it is a small regular file (never a link, a pipe or a device).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any

from trtflow.storage import records
from trtflow.storage.confined import kinds
from trtflow.storage.confined.names import Refused, check_relative
from trtflow.storage.confined.tree import Tree
from trtflow.storage.manifest import outputs_problem, safe_relative_name

INDEX = ".trtflow.json"
INDEX_FORMAT = 1  # indexes without a format are those of trtflow before 0.1: read, under the same rules
MAX_INDEX_BYTES = kinds.INDEX.cap
log = logging.getLogger("trtflow.storage")

#: An output folder (or a folder inside it) that is a link or not a folder: trtflow puts nothing there.
UnsafeOutputFolder = Refused

OpenObject = Callable[[str], AbstractContextManager[IO[bytes]]]


def node_folder(dest: Path, base: Path | None) -> tuple[Tree, tuple[str, ...]]:
    """The tree of ``base`` (the folder the user chose; its own links are theirs) and the parts of ``dest`` below
    it, each walked without following links. Without ``base`` (or when ``dest`` is not below it): ``dest``'s
    parent."""
    dest = Path(dest).absolute()
    root = Path(base).absolute() if base is not None else dest.parent
    try:
        parts = dest.relative_to(root).parts
    except ValueError:
        root, parts = dest.parent, (dest.name,)
    if not parts:
        root, parts = dest.parent, (dest.name,)
    return Tree(root), check_relative(parts, "output folder")


def read_index(folder: Tree) -> dict[str, Any]:
    """The index of ``folder``, or {} when it is absent, not a small regular file, not JSON, or of a newer format."""
    try:
        data = records.read(folder, INDEX, records.INDEX)
    except Refused as exc:
        log.warning("ignoring the output index %s", exc.message)
        return {}
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("files", {}), dict):
        return {}
    written_as = data.get("format", INDEX_FORMAT)
    if not isinstance(written_as, int) or written_as > INDEX_FORMAT:
        return {}
    return data


def write_index(folder: Tree, data: Mapping[str, Any]) -> None:
    """Replace the folder's index atomically (a link in its place is replaced, never followed); not fsynced: it
    only saves copies, and a lost one means a re-copy."""
    folder.write_bytes(INDEX, json.dumps(dict(data, format=INDEX_FORMAT), indent=1).encode("utf-8"), durable=False)


def made_by_us(folder: Tree, name: object, record: Any) -> bool:
    """``name`` (a plain relative name) is a regular file in ``folder``, reached through real folders, with the
    size, mtime, ctime and inode the index recorded when trtflow made it (a copy edited in place with its size and
    mtime restored has another ctime: it is the user's now)."""
    return ours(folder, name, record) is not None


def ours(folder: Tree, name: object, record: Any) -> os.stat_result | None:
    """The status of ``name`` when `made_by_us` holds (one stat), else None."""
    if not isinstance(record, Mapping) or not safe_relative_name(name):
        return None
    assert isinstance(name, str)
    try:
        st = folder.stat(name)
    except OSError:
        return None
    if st is not None and stat.S_ISREG(st.st_mode) and (
            st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) == (
            record.get("size"), record.get("mtime_ns"), record.get("ctime_ns"), record.get("ino")):
        return st
    return None


def materialize(manifest: Mapping[str, Any], dest: Path, base: Path | None,
                open_object: OpenObject) -> dict[str, Path]:
    """Copy a node's outputs into ``dest`` (copies, never aliases: editing them cannot change the store).

    A copy that is still the one trtflow made for this key is kept; a file of the previous result that is still
    ours and no longer an output is removed. Raises Refused (an OSError) when ``dest`` or a folder in it leads
    elsewhere, or the manifest's outputs cannot be placed."""
    problem = outputs_problem(manifest.get("outputs"))
    if problem is not None:
        raise Refused(dest, f"cannot receive the outputs of node {manifest.get('node')}: {problem}")
    tree, rel = node_folder(dest, base)
    try:
        tree.ensure()
        folder = tree.subtree(rel, create=True)
    finally:
        tree.close()
    try:
        index = read_index(folder)
        recorded = index.get("files", {})
        same_key = index.get("key") == manifest.get("key")
        paths: dict[str, Path] = {}
        files: dict[str, dict[str, Any]] = {}
        for name, out in manifest.get("outputs", {}).items():
            filename = out["filename"]
            paths[name] = dest / filename
            st = ours(folder, filename, recorded.get(filename)) if same_key else None
            if st is None:
                with open_object(out["digest"]) as source:
                    folder.copy_in(filename, source, durable=False)
                st = folder.stat(filename)  # after the rename, which changes the ctime the index must hold
            assert st is not None
            files[filename] = {"digest": out["digest"], "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                               "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}
        for leftover, record in recorded.items():
            if leftover not in files and made_by_us(folder, leftover, record):
                folder.unlink(leftover)
        current = {"format": INDEX_FORMAT, "key": manifest.get("key"), "node": manifest.get("node"),
                   "status": "current", "files": files}
        if current != index:  # a re-run that found every copy intact writes nothing
            write_index(folder, current)
        return paths
    finally:
        folder.close()


def retract(dest: Path, reason: str, base: Path | None = None) -> list[str]:
    """Remove the copies trtflow made in ``dest`` (they no longer match the node) and say why in its index.

    Returns the removed file names; anything else (a file the user made or edited, a name outside the folder)
    is left alone. A ``dest`` reached through a link is not touched at all."""
    tree, rel = node_folder(dest, base)
    try:
        folder = tree.subtree(rel)
    except OSError:  # absent, or through a link
        return []
    finally:
        tree.close()
    with contextlib.closing(folder):
        index = read_index(folder)
        removed = []
        for filename, record in index.get("files", {}).items():
            if made_by_us(folder, filename, record):
                folder.unlink(filename)
                removed.append(filename)
        if index:
            write_index(folder, {"key": None, "node": index.get("node"), "status": "stale", "reason": reason,
                                 "files": {}})
        return removed
