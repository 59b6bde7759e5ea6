"""Every file trtflow touches under the store and under build/ is touched here, and only here.

The store (``.trtflow`` or ``$TRTFLOW_STORE``) and the output folder (``build/``) may come from elsewhere: a cloned
repository can carry both, and a shared store or a remote cache folder is written by others. So trtflow acts there
only within these rules, each enforced by this module (and no other module opens those paths: see
``tests/reliability/test_confined.py``):

- A `Tree` is a folder opened once. Every path below it is walked from that descriptor one folder at a time with
  ``O_NOFOLLOW | O_DIRECTORY`` (``openat``), so a symbolic link anywhere below the root stops the walk with
  `Refused`, and a folder renamed or swapped during the walk cannot lead it elsewhere. The root itself may be a
  link when the user named it (``--store``, ``TRTFLOW_STORE``, ``--output-dir``); a root found by default in the
  working folder (``.trtflow``, ``build``) may not (``follow_root=False``).
- A file is read only if it is a regular file (``fstat`` after an ``O_NOFOLLOW | O_NONBLOCK`` open: a named pipe
  never blocks, a device or a socket is refused) and never past the cap of its kind (`Kind`).
- A file is written through a temporary file in the same folder (created with ``O_EXCL | O_NOFOLLOW``), fsynced,
  then renamed over the name: a link in the name's place is replaced, never followed. ``create`` is exclusive.
- A ledger is appended to only when it is a regular file, not a link, with one link, owned by this user
  (`append`); one that is not is moved aside (and said so), and a new one is made with ``O_EXCL``.
- chmod is ``fchmod`` on a descriptor opened without following links; delete is ``unlinkat`` relative to the
  parent's descriptor (a link is removed, never what it points to); a tree is removed without following links.
- Locks are ``flock`` on a descriptor opened here (never truncated, never through a link).
- A name read from a record (a manifest, the build index, a no-op record, refs, journal rows) becomes part of a
  path only after `check_name` / `check_relative`: no ``/`` (for a name), no ``..`` or ``.``, no NUL, no empty
  part, at most 255 bytes per part.

Which functions other code calls: `Tree` (``read_bytes``, ``read_json``, ``open_read``, ``write_bytes``,
``copy_in``, ``create``, ``append``, ``unlink``, ``remove_tree``, ``chmod``, ``mkdir``, ``listdir``, ``stat``,
``rename``, ``link``, ``subtree``, ``lock``, ``open_lock``, ``open_append_fd``), `check_name`, `check_relative`,
`is_plain_name`, `Kind` (the caps), `Refused`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("trtflow.storage")

CHUNK = 1 << 20
NAME_MAX = 255
_OPENING = threading.Lock()
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LOCK = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

MiB = 1 << 20


@dataclass(frozen=True)
class Kind:
    """A kind of file trtflow reads, with the most bytes it reads of one (a larger one is refused, not read)."""

    name: str
    cap: int


MANIFEST = Kind("manifest", 16 * MiB)
PIN = Kind("pin", 16 * MiB)  # pins/: a pinned artifact's digests and the record kept with it
REFS = Kind("refs file", 64 * MiB)  # current.json of a recipe of 50,000 nodes is about 8 MiB
LEDGER = Kind("refs ledger", 256 * MiB)  # history.jsonl, .pending.jsonl (gc trims history)
NOOP_RECORD = Kind("no-op record", 64 * MiB)
FORMAT_FILE = Kind("format file", 64 * 1024)
INDEX = Kind("output index", MiB)
NOTE = Kind("note", 64 * 1024)  # .damaged notes, .missing markers, lock holders, legacy refs
JOB = Kind("job file", 256 * MiB)  # job.json / result.json / native-step notes in a node's scratch space
LOG = Kind("log", 1 << 40)  # logs are read by their tail only
CACHE = Kind("shared cache", 4 << 30)  # a TensorRT timing cache
OBJECT = Kind("stored object", 1 << 50)  # objects are streamed (hashed, copied), never read whole


class Refused(OSError):
    """An entry trtflow will not use: a symbolic link, not a regular file or folder, too large, not ours to
    append to, or a name that would leave its folder. ``message`` names the path and says why."""

    def __init__(self, path: Path | str, why: str, hint: str | None = None) -> None:
        self.path = Path(path)
        self.why = why
        self.hint = hint
        self.message = f"{path} {why}"
        super().__init__(errno.EPERM, self.message)

    def __str__(self) -> str:
        return self.message


# ------------------------------------------------------------------------------------------------ names
def is_plain_name(name: object, max_bytes: int = NAME_MAX) -> bool:
    """A single path component: a non-empty string without '/', NUL or backslash, not '.' or '..', at most
    ``max_bytes`` bytes in UTF-8."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name or "\\" in name:
        return False
    try:
        return len(name.encode("utf-8")) <= max_bytes
    except UnicodeEncodeError:
        return False


