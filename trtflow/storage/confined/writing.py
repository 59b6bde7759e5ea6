"""Writing below a tree: a file is written through a temporary file in the same folder (created with ``O_EXCL |
O_NOFOLLOW``), fsynced, then renamed over the name: a link in the name's place is replaced, never followed.
``create`` is exclusive. A ledger is appended to only when it is a regular file, not a link, with one link, owned
by this user (`Writing.append`); one that is not is moved aside (and said so), and a new one is made with
``O_EXCL``."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from trtflow.storage.confined.kinds import CHUNK
from trtflow.storage.confined.names import Refused, Rel, check_relative, parts_of
from trtflow.storage.confined.walking import Walker
from trtflow.userfiles import NEW_FLAGS, write_all, write_in

log = logging.getLogger("trtflow.storage")
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Writing(Walker):
    """The writing half of a `tree.Tree`."""

    def write_bytes(self, rel: Rel, data: bytes | Callable[[int], None], *, mode: int | None = None,
                    durable: bool = True, parents: bool = True) -> os.stat_result:
        """Replace ``rel`` atomically with ``data`` (bytes, or a function that writes into the descriptor it is
        given): a temporary file in the same folder, fsynced (``durable``), ``fchmod`` to ``mode`` if given,
        renamed over the name. Returns the new file's status."""
        parts = parts_of(rel)
        with self._folder(parts[:-1], create=parents) as folder:
            return write_in(folder, parts[-1], data, mode=mode, durable=durable)

    def write_text(self, rel: Rel, text: str, **kwargs: Any) -> os.stat_result:
        return self.write_bytes(rel, text.encode("utf-8"), **kwargs)

    def write_json(self, rel: Rel, value: Any, **kwargs: Any) -> os.stat_result:
        return self.write_bytes(rel, json.dumps(value, indent=1, sort_keys=True).encode("utf-8"), **kwargs)

    def copy_in(self, rel: Rel, source: IO[bytes], *, mode: int | None = None, durable: bool = True,
                limit: int | None = None) -> os.stat_result:
        """Replace ``rel`` atomically with a copy of the open file ``source`` (``copy_file_range`` where the file
        systems offer it: a reflink); at most ``limit`` bytes are copied (Refused past it)."""
        copied = [0]

        def write(fd: int) -> None:
            copied[0] = copy_fd(source.fileno(), fd, None if limit is None else limit + 1)
            if limit is not None and copied[0] > limit:
                raise Refused(self.shown(rel), f"would be larger than {limit} bytes")

        return self.write_bytes(rel, write, mode=mode, durable=durable)

    def create(self, rel: Rel, data: bytes = b"", *, mode: int = 0o644) -> bool:
        """Create ``rel`` with ``data`` unless an entry of that name exists (O_EXCL); True if this call made it."""
        parts = parts_of(rel)
        with self._folder(parts[:-1], create=True) as folder:
            try:
                fd = os.open(parts[-1], NEW_FLAGS, mode, dir_fd=folder)
            except FileExistsError:
                return False
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
            return True

    def append(self, rel: Rel, data: bytes, *, durable: bool = True) -> None:
        """Append ``data`` to the ledger ``rel``, made by trtflow: a regular file, not a link, with one link, owned
        by this user. One that is not (a link planted in its place, a pipe, someone else's file) is moved aside
        to ``<name>.refused-<time>`` with a warning, and a new ledger is created exclusively."""
        parts = parts_of(rel)
        shown = self.shown(parts)
        with self._folder(parts[:-1], create=True) as folder:
            name = parts[-1]
            fd = self._ledger_fd(folder, name, shown)
            try:
                write_all(fd, data)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def _ledger_fd(self, folder: int, name: str, shown: Path) -> int:
        for _ in range(3):
            try:
                fd = os.open(name, NEW_FLAGS | os.O_APPEND, 0o644, dir_fd=folder)
            except FileExistsError:
                pass
            else:
                with contextlib.suppress(OSError):
                    os.fsync(folder)
                return fd
            try:
                fd = os.open(name, APPEND_FLAGS, dir_fd=folder)
            except FileNotFoundError:
                continue  # removed meanwhile: create it
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EACCES, errno.EPERM):
                    raise
                self._set_aside(folder, name, shown, str(self._not_regular(shown, folder, name).why)
                                if exc.errno != errno.EACCES else "is not writable by this user")
                continue
            st = os.fstat(fd)
            problem = ("is not a regular file" if not stat.S_ISREG(st.st_mode)
                       else "has more than one link (a hard link to another file?)" if st.st_nlink != 1
                       else "belongs to another user" if st.st_uid != os.geteuid() else None)
            if problem is None:
                return fd
            os.close(fd)
            self._set_aside(folder, name, shown, problem)
        raise Refused(shown, "keeps being replaced while trtflow appends to it")

    def _set_aside(self, folder: int, name: str, shown: Path, why: str) -> None:
        aside = f"{name}.refused-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        os.rename(name, aside, src_dir_fd=folder, dst_dir_fd=folder)  # a rename never follows a link
        log.warning("%s %s; trtflow appends only to ledgers it made: moved it aside to %s and started a new one",
                    shown, why, aside)

    def open_append_fd(self, rel: Rel, *, readable: bool = False) -> int:
        """A descriptor appending to the log ``rel`` (created if absent; never a link, pipe or device): for a
        process's output; ``readable``: it also reads (``pread``: the log's end read back through it). The caller
        closes it."""
        parts = parts_of(rel)
        flags = (APPEND_FLAGS & ~os.O_WRONLY) | os.O_RDWR if readable else APPEND_FLAGS
        with self._folder(parts[:-1], create=True) as folder:
            try:
                fd = os.open(parts[-1], flags | os.O_CREAT, 0o644, dir_fd=folder)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                    raise self._not_regular(self.shown(parts), folder, parts[-1]) from None
                raise
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise self._not_regular(self.shown(parts), folder, parts[-1])
            os.set_blocking(fd, True)
            return fd

    def append_text(self, rel: Rel, text: str) -> None:
        """Append to a log (not a ledger: no fsync, any owner of a file we may write)."""
        fd = self.open_append_fd(rel)
        try:
            write_all(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)

    def mkdir(self, rel: Rel) -> None:
        """Make the folder ``rel`` and its missing parents below the tree, all real folders."""
        with self._folder(parts_of(rel), create=True):
            pass


    def publish(self, staged: Rel, target: Rel) -> bool:
        """Give the staged file ``staged`` the name ``target`` unless that name exists (a hard link, which fails
        if it does; a file system without hard links: check, then rename); True if this call named it."""
        src, dst = parts_of(staged), parts_of(target)
        with self._folder(src[:-1]) as sfolder, self._folder(dst[:-1], create=True) as dfolder:
            try:
                os.link(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder, follow_symlinks=False)
            except FileExistsError:
                return False
            except OSError:
                try:
                    os.stat(dst[-1], dir_fd=dfolder, follow_symlinks=False)
                    return False
                except FileNotFoundError:
                    os.replace(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder)
            with contextlib.suppress(OSError):
                os.fsync(dfolder)
            return True

    @contextlib.contextmanager
    def staged(self, folder_rel: Rel, prefix: str, mode: int | None = None) -> Iterator[tuple[str, int]]:
        """A new temporary file in the folder ``folder_rel`` (created, real): (its name, a descriptor open for
        writing). The file is removed on the way out unless the caller renamed or linked it away. The descriptor is
        closed here on the way out: the caller never closes it (a second close would close whatever file the
        process opened meanwhile under that number; `tests/reliability/test_confined.py` checks callers)."""
        parts = check_relative(folder_rel) if folder_rel else ()
        with self._folder(parts, create=True) as folder:
            name = f".{prefix[:200]}.{secrets.token_hex(8)}.part"
            fd = os.open(name, NEW_FLAGS, 0o666, dir_fd=folder)
            try:
                yield name, fd
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=folder)


@contextlib.contextmanager
def reopen_for_writing(path: Path) -> Iterator[int]:
    """A descriptor writing the regular file ``path`` from its start (truncated), its last component not followed:
    for a file made just before through a `Tree` (``staged``) that an API names by its path."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(path, "is not a regular file")
        os.ftruncate(fd, 0)
        yield fd
    finally:
        os.close(fd)


def copy_fd(src: int, dst: int, limit: int | None) -> int:
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
            write_all(dst, chunk)
            n = len(chunk)
        if n == 0:
            break
        copied += n
    return copied
