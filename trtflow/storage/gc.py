"""Garbage collection: drop what no recipe file's latest runs use, under the store lock.

Roots: for every recipe file with refs, the key each of its nodes used in its latest run (refs/<recipe>/current.json),
plus the keys of runs younger than the retention (``keep_days``, refs history), plus every object a pin keeps
(`pins`: the reference artifacts comparisons re-measure). A recipe file that no longer exists
keeps its roots for a grace period (``forget_missing_days``, counted from the first gc that saw it missing): a
branch switch, a rename in progress or an unmounted share must not cost every result of a recipe.

Besides results: scratch space and locks (no run is running while gc holds the lock), logs and crash folders of
runs no kept result comes from, partial downloads, the transfer area of local Ray clusters (``ray-remote/``: what
workers exchanged during runs, none of which is running), and no-op records (``noop/``) that can no longer hold (a
result they name was removed, or they are unreadable or an older trtflow's, which may hold variables' values) or
that no run has written for ``NOOP_RECORD_DAYS`` (the next run of that command plans once and records it again).

gc holds the store lock exclusively, so no run can commit (or be half-way through linking) while it decides and
deletes: a run waits for gc, and gc waits for runs (or says "store busy"). Everything it reads and removes goes
through the store's `confined.Tree`: a link in the store is removed as a link, never followed.
"""

from __future__ import annotations

import logging
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.errors import StoreError
from trtflow.storage import records
from trtflow.storage.lock import EXCLUSIVE, StoreLock
from trtflow.storage.pins import PinStore
from trtflow.storage.refs import RecipeRefs
from trtflow.storage.store import NOOP, TRANSFER, Store

DAY = 86400.0
FORGET_MISSING_DAYS = 7.0
NOOP_RECORD_DAYS = 30.0
log = logging.getLogger("trtflow.storage")


@dataclass
class Removal:
    what: str  # "result" (a manifest and the objects only it used), "object", "scratch", "log", "crash", "refs",
    # "transfer" (a run's folder in the Ray transfer area), "no-op record"
    recipe: str
    node: str
    size: int
    age_s: float | None
    why: str


@dataclass(frozen=True)
class MissingRecipe:
    """A recipe file with refs that no longer exists, whose results are kept until its grace period ends."""

    recipe: str
    path: str | None
    since: float
    forget_at: float


@dataclass
class GcReport:
    removals: list[Removal] = field(default_factory=list)
    missing: list[MissingRecipe] = field(default_factory=list)
    kept_results: int = 0
    kept_objects: int = 0
    dry_run: bool = False

    def total(self, what: str | None = None) -> tuple[int, int]:
        items = [r for r in self.removals if what is None or r.what == what]
        return len(items), sum(r.size for r in items)


def collect_garbage(store: Store, keep_days: float = 0.0, dry_run: bool = False, wait_s: float = 60.0,
                    on_wait: Any = None, forget_missing_days: float = FORGET_MISSING_DAYS) -> GcReport:
    report = GcReport(dry_run=dry_run)
    if not store.exists():
        return report
    if not dry_run:
        store.ensure()  # migrates an older store first: its refs become roots in today's form
    store.check_format()
    store.check_folders()
    with StoreLock(store.tree).held(EXCLUSIVE, "trtflow gc" + (" --dry-run" if dry_run else ""), wait_s, on_wait):
        try:
            _collect(store, keep_days, dry_run, report, forget_missing_days)
        except OSError as exc:
            raise StoreError(f"gc could not change the store {store.root}: {exc.strerror or exc}"
                             + (f" ({exc.filename})" if exc.filename else ""),
                             hint="a read-only store cannot be collected; mount it writable, or run gc where it "
                             "is writable") from None
    return report


