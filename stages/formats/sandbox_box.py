"""The confined child's box, held by descriptors from its creation (`confinement.run` uses it).

The box (an empty folder under a folder the caller holds open), the child's log beside it, and every file taken
back from the box are created, opened and removed through descriptors, never walked again by name: a second
writer swapping the box, its log or a folder inside it for a link cannot make trtflow write, truncate or read
anything outside (links are never followed; a file taken back must be plain, with one link).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from trtflow.stage import StageFailed

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_folder(path: Path) -> int:
    """A new descriptor of the folder ``path``, its last component not followed if it is a link. A path through a
    descriptor this process holds (``/proc/self/fd/<n>/...`` or ``/proc/<this pid>/fd/<n>/...``, as the runner
    hands a node its scratch folder) starts from that descriptor itself and walks the rest without links, so the
    folder is the one held, whatever its name in the store now is."""
    parts = Path(path).parts
    if len(parts) >= 5 and parts[:2] == ("/", "proc") and parts[2] in ("self", str(os.getpid())) \
            and parts[3] == "fd" and parts[4].isdigit():
        fd = os.dup(int(parts[4]))
        try:
            for part in parts[5:]:
                nxt = os.open(part, OPEN_DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd
    return os.open(path, OPEN_DIR)


def fresh_box(parent: int, name: str) -> int:
    """An empty folder ``name`` under ``parent`` (what was there removed without following links), opened."""
    remove(parent, name)
    os.mkdir(name, 0o700, dir_fd=parent)
    fd = os.open(name, OPEN_DIR, dir_fd=parent)
    try:
        if os.listdir(fd):
            raise StageFailed(f"the confined child's folder {name} was not empty when made: another process "
                              "writes into this scratch folder", hint="run one trtflow per scratch folder")
        for sub in ("home", "tmp", "cache"):
            os.mkdir(sub, 0o700, dir_fd=fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove(parent: int, name: str) -> None:
    import shutil
    import stat

    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=parent)  # descriptor-based, never follows a link
    else:
        os.unlink(name, dir_fd=parent)


def fresh_file(parent: int, name: str) -> int:
    """A new empty file ``name`` under ``parent``, opened for writing (whatever was there removed, not followed)."""
    remove(parent, name)
    return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)


def tail(fd: int, limit: int) -> str:
    """The end of the log the parent holds open (the child's output)."""
    size = os.fstat(fd).st_size
    return os.pread(fd, limit, max(0, size - limit)).decode("utf-8", "replace").strip()


def open_plain(box_fd: int, name: str) -> int:
    """``name`` (relative, ``/``-separated) in the box, opened one component at a time, no link followed: a plain
    file with one link (the child made it; it could have pointed a link or a hard link at a file it may not read)."""
    import stat

    *folders, last = name.split("/")
    at, opened = box_fd, []
    try:
        for folder in folders:
            if folder in ("", ".", ".."):
                raise OSError(errno.EINVAL, f"{name} is not a plain name in the box")
            at = os.open(folder, OPEN_DIR, dir_fd=at)
            opened.append(at)
        fd = os.open(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=at)
    finally:
        for folder_fd in opened:
            os.close(folder_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EINVAL, f"{name} is something other than a plain file")
    return fd


def read_plain(box_fd: int, name: str, limit: int) -> bytes:
    fd = open_plain(box_fd, name)
    try:
        if os.fstat(fd).st_size > limit:
            raise OSError(errno.EFBIG, f"{name} is larger than {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


def take(box_fd: int, name: str, target: Path) -> None:
    """Copy the child's file ``name`` (through the box's descriptor) to ``target`` (outside its box)."""
    import shutil

    try:
        fd = open_plain(box_fd, name)
    except OSError as error:
        raise StageFailed(f"the confined conversion left no plain {name}: {error.strerror}") from error
    with os.fdopen(fd, "rb") as f:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise StageFailed(f"cannot write {target}: {error.strerror}",
                              hint="another process put a link or a folder there; remove it") from error
        with os.fdopen(out, "wb") as copy:
            shutil.copyfileobj(f, copy, 1 << 20)
