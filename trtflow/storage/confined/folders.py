"""The folders trtflow makes for a run and for a node, held as descriptors from the moment they are made.

A store may be shared: another writer of ``tmp/`` or ``logs/`` can rename a run's folder away and put a link to
somewhere else in its place while the run works. So a folder made here is made with ``mkdirat`` below a folder
already held, opened at once with ``O_NOFOLLOW | O_DIRECTORY``, checked to be the folder just made (a real
folder, owned by this user), and from then on reached only through that descriptor: handed down to the node's
process (inherited, or passed over a socket with ``SCM_RIGHTS``), never walked again by its name. What the parent
takes back from a node's folder (its result, its outputs) is read through the descriptor it made the folder
with. A held folder is removed through descriptors: its entries with ``unlinkat`` walks relative to it, then its
own name in its parent only while that name is still the folder held (a link put in its place is left alone).

Libraries that want a path (ONNX, torch, TensorRT write by path) get `fd_path`: ``/proc/<pid>/fd/<n>`` of the
held descriptor. The kernel resolves it to the open folder itself, whatever its name is now, so renaming the
folder or a link in its place cannot redirect it; it holds in the process that holds the descriptor and in its
children (same user, the same ``/proc``).

`RunFolders` holds a run's ``tmp/<run>`` (made private, 0700) and ``logs/<run>``; `NodeFolders` holds one node's
scratch folder (``tmp/<run>/<node>``, 0700) and its log, open for appending.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from trtflow.storage.confined.names import Refused, check_name
from trtflow.storage.confined.tree import Tree
from trtflow.storage.confined.walking import DIR_FLAGS

PRIVATE = 0o700


def fd_path(tree: Tree) -> Path:
    """A path naming the folder ``tree`` holds that no rename or link can redirect: ``/proc/<pid>/fd/<n>``."""
    return Path(f"/proc/{os.getpid()}/fd/{tree.fd()}")


def make_folder(parent: Tree, name: str, mode: int = PRIVATE, *, fresh: bool = True) -> Tree:
    """The folder ``name`` in ``parent``, made now (``fresh``: whatever had the name is removed first, through
    descriptors) and held: a tree over the descriptor opened right after ``mkdirat``, checked to be a real folder
    of this user. Raises Refused when something else keeps taking the name."""
    check_name(name, "folder name")
    shown = parent.shown(name)
    for _ in range(3):
        if fresh:
            parent.remove_tree(name)
        try:
            os.mkdir(name, mode, dir_fd=parent.fd())
        except FileExistsError:
            if fresh:
                continue  # made again meanwhile: remove it again
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent.fd())
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                continue  # swapped between mkdirat and open: try again
            raise
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            if stat.S_IMODE(st.st_mode) & ~mode:
                os.fchmod(fd, mode)  # umask aside, the mode asked for (never more open)
            return Tree.of_fd(fd, shown)
        os.close(fd)
        if not fresh:
            raise Refused(shown, "belongs to another user; trtflow makes its run folders itself",
                          hint=f"remove {shown}")
    raise Refused(shown, "keeps being replaced while trtflow makes it (another process is writing there)")


def discard(parent: Tree, name: str, held: Tree) -> None:
    """Remove the held folder: every entry in it through its descriptor, then ``name`` in ``parent`` only while
    that name is still the held folder. Closes ``held``. Best effort: an entry that cannot be removed stays."""
    try:
        with contextlib.suppress(OSError):
            for entry in held.names():
                with contextlib.suppress(OSError):
                    held.remove_tree(entry)
        with contextlib.suppress(OSError):
            mine = os.fstat(held.fd())
            now = parent.stat(name)
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                parent.remove_empty_folder(name)
    finally:
        held.close()


@dataclass
class NodeFolders:
    """One node's scratch folder and its log, held by the runner while the node runs."""

    scratch: Tree
    log_fd: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.log_fd)
        self.log_fd = -1


class RunFolders:
    """A run's ``tmp/<run>`` and ``logs/<run>`` in the store ``store`` (a tree over the store's root), made and held
    when the first node needs them (a run that builds nothing makes none); the nodes' folders are made below
    them. Safe to use from the run's node threads."""

    def __init__(self, store: Tree, run_id: str) -> None:
        self.run_id = check_name(run_id, "run id")
        self._store = store
        self._lock = threading.Lock()
        self._held: tuple[Tree, Tree, Tree, Tree] | None = None  # tmp/, logs/, tmp/<run>, logs/<run>

    def _folders(self) -> tuple[Tree, Tree, Tree, Tree]:
        with self._lock:
            if self._held is None:
                tmp = self._store.subtree("tmp", create=True)
                logs = self._store.subtree("logs", create=True)
                try:
                    self._held = (tmp, logs, make_folder(tmp, self.run_id),
                                  make_folder(logs, self.run_id, 0o755, fresh=False))
                except BaseException:
                    tmp.close()
                    logs.close()
                    raise
            return self._held

    @property
    def scratch(self) -> Tree:
        """``tmp/<run>``, held."""
        return self._folders()[2]

    @property
    def logs(self) -> Tree:
        """``logs/<run>``, held."""
        return self._folders()[3]

    def node(self, node: str) -> NodeFolders:
        """The node's scratch folder (made afresh, private) and its log (``<node>.log``, appended to)."""
        scratch = make_folder(self.scratch, check_name(node, "node name"))
        try:
            log = self.logs.open_append_fd(check_name(f"{node}.log", "node name"), readable=True)  # its end read back
            return NodeFolders(scratch, log)
        except BaseException:
            scratch.close()
            raise

    def end_node(self, node: str, folders: NodeFolders) -> None:
        """Remove the node's scratch folder (through its descriptor) and close its log."""
        folders.close()
        discard(self.scratch, node, folders.scratch)

    def close(self) -> None:
        """Remove ``tmp/<run>`` (through its descriptor), and ``logs/<run>`` if no node wrote a log there (a run that
        built nothing leaves no log folder for gc to keep), and let the folders go."""
        with self._lock:
            held, self._held = self._held, None
        if held is not None:
            tmp, logs, scratch, run_logs = held
            discard(tmp, self.run_id, scratch)
            try:
                empty = not run_logs.names()
            except OSError:
                empty = False
            if empty:
                discard(logs, self.run_id, run_logs)
            for tree in (run_logs, tmp, logs):
                tree.close()
