"""One file outside the store and build/, named by its path: the project's own files (the trust file, a recipe
`trtflow init` writes, the schema beside it), the files named with ``-o`` (provenance, reports, results), the user's
config folder (keys, the user's trust file), and the model files and configurations a recipe or `trtflow init`
reads. A cloned repository may commit any of them, or a link or a named pipe in their place, so the rules below
the store's trees hold here too, for the one file:

- Writing (`write_file`): the target's folder is opened once as a descriptor (the links in the folder's own path
  are followed: the user named it, or it is the project root or the user's config folder); a temporary file with
  a random name is created in that descriptor with ``O_CREAT | O_EXCL | O_NOFOLLOW``, written, fsynced, and renamed
  over the target's name. The target's last component is never followed: a link in its place is replaced by the
  file, never written through; a planted ``.<name>.<pid>`` (or any name) is never opened. ``exclusive``: the file
  is linked into place only if no entry of that name exists (a key).
- Reading (`read_file`, `open_file`): a regular file only (opened with ``O_NONBLOCK`` and checked with ``fstat``:
  a named pipe never blocks, a device or a socket is refused), never past ``cap`` bytes. ``follow=False`` (a file
  trtflow finds by itself: the project's trust file, the user's keys) opens the last component with
  ``O_NOFOLLOW``: a link there is refused. A file a recipe names (``follow=True``) was resolved inside the
  project's allowed roots first (`trtflow.fsutil.input_path`).
- What such a file holds is parsed as a typed record (`trtflow.storage.records`): bounded depth, size and type.

Errors are `Refused` (an OSError naming the path and why) or the OSError of the call.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from trtflow.storage.confined.names import Refused, check_name
from trtflow.storage.confined.tree import Tree
from trtflow.storage.confined.writing import write_all

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def _open_regular(path: Path | str, follow: bool) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, _READ | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise Refused(path, "is a symbolic link (trtflow reads this file only as a regular file)",
                          hint="replace the link by the file itself") from None
        if exc.errno == errno.ENXIO:  # a socket, or a named pipe opened for writing without a reader
            raise Refused(path, "is not a regular file (a named pipe, a device or a socket)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(path, "is not a regular file (a named pipe, a device or a socket)",
                          hint="point at the file itself")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_file(path: Path | str, cap: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``cap`` (Refused past it, before reading when its size says
    so); Refused for a link (``follow=False``), a named pipe, a device or a socket; FileNotFoundError when absent."""
    fd, st = _open_regular(path, follow)
    try:
        if st.st_size > cap:
            raise Refused(path, f"has {st.st_size} bytes, more than the {cap} trtflow reads of such a file")
        chunks, got = [], 0
        while got <= cap and (chunk := os.read(fd, min(1 << 20, cap + 1 - got))):
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > cap:
        raise Refused(path, f"has more than the {cap} bytes trtflow reads of such a file")
    return b"".join(chunks)


@contextlib.contextmanager
def open_file(path: Path | str, *, follow: bool = True) -> Iterator[IO[bytes]]:
    """The regular file ``path`` open for reading (streamed: hashed, or looked into as a zip archive); Refused as
    by `read_file`."""
    fd, _ = _open_regular(path, follow)
    with os.fdopen(fd, "rb") as f:
        yield f


def write_file(path: Path | str, data: bytes | str, *, mode: int | None = None, exclusive: bool = False,
               parents: bool = True) -> None:
    """Replace the file ``path`` with ``data`` (text is written as UTF-8) by the rules above: a random temporary file
    made exclusively in the target's folder (opened as a descriptor), fsynced, ``fchmod`` to ``mode`` if given, then
    renamed over the name (a link there is replaced, never followed). ``exclusive``: FileExistsError if an entry of
    that name exists (the file is linked into place, whole). ``parents``: missing folders above are made."""
    target = Path(path).absolute()
    name = check_name(target.name)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tree = Tree(target.parent)
    try:
        if parents:
            tree.ensure()
        if not exclusive:
            tree.write_bytes((name,), raw, mode=mode, parents=False)
            return
        with tree.staged("", name, mode) as (staged, fd):
            write_all(fd, raw)
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
            if not tree.publish((staged,), (name,)):
                raise FileExistsError(errno.EEXIST, "File exists", str(target))
    finally:
        tree.close()
