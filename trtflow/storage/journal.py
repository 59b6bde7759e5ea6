"""SQLite journal: runs, node states and timings (for status, show and reports), the history of measured figures
(`trtflow history`), the file-hash stat cache, and the index of the module sets `python:` code was recorded
importing (by pre-key, see `plan`).

The journal is history, not truth: objects, manifests and refs are. So every SQLite failure becomes a
`StoreError` that says what happened and what to do (a damaged journal is reset by `trtflow verify --fix`
without losing a stored result), read-only stores are opened read-only for the commands that only read, and
the stat cache and the module-set index (optimisations: losing them costs re-hashing and rebuilds, never a wrong
reuse) never fail a command.

The journal file may come with a cloned repository or a shared store, so it is opened only as a regular file
that is not a link and has one link (and so are its ``-wal``, ``-shm`` and ``-journal`` companions, which SQLite
opens by name), in the store's real folder (`Tree`); after SQLite opened it, the file it opened is
checked to be that one. A database that is not a trtflow journal (other tables, views or triggers, another
``application_id``) is refused, never written into; schema code never runs with side effects
(``trusted_schema=OFF``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trtflow.errors import StoreBusy, StoreError
from trtflow.storage import records
from trtflow.storage.confined.names import Refused, check_name
from trtflow.storage.confined.tree import Tree

log = logging.getLogger("trtflow.storage")
FORMAT = 3  # PRAGMA user_version; 0 = the first release's journal (no recipe_id column); 3: ctime in the stat cache
APPLICATION_ID = int.from_bytes(b"TRTF", "big")  # PRAGMA application_id of a trtflow journal
COMPANIONS = ("-wal", "-shm", "-journal")
#: What a trtflow journal may hold (older ones have no application_id): anything else is someone else's database.
OWN_OBJECTS = {("table", "runs"), ("table", "node_runs"), ("table", "stat_cache"), ("table", "history"),
               ("table", "dep_sets"), ("index", "node_runs_node"), ("index", "history_series"),
               ("index", "sqlite_autoindex_runs_1"), ("index", "sqlite_autoindex_node_runs_1"),
               ("index", "sqlite_autoindex_stat_cache_1"), ("index", "sqlite_autoindex_history_1"),
               ("index", "sqlite_autoindex_dep_sets_1")}

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, recipe TEXT, recipe_path TEXT, started REAL, ended REAL,
    status TEXT, command TEXT, pid INTEGER, host TEXT, recipe_id TEXT
);
CREATE TABLE IF NOT EXISTS node_runs (
    run_id TEXT, node TEXT, stage TEXT, key TEXT, status TEXT, reason TEXT,
    started REAL, ended REAL, duration REAL, log_path TEXT, error TEXT, summary TEXT, peak_rss INTEGER,
    PRIMARY KEY (run_id, node)
);
CREATE INDEX IF NOT EXISTS node_runs_node ON node_runs(node, started);
CREATE TABLE IF NOT EXISTS history (
    recipe_id TEXT, node TEXT, figure TEXT, measurement TEXT, run_id TEXT, recorded REAL, stage TEXT, key TEXT,
    value REAL, low REAL, high REAL, n INTEGER, unit TEXT, better TEXT, is_primary INTEGER, facts TEXT,
    context TEXT,
    PRIMARY KEY (recipe_id, node, figure, measurement)
);
CREATE INDEX IF NOT EXISTS history_series ON history(recipe_id, node, figure, recorded);
CREATE TABLE IF NOT EXISTS stat_cache (
    path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, ctime_ns INTEGER, inode INTEGER, digest TEXT
);
CREATE TABLE IF NOT EXISTS dep_sets (
    pre TEXT, deps TEXT, used REAL, PRIMARY KEY (pre, deps)
);
"""
DEP_SETS_TRIED = 64  # the module sets the planner tries per pre-key, most recently used first

#: The record each table's rows are checked as, and the cap of each column in bytes (`records.COLUMN_CAP` else).
ROW_KINDS = {"runs": records.RUN_ROW, "node_runs": records.NODE_ROW, "history": records.HISTORY_ROW}
CAPS = {"summary": records.SUMMARY_CAP, "error": records.MiB, "deps": records.DEP_SET.limits.bytes}

