"""Refs: which stored result each node of each recipe FILE used in its latest runs (gc's roots).

A recipe is identified by its file: its path relative to the project root (``pipelines/quickstart.yaml``), not
by its ``name:``, so two files with the same name (a variant, a copy in another folder) never overwrite each
other's refs. Per recipe file, under ``refs/<slug>/``:
  ``current.json``    node -> {key, run_id, time}: what the latest run of each node used; nodes that are no longer
                      in the recipe are dropped at the next run;
  ``history.jsonl``   one line per update {run_id, time, keys}: what earlier runs used (for gc's retention);
  ``.pending.jsonl``  results used since ``current.json`` was last written: one line appended and fsynced per
                      committed (or reused) node *before* the run reports it (`RefStore.record`), so a run killed
                      right after a commit (kill -9, power loss) never leaves a result that gc may take for
                      garbage. Readers fold these lines over ``current.json``; `RefStore.update` (at the start and
                      the end of a run) folds them into ``current.json`` and ``history.jsonl`` and removes them.
  ``.missing``        {since}: when gc first saw the recipe file missing (its refs are forgotten after a grace).
Every run writes them, a run that finds everything up to date too. Updates are read-merge-write under a
per-recipe lock, so concurrent runs of one recipe never lose each other's refs.

Every file here is read and written through the store's `Tree`: read only when it is a regular file
within its cap, rewritten by temp file and rename, and the ledgers (``history.jsonl``, ``.pending.jsonl``) appended
to only when trtflow made them (`Tree.append`). A line written there is JSON with ``$`` and backquotes escaped
(`ledger_line`): data, never something a shell could run, wherever it ends up.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import StoreError
from trtflow.fingerprint import hash_text
from trtflow.storage import records
from trtflow.storage.confined import kinds
from trtflow.storage.confined.kinds import Kind
from trtflow.storage.confined.names import Refused, check_name, is_plain_name
from trtflow.storage.confined.tree import Tree
from trtflow.storage.manifest import is_key

#: A recipe's refs are rewritten at least this often by runs that change nothing (``updated`` stays meaningful).
REFRESH_SECONDS = 24 * 3600
FORMAT = 2
LEGACY_PREFIX = "legacy-"
PENDING = ".pending.jsonl"  # a dot name: never taken for a first-release (legacy) ref file
HISTORY = "history.jsonl"
CURRENT = "current.json"
MISSING_MARKER = ".missing"  # {"since": time}: when gc first saw the recipe file missing
LOCK = ".lock"
BASE = "refs"
LOCK_TIMEOUT_S = 600.0
log = logging.getLogger("trtflow.storage")


@dataclass(frozen=True)
class RecipeIdentity:
    """A recipe file: ``id`` is its project-relative POSIX path; ``name`` its ``name:``; ``path`` its location."""

    id: str
    name: str
    path: Path


@dataclass
class RecipeRefs:
    folder: Path  # shown in messages; ``slug`` is its name under refs/
    recipe_id: str
    name: str
    path: str | None
    host: str | None
    updated: float
    nodes: dict[str, dict[str, Any]]
    legacy: bool = False
    slug: str = ""

    def keys(self) -> dict[str, str]:
        return {node: entry["key"] for node, entry in self.nodes.items() if isinstance(entry.get("key"), str)}

    def missing_on_this_host(self) -> bool:
        """The recipe file was recorded on this host and no longer exists (deleted or moved)."""
        return bool(self.path and self.host == os.uname().nodename and not Path(self.path).exists())


def slug(recipe_id: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", recipe_id).strip("_")[:80] or "recipe"
    return f"{readable}-{hash_text(recipe_id)[:10]}"


def ledger_line(record: Mapping[str, Any]) -> bytes:
    """One line of a ledger: JSON whose ``$`` and backquotes are escaped (``\\u0024``, ``\\u0060``; the same JSON
    value), so that no shell expands anything in it even if the line were read by one."""
    text = json.dumps(record, ensure_ascii=True).replace("$", "\\u0024").replace("`", "\\u0060")
    return (text + "\n").encode("ascii")


def _jsonl(data: bytes) -> list[dict[str, Any]]:
    """The records of a ledger that name keys, oldest first (a line cut short by a crash is skipped); each record's
    ``keys`` reduced to node names mapped to well-formed keys, its ``time`` a number, its ``run_id`` a string."""
    found = []
    for record in records.lines(records.LEDGER_LINE, data):
        if isinstance(record, dict) and isinstance(record.get("keys"), dict):
            record["keys"] = {n: k for n, k in record["keys"].items() if is_key(k)}
            record["time"] = _time(record)
            record["run_id"] = _run_id(record.get("run_id"))
            found.append(record)
    return found


def _entries(nodes: object) -> dict[str, dict[str, Any]]:
    """The node entries of a refs record that name a well-formed key (anything else in a planted file is dropped)."""
    if not isinstance(nodes, dict):
        return {}
    return {n: {**e, "key": e["key"], "run_id": _run_id(e.get("run_id")), "time": _time(e)}
            for n, e in nodes.items() if isinstance(e, dict) and is_key(e.get("key"))}


def _run_id(value: object) -> str | None:
    return value if isinstance(value, str) and is_plain_name(value) else None


class RefStore:
    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.root = tree.shown(BASE)

    def folder(self, recipe_id: str) -> Path:
        return self.root / slug(recipe_id)

    @staticmethod
    def _rel(folder: str, name: str | None = None) -> tuple[str, ...]:
        check_name(folder, "refs folder")
        return (BASE, folder) if name is None else (BASE, folder, name)

    # ----- reading
    def current(self, recipe_id: str) -> dict[str, str]:
        """node -> key used by the latest run of each node of this recipe file."""
        refs = self._read(slug(recipe_id))
        return refs.keys() if refs else {}

    def entry(self, recipe_id: str, node: str) -> dict[str, Any] | None:
        refs = self._read(slug(recipe_id))
        return refs.nodes.get(node) if refs else None

    def recipes(self) -> Iterator[RecipeRefs]:
        try:
            entries = self.tree.listdir(BASE)
        except OSError:
            return
        for name, st in entries:
            if not stat.S_ISDIR(st.st_mode):
                continue
            refs = self._read(name)
            if refs is not None:
                yield refs

    def history(self, folder: str) -> Iterator[dict[str, Any]]:
        yield from _jsonl(self._read_file(folder, HISTORY, kinds.LEDGER) or b"")

    def _read_file(self, folder: str, name: str, kind: Kind) -> bytes | None:
        """The bytes of a refs file; None if absent, or refused (a link, a pipe, too large: said so)."""
        try:
            return self.tree.read_bytes(self._rel(folder, name), kind)
        except FileNotFoundError:
            return None
        except Refused as exc:
            log.warning("ignoring the refs file %s", exc.message)
            return None
        except OSError:
            return None

    def _pending(self, folder: str) -> list[dict[str, Any]]:
        return _jsonl(self._read_file(folder, PENDING, kinds.LEDGER) or b"")

    def _read(self, folder: str) -> RecipeRefs | None:
        """The refs of one recipe file: ``current.json`` with the pending records folded over it."""
        pending = self._pending(folder)
        try:
            data = records.read(self.tree, self._rel(folder, CURRENT), records.REFS)
        except FileNotFoundError:
            if not pending:
                return self._legacy(folder)
            data = {}  # a first run killed before it wrote current.json: its pending records are the refs
        except Refused as exc:
            log.warning("ignoring the refs file %s", exc.message)
            return None
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        written_as = data.get("format", 0)
        if isinstance(written_as, int) and written_as > FORMAT:
            raise StoreError(f"refs {self.root / folder} have format {written_as}; this trtflow reads format "
                             f"{FORMAT}", hint="upgrade trtflow (pip install -U trtflow)")
        nodes = _entries(data.get("nodes"))
        _fold(nodes, pending)
        who = pending[-1] if pending and not data else data
        path = who.get("path")
        try:
            updated = float(who.get("updated", who.get("time", 0.0)))
        except (TypeError, ValueError):
            updated = 0.0
        return RecipeRefs(self.root / folder, str(who.get("recipe_id", folder)), str(who.get("name", "")),
                          path if isinstance(path, str) else None,
                          who.get("host") if isinstance(who.get("host"), str) else None, updated,
                          nodes, bool(data.get("legacy")), folder)

    # ----- writing
    def _locked(self, folder: str) -> Any:
        try:
            return self.tree.lock(self._rel(folder, LOCK), timeout=LOCK_TIMEOUT_S)
        except Refused as exc:
            raise StoreError(f"the refs lock {exc.message}", hint=exc.hint or "remove it") from None

    def record(self, recipe: RecipeIdentity, run_id: str, keys: Mapping[str, str]) -> None:
        """Durably note that ``run_id`` used ``keys`` (node -> key) now, before the run reports those nodes: one
        line appended to the recipe's pending records and fsynced, under the recipe's lock. Readers (and gc) see
        it at once; the next `update` folds it into ``current.json``."""
        if not keys:
            return
        folder = slug(recipe.id)
        line = ledger_line({"run_id": run_id, "time": time.time(), "keys": dict(keys), "recipe_id": recipe.id,
                            "name": recipe.name, "path": str(recipe.path), "host": os.uname().nodename})
        with self._locked(folder):
            self.tree.append(self._rel(folder, PENDING), line)

    def update(self, recipe: RecipeIdentity, run_id: str, recipe_nodes: Iterable[str],
               keys: Mapping[str, str]) -> None:
        """Record that ``run_id`` used ``keys`` (node -> key); forget nodes no longer in ``recipe_nodes``; fold the
        pending records (`record`) into ``current.json`` and ``history.jsonl``."""
        folder = slug(recipe.id)
        now = time.time()
        with self._locked(folder):
            pending = self._pending(folder)
            existing = self._read(folder)
            base = self._read_written(folder)
            wanted = set(recipe_nodes)
            nodes = {n: e for n, e in (base.nodes if base else {}).items() if n in wanted}
            history = _fold(nodes, pending, wanted)
            changed = {n: k for n, k in keys.items() if nodes.get(n, {}).get("key") != k}
            for node, key in changed.items():  # an unchanged key keeps the run that made it (and its logs)
                nodes[node] = {"key": key, "run_id": run_id, "time": now}
            if changed:
                history.append({"run_id": run_id, "time": now, "keys": changed})
            if (not pending and existing is not None and not existing.legacy and not changed
                    and nodes == existing.nodes and existing.path == str(recipe.path)
                    and now - existing.updated < REFRESH_SECONDS):
                return  # a no-op run: the refs already say all of it (no write, no fsync)
            data = {"format": FORMAT, "recipe_id": recipe.id, "name": recipe.name, "path": str(recipe.path),
                    "host": os.uname().nodename, "updated": now, "run_id": run_id,
                    "nodes": dict(sorted(nodes.items()))}
            self.tree.write_text(self._rel(folder, CURRENT), json.dumps(data, indent=1))
            if history:
                self.tree.append(self._rel(folder, HISTORY), b"".join(ledger_line(h) for h in history))
            if pending:
                self.tree.unlink(self._rel(folder, PENDING))  # folded: a crash before this folds them again
        legacy = f"{LEGACY_PREFIX}{recipe.name}"
        if is_plain_name(legacy):
            self.tree.remove_tree((BASE, legacy))

    def _read_written(self, folder: str) -> RecipeRefs | None:
        """``current.json`` alone, without the pending records."""
        try:
            data = records.read(self.tree, self._rel(folder, CURRENT), records.REFS)
        except (OSError, ValueError):
            return None
        nodes = _entries(data.get("nodes")) if isinstance(data, dict) else {}
        return RecipeRefs(self.root / folder, "", "", None, None, 0.0, nodes, slug=folder)

    # ----- a recipe file that is missing (gc's grace period before forgetting it)
    def missing_since(self, folder: str, now: float, record: bool) -> float:
        """Since when the recipe file of ``folder`` has been seen missing: the time recorded by the first gc that
        saw it missing (recorded now, when ``record`` and none is)."""
        try:
            since = float(records.read(self.tree, self._rel(folder, MISSING_MARKER), records.MISSING_MARKER)["since"])
            if since <= now:
                return since
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if record:
            self.tree.write_text(self._rel(folder, MISSING_MARKER), json.dumps({"since": now}))
        return now

    def found_again(self, folder: str) -> None:
        """The recipe file of ``folder`` exists (again): forget when it was seen missing."""
        self.tree.unlink(self._rel(folder, MISSING_MARKER))

    def trim_history(self, folder: str, keep_since: float) -> int:
        """Drop history lines older than ``keep_since``; returns how many were dropped."""
        with self._locked(folder):
            records = list(self.history(folder))
            kept = [r for r in records if _time(r) >= keep_since]
            if len(kept) != len(records):
                self.tree.write_bytes(self._rel(folder, HISTORY), b"".join(ledger_line(r) for r in kept))
        return len(records) - len(kept)

    def forget(self, folder: str) -> None:
        """Remove a recipe's refs (gc, after the recipe file has been missing for the grace period)."""
        self.tree.remove_tree(self._rel(folder))

    # ----- the first release's refs
    def _legacy(self, folder: str) -> RecipeRefs | None:
        """A first-release refs folder (``refs/<recipe name>/<node>`` files holding keys), read without migrating."""
        nodes = _legacy_nodes(self.tree, (BASE, folder))
        if not nodes:
            return None
        return RecipeRefs(self.root / folder, f"(recipe named {folder!r}, from an older trtflow)", folder, None,
                          None, 0.0, nodes, legacy=True, slug=folder)