def _collect(store: Store, keep_days: float, dry_run: bool, report: GcReport, forget_missing_days: float) -> None:
    now = time.time()
    keep_since = now - keep_days * DAY
    recipes = list(store.refs.recipes())
    forgotten = _forgotten(store, recipes, now, dry_run, forget_missing_days, report)
    active = [r for r in recipes if r not in forgotten]
    roots: dict[str, str] = {}  # key -> why it is kept (for --dry-run listings of kept items: not printed today)
    current_users: dict[tuple[str, str], str] = {}  # (recipe id, node) -> the key it uses now
    keep_runs: set[str] = set()
    for refs in active:
        for node, entry in refs.nodes.items():  # entries and history records come checked (refs.py)
            key = entry["key"]
            roots[key] = f"{refs.recipe_id}:{node}"
            current_users[(refs.recipe_id, node)] = key
            if entry.get("run_id"):
                keep_runs.add(entry["run_id"])
        for record in store.refs.history(refs.slug):
            if record["time"] >= keep_since and keep_days > 0:
                keep_runs.add(str(record["run_id"]))
                for node, key in record["keys"].items():
                    roots.setdefault(key, f"{refs.recipe_id}:{node} (run {record.get('run_id')})")
    by_id = {r.recipe_id: r for r in recipes}

    live_digests: set[str] = PinStore(store).digests()
    kept_keys: set[str] = set()
    doomed: list[tuple[Path, dict[str, Any] | None]] = []
    tree = store.tree
    for path, manifest in store.iter_manifests():
        key = path.stem
        if key in roots and isinstance(manifest, dict):
            report.kept_results += 1
            kept_keys.add(key)
            if manifest.get("run_id"):
                keep_runs.add(str(manifest["run_id"]))  # the logs of the run that built a kept result
            live_digests.update(o.get("digest", "") for o in _outputs(manifest))
        else:
            doomed.append((path, manifest if isinstance(manifest, dict) else None))
    sizes = {}
    for obj in store.iter_objects():
        st = _stat(store, store.rel(obj))
        sizes[obj.name] = st.st_size if st is not None else 0
    for path, manifest in doomed:
        manifest = manifest or {}
        exclusive = {o.get("digest") for o in _outputs(manifest)} - live_digests
        size = sum(sizes.get(d, 0) for d in exclusive if isinstance(d, str))
        committed = manifest.get("committed")
        report.removals.append(Removal(
            "result", str(manifest.get("recipe_id") or manifest.get("recipe") or "?"), str(manifest.get("node", "?")),
            size, (now - committed) if isinstance(committed, (int, float)) else None,
            _why(path.stem, manifest, by_id, current_users, forgotten)))
        if not dry_run:
            rel = store.rel(path)
            tree.unlink(rel)
            tree.unlink((*rel[:-1], f"{path.stem}.damaged"))
    claimed = {o.get("digest") for _, m in doomed if m for o in _outputs(m)}
    for obj in store.iter_objects():
        if obj.name in live_digests:
            report.kept_objects += 1
            continue
        rel = store.rel(obj)
        if obj.name not in claimed:
            report.removals.append(Removal("object", "-", "-", sizes.get(obj.name, 0), _age(store, rel, now),
                                           "no stored result refers to it"))
        if not dry_run:
            tree.unlink(rel)  # the entry, never what a link points to; a read-only shard folder is made writable
    for name, st in tree.listdir("tmp"):
        report.removals.append(Removal("scratch", "-", name, tree.size_of(("tmp", name)), now - st.st_mtime,
                                       "scratch space of a run that is no longer running"))
        if not dry_run:
            tree.remove_tree(("tmp", name))
    for name, _ in tree.listdir("locks"):
        if not dry_run:
            tree.unlink(("locks", name))
    latest_journal_runs = _latest_run_per_recipe(store)
    for name, st in tree.listdir("logs"):
        if not stat.S_ISDIR(st.st_mode):
            continue
        if name in keep_runs or name in latest_journal_runs or _run_started(name) >= keep_since:
            continue
        report.removals.append(Removal("log", "-", name, tree.size_of(("logs", name)), now - st.st_mtime,
                                       "logs of a run no recipe's latest results come from"))
        if not dry_run:
            tree.remove_tree(("logs", name))
    for name, st in tree.listdir("crashes"):
        if name in keep_runs or name in latest_journal_runs or _run_started(name) >= keep_since:
            continue
        report.removals.append(Removal("crash", "-", name, tree.size_of(("crashes", name)), now - st.st_mtime,
                                       "inputs kept to reproduce a crash of a run that is no longer the latest"))
        if not dry_run:
            tree.remove_tree(("crashes", name))
    for partial in store.iter_partials():
        rel = store.rel(partial)
        st = _stat(store, rel)
        report.removals.append(Removal("scratch", "-", partial.name, st.st_size if st else 0, _age(store, rel, now),
                                       "a partial download or copy left by a killed run"))
        if not dry_run:
            tree.unlink(rel)
    for name, st in tree.listdir(TRANSFER):
        report.removals.append(Removal("transfer", "-", name, tree.size_of((TRANSFER, name)), now - st.st_mtime,
                                       "what Ray workers exchanged during a run that is no longer running"))
        if not dry_run:
            tree.remove_tree((TRANSFER, name))
    _collect_noop_records(store, kept_keys, now, dry_run, report)
    for refs in forgotten:
        report.removals.append(Removal("refs", refs.recipe_id, "-", 0, now - refs.updated,
                                       f"the recipe file {refs.path} no longer exists"))
        if not dry_run:
            store.refs.forget(refs.slug)
    if not dry_run:
        for refs in active:
            store.refs.trim_history(refs.slug, keep_since if keep_days > 0 else now)


