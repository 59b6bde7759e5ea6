"""A remote cache in a folder on a local or network file system (NFS, a CI cache folder).

Other machines write there too, so nothing in it is followed blindly: every path goes through `Tree`,
walked from the root one folder at a time with ``O_NOFOLLOW`` (a folder that is a symbolic link stops the walk, so
nothing is read or written outside the root), a file is opened without following a link and without blocking (a
named pipe), and only a regular file is read, never more bytes than the caller allows. The root itself may be a
link (a share mounted elsewhere is the user's choice).

Writes are put-if-absent: a complete, synced, read-only temporary file is hard-linked to its name, which fails if
the name exists (a file system without hard links: check, then rename).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from trtflow.storage.confined.kinds import Kind
from trtflow.storage.confined.names import Refused, check_relative
from trtflow.storage.confined.reading import open_regular
from trtflow.storage.confined.tree import Tree
from trtflow.storage.confined.writing import copy_fd, reopen_for_writing, write_all
from trtflow.storage.remote.errors import RemoteError, TooLarge, Unreadable
from trtflow.storage.store import READ_ONLY


class DirectoryBackend:
    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url
        self.tree = Tree(root)  # the root may be a link (a share mounted elsewhere); nothing below it may

    def check(self) -> None:
        if not self.root.is_dir():
            what = "is not a directory" if self.root.exists() else "does not exist"
            raise RemoteError(f"the remote cache directory {self.root} {what}",
                              hint=f"create it (mkdir -p {self.root}), or fix --remote / TRTFLOW_REMOTE")

    @contextlib.contextmanager
    def _errors(self, what: str, path: str) -> Iterator[None]:
        try:
            yield
        except (FileNotFoundError, FileExistsError, NotADirectoryError):
            raise
        except Refused as exc:
            if exc.why.startswith("is not a folder") and exc.path != self.root / path:
                if what == "read":  # something that is not a folder on the way: nothing of that name is there
                    raise NotADirectoryError(exc.message) from None
                raise RemoteError(f"cannot {what} {self.root / path}: {exc.message}",
                                  hint="remove that entry from the remote directory") from None
            raise Unreadable(_why(exc, self.tree.path, path)) from None
        except OSError as exc:
            hint = ("make the remote directory writable for this user, or use it read-only by not pushing"
                    if isinstance(exc, PermissionError) else None)
            raise RemoteError(f"cannot {what} {self.root / path}: {exc.strerror or exc}", hint=hint) from None

    # ----- reading
    def read(self, path: str, limit: int) -> bytes | None:
        try:
            with self._errors("read", path):
                return self.tree.read_bytes(path, Kind("remote file", limit))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except Unreadable as exc:
            if "bytes" in exc.message and "more" in exc.message:
                raise TooLarge(f"is larger than {limit} bytes") from None
            raise

    def size(self, path: str) -> int | None:
        try:
            with self._errors("read", path):
                st = self.tree.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if st is None:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise Unreadable("is not a regular file (a symbolic link)")
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable("is not a regular file (a pipe, a device or a folder)")
        return st.st_size

    def download(self, path: str, dest: Path, limit: int) -> None:
        """Copy ``path`` into ``dest``: a file the caller just created (exclusively, in a real folder), opened again
        here without following a link and truncated."""
        with self._errors("read", path), self.tree.open_read(path) as src, reopen_for_writing(dest) as out:
            if os.fstat(src.fileno()).st_size > limit:
                raise TooLarge(f"has {os.fstat(src.fileno()).st_size} bytes, more than {limit}")
            copied = copy_fd(src.fileno(), out, limit + 1)
        if copied > limit:
            raise TooLarge(f"has more than {limit} bytes")

    # ----- writing
    @contextlib.contextmanager
    def _staged(self, path: str, source: Path | bytes) -> Iterator[tuple[str, ...]]:
        """A complete, synced, read-only copy of ``source`` in the folder of ``path`` under a temporary name."""
        parts = check_relative(path)
        with self.tree.staged(parts[:-1], parts[-1]) as (tmp, fd):
            if isinstance(source, bytes):
                write_all(fd, source)
            else:
                with open_regular(source) as src:
                    copy_fd(src.fileno(), fd, None)
            os.fsync(fd)
            os.fchmod(fd, READ_ONLY)
            yield (*parts[:-1], tmp)

    def create(self, path: str, source: Path | bytes) -> bool:
        with self._writing(path), self._staged(path, source) as staged:
            return self.tree.publish(staged, path)

    def replace(self, path: str, source: Path | bytes) -> None:
        with self._writing(path), self._staged(path, source) as staged:
            self.tree.rename(staged, path, durable=True)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), self._writing(path, create=False):
            self.tree.unlink(path)

    def clear(self) -> None:
        parent = Tree(self.root.parent)
        try:
            parent.remove_tree(self.root.name)  # links inside are removed, never followed
        except FileNotFoundError:
            pass
        finally:
            parent.close()

    @contextlib.contextmanager
    def _writing(self, path: str, create: bool = True) -> Iterator[None]:
        try:
            with self._errors("write" if create else "remove", path):
                yield
        except Unreadable as exc:
            raise RemoteError(f"cannot write {self.root / path}: it {exc.message}; trtflow writes only inside "
                              f"{self.root}", hint="remove the link from the remote directory") from None


def _why(exc: Refused, root: Path, path: str) -> str:
    """What a refused remote entry is, in the words of `Unreadable` (the caller names the entry)."""
    if exc.path != root / path:  # a folder on the way
        try:
            walked = exc.path.relative_to(root).as_posix()
        except ValueError:
            walked = str(exc.path)
        kind = "a symbolic link" if exc.why.startswith("is a symbolic link") else "something that is not a folder"
        return f"lies under {kind} ({walked})"
    if exc.why.startswith("is a symbolic link"):
        return "is not a regular file (a symbolic link)"
    if exc.why.startswith("is not a regular file"):
        return "is not a regular file (a pipe, a device or a folder)"
    return exc.why
