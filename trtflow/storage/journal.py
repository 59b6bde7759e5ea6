"""SQLite journal: runs, node states and timings (for status, show, resume and reports), and a stat cache."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, recipe TEXT, recipe_path TEXT, started REAL, ended REAL,
    status TEXT, command TEXT, pid INTEGER, host TEXT
);
CREATE TABLE IF NOT EXISTS node_runs (
    run_id TEXT, node TEXT, stage TEXT, key TEXT, status TEXT, reason TEXT,
    started REAL, ended REAL, duration REAL, log_path TEXT, error TEXT, summary TEXT,
    PRIMARY KEY (run_id, node)
);
CREATE INDEX IF NOT EXISTS node_runs_node ON node_runs(node, started);
CREATE TABLE IF NOT EXISTS stat_cache (
    path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, inode INTEGER, digest TEXT
);
"""


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(SCHEMA)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ----- runs
    def start_run(self, run_id: str, recipe: str, recipe_path: str, command: str) -> None:
        self.conn.execute(
            "INSERT INTO runs (id, recipe, recipe_path, started, status, command, pid, host) "
            "VALUES (?, ?, ?, ?, 'running', ?, ?, ?)",
            (run_id, recipe, recipe_path, time.time(), command, os.getpid(), os.uname().nodename),
        )

    def end_run(self, run_id: str, status: str) -> None:
        self.conn.execute("UPDATE runs SET ended = ?, status = ? WHERE id = ?", (time.time(), status, run_id))

    def node_state(self, run_id: str, node: str, stage: str, key: str | None, status: str, reason: str = "",
                   started: float | None = None, ended: float | None = None, log_path: str | None = None,
                   error: str | None = None, summary: Any = None) -> None:
        duration = (ended - started) if (started is not None and ended is not None) else None
        self.conn.execute(
            "INSERT OR REPLACE INTO node_runs (run_id, node, stage, key, status, reason, started, ended, duration,"
            " log_path, error, summary) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, node, stage, key, status, reason, started, ended, duration, log_path, error,
             json.dumps(summary) if summary is not None else None),
        )

    def runs(self, limit: int = 10, recipe: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT * FROM runs"
        args: tuple = ()
        if recipe:
            query += " WHERE recipe = ?"
            args = (recipe,)
        query += " ORDER BY started DESC LIMIT ?"
        return self._rows(query, (*args, limit))

    def node_runs(self, run_id: str) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM node_runs WHERE run_id = ? ORDER BY rowid", (run_id,))

    def last_node_run(self, node: str, recipe: str | None = None) -> dict[str, Any] | None:
        query = ("SELECT n.* FROM node_runs n JOIN runs r ON r.id = n.run_id WHERE n.node = ?"
                 + (" AND r.recipe = ?" if recipe else "") + " ORDER BY n.started DESC LIMIT 1")
        rows = self._rows(query, (node, recipe) if recipe else (node,))
        return rows[0] if rows else None

    def last_executed(self, node: str, recipe: str | None = None) -> dict[str, Any] | None:
        query = ("SELECT n.* FROM node_runs n JOIN runs r ON r.id = n.run_id WHERE n.node = ? AND n.status IN "
                 "('done', 'failed', 'gate_failed', 'skipped')" + (" AND r.recipe = ?" if recipe else "")
                 + " ORDER BY n.started DESC LIMIT 1")
        rows = self._rows(query, (node, recipe) if recipe else (node,))
        return rows[0] if rows else None

    def _rows(self, query: str, args: tuple) -> list[dict[str, Any]]:
        cur = self.conn.execute(query, args)
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    # ----- stat cache (fingerprint.StatCache protocol)
    def get(self, path: str, size: int, mtime_ns: int, inode: int) -> str | None:
        row = self.conn.execute("SELECT size, mtime_ns, inode, digest FROM stat_cache WHERE path = ?",
                                (path,)).fetchone()
        if row and row[0] == size and row[1] == mtime_ns and row[2] == inode:
            return row[3]
        return None

    def put(self, path: str, size: int, mtime_ns: int, inode: int, digest: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO stat_cache VALUES (?, ?, ?, ?, ?)",
                          (path, size, mtime_ns, inode, digest))