_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

DAMAGED_HINT = ("run `trtflow verify --fix` to reset it; stored results (objects, manifests, refs) are kept: "
                "the journal only holds the history of runs")


class JournalDamaged(StoreError):
    """The journal file is not a readable SQLite database."""


class StoreReadOnly(StoreError):
    """The store cannot be written (read-only mount or permissions)."""


class StoreFull(StoreError):
    """The disk holding the store is full."""


class JournalRefused(StoreError):
    """The journal's file is a link, not a regular file, or a database that is not a trtflow journal."""


def translate(exc: sqlite3.Error, path: Path, doing: str) -> StoreError:
    """The `StoreError` a user should see for an SQLite failure while ``doing`` something."""
    text = str(exc)
    lowered = text.lower()
    store = path.parent
    if isinstance(exc, sqlite3.DatabaseError) and any(
            s in lowered for s in ("not a database", "malformed", "file is encrypted", "schema")):
        return JournalDamaged(f"the journal {path} is damaged ({text}) while {doing}", hint=DAMAGED_HINT)
    if "locked" in lowered or "busy" in lowered:
        return StoreBusy(f"the journal {path} is locked by another process while {doing} ({text})")
    if "full" in lowered or "disk i/o" in lowered or "no space" in lowered:
        return StoreFull(f"no space left on the disk holding the store {store} while {doing} ({text})",
                         hint="free disk space, then run again: finished nodes are kept and the run resumes")
    if "readonly" in lowered or "read-only" in lowered or "unable to open" in lowered:
        return StoreReadOnly(f"the store {store} is not writable ({text}) while {doing}",
                             hint="`plan`, `status`, `show` and `report` work on a read-only store; to run, "
                             "use a writable store (--store / TRTFLOW_STORE)")
    return StoreError(f"the journal {path} failed while {doing}: {text}", hint=DAMAGED_HINT)