def check_name(name: object, what: str = "name", max_bytes: int = NAME_MAX) -> str:
    """``name`` if it is a plain name (`is_plain_name`); raises Refused otherwise."""
    if not is_plain_name(name, max_bytes):
        raise Refused(repr(name)[:300], f"is not a plain {what} (no '/', '..', NUL or backslash, at most "
                      f"{max_bytes} bytes)")
    assert isinstance(name, str)
    return name


def check_relative(path: object, what: str = "path") -> tuple[str, ...]:
    """The parts of a relative POSIX path whose every part is a plain name; raises Refused otherwise."""
    if isinstance(path, (tuple, list)):
        parts = tuple(path)
    elif isinstance(path, str) and path and not path.startswith("/"):
        parts = tuple(path.split("/"))
    else:
        raise Refused(repr(path)[:300], f"is not a relative {what}")
    for part in parts:
        check_name(part, f"part of a {what}")
    return parts


Rel = str | Sequence[str]


def _parts(rel: Rel) -> tuple[str, ...]:
    parts = check_relative(rel)
    if not parts:
        raise Refused(repr(rel), "names no file")
    return parts


# ------------------------------------------------------------------------------------------------ the tree
class Tree:
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

    # ----- the root
    @classmethod
    def of_fd(cls, fd: int, path: Path) -> Tree:
        """A tree over a folder descriptor opened by this module (see `subtree`); it owns the descriptor."""
        tree = cls(path)
        tree._fd = fd
        return tree

    def fd(self) -> int:
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

    def _open_dir(self, folder: int, name: str, shown: Path, create: bool) -> int:
        try:
            return os.open(name, _DIR, dir_fd=folder)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._describe(shown, folder, name) from None
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=folder)
        try:
            return os.open(name, _DIR, dir_fd=folder)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._describe(shown, folder, name) from None
            raise

    @contextlib.contextmanager
    def _folder(self, parts: Sequence[str], create: bool = False) -> Iterator[int]:
        """A descriptor of the folder ``parts`` (the tree's own for no parts), walked without following links."""
        current = self.fd()
        opened = -1
        try:
            for i, part in enumerate(parts):
                inner = self._open_dir(current, part, self.shown(parts[: i + 1]), create)
                if opened >= 0:
                    os.close(opened)
                current = opened = inner
            yield current
        finally:
            if opened >= 0:
                os.close(opened)

    def _file_fd(self, folder: int, name: str, shown: Path, flags: int = _READ) -> tuple[int, os.stat_result]:
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
        parts = _parts(rel)
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
        parts = _parts(rel)
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
        parts = _parts(rel)
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

    # ----- reading
    def read_bytes(self, rel: Rel, kind: Kind) -> bytes:
        """The content of the regular file ``rel``; raises FileNotFoundError, or Refused (a link, not a regular
        file, larger than ``kind``'s cap)."""
        parts = _parts(rel)
        shown = self.shown(parts)
        with self._folder(parts[:-1]) as folder:
            fd, st = self._file_fd(folder, parts[-1], shown)
        try:
            if st.st_size > kind.cap:
                raise Refused(shown, f"has {st.st_size} bytes, more than a {kind.name} may have ({kind.cap})")
            chunks = []
            got = 0
            while got <= kind.cap and (chunk := os.read(fd, min(CHUNK, kind.cap + 1 - got))):
                chunks.append(chunk)
                got += len(chunk)
        finally:
            os.close(fd)
        if got > kind.cap:
            raise Refused(shown, f"has more bytes than a {kind.name} may have ({kind.cap})")
        return b"".join(chunks)

    def read_text(self, rel: Rel, kind: Kind) -> str:
        return self.read_bytes(rel, kind).decode("utf-8", "replace")

    def read_json(self, rel: Rel, kind: Kind) -> Any:
        """The JSON value of ``rel``; raises FileNotFoundError, Refused, or ValueError (not JSON)."""
        return json.loads(self.read_bytes(rel, kind))

    def read_tail(self, rel: Rel, max_bytes: int) -> str:
        """The last ``max_bytes`` of a regular file as text (undecodable bytes replaced)."""
        parts = _parts(rel)
        with self._folder(parts[:-1]) as folder:
            fd, st = self._file_fd(folder, parts[-1], self.shown(parts))
        with os.fdopen(fd, "rb") as f:
            f.seek(max(0, st.st_size - max_bytes))
            return f.read(max_bytes).decode("utf-8", "replace")

    @contextlib.contextmanager
    def open_read(self, rel: Rel) -> Iterator[IO[bytes]]:
        """The regular file ``rel`` open for reading (for streaming: hashing, copying)."""
        parts = _parts(rel)
        with self._folder(parts[:-1]) as folder:
            fd, _ = self._file_fd(folder, parts[-1], self.shown(parts))
        with os.fdopen(fd, "rb") as f:
            yield f

    # ----- writing
    def write_bytes(self, rel: Rel, data: bytes | Callable[[int], None], *, mode: int | None = None,
                    durable: bool = True, parents: bool = True) -> os.stat_result:
        """Replace ``rel`` atomically with ``data`` (bytes, or a function that writes into the descriptor it is
        given): a temporary file in the same folder, fsynced (``durable``), ``fchmod`` to ``mode`` if given,
        renamed over the name. Returns the new file's status."""
        parts = _parts(rel)
        with self._folder(parts[:-1], create=parents) as folder:
            name = parts[-1]
            tmp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
            fd = os.open(tmp, _NEW, 0o666, dir_fd=folder)
            try:
                try:
                    if callable(data):
                        data(fd)
                    else:
                        _write_all(fd, data)
                    if durable:
                        os.fsync(fd)
                    if mode is not None:
                        os.fchmod(fd, mode)
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=folder)
                raise
            if durable:
                with contextlib.suppress(OSError):
                    os.fsync(folder)
            return st

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
        parts = _parts(rel)
        with self._folder(parts[:-1], create=True) as folder:
            try:
                fd = os.open(parts[-1], _NEW, mode, dir_fd=folder)
            except FileExistsError:
                return False
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            return True

    def append(self, rel: Rel, data: bytes, *, durable: bool = True) -> None:
        """Append ``data`` to the ledger ``rel``, made by trtflow: a regular file, not a link, with one link, owned
        by this user. One that is not (a link planted in its place, a pipe, someone else's file) is moved aside
        to ``<name>.refused-<time>`` with a warning, and a new ledger is created exclusively."""
        parts = _parts(rel)
        shown = self.shown(parts)
        with self._folder(parts[:-1], create=True) as folder:
            name = parts[-1]
            fd = self._ledger_fd(folder, name, shown)
            try:
                _write_all(fd, data)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def _ledger_fd(self, folder: int, name: str, shown: Path) -> int:
        for _ in range(3):
            try:
                fd = os.open(name, _NEW | os.O_APPEND, 0o644, dir_fd=folder)
            except FileExistsError:
                pass
            else:
                with contextlib.suppress(OSError):
                    os.fsync(folder)
                return fd
            try:
                fd = os.open(name, _APPEND, dir_fd=folder)
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

    def open_append_fd(self, rel: Rel) -> int:
        """A descriptor appending to the log ``rel`` (created if absent; never a link, pipe or device): for a
        process's output. The caller closes it."""
        parts = _parts(rel)
        with self._folder(parts[:-1], create=True) as folder:
            try:
                fd = os.open(parts[-1], _APPEND | os.O_CREAT, 0o644, dir_fd=folder)
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
            _write_all(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)

    def mkdir(self, rel: Rel) -> None:
        """Make the folder ``rel`` and its missing parents below the tree, all real folders."""
        with self._folder(_parts(rel), create=True):
            pass

    def subtree(self, rel: Rel = (), create: bool = False) -> Tree:
        """A tree over the folder ``rel`` (walked without following links; created when ``create``)."""
        parts = check_relative(rel) if rel else ()
        with self._folder(parts, create=create) as folder:
            return Tree.of_fd(os.dup(folder), self.shown(parts))

    # ----- changing
    def unlink(self, rel: Rel, missing_ok: bool = True) -> bool:
        """Remove the entry ``rel`` (a file or a link; never what a link points to); True if removed. A folder
        whose permissions forbid removing entries and that we own is made writable first."""
        parts = _parts(rel)
        try:
            with self._folder(parts[:-1]) as folder:
                try:
                    os.unlink(parts[-1], dir_fd=folder)
                except PermissionError:
                    _make_writable(folder)
                    os.unlink(parts[-1], dir_fd=folder)
                return True
        except (FileNotFoundError, NotADirectoryError):
            if missing_ok:
                return False
            raise

    def remove_tree(self, rel: Rel) -> bool:
        """Remove ``rel`` whatever it is: a folder with everything in it (links inside removed, never followed),
        a file, or a link; True if something was removed."""
        parts = _parts(rel)
        try:
            with self._folder(parts[:-1]) as folder:
                st = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(parts[-1], dir_fd=folder)
                    return True

                try:
                    shutil.rmtree(parts[-1], dir_fd=folder)
                except PermissionError:
                    self._chmod_tree(folder, parts[-1])
                    shutil.rmtree(parts[-1], dir_fd=folder)
                return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _chmod_tree(self, folder: int, name: str) -> None:
        """Make our folders under ``name`` writable (a read-only folder blocks removing its entries)."""
        fd = os.open(name, _DIR, dir_fd=folder)
        try:
            _make_writable(fd)
            for _top, dirs, _files, top_fd in os.fwalk(dir_fd=fd):
                for d in dirs:
                    with contextlib.suppress(OSError):
                        inner = os.open(d, _DIR, dir_fd=top_fd)
                        try:
                            _make_writable(inner)
                        finally:
                            os.close(inner)
        finally:
            os.close(fd)

    def seal(self, rel: Rel, mode: int) -> None:
        """fsync the regular file ``rel`` and ``fchmod`` it to ``mode`` (an object made read-only before its rename)."""
        parts = _parts(rel)
        with self._folder(parts[:-1]) as folder:
            fd, _ = self._file_fd(folder, parts[-1], self.shown(parts))
        try:
            os.fsync(fd)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def remove_empty_folder(self, rel: Rel) -> None:
        """Remove the empty folder ``rel``; raises OSError if it is not empty (or not a folder)."""
        parts = _parts(rel)
        with self._folder(parts[:-1]) as folder:
            os.rmdir(parts[-1], dir_fd=folder)

    def chmod(self, rel: Rel, mode: int) -> None:
        """``fchmod`` the regular file or folder ``rel`` (a link is refused, never followed)."""
        parts = _parts(rel)
        with self._folder(parts[:-1]) as folder:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO):
                    raise self._not_regular(self.shown(parts), folder, parts[-1]) from None
                raise
            try:
                st = os.fstat(fd)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                    raise self._not_regular(self.shown(parts), folder, parts[-1])
                os.fchmod(fd, mode)
            finally:
                os.close(fd)

    def fsync_folder(self, rel: Rel = ()) -> None:
        """fsync the folder ``rel`` (a rename or a new name in it made durable); best effort."""
        parts = check_relative(rel) if rel else ()
        with contextlib.suppress(OSError), self._folder(parts) as folder:
            os.fsync(folder)

    def rename(self, source: Rel, target: Rel, *, durable: bool = False, parents: bool = True) -> None:
        """Rename ``source`` to ``target`` (both below this tree), replacing a target file or link."""
        src, dst = _parts(source), _parts(target)
        with self._folder(src[:-1]) as sfolder, self._folder(dst[:-1], create=parents) as dfolder:
            os.replace(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder)
            if durable:
                with contextlib.suppress(OSError):
                    os.fsync(dfolder)

    def move_to(self, source: Rel, other: Tree, target: Rel) -> None:
        """Rename ``source`` of this tree to ``target`` of ``other`` (the same file system)."""
        src, dst = _parts(source), _parts(target)
        with self._folder(src[:-1]) as sfolder, other._folder(dst[:-1], create=True) as dfolder:
            os.replace(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder)

    def link(self, source: Rel, target: Rel) -> None:
        """Hard-link the regular file ``source`` to the new name ``target`` (both below this tree)."""
        src, dst = _parts(source), _parts(target)
        with self._folder(src[:-1]) as sfolder, self._folder(dst[:-1], create=True) as dfolder:
            fd, _ = self._file_fd(sfolder, src[-1], self.shown(src))
            os.close(fd)
            os.link(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder, follow_symlinks=False)

    def publish(self, staged: Rel, target: Rel) -> bool:
        """Give the staged file ``staged`` the name ``target`` unless that name exists (a hard link, which fails
        if it does; a file system without hard links: check, then rename); True if this call named it."""
        src, dst = _parts(staged), _parts(target)
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
            fd = os.open(name, _NEW, 0o666, dir_fd=folder)
            try:
                yield name, fd
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=folder)

    # ----- SQLite
    def sqlite_connect(self, name: str, *, create: bool, **kwargs: Any) -> Any:
        """A SQLite connection to the database ``name`` in this folder, opened only as a regular file that is not a
        link and has one link, and so are its ``-wal``, ``-shm`` and ``-journal`` companions (SQLite opens them by
        name); created empty and exclusively when absent and ``create``. After SQLite opened it, the file it
        opened is checked to be the one that was checked (a link put in its place meanwhile is refused: the
        ``nofollow`` SQLite's Python module does not offer). Read-only when not ``create``: ``mode=ro``, or
        ``immutable=1`` where a read-only mount cannot take the shared-memory file. Raises FileNotFoundError
        (absent and not ``create``), Refused, or sqlite3.Error."""
        import sqlite3

        check_name(name, "database name")
        checked = self._sqlite_files(name)
        if checked is None:
            if not create:
                raise FileNotFoundError(str(self.shown(name)))
            self.create(name, b"")  # exclusive, never through a link: SQLite fills the empty file
            checked = self._sqlite_files(name)
        path = self.shown(name)
        if create:
            conn = sqlite3.connect(str(path), **kwargs)
        else:
            uri = path.as_uri()
            try:
                conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, **kwargs)
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError:
                conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, **{k: v for k, v in kwargs.items()
                                                                           if k != "timeout"})
        try:
            now = self._sqlite_files(name)
            try:
                followed = os.stat(path)
            except OSError:
                followed = None
            same = (now is not None and followed is not None and checked is not None
                    and (followed.st_dev, followed.st_ino) == (now.st_dev, now.st_ino) == (checked.st_dev,
                                                                                            checked.st_ino))
            if not same:
                raise Refused(path, "changed while trtflow opened it (another process is replacing it)")
        except BaseException:
            conn.close()
            raise
        return conn

    def _sqlite_files(self, name: str) -> os.stat_result | None:
        found = None
        for suffix in ("", "-wal", "-shm", "-journal"):
            st = self.stat(name + suffix)
            if st is None:
                if not suffix:
                    return None
                continue
            shown = self.shown(name + suffix)
            if stat.S_ISLNK(st.st_mode):
                raise Refused(shown, f"is a symbolic link (to {self.readlink(name + suffix)}); trtflow opens only "
                              "its own database, a regular file in the store", hint=f"remove {shown}")
            if not stat.S_ISREG(st.st_mode):
                raise Refused(shown, "is not a regular file", hint=f"remove {shown}")
            if st.st_nlink != 1:
                raise Refused(shown, f"has {st.st_nlink} links (a hard link to another file?); trtflow writes only "
                              "into its own database", hint=f"remove {shown}")
            if not suffix:
                found = st
        return found

    # ----- locks
    def open_lock(self, rel: Rel, read_only_ok: bool = True) -> int:
        """A descriptor to ``flock``: the file ``rel``, created if absent, never truncated, never a link."""
        parts = _parts(rel)
        with self._folder(parts[:-1], create=True) as folder:
            try:
                fd = os.open(parts[-1], _LOCK, 0o666, dir_fd=folder)
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


