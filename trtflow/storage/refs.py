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
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import StoreError
from trtflow.fingerprint import hash_text
from trtflow.fsutil import atomic_write_text, fsync_dir

#: A recipe's refs are rewritten at least this often by runs that change nothing (``updated`` stays meaningful).
REFRESH_SECONDS = 24 * 3600
FORMAT = 2
LEGACY_PREFIX = "legacy-"
PENDING = ".pending.jsonl"  # a dot name: never taken for a first-release (legacy) ref file
MISSING_MARKER = ".missing"  # {"since": time}: when gc first saw the recipe file missing


@dataclass(frozen=True)
class RecipeIdentity:
    """A recipe file: ``id`` is its project-relative POSIX path; ``name`` its ``name:``; ``path`` its location."""

    id: str
    name: str
    path: Path


@dataclass
class RecipeRefs:
    folder: Path
    recipe_id: str
    name: str
    path: str | None
    host: str | None
    updated: float
    nodes: dict[str, dict[str, Any]]
    legacy: bool = False

    def keys(self) -> dict[str, str]:
        return {node: entry["key"] for node, entry in self.nodes.items() if entry.get("key")}

    def missing_on_this_host(self) -> bool:
        """The recipe file was recorded on this host and no longer exists (deleted or moved)."""
        return bool(self.path and self.host == os.uname().nodename and not Path(self.path).exists())


