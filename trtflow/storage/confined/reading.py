"""Reading below a tree: a file is read only if it is a regular file (``fstat`` after an ``O_NOFOLLOW |
O_NONBLOCK`` open: a named pipe never blocks, a device or a socket is refused) and never past the cap of its kind
(`kinds.Kind`)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from trtflow.storage.confined.kinds import Kind
from trtflow.storage.confined.names import Refused, Rel, parts_of
from trtflow.storage.confined.walking import READ_FLAGS, Walker
from trtflow.userfiles import read_bounded


class Reading(Walker):
    """The reading half of a `tree.Tree`."""

    def read_bytes(self, rel: Rel, kind: Kind) -> bytes:
        """The content of the regular file ``rel``; raises FileNotFoundError, or Refused (a link, not a regular
        file, larger than ``kind``'s cap)."""
        parts = parts_of(rel)
        shown = self.shown(parts)
        with self._folder(parts[:-1]) as folder:
            fd, st = self._file_fd(folder, parts[-1], shown)
        try:
            return read_bounded(fd, st, kind.cap, shown, f"a {kind.name}")
        finally:
            os.close(fd)

    def read_text(self, rel: Rel, kind: Kind) -> str:
        return self.read_bytes(rel, kind).decode("utf-8", "replace")

    def read_tail(self, rel: Rel, max_bytes: int) -> str:
        """The last ``max_bytes`` of a regular file as text (undecodable bytes replaced)."""
        parts = parts_of(rel)
        with self._folder(parts[:-1]) as folder:
            fd, st = self._file_fd(folder, parts[-1], self.shown(parts))
        with os.fdopen(fd, "rb") as f:
            f.seek(max(0, st.st_size - max_bytes))
            return f.read(max_bytes).decode("utf-8", "replace")

    @contextlib.contextmanager
    def open_read(self, rel: Rel) -> Iterator[IO[bytes]]:
        """The regular file ``rel`` open for reading (for streaming: hashing, copying)."""
        parts = parts_of(rel)
        with self._folder(parts[:-1]) as folder:
            fd, _ = self._file_fd(folder, parts[-1], self.shown(parts))
        with os.fdopen(fd, "rb") as f:
            yield f


@contextlib.contextmanager
def open_regular(path: Path) -> Iterator[IO[bytes]]:
    """The regular file ``path`` open for reading, its last component not followed: for a file reached just
    before through a `Tree` (a stored object, a node's output) that an API names by its path."""
    fd = os.open(path, READ_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(path, "is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        yield f



def tail_of_fd(fd: int, max_bytes: int) -> str:
    """The last ``max_bytes`` of the regular file open as ``fd`` (a log held open; read with ``pread``, the
    descriptor's offset untouched) as text."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"/proc/self/fd/{fd}", "is not a regular file")
    start = max(0, st.st_size - max_bytes)
    return os.pread(fd, st.st_size - start, start).decode("utf-8", "replace")