def _time(record: Mapping[str, Any]) -> float:
    value = record.get("time", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 0.0
    return float(value)


def _legacy_nodes(tree: Tree, rel: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The ref files of a first-release refs folder: regular files (never followed, never large), one key each."""
    nodes = {}
    try:
        entries = tree.listdir(rel)
    except OSError:
        return {}
    for name, st in entries:
        if name.startswith(".") or not stat.S_ISREG(st.st_mode):
            continue  # a link or anything but a file is never read: its content would be copied into the store
        try:
            key = tree.read_text((*rel, name), kinds.NOTE).strip()
        except OSError:
            continue
        if is_key(key):
            nodes[name] = {"key": key, "run_id": None, "time": st.st_mtime}
    return nodes


def _fold(nodes: dict[str, dict[str, Any]], records: list[dict[str, Any]],
          wanted: set[str] | None = None) -> list[dict[str, Any]]:
    """Apply pending records to ``nodes`` in order; return the history lines of what they changed."""
    history = []
    for record in records:
        changed = {n: k for n, k in record["keys"].items()
                   if (wanted is None or n in wanted) and isinstance(k, str) and nodes.get(n, {}).get("key") != k}
        for node, key in changed.items():
            nodes[node] = {"key": key, "run_id": record.get("run_id"), "time": record.get("time", 0.0)}
        if changed:
            history.append({"run_id": record.get("run_id"), "time": record.get("time", 0.0), "keys": changed})
    return history


def migrate_legacy_refs(tree: Tree) -> int:
    """Turn the first release's refs (``refs/<recipe name>/<node>`` holding a key) into legacy refs.

    They were keyed by recipe name, not file, so they cannot be attributed to a file: they are kept as gc roots
    until a run of a recipe with that name records its own refs. Only regular files in real folders are read (a
    link is left alone, never followed: its target's content would be copied into the store). Returns how many
    recipes were migrated.
    """
    migrated = 0
    try:
        folders = [name for name, st in tree.listdir(BASE) if stat.S_ISDIR(st.st_mode)]
    except OSError:
        return 0
    for folder in folders:
        rel = (BASE, folder)
        if tree.stat((*rel, CURRENT)) is not None:
            continue
        nodes = _legacy_nodes(tree, rel)
        if not nodes:
            continue
        target = f"{LEGACY_PREFIX}{folder}"
        if not is_plain_name(target):
            continue
        data = {"format": FORMAT, "recipe_id": f"(recipe named {folder!r}, from an older trtflow)",
                "name": folder, "path": None, "host": None, "updated": time.time(), "legacy": True,
                "nodes": nodes}
        tree.write_text((BASE, target, CURRENT), json.dumps(data, indent=1))
        for name in nodes:
            tree.unlink((*rel, name))
        if folder != target:
            try:
                tree.remove_empty_folder(rel)
            except OSError:
                pass
        migrated += 1
    return migrated