def slug(recipe_id: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", recipe_id).strip("_")[:80] or "recipe"
    return f"{readable}-{hash_text(recipe_id)[:10]}"


class RefStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, recipe_id: str) -> Path:
        return self.root / slug(recipe_id)

    # ----- reading
    def current(self, recipe_id: str) -> dict[str, str]:
        """node -> key used by the latest run of each node of this recipe file."""
        refs = self._read(self.folder(recipe_id))
        return refs.keys() if refs else {}

    def entry(self, recipe_id: str, node: str) -> dict[str, Any] | None:
        refs = self._read(self.folder(recipe_id))
        return refs.nodes.get(node) if refs else None

    def recipes(self) -> Iterator[RecipeRefs]:
        if not self.root.exists():
            return
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            refs = self._read(folder)
            if refs is not None:
                yield refs

    def history(self, folder: Path) -> Iterator[dict[str, Any]]:
        try:
            with open(folder / "history.jsonl", encoding="utf-8") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue  # a line cut short by a crash or a full disk
                    if isinstance(record, dict) and isinstance(record.get("keys"), dict):
                        yield record
        except OSError:
            return

    def _read(self, folder: Path) -> RecipeRefs | None:
        """The refs of one recipe file: ``current.json`` with the pending records folded over it."""
        pending = _pending(folder)
        try:
            data = json.loads((folder / "current.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            if not pending:
                return _legacy(folder)
            data = {}  # a first run killed before it wrote current.json: its pending records are the refs
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        if int(data.get("format", 0)) > FORMAT:
            raise StoreError(f"refs {folder} have format {data.get('format')}; this trtflow reads format {FORMAT}",
                             hint="upgrade trtflow (pip install -U trtflow)")
        nodes = data.get("nodes") if isinstance(data.get("nodes"), dict) else {}
        nodes = {n: e for n, e in nodes.items() if isinstance(e, dict)}
        _fold(nodes, pending)
        who = pending[-1] if pending and not data else data
        return RecipeRefs(folder, str(who.get("recipe_id", folder.name)), str(who.get("name", "")),
                          who.get("path"), who.get("host"), float(who.get("updated", who.get("time", 0.0))),
                          nodes, bool(data.get("legacy")))

    # ----- writing
    def record(self, recipe: RecipeIdentity, run_id: str, keys: Mapping[str, str]) -> None:
        """Durably note that ``run_id`` used ``keys`` (node -> key) now, before the run reports those nodes: one
        line appended to the recipe's pending records and fsynced, under the recipe's lock. Readers (and gc) see
        it at once; the next `update` folds it into ``current.json``."""
        from filelock import FileLock

        if not keys:
            return
        folder = self.folder(recipe.id)
        folder.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"run_id": run_id, "time": time.time(), "keys": dict(keys), "recipe_id": recipe.id,
                           "name": recipe.name, "path": str(recipe.path), "host": os.uname().nodename})
        path = folder / PENDING
        with FileLock(str(folder / ".lock")):
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                fsync_dir(folder)

    def update(self, recipe: RecipeIdentity, run_id: str, recipe_nodes: Iterable[str],
               keys: Mapping[str, str]) -> None:
        """Record that ``run_id`` used ``keys`` (node -> key); forget nodes no longer in ``recipe_nodes``; fold the
        pending records (`record`) into ``current.json`` and ``history.jsonl``."""
        from filelock import FileLock

        folder = self.folder(recipe.id)
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        with FileLock(str(folder / ".lock")):
            pending = _pending(folder)
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
            atomic_write_text(folder / "current.json", json.dumps(data, indent=1))
            if history:
                with open(folder / "history.jsonl", "a", encoding="utf-8") as f:
                    f.write("".join(json.dumps(h) + "\n" for h in history))
                    f.flush()
                    os.fsync(f.fileno())
            if pending:
                (folder / PENDING).unlink(missing_ok=True)  # folded: a crash before this folds them again, harmlessly
        legacy = self.root / f"{LEGACY_PREFIX}{recipe.name}"
        if legacy.exists():
            import shutil

            shutil.rmtree(legacy, ignore_errors=True)

    def _read_written(self, folder: Path) -> RecipeRefs | None:
        """``current.json`` alone, without the pending records."""
        try:
            data = json.loads((folder / "current.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        nodes = data.get("nodes") if isinstance(data, dict) and isinstance(data.get("nodes"), dict) else {}
        return RecipeRefs(folder, "", "", None, None, 0.0, {n: e for n, e in nodes.items() if isinstance(e, dict)})
    # ----- a recipe file that is missing (gc's grace period before forgetting it)
    def missing_since(self, folder: Path, now: float, record: bool) -> float:
        """Since when the recipe file of ``folder`` has been seen missing: the time recorded by the first gc that
        saw it missing (recorded now, when ``record`` and none is)."""
        marker = folder / MISSING_MARKER
        try:
            since = float(json.loads(marker.read_text(encoding="utf-8"))["since"])
            if since <= now:
                return since
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if record:
            atomic_write_text(marker, json.dumps({"since": now}))
        return now

    def found_again(self, folder: Path) -> None:
        """The recipe file of ``folder`` exists (again): forget when it was seen missing."""
        (folder / MISSING_MARKER).unlink(missing_ok=True)

    def trim_history(self, folder: Path, keep_since: float) -> int:
        """Drop history lines older than ``keep_since``; returns how many were dropped."""
        from filelock import FileLock

        with FileLock(str(folder / ".lock")):
            records = list(self.history(folder))
            kept = [r for r in records if float(r.get("time", 0)) >= keep_since]
            if len(kept) != len(records):
                atomic_write_text(folder / "history.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
        return len(records) - len(kept)


def _pending(folder: Path) -> list[dict[str, Any]]:
    """The pending records of a recipe's refs, oldest first (a line cut short by a crash is skipped)."""
    try:
        text = (folder / PENDING).read_text(encoding="utf-8")
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("keys"), dict):
            records.append(record)
    return records


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


def _legacy(folder: Path) -> RecipeRefs | None:
    """A first-release refs folder (``refs/<recipe name>/<node>`` files holding keys), read without migrating it."""
    nodes = {}
    try:
        for ref in folder.iterdir():
            if ref.is_file() and not ref.name.startswith("."):
                nodes[ref.name] = {"key": ref.read_text(encoding="utf-8").strip(), "run_id": None,
                                   "time": ref.stat().st_mtime}
    except OSError:
        return None
    if not nodes:
        return None
    return RecipeRefs(folder, f"(recipe named {folder.name!r}, from an older trtflow)", folder.name, None, None, 0.0,
                      nodes, legacy=True)


def migrate_legacy_refs(root: Path) -> int:
    """Turn the first release's refs (``refs/<recipe name>/<node>`` holding a key) into legacy refs.

    They were keyed by recipe name, not file, so they cannot be attributed to a file: they are kept as gc roots
    until a run of a recipe with that name records its own refs. Returns how many recipes were migrated.
    """
    if not root.exists():
        return 0
    migrated = 0
    for folder in [p for p in root.iterdir() if p.is_dir() and not (p / "current.json").exists()]:
        files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
        if not files:
            continue
        nodes = {}
        for ref in files:
            try:
                nodes[ref.name] = {"key": ref.read_text(encoding="utf-8").strip(), "run_id": None,
                                   "time": ref.stat().st_mtime}
            except OSError:
                continue
        target = root / f"{LEGACY_PREFIX}{folder.name}"
        target.mkdir(exist_ok=True)
        data = {"format": FORMAT, "recipe_id": f"(recipe named {folder.name!r}, from an older trtflow)",
                "name": folder.name, "path": None, "host": None, "updated": time.time(), "legacy": True,
                "nodes": nodes}
        atomic_write_text(target / "current.json", json.dumps(data, indent=1))
        for ref in files:
            ref.unlink(missing_ok=True)
        if folder != target:
            try:
                folder.rmdir()
            except OSError:
                pass
        migrated += 1
    return migrated
