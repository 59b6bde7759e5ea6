"""A SQLite database below a tree (the journal), opened only as a regular file of its own with companions that
are too."""

from __future__ import annotations

import os
import stat
from typing import Any

from trtflow.storage.confined.names import Refused, check_name
from trtflow.storage.confined.writing import Writing


class Database(Writing):
    """The SQLite part of a `tree.Tree`."""

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

