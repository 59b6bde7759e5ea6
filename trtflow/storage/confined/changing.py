"""Changing what is below a tree: delete is ``unlinkat`` relative to the parent's descriptor (a link is removed,
never what it points to); a folder is removed by a walk of descriptors that never follows a link; chmod is
``fchmod`` on a descriptor opened without following links; renames and hard links are relative to descriptors of
both folders."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat

from trtflow.storage.confined.names import Rel, check_relative, parts_of
from trtflow.storage.confined.walking import DIR_FLAGS, Walker


class Changing(Walker):
    """The removing, renaming, linking and chmod-ing part of a `tree.Tree`."""

    def unlink(self, rel: Rel, missing_ok: bool = True) -> bool:
        """Remove the entry ``rel`` (a file or a link; never what a link points to); True if removed. A folder
        whose permissions forbid removing entries and that we own is made writable first."""
        parts = parts_of(rel)
        try:
            with self._folder(parts[:-1]) as folder:
                try:
                    os.unlink(parts[-1], dir_fd=folder)
                except PermissionError:
                    make_writable(folder)
                    os.unlink(parts[-1], dir_fd=folder)
                return True
        except (FileNotFoundError, NotADirectoryError):
            if missing_ok:
                return False
            raise

    def remove_tree(self, rel: Rel) -> bool:
        """Remove ``rel`` whatever it is: a folder with everything in it (links inside removed, never followed),
        a file, or a link; True if something was removed."""
        parts = parts_of(rel)
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
        fd = os.open(name, DIR_FLAGS, dir_fd=folder)
        try:
            make_writable(fd)
            for _top, dirs, _files, top_fd in os.fwalk(dir_fd=fd):
                for d in dirs:
                    with contextlib.suppress(OSError):
                        inner = os.open(d, DIR_FLAGS, dir_fd=top_fd)
                        try:
                            make_writable(inner)
                        finally:
                            os.close(inner)
        finally:
            os.close(fd)

    def seal(self, rel: Rel, mode: int) -> None:
        """fsync the regular file ``rel`` and ``fchmod`` it to ``mode`` (an object made read-only before its rename)."""
        parts = parts_of(rel)
        with self._folder(parts[:-1]) as folder:
            fd, _ = self._file_fd(folder, parts[-1], self.shown(parts))
        try:
            os.fsync(fd)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def remove_empty_folder(self, rel: Rel) -> None:
        """Remove the empty folder ``rel``; raises OSError if it is not empty (or not a folder)."""
        parts = parts_of(rel)
        with self._folder(parts[:-1]) as folder:
            os.rmdir(parts[-1], dir_fd=folder)

    def chmod(self, rel: Rel, mode: int) -> None:
        """``fchmod`` the regular file or folder ``rel`` (a link is refused, never followed)."""
        parts = parts_of(rel)
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
        src, dst = parts_of(source), parts_of(target)
        with self._folder(src[:-1]) as sfolder, self._folder(dst[:-1], create=parents) as dfolder:
            os.replace(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder)
            if durable:
                with contextlib.suppress(OSError):
                    os.fsync(dfolder)

    def move_to(self, source: Rel, other: Walker, target: Rel) -> None:
        """Rename ``source`` of this tree to ``target`` of ``other`` (the same file system)."""
        src, dst = parts_of(source), parts_of(target)
        with self._folder(src[:-1]) as sfolder, other._folder(dst[:-1], create=True) as dfolder:
            os.replace(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder)

    def link_into(self, source: Rel, other: Walker, target: Rel) -> None:
        """Hard-link the regular file ``source`` of this tree to the new name ``target`` of ``other`` (a held
        folder on the same file system: a stored object into a node's scratch folder)."""
        src, dst = parts_of(source), parts_of(target)
        with self._folder(src[:-1]) as sfolder, other._folder(dst[:-1], create=True) as dfolder:
            fd, _ = self._file_fd(sfolder, src[-1], self.shown(src))
            os.close(fd)
            os.link(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder, follow_symlinks=False)

    def link(self, source: Rel, target: Rel) -> None:
        """Hard-link the regular file ``source`` to the new name ``target`` (both below this tree)."""
        src, dst = parts_of(source), parts_of(target)
        with self._folder(src[:-1]) as sfolder, self._folder(dst[:-1], create=True) as dfolder:
            fd, _ = self._file_fd(sfolder, src[-1], self.shown(src))
            os.close(fd)
            os.link(src[-1], dst[-1], src_dir_fd=sfolder, dst_dir_fd=dfolder, follow_symlinks=False)



def make_writable(folder: int) -> None:
    st = os.fstat(folder)
    if st.st_uid == os.geteuid() and not st.st_mode & stat.S_IWUSR:
        os.fchmod(folder, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)


