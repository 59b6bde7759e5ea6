"""`Tree`: a folder opened once, with everything the confined layer does below it (`walking`, `reading`,
`writing`, `changing`, `locking`, `database`), and the helpers that make one from a path.

Which functions other code calls: `Tree` (``read_bytes``, ``open_read``, ``write_bytes``,
``copy_in``, ``create``, ``append``, ``unlink``, ``remove_tree``, ``chmod``, ``mkdir``, ``listdir``, ``stat``,
``rename``, ``link``, ``subtree``, ``lock``, ``open_lock``, ``open_append_fd``), `locate`, `tail_of`, `as_tree`,
`private_folder`; `names.check_name`, `names.check_relative`, `names.is_plain_name`, `names.Refused`; `kinds`.
"""

from __future__ import annotations

from pathlib import Path

from trtflow.storage.confined.changing import Changing
from trtflow.storage.confined.database import Database
from trtflow.storage.confined.locking import Locking
from trtflow.storage.confined.names import Refused, check_name, check_relative
from trtflow.storage.confined.reading import Reading


class Tree(Reading, Database, Changing, Locking):
    """A folder opened once; every path below it walked without following links (see `walking`).

    ``path``: the folder (shown in messages; made absolute). ``follow_root``: whether the folder's own last
    component may be a link (True when the user named it). The folder is opened on first use (and created by
    `ensure`); operations on a tree whose folder does not exist raise FileNotFoundError.
    """


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
    """A new folder of this process's own in the system's temporary folder (a Ray worker's work space), held from
    its creation: opened right after ``mkdtemp`` without following a link, and checked to be this user's."""
    import os
    import stat
    import tempfile

    from trtflow.storage.confined.walking import DIR_FLAGS

    path = tempfile.mkdtemp(prefix=prefix)
    fd = os.open(path, DIR_FLAGS)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        os.close(fd)
        raise Refused(path, "was replaced right after trtflow made it (another process is writing there)")
    return Tree.of_fd(fd, Path(path))


def as_tree(folder: Path | str | Tree) -> Tree:
    """``folder`` as a `Tree` (a path is opened as one, its own links followed: the caller's choice)."""
    return folder if isinstance(folder, Tree) else Tree(folder)