def _collect_noop_records(store: Store, kept_keys: set[str], now: float, dry_run: bool, report: GcReport) -> None:
    """No-op records that can no longer hold (a result they rest on is gone; unreadable) or unwritten for long."""
    for name, st in store.tree.listdir(NOOP):
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "not a regular file"
        elif now - st.st_mtime > NOOP_RECORD_DAYS * DAY:
            why = f"no run recorded it for {NOOP_RECORD_DAYS:g} days (the next run of that command plans once)"
        else:
            keys = store.noop_record_keys(name)
            if keys is None:
                why = "unreadable, or an older trtflow's"
            elif not set(keys) <= kept_keys:
                why = "a result it rests on is no longer stored"
        if why is None:
            continue
        report.removals.append(Removal("no-op record", "-", name, st.st_size, now - st.st_mtime, why))
        if not dry_run:
            store.tree.unlink((NOOP, name))


def _outputs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    outputs = manifest.get("outputs")
    return [o for o in outputs.values() if isinstance(o, dict)] if isinstance(outputs, dict) else []


def _stat(store: Store, rel: tuple[str, ...]) -> Any:
    try:
        return store.tree.stat(rel)
    except OSError:
        return None


def _age(store: Store, rel: tuple[str, ...], now: float) -> float | None:
    st = _stat(store, rel)
    return now - st.st_mtime if st is not None else None


def _forgotten(store: Store, recipes: list[RecipeRefs], now: float, dry_run: bool, grace_days: float,
               report: GcReport) -> list[RecipeRefs]:
    """The recipes whose file has been missing for the grace period; the others that are missing go to the report."""
    forgotten = []
    for refs in recipes:
        if not refs.missing_on_this_host():
            if not dry_run:
                store.refs.found_again(refs.slug)
            continue
        since = store.refs.missing_since(refs.slug, now, record=not dry_run)
        if now - since >= grace_days * DAY:
            forgotten.append(refs)
        else:
            report.missing.append(MissingRecipe(refs.recipe_id, refs.path, since, since + grace_days * DAY))
    return forgotten


def _why(key: str, manifest: dict[str, Any], recipes: dict[str, RecipeRefs],
         current_users: dict[tuple[str, str], str], forgotten: list[RecipeRefs]) -> str:
    if not manifest:
        return "unreadable manifest"
    recipe_id, node = manifest.get("recipe_id"), manifest.get("node")
    if not isinstance(recipe_id, str) or not isinstance(node, str):
        return "no recipe file's latest run uses it"
    if recipe_id in {r.recipe_id for r in forgotten}:
        return f"the recipe file {recipe_id} no longer exists"
    if recipe_id in recipes:
        now_uses = current_users.get((recipe_id, node))
        if now_uses is None:
            return f"node {node} is no longer in {recipe_id}"
        entry = recipes[recipe_id].nodes.get(node, {})
        return f"superseded: {recipe_id} now uses {now_uses[:12]} (run {entry.get('run_id') or '?'})"
    return "no recipe file's latest run uses it"


def _latest_run_per_recipe(store: Store) -> set[str]:
    if not store.has_journal():
        return set()
    journal = store.journal(readonly=True)
    try:
        rows = journal._rows(f"SELECT {records.sql_capped(('id', 'recipe_id', 'recipe', 'started'))} FROM runs "
                             "ORDER BY started", ())
    except StoreError as exc:  # a damaged or refused journal must not stop gc; `verify` reports it
        log.warning("gc could not read the journal (%s): the logs of each recipe's latest run are kept only when a "
                    "stored result comes from that run", exc.message)
        return set()
    finally:
        journal.close()
    latest: dict[str, str] = {}
    for row in rows:
        recipe, run_id = row["recipe_id"] or row["recipe"], row["id"]
        if isinstance(recipe, str) and isinstance(run_id, str):
            latest[recipe] = run_id
    return set(latest.values())


def _run_started(run_id: str) -> float:
    try:
        return time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return 0.0
