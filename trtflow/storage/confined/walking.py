"""A folder opened once, and the walk below it: every path below the folder is walked from its descriptor one
folder at a time with ``O_NOFOLLOW | O_DIRECTORY`` (``openat``), so a symbolic link anywhere below the root stops
the walk with `Refused`, and a folder renamed or swapped during the walk cannot lead it elsewhere. The root itself
may be a link when the user named it (``--store``, ``TRTFLOW_STORE``, ``--output-dir``); a root found by default
in the working folder (``.trtflow``, ``build``) may not (``follow_root=False``). Looking at entries (``stat``,
``listdir``, ``size_of``) is here too; `reading`, `writing`, `changing`, `locking` and `database` build on it."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from trtflow.storage.confined.names import Refused, Rel, check_relative, parts_of

_OPENING = threading.Lock()
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
W = TypeVar("W", bound="Walker")


class Walker:
    """A folder opened once; every path below it walked without following links (see the module's rules).

    ``path``: the folder (shown in messages; made absolute). ``follow_root``: whether the folder's own last
    component may be a link (True when the user named it). The folder is opened on first use (and created by
    `ensure`); operations on a tree whose folder does not exist raise FileNotFoundError.
    """

    def __init__(self, path: Path | str, *, follow_root: bool = True) -> None:
        self.path = Path(path).absolute()
        self.follow_root = follow_root
        self._fd: int | None = None
        self._owned = True
        self._held = False  # a tree over a descriptor (`of_fd`): once closed, never opened again by its path

    # ----- the root
    @classmethod
    def of_fd(cls: type[W], fd: int, path: Path) -> W:
        """A tree over a folder descriptor opened by this module (see `subtree`); it owns the descriptor."""
        tree = cls(path)
        tree._fd = fd
        tree._held = True
        return tree

    def fd(self) -> int:
        if self._fd is None and self._held:
            raise FileNotFoundError(errno.EBADF, "a held folder was let go (it is never opened again by its path)",
                                    str(self.path))
        if self._fd is None:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if self.follow_root else os.O_NOFOLLOW)
            try:
                fd = os.open(self.path, flags)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise self._describe(self.path, None, self.path.name) from None
                raise
            with _OPENING:  # two threads opening it at once keep one descriptor
                if self._fd is None:
                    self._fd = fd
                else:
                    os.close(fd)
        return self._fd

    def exists(self) -> bool:
        try:
            self.fd()
            return True
        except FileNotFoundError:
            return False

    def ensure(self) -> None:
        """Create the folder (and its missing parents, which are the user's) if it does not exist."""
        try:
            self.fd()
            return
        except FileNotFoundError:
            pass
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.path)
        self.fd()

    def close(self) -> None:
        with _OPENING:  # two threads closing at once close the descriptor once (a second close could hit a
            fd, self._fd = self._fd, None  # number the process has given to another file meanwhile)
        if fd is not None and self._owned:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # a descriptor does not travel to another process
        return {"path": self.path, "follow_root": self.follow_root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], follow_root=state["follow_root"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Tree({str(self.path)!r})"

    def shown(self, rel: Rel = ()) -> Path:
        """The path of ``rel`` below the tree, for messages (never opened by that name)."""
        parts = tuple(rel.split("/")) if isinstance(rel, str) else tuple(rel)
        return self.path.joinpath(*parts) if parts else self.path

    # ----- walking
    def _describe(self, shown: Path, folder: int | None, name: str) -> Refused:
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False) if folder is not None else os.lstat(shown)
        except OSError:
            return Refused(shown, "cannot be walked (it changed while trtflow looked at it)")
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=folder) if folder is not None else os.readlink(shown)
            except OSError:
                target = "?"
            return Refused(shown, f"is a symbolic link (to {target}); trtflow reads and writes only real folders "
                           "and files there: remove the link", hint="remove the link")
        return Refused(shown, "is not a folder", hint="remove it")

    def _open_dir(self, folder: int, name: str, parts: Sequence[str], create: bool) -> int:
        """A descriptor of the folder ``name`` in ``folder`` (``parts``: its path below the tree, for messages)."""
        try:
            return os.open(name, DIR_FLAGS, dir_fd=folder)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._describe(self.shown(parts), folder, name) from None
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=folder)
        try:
            return os.open(name, DIR_FLAGS, dir_fd=folder)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._describe(self.shown(parts), folder, name) from None
            raise

    @contextlib.contextmanager
    def _folder(self, parts: Sequence[str], create: bool = False) -> Iterator[int]:
        """A descriptor of the folder ``parts`` (the tree's own for no parts), walked without following links."""
        current = self.fd()
        opened = -1
        try:
            for i, part in enumerate(parts):
                inner = self._open_dir(current, part, parts[: i + 1], create)
                if opened >= 0:
                    os.close(opened)
                current = opened = inner
            yield current
        finally:
            if opened >= 0:
                os.close(opened)

    def _file_fd(self, folder: int, name: str, shown: Path, flags: int = READ_FLAGS) -> tuple[int, os.stat_result]:
        """A descriptor of the regular file ``name`` in ``folder``; raises FileNotFoundError or Refused."""
        try:
            fd = os.open(name, flags, dir_fd=folder)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR, errno.EOPNOTSUPP):
                raise self._not_regular(shown, folder, name) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._not_regular(shown, folder, name)
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def _not_regular(self, shown: Path, folder: int, name: str) -> Refused:
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return Refused(shown, "is not a regular file")
        if stat.S_ISLNK(st.st_mode):
            return self._describe(shown, folder, name)
        what = ("a folder" if stat.S_ISDIR(st.st_mode) else "a named pipe" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        return Refused(shown, f"is not a regular file ({what})", hint="remove it")

    # ----- looking
    def stat(self, rel: Rel) -> os.stat_result | None:
        """The entry's own status (a link is not followed); None if it does not exist."""
        parts = parts_of(rel)
        try:
            with self._folder(parts[:-1]) as folder:
                return os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_dir(self, rel: Rel = ()) -> bool:
        """A real folder (not a link to one)."""
        if not rel:
            return self.exists()
        st = self.stat(rel)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def readlink(self, rel: Rel) -> str:
        """Where the link ``rel`` points (for messages); '?' if it is not a link or cannot be read."""
        parts = parts_of(rel)
        try:
            with self._folder(parts[:-1]) as folder:
                return os.readlink(parts[-1], dir_fd=folder)
        except OSError:
            return "?"

    def listdir(self, rel: Rel = ()) -> list[tuple[str, os.stat_result]]:
        """(name, own status) of every entry of the folder ``rel``, sorted by name; [] if it does not exist."""
        parts = check_relative(rel) if rel else ()
        try:
            with self._folder(parts) as folder:
                found = []
                for name in sorted(os.listdir(folder)):
                    with contextlib.suppress(FileNotFoundError):
                        found.append((name, os.stat(name, dir_fd=folder, follow_symlinks=False)))
                return found
        except (FileNotFoundError, NotADirectoryError):
            return []

    def names(self, rel: Rel = ()) -> list[str]:
        """The names in the folder ``rel``, sorted; [] if it does not exist."""
        parts = check_relative(rel) if rel else ()
        try:
            with self._folder(parts) as folder:
                return sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def size_of(self, rel: Rel) -> int:
        """Bytes of the regular files under ``rel`` (a file or a folder), links not followed."""
        st = self.stat(rel)
        if st is None:
            return 0
        if stat.S_ISREG(st.st_mode):
            return st.st_size
        if not stat.S_ISDIR(st.st_mode):
            return 0
        parts = parts_of(rel)
        total = 0
        try:
            with self._folder(parts) as folder:
                for _top, _dirs, files, top_fd in os.fwalk(dir_fd=folder):
                    for name in files:
                        with contextlib.suppress(OSError):
                            info = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
                            if stat.S_ISREG(info.st_mode):
                                total += info.st_size
        except (OSError, Refused):
            return total
        return total


    def subtree(self: W, rel: Rel = (), create: bool = False) -> W:
        """A tree over the folder ``rel`` (walked without following links; created when ``create``)."""
        parts = check_relative(rel) if rel else ()
        with self._folder(parts, create=create) as folder:
            return type(self).of_fd(os.dup(folder), self.shown(parts))

