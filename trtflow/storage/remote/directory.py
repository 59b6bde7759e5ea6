"""A remote cache in a folder on a local or network file system (NFS, a CI cache folder).

Other machines write there too, so nothing in it is followed blindly: every path is walked from the root one
folder at a time with ``O_NOFOLLOW`` (a folder that is a symbolic link stops the walk, so nothing is read or
written outside the root), a file is opened without following a link and without blocking (a named pipe), and
only a regular file is read, never more bytes than the caller allows. The root itself may be a link (a share
mounted elsewhere is the user's choice).

Writes are put-if-absent: a complete, synced, read-only temporary file is hard-linked to its name, which fails if
the name exists (a file system without hard links: check, then rename).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

from trtflow.storage.remote.errors import RemoteError, TooLarge, Unreadable
from trtflow.storage.store import READ_ONLY

CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


class DirectoryBackend:
    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url

    def check(self) -> None:
        if not self.root.is_dir():
            what = "is not a directory" if self.root.exists() else "does not exist"
            raise RemoteError(f"the remote cache directory {self.root} {what}",
                              hint=f"create it (mkdir -p {self.root}), or fix --remote / TRTFLOW_REMOTE")

    # ----- walking
    @contextlib.contextmanager
    def _folder(self, path: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """(descriptor of the folder holding ``path``, the file's name), walked without following links."""
        parts = path.split("/")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i, part in enumerate(parts[:-1]):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                try:
                    inner = os.open(part, _DIR, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                        raise Unreadable(f"lies under a symbolic link ({'/'.join(parts[: i + 1])})") from None
                    raise
                os.close(fd)
                fd = inner
            yield fd, parts[-1]
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _open(self, path: str) -> Iterator[tuple[int, os.stat_result]]:
        """A descriptor of the regular file ``path``; raises FileNotFoundError, or Unreadable."""
        with self._folder(path) as (folder, name):
            try:
                fd = os.open(name, _FILE, dir_fd=folder)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise Unreadable("is not a regular file (a symbolic link)") from None
                raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Unreadable("is not a regular file (a pipe, a device or a folder)")
            yield fd, st
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _errors(self, what: str, path: str) -> Iterator[None]:
        try:
            yield
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            hint = ("make the remote directory writable for this user, or use it read-only by not pushing"
                    if isinstance(exc, PermissionError) else None)
            raise RemoteError(f"cannot {what} {self.root / path}: {exc.strerror or exc}", hint=hint) from None

    # ----- reading
    def read(self, path: str, limit: int) -> bytes | None:
        with self._errors("read", path):
            try:
                with self._open(path) as (fd, _):
                    data = b""
                    while len(data) <= limit and (chunk := os.read(fd, min(CHUNK, limit + 1 - len(data)))):
                        data += chunk
            except (FileNotFoundError, NotADirectoryError):
                return None
        if len(data) > limit:
            raise TooLarge(f"is larger than {limit} bytes")
        return data

    def size(self, path: str) -> int | None:
        with self._errors("read", path):
            try:
                with self._folder(path) as (folder, name):
                    st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return None
        if stat.S_ISLNK(st.st_mode):
            raise Unreadable("is not a regular file (a symbolic link)")
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable("is not a regular file (a pipe, a device or a folder)")
        return st.st_size

    def download(self, path: str, dest: Path, limit: int) -> None:
        with self._errors("read", path), self._open(path) as (fd, st), open(dest, "wb") as out:
            if st.st_size > limit:
                raise TooLarge(f"has {st.st_size} bytes, more than {limit}")
            copied = _copy(fd, out.fileno(), limit + 1)
        if copied > limit:
            raise TooLarge(f"has more than {limit} bytes")

    # ----- writing
    def _stage(self, folder: int, name: str, source: Path | bytes) -> str:
        """A complete, synced, read-only copy of ``source`` in ``folder`` under a temporary name."""
        tmp = f".{name}.{uuid.uuid4().hex}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        try:
            if isinstance(source, bytes):
                view = memoryview(source)
                while view:
                    view = view[os.write(fd, view):]
            else:
                with open(source, "rb") as src:
                    _copy(src.fileno(), fd, None)
            os.fsync(fd)
            os.fchmod(fd, READ_ONLY)
        finally:
            os.close(fd)
        return tmp

    def create(self, path: str, source: Path | bytes) -> bool:
        with self._writing(path) as (folder, name):
            tmp = self._stage(folder, name, source)
            try:
                try:
                    os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)  # fails if the name exists
                except FileExistsError:
                    return False
                except OSError:
                    # A filesystem without hard links: check, then rename. Losing that race overwrites the
                    # name with content of the same digest (objects) or an equally valid manifest of the key.
                    try:
                        os.stat(name, dir_fd=folder, follow_symlinks=False)
                        return False
                    except FileNotFoundError:
                        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
                os.fsync(folder)
                return True
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=folder)

    def replace(self, path: str, source: Path | bytes) -> None:
        with self._writing(path) as (folder, name):
            tmp = self._stage(folder, name, source)
            try:
                os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
                os.fsync(folder)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=folder)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError), self._writing(path, create=False) as (folder, name):
            os.unlink(name, dir_fd=folder)

    @contextlib.contextmanager
    def _writing(self, path: str, create: bool = True) -> Iterator[tuple[int, str]]:
        try:
            with self._errors("write" if create else "remove", path), self._folder(path, create) as found:
                yield found
        except Unreadable as exc:
            raise RemoteError(f"cannot write {self.root / path}: it {exc.message}; trtflow writes only inside "
                              f"{self.root}", hint="remove the link from the remote directory") from None


def _is_link(name: str, folder: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _copy(src: int, dst: int, limit: int | None) -> int:
    """Copy from descriptor ``src`` to ``dst`` until the end or ``limit`` bytes; returns the bytes copied."""
    copied = 0
    in_kernel = True
    while limit is None or copied < limit:
        want = CHUNK if limit is None else min(CHUNK, limit - copied)
        n = -1
        if in_kernel:
            try:
                n = os.copy_file_range(src, dst, want)
            except OSError:  # not offered between these file systems: plain reads and writes from here on
                in_kernel = False
        if n < 0:
            chunk = os.read(src, want)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view):]
            n = len(chunk)
        if n == 0:
            break
        copied += n
    return copied