def locate(path: Path | str, base: Path | str | None = None) -> tuple[Tree, tuple[str, ...]]:
    """A tree and the parts below it of ``path``: below ``base`` (walked without following links) when ``path`` is
    there, else below its own folder (which was made, or checked, through a tree by the caller: a scratch space, a
    log folder handed to another process by its path)."""
    path = Path(path).absolute()
    if base is not None:
        root = Path(base).absolute()
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            parts = ()
        if parts:
            return Tree(root), check_relative(parts)
    return Tree(path.parent), (check_name(path.name),)


def tail_of(path: Path | str, max_bytes: int) -> str:
    """The last ``max_bytes`` of the regular file ``path`` (a log; never a pipe or a device) as text."""
    tree, parts = locate(path)
    try:
        return tree.read_tail(parts, max_bytes)
    finally:
        tree.close()


def private_folder(prefix: str) -> Tree:
    """A new folder of this process's own in the system's temporary folder (a Ray worker's work space)."""
    import tempfile

    return Tree(tempfile.mkdtemp(prefix=prefix))


def as_tree(folder: Path | str | Tree) -> Tree:
    """``folder`` as a `Tree` (a path is opened as one, its own links followed: the caller's choice)."""
    return folder if isinstance(folder, Tree) else Tree(folder)


class Flock:
    """An exclusive ``flock`` on a lock file of a tree (opened by `Tree.open_lock`: never a link, never truncated),
    taken by ``acquire`` and given back by ``release``."""

    def __init__(self, tree: Tree, rel: Rel) -> None:
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


@contextlib.contextmanager
def open_regular(path: Path) -> Iterator[IO[bytes]]:
    """The regular file ``path`` open for reading, its last component not followed: for a file reached just
    before through a `Tree` (a stored object, a node's output) that an API names by its path."""
    fd = os.open(path, _READ)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(path, "is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        yield f


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


def write_all(fd: int, data: bytes) -> None:
    _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _make_writable(folder: int) -> None:
    st = os.fstat(folder)
    if st.st_uid == os.geteuid() and not st.st_mode & stat.S_IWUSR:
        os.fchmod(folder, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)


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
            _write_all(dst, chunk)
            n = len(chunk)
        if n == 0:
            break
        copied += n
    return copied
