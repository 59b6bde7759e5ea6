"""One file outside the store and build/, named by its path, and the primitives the store's confined trees
(`trtflow.storage.confined`) use for each file below them: the same rules, one definition.

The files: the project's own (the trust file, a recipe `trtflow init` writes, the schema beside it), the files
named with ``-o`` (provenance, reports, results, a schema), the user's config folder (keys, the user's trust
file), and the model files and configurations a recipe or `trtflow init` reads. A cloned repository may commit
any of them, or a link or a named pipe in their place, so:

- Writing (`write_file`): the target's folder is opened once as a descriptor (the links in the folder's own path
  are followed: the user named it, or it is the project root or the user's config folder); a temporary file with
  a random name is created in that descriptor with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (`write_in`), written,
  fsynced, and renamed over the target's name. The target's last component is never followed: a link in its
  place is replaced by the file, never written through; a planted ``.<name>.<pid>`` (or any name) is never opened.
  ``exclusive``: the file is linked into place only if no entry of that name exists (a key).
- Reading (`read_file`, `open_file`): a regular file only (opened with ``O_NONBLOCK`` and checked with ``fstat``:
  a named pipe never blocks, a device or a socket is refused), never past ``cap`` bytes (`read_bounded`).
  ``follow=False`` (a file trtflow finds by itself: the project's and the user's trust file, the user's keys)
  opens the last component with ``O_NOFOLLOW``: a link there is refused. A file a recipe or `trtflow init` names
  (``follow=True``) was checked first by `trtflow.fsutil.input_path` (inside the project, a regular file or a
  folder). ``owner_only``: the file must be this user's, unreadable by others (a secret).
- The user's key folder (`own_folder`): opened component by component below the configuration folder the user
  named (XDG_CONFIG_HOME or ~/.config), each with ``O_NOFOLLOW | O_DIRECTORY`` (a link there is refused, never
  followed, never chmod-ed), this user's and writable by nobody else (else refused with the fix), made 0700 with
  ``fchmod`` on its descriptor; the files in it are read and written relative to that descriptor.
- What such a file holds is parsed as a typed record (`trtflow.storage.records`, bounded depth, size and type) or,
  for YAML, with its nesting bounded (`load_yaml`).

No other module opens, reads or writes a file: ``tests/reliability/test_file_sites.py`` audits trtflow/ and
stages/ for any other call and allows only named sites, each with its reason. Errors are `Refused` (an OSError
naming the path and why) or the OSError of the call.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
CHUNK = 1 << 20
#: The deepest a YAML document trtflow reads (a trust file) may nest.
YAML_DEPTH = 32


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


NOT_REGULAR = "is not a regular file (a named pipe, a device or a socket)"


def _open_regular(path: Path | str, follow: bool, owner_only: bool, folder: int | None = None,
                  shown: Path | str | None = None) -> tuple[int, os.stat_result]:
    """``path`` open for reading (a name in the folder open as ``folder``, if given); ``shown``: its full path."""
    where = path if shown is None else shown
    try:
        fd = os.open(path, _READ | (0 if follow else os.O_NOFOLLOW), dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise Refused(where, "is a symbolic link (trtflow reads this file only as a regular file, never through "
                          "a link)", hint=f"replace the link by the file itself: cp --remove-destination "
                          f"\"$(readlink -f {where})\" {where}") from None
        if exc.errno == errno.ENXIO:  # a socket
            raise Refused(where, NOT_REGULAR) from None
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(where))
        if not stat.S_ISREG(st.st_mode):
            raise Refused(where, NOT_REGULAR, hint="point at the file itself")
        if owner_only and (st.st_uid != os.geteuid() or st.st_mode & 0o077):
            raise Refused(where, "belongs to another user or may be read by others")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bounded(fd: int, st: os.stat_result, cap: int, shown: Path | str, what: str = "such a file") -> bytes:
    """The bytes of the regular file open as ``fd`` (``st``: its status), at most ``cap``: Refused before reading
    when its size says more, or when more arrives while reading."""
    if st.st_size > cap:
        raise Refused(shown, f"has {st.st_size} bytes, more than {what} may have ({cap})")
    chunks, got = [], 0
    while got <= cap and (chunk := os.read(fd, min(CHUNK, cap + 1 - got))):
        chunks.append(chunk)
        got += len(chunk)
    if got > cap:
        raise Refused(shown, f"has more bytes than {what} may have ({cap})")
    return b"".join(chunks)


def read_file(path: Path | str, cap: int, *, follow: bool = True, owner_only: bool = False,
              folder: int | None = None, shown: Path | str | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``cap``; Refused for a link (``follow=False``), a named pipe,
    a device, a socket, a larger file, or (``owner_only``) a file others may read; FileNotFoundError when absent.
    ``folder``: ``path`` is a name in the folder open as this descriptor (`own_folder`); ``shown``: its full
    path, in messages."""
    fd, st = _open_regular(path, follow, owner_only, folder, shown)
    try:
        return read_bounded(fd, st, cap, path if shown is None else shown)
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_file(path: Path | str, *, follow: bool = True) -> Iterator[IO[bytes]]:
    """The regular file ``path`` open for reading (streamed: hashed, or looked into as a zip archive); Refused as
    by `read_file`."""
    fd, _ = _open_regular(path, follow, False)
    with os.fdopen(fd, "rb") as f:
        yield f


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_in(folder: int, name: str, data: bytes | Callable[[int], None], *, mode: int | None = None,
             durable: bool = True, exclusive: bool = False) -> os.stat_result:
    """Replace ``name`` in the folder open as ``folder`` with ``data`` (bytes, or a function that writes into the
    descriptor it is given): a temporary file of a random name made there with ``O_EXCL | O_NOFOLLOW`` (``fchmod``
    to ``mode`` first, if given), fsynced (``durable``), renamed over ``name`` (never followed) or, ``exclusive``,
    linked to it (FileExistsError if an entry of that name exists). Returns the new file's status."""
    tmp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, NEW_FLAGS, 0o666, dir_fd=folder)
    try:
        try:
            if mode is not None:  # before the content: a key is never readable by others, even for a moment
                os.fchmod(fd, mode)
            if callable(data):
                data(fd)
            else:
                write_all(fd, data)
            if durable:
                os.fsync(fd)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
            os.unlink(tmp, dir_fd=folder)
        else:
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise
    if durable:
        with contextlib.suppress(OSError):
            os.fsync(folder)
    return st


