"""Locks below a tree: ``flock`` on a descriptor opened here (never truncated, never through a link)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator

from trtflow.storage.confined.names import Rel, parts_of
from trtflow.storage.confined.walking import Walker

LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Locking(Walker):
    """The locking part of a `tree.Tree`."""

    def open_lock(self, rel: Rel, read_only_ok: bool = True) -> int:
        """A descriptor to ``flock``: the file ``rel``, created if absent, never truncated, never a link."""
        parts = parts_of(rel)
        with self._folder(parts[:-1], create=True) as folder:
            try:
                fd = os.open(parts[-1], LOCK_FLAGS, 0o666, dir_fd=folder)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                    raise self._not_regular(self.shown(parts), folder, parts[-1]) from None
                if not (read_only_ok and exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM)):
                    raise
                fd, _ = self._file_fd(folder, parts[-1], self.shown(parts))  # a read-only store: flock works too
                return fd
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise self._not_regular(self.shown(parts), folder, parts[-1])
            return fd

    @contextlib.contextmanager
    def lock(self, rel: Rel, timeout: float = float("inf"), poll: float = 0.05,
             cancelled: Callable[[], bool] | None = None) -> Iterator[None]:
        """Hold an exclusive ``flock`` on ``rel`` while the block runs; raises TimeoutError after ``timeout``
        seconds (or as soon as ``cancelled()`` says so)."""
        fd = self.open_lock(rel)
        try:
            if not try_flock(fd, fcntl.LOCK_EX, timeout, poll, cancelled):
                raise TimeoutError(f"{self.shown(rel)} is locked by another process")
            yield
        finally:
            os.close(fd)



class Flock:
    """An exclusive ``flock`` on a lock file of a tree (opened by `Tree.open_lock`: never a link, never truncated),
    taken by ``acquire`` and given back by ``release``."""

    def __init__(self, tree: Locking, rel: Rel) -> None:
        self.path = tree.shown(rel)
        self._fd: int | None = tree.open_lock(rel)

    def acquire(self, timeout: float, cancelled: Callable[[], bool] | None = None) -> bool:
        assert self._fd is not None
        return try_flock(self._fd, fcntl.LOCK_EX, timeout, cancelled=cancelled)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def try_flock(fd: int, flag: int, timeout: float, poll: float = 0.05,
              cancelled: Callable[[], bool] | None = None) -> bool:
    """Take ``flock(flag)`` on ``fd`` within ``timeout`` seconds; False if it could not (or was cancelled)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, flag | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline or (cancelled is not None and cancelled()):
            return False
        time.sleep(poll)