class Journal:
    """The run journal. ``readonly=True`` never writes (commands that only read: plan, status, report).

    ``tree``: the store's folder (`Store.tree`); by default the folder of ``path``."""

    def __init__(self, path: Path, readonly: bool = False, tree: Tree | None = None) -> None:
        self.path = Path(path).absolute()
        self.tree = tree if tree is not None else Tree(self.path.parent)
        self.name = check_name(self.path.name, "journal name")
        self.readonly = readonly
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()  # one connection shared by the runner's threads: one statement at a time
        self._said = False  # a journal that cannot be used was reported
        self._known: dict[str, tuple[str, ...]] = {}  # the columns of each table (older journals have fewer)

    # ----- connection
    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            with self.guard("opening the journal"):
                self._conn = self._open_readonly() if self.readonly else self._open_writable()
        return self._conn

    def _check_ours(self, conn: sqlite3.Connection) -> int:
        """Refuse a database that is not a trtflow journal; returns its application_id."""
        conn.execute("PRAGMA trusted_schema = OFF")
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        objects = {(t, n) for t, n in conn.execute("SELECT type, name FROM sqlite_master").fetchall()}
        foreign = objects - OWN_OBJECTS
        if (app not in (0, APPLICATION_ID)) or foreign:
            names = ", ".join(sorted(f"{t} {n}" for t, n in foreign)[:5]) or f"application_id {app}"
            raise JournalRefused(f"the journal file {self.path} is not a trtflow journal (it holds {names}); "
                                 "trtflow does not write into other databases",
                                 hint=f"move {self.path} away (a fresh journal is made), or use another store")
        return int(app)

    def _connect(self, create: bool) -> sqlite3.Connection:
        """The journal's file opened through the store's confined tree (a regular file, not a link, ours)."""
        try:
            if create:
                self.tree.ensure()
            return self.tree.sqlite_connect(self.name, create=create, timeout=60, isolation_level=None,
                                            check_same_thread=False)
        except FileNotFoundError:
            raise sqlite3.OperationalError("unable to open database file") from None
        except Refused as exc:
            raise JournalRefused(f"the journal file {exc.message}", hint=exc.hint) from None
        except OSError as exc:
            raise sqlite3.OperationalError(f"unable to open database file ({exc.strerror or exc})") from None

    def _open_writable(self) -> sqlite3.Connection:
        conn = self._connect(create=True)
        try:
            app = self._check_ours(conn)
            if app != APPLICATION_ID:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > FORMAT:
                raise StoreError(f"the journal {self.path} has format {version}; this trtflow reads format "
                                 f"{FORMAT} and older", hint="upgrade trtflow (pip install -U trtflow)")
            conn.executescript(SCHEMA)
            if version < FORMAT:
                _migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_readonly(self) -> sqlite3.Connection:
        conn = self._connect(create=False)
        try:
            self._check_ours(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        """Turn any SQLite failure inside the block into a `StoreError` that says what to do."""
        with self._lock:
            try:
                yield
            except sqlite3.Error as exc:
                raise translate(exc, self.path, doing) from None

    def _execute(self, doing: str, sql: str, args: Sequence[Any] = ()) -> _Rows | sqlite3.Cursor:
        with self.guard(doing):
            cursor = self.conn.execute(sql, _bound(args))
            if cursor.description is None:
                return cursor
            return _Rows(cursor.description, cursor.fetchall())

    def check(self) -> list[str]:
        """Problems found by SQLite's own integrity check (empty when healthy)."""
        with self.guard("checking the journal"):
            rows = self.conn.execute("PRAGMA integrity_check").fetchall()
        problems = [r[0] for r in rows if r[0] != "ok"]
        return problems

    # ----- runs
    def start_run(self, run_id: str, recipe: str, recipe_path: str, command: str, recipe_id: str = "") -> None:
        self._execute(
            "recording the start of the run",
            "INSERT INTO runs (id, recipe, recipe_path, started, status, command, pid, host, recipe_id) "
            "VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
            (run_id, recipe, recipe_path, time.time(), command, os.getpid(), os.uname().nodename, recipe_id),
        )

    def end_run(self, run_id: str, status: str) -> None:
        self._execute("recording the end of the run", "UPDATE runs SET ended = ?, status = ? WHERE id = ?",
                      (time.time(), status, run_id))

    def node_state(self, run_id: str, node: str, stage: str, key: str | None, status: str, reason: str = "",
                   started: float | None = None, ended: float | None = None, log_path: str | None = None,
                   error: str | None = None, summary: Any = None) -> None:
        duration = (ended - started) if (started is not None and ended is not None) else None
        self._execute(
            f"recording node {node}",
            "INSERT OR REPLACE INTO node_runs (run_id, node, stage, key, status, reason, started, ended, duration,"
            " log_path, error, summary) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, node, stage, key, status, reason, started, ended, duration, log_path, error,
             json.dumps(summary) if summary is not None else None),
        )

    def record_nodes(self, rows: list[tuple[Any, ...]]) -> None:
        """Record many up-to-date nodes in one transaction: (run_id, node, stage, key, status, reason, summary)."""
        if not rows:
            return
        with self.guard("recording up-to-date nodes"):
            self.conn.execute("BEGIN")
            try:
                self.conn.executemany("INSERT OR REPLACE INTO node_runs (run_id, node, stage, key, status, reason, "
                                      "summary) VALUES (?, ?, ?, ?, ?, ?, ?)", [_bound(r) for r in rows])
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def running_runs(self) -> list[tuple[str, int, str]]:
        """(run id, pid, host) of runs recorded as running. A run id becomes a path (``tmp/<run id>``): one that is
        not a plain name (a row planted in a journal that came with a cloned repository) is left out."""
        rows = self._execute("reading running runs", "SELECT id, pid, host FROM runs WHERE status = 'running'")
        return [tuple(r) for r in rows.fetchall() if isinstance(r[0], str) and _RUN_ID.fullmatch(r[0])]

    def mark_dead(self, run_id: str) -> None:
        """Record that a run's process ended without recording its outcome (kill -9, power loss, full disk)."""
        with self.guard("recording a dead run"):
            self.conn.execute("UPDATE runs SET ended = ?, status = 'killed' WHERE id = ?",
                              _bound((time.time(), run_id)))
            self.conn.execute("UPDATE node_runs SET status = 'interrupted', reason = 'the run was killed' "
                              "WHERE run_id = ? AND status = 'running'", _bound((run_id,)))

    def runs(self, limit: int = 10, recipe_id: str | None = None) -> list[dict[str, Any]]:
        query = f"SELECT {self._columns('runs')} FROM runs"
        args: tuple = ()
        if recipe_id:
            query += " WHERE recipe_id = ?"
            args = (recipe_id,)
        query += " ORDER BY started DESC LIMIT ?"
        return self._rows(query, (*args, limit))

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self._rows(f"SELECT {self._columns('runs')} FROM runs WHERE id = ?", (run_id,))
        return rows[0] if rows else None

    def node_runs(self, run_id: str) -> list[dict[str, Any]]:
        return self._rows(f"SELECT {self._columns('node_runs')} FROM node_runs WHERE run_id = ? ORDER BY rowid",
                          (run_id,))

    def last_node_run(self, node: str, recipe_id: str | None = None) -> dict[str, Any] | None:
        query = (f"SELECT {self._columns('node_runs', 'n')} FROM node_runs n JOIN runs r ON r.id = n.run_id "
                 "WHERE n.node = ?"
                 + (" AND r.recipe_id = ?" if recipe_id else "") + " ORDER BY n.started DESC LIMIT 1")
        rows = self._rows(query, (node, recipe_id) if recipe_id else (node,))
        return rows[0] if rows else None

    def last_executed(self, node: str, recipe_id: str | None = None) -> dict[str, Any] | None:
        """The latest run of ``node`` that executed it (done, failed, gate failed or skipped)."""
        query = (f"SELECT {self._columns('node_runs', 'n')} FROM node_runs n JOIN runs r ON r.id = n.run_id "
                 "WHERE n.node = ? AND n.status IN ('done', 'failed', 'gate_failed', 'skipped')"
                 + (" AND r.recipe_id = ?" if recipe_id else "")
                 + " ORDER BY n.started DESC LIMIT 1")
        rows = self._rows(query, (node, recipe_id) if recipe_id else (node,))
        return rows[0] if rows else None

    def built(self, key: str) -> dict[str, Any] | None:
        """The node run that built ``key`` (status done), if the journal still has it."""
        rows = self._rows(f"SELECT {self._columns('node_runs')} FROM node_runs WHERE key = ? AND status = 'done' "
                          "ORDER BY started DESC LIMIT 1", (key,))
        return rows[0] if rows else None

    def run_ids(self) -> list[str]:
        return [r[0] for r in self._execute("listing runs", "SELECT id FROM runs").fetchall()]

    def _rows(self, query: str, args: tuple) -> list[dict[str, Any]]:
        """The rows of ``query`` (one of this class's, over one table: `_columns`), each checked as its table's
        record (`records.RUN_ROW`, ...): a damaged row is left out, with a warning that says the fix."""
        cur = self._execute("reading the journal", query, args)
        cols = [c[0] for c in cur.description]
        found = [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
        table = next((t for t in ROW_KINDS if f"FROM {t} " in query + " "), None)
        if table is None:
            return found
        return records.rows(ROW_KINDS[table], found, f"in {self.path}")

    def _columns(self, table: str, alias: str = "") -> str:
        """The SELECT list of ``table``'s columns this journal has, each value over its cap replaced by a marker
        (`records.sql_capped`): a planted 200 MB summary is never fetched."""
        if table not in self._known:
            with self.guard("reading the journal"):
                names = tuple(r[1] for r in self.conn.execute(f"PRAGMA table_info({table})").fetchall())
            self._known[table] = tuple(n for n in names if isinstance(n, str) and n.isidentifier())
        return records.sql_capped(self._known[table], alias, CAPS)

    def damaged_rows(self) -> list[str]:
        """What is damaged among the journal's rows (runs, node runs and their summaries, history rows), for
        `trtflow verify`: each problem said once, at most 20."""
        problems: list[str] = []
        for table, kind in ROW_KINDS.items():
            if not self._has_table(table):
                continue
            cur = self._execute("checking the journal", f"SELECT {self._columns(table)} FROM {table}")
            cols = [c[0] for c in cur.description]
            for row in cur.fetchall():
                value = dict(zip(cols, row, strict=True))
                try:
                    records.check(kind, value, f"row of {table}")
                    if table == "node_runs" and value.get("summary"):
                        records.parse(records.NODE_SUMMARY, value["summary"], f"of node {value.get('node')!r}")
                    if table == "history":
                        for column in ("facts", "context"):
                            if value.get(column):
                                records.parse(records.FIGURE_FACTS, value[column], f"{column} of a history row")
                except records.Damaged as exc:
                    problems.append(exc.message)
                if len(problems) >= 20:
                    return problems
        return problems

    def peak_rss(self, node: str, recipe_id: str) -> int | None:
        """The largest peak memory a run of this recipe file measured for ``node`` (for memory-aware scheduling)."""
        rows = self._rows("SELECT max(n.peak_rss) AS peak FROM node_runs n JOIN runs r ON r.id = n.run_id "
                          "WHERE n.node = ? AND r.recipe_id = ? AND typeof(n.peak_rss) = 'integer'", (node, recipe_id))
        peak = rows[0]["peak"] if rows else None
        return peak if isinstance(peak, int) and peak > 0 else None

    def set_peak_rss(self, run_id: str, node: str, peak: int) -> None:
        self._execute(f"recording the memory of node {node}",
                      "UPDATE node_runs SET peak_rss = ? WHERE run_id = ? AND node = ?", (peak, run_id, node))

    # ----- history: one row per (recipe file, node, figure, measurement); a reused result adds nothing
    HISTORY_COLUMNS = ("recipe_id", "node", "figure", "measurement", "run_id", "recorded", "stage", "key", "value",
                       "low", "high", "n", "unit", "better", "is_primary", "facts", "context")

    def add_history(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Record figures (`HISTORY_COLUMNS`; ``facts``/``context`` as JSON text), in one transaction; a row of a
        measurement already recorded is kept as it was. Returns how many rows were new."""
        if not rows:
            return 0
        columns = self.HISTORY_COLUMNS
        sql = (f"INSERT OR IGNORE INTO history ({', '.join(columns)}) "
               f"VALUES ({', '.join('?' for _ in columns)})")
        with self.guard("recording the history of figures"):
            self.conn.execute("BEGIN")
            try:
                before = self.conn.total_changes
                self.conn.executemany(sql, [_bound([row.get(c) for c in columns]) for row in rows])
                added = self.conn.total_changes - before
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        return added

    def history(self, recipe_id: str, nodes: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The recorded figures of a recipe file (of ``nodes`` only, if given), oldest first. A journal written
        before the history existed has none."""
        if not self._has_table("history"):
            return []
        query = f"SELECT {self._columns('history')} FROM history WHERE recipe_id = ?"
        args: tuple = (recipe_id,)
        if nodes:
            query += f" AND node IN ({', '.join('?' for _ in nodes)})"
            args += tuple(nodes)
        return self._rows(query + " ORDER BY recorded, rowid", args)

    def _has_table(self, name: str) -> bool:
        rows = self._execute("reading the journal", "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                             (name,))
        return bool(rows.fetchall())

    # ----- stat cache (fingerprint.StatCache protocol): an optimisation, so it never fails a command
    def get(self, path: str, sig: tuple[int, int, int, int]) -> str | None:
        """The digest recorded for ``path`` if its signature (size, mtime, ctime, inode) is still ``sig``."""
        try:
            with self._lock:
                row = self.conn.execute("SELECT size, mtime_ns, ctime_ns, inode, digest FROM stat_cache "
                                        "WHERE path = ?", _bound((path,))).fetchone()
        except sqlite3.Error:
            return None
        except StoreError as exc:
            if not self._said:
                self._said = True
                log.warning("the journal cannot be used, so files are hashed again: %s", exc.message)
            return None
        if row and tuple(row[:4]) == tuple(sig) and isinstance(row[4], str) and row[4].isalnum():
            return row[4]
        return None

    def put(self, path: str, sig: tuple[int, int, int, int], digest: str) -> None:
        if self.readonly:
            return
        size, mtime_ns, ctime_ns, inode = sig
        try:
            with self._lock:
                self.conn.execute("INSERT OR REPLACE INTO stat_cache (path, size, mtime_ns, ctime_ns, inode, digest) "
                                  "VALUES (?, ?, ?, ?, ?, ?)", _bound((path, size, mtime_ns, ctime_ns, inode, digest)))
        except (sqlite3.Error, StoreError):
            return


    # ----- module sets recorded by pre-key (keys.DepIndex protocol): an optimisation, so it never fails a command
    def dep_sets(self, pre: str) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """The module sets recorded for ``pre``, most recently used first: (file labels, empty slot labels)."""
        try:
            with self._lock:
                rows = self.conn.execute(f"SELECT {records.sql_capped(('deps',), caps=CAPS)} FROM dep_sets "
                                         "WHERE pre = ? ORDER BY used DESC LIMIT ?",
                                         _bound((pre, DEP_SETS_TRIED))).fetchall()
        except (sqlite3.Error, StoreError):
            return []
        found = []
        for (text,) in rows:
            try:
                files, absent = records.parse(records.DEP_SET, text if isinstance(text, str) else "", str(self.path))
            except records.Damaged:
                continue
            found.append((tuple(files), tuple(absent)))
        return found

    def note_dep_set(self, pre: str, deps: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
        """Record that a result under ``pre`` was made (or used) with the module set ``deps``."""
        if self.readonly:
            return
        try:
            with self._lock:
                self.conn.execute("INSERT OR REPLACE INTO dep_sets (pre, deps, used) VALUES (?, ?, ?)",
                                  _bound((pre, json.dumps([list(deps[0]), list(deps[1])]), time.time())))
        except (sqlite3.Error, StoreError):
            return


class _Rows:
    """A fetched result that outlives the lock it was read under (a cursor would not)."""

    def __init__(self, description: Any, rows: list[Any]) -> None:
        self.description = description
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring an older journal to FORMAT (add columns; history rows are kept)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)").fetchall()}
    if "recipe_id" not in columns:
        conn.execute("ALTER TABLE runs ADD COLUMN recipe_id TEXT")
    node_columns = {row[1] for row in conn.execute("PRAGMA table_info(node_runs)").fetchall()}
    if "peak_rss" not in node_columns:
        conn.execute("ALTER TABLE node_runs ADD COLUMN peak_rss INTEGER")
    cache_columns = {row[1] for row in conn.execute("PRAGMA table_info(stat_cache)").fetchall()}
    if "ctime_ns" not in cache_columns:  # entries without a ctime cannot tell a restored mtime: start afresh
        conn.execute("DROP TABLE stat_cache")
        conn.executescript(SCHEMA)
    conn.execute(f"PRAGMA user_version = {FORMAT}")


def reset(tree: Tree, name: str = "trtflow.db") -> Path | None:
    """Move a damaged (or foreign, or planted) journal aside, companions too, keeping it for inspection, so a fresh
    one is created; returns where. A link is moved as the link it is, never followed."""
    if tree.stat(name) is None:
        return None
    aside = f"{name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    tree.rename(name, aside)
    for suffix in COMPANIONS:
        if tree.stat(name + suffix) is not None:
            tree.rename(name + suffix, aside + suffix)
    return tree.shown(aside)


def _bound(values: Sequence[Any]) -> tuple[Any, ...]:
    """The parameters of a statement as SQLite can take them: every statement of this module binds through here
    (tests/storage/test_journal_text.py fails on one that does not)."""
    return tuple(_storable(v) for v in values)


def _storable(value: Any) -> Any:
    """``value`` as SQLite can store it: text with a file name's undecodable bytes (``os.fsdecode``'s surrogates,
    which UTF-8 cannot encode) keeps them as backslash escapes (``\\udc90``) instead of failing the write, and a
    path looked up in the stat cache is escaped the same way (its signature, inode included, still decides)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