def write_file(path: Path | str, data: bytes | str, *, mode: int | None = None, exclusive: bool = False,
               parents: bool = True) -> None:
    """Write the file ``path`` by the rules above (text as UTF-8): `write_in` in its folder, opened as a descriptor
    (made first with its missing parents when ``parents``)."""
    target = Path(path).absolute()
    name = target.name
    if not name or name in (".", ".."):
        raise Refused(target, "names no file")
    if parents:
        os.makedirs(target.parent, exist_ok=True)
    folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        write_in(folder, name, data.encode("utf-8") if isinstance(data, str) else data, mode=mode,
                 exclusive=exclusive)
    finally:
        os.close(folder)


@contextlib.contextmanager
def own_folder(start: Path, parts: tuple[str, ...], *, create: bool, private_from: int = 0
                   ) -> Iterator[int | None]:
    """The folder ``start/parts...`` open as a descriptor (None when absent and not ``create``): the user's own
    folder below a start the user named (`trtflow.keys.config_base`: XDG_CONFIG_HOME or ~/.config, whose own path
    may hold links: the user chose it). Below ``start`` each component is opened relative to the one above with
    ``O_NOFOLLOW | O_DIRECTORY`` (a link is refused, never followed) and made (``create``, mode 0700) when absent;
    each must belong to this user and be writable by nobody else, or it is `Refused` with the fix; the components
    from index ``private_from`` on are set to mode 0700 through the descriptor (``fchmod``). What is in it is read
    and written relative to the descriptor (`read_file` with ``folder``, `write_in`): no name is followed again."""
    if create:
        os.makedirs(start, exist_ok=True)
    fd: int | None
    try:
        fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        yield None
        return
    try:
        here = Path(start)
        for index, part in enumerate(parts):
            here = here / part
            sub = _open_below(fd, part, here, create)
            os.close(fd)
            fd = sub
            if fd is None:
                break
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                raise Refused(here, f"belongs to another user (uid {st.st_uid}): trtflow keeps this user's keys "
                              "only in a folder of this user", hint=f"move it away (mv {here} {here}.theirs); "
                              "trtflow makes its own")
            if st.st_mode & 0o022:
                raise Refused(here, f"may be written by others (mode {st.st_mode & 0o777:o}): they could replace "
                              "the keys in it", hint=f"chmod go-w {here} (check what is in it first)")
            if index >= private_from and st.st_mode & 0o077:
                os.fchmod(fd, 0o700)
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _open_below(parent: int, name: str, shown: Path, create: bool) -> int | None:
    """The folder ``name`` in the folder open as ``parent``, never through a link (made 0700 when ``create``)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(2):
        try:
            return os.open(name, flags, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            with contextlib.suppress(FileExistsError):  # made meanwhile by another trtflow process: opened next
                os.mkdir(name, 0o700, dir_fd=parent)
        except (NotADirectoryError, OSError) as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise Refused(shown, "is a symbolic link: trtflow keeps the user's keys only in a folder of its "
                              "own, never through a link", hint=f"remove the link (rm {shown}); trtflow makes the "
                              "folder itself") from None
            raise Refused(shown, "is not a folder", hint=f"move it away (mv {shown} {shown}.old)") from None
    raise Refused(shown, "could not be made")


def load_yaml(text: str, shown: Path | str, max_depth: int = YAML_DEPTH) -> Any:
    """The YAML document ``text`` (safe types only) if it nests at most ``max_depth`` deep; Refused (naming
    ``shown``) when deeper, a ``yaml.YAMLError`` when it is not YAML."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise Refused(shown, f"nests deeper than {max_depth} levels") from None
    stack: list[tuple[Any, int]] = [(data, 1)]
    seen: set[int] = set()  # an alias names a value again (or itself): walked once
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)) and id(item) not in seen:
            seen.add(id(item))
            if depth > max_depth:
                raise Refused(shown, f"nests deeper than {max_depth} levels")
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return data
