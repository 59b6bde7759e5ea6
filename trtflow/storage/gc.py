"""Garbage collection: drop what no recipe file's latest runs use, under the store lock.

Roots: for every recipe file with refs, the key each of its nodes used in its latest run (refs/<recipe>/current.json),
plus the keys of runs younger than the retention (``keep_days``, refs history), plus every object a pin keeps
(`pins`: the reference artifacts comparisons re-measure). A recipe file that no longer exists
keeps its roots for a grace period (``forget_missing_days``, counted from the first gc that saw it missing): a
branch switch, a rename in progress or an unmounted share must not cost every result of a recipe.

gc holds the store lock exclusively, so no run can commit (or be half-way through linking) while it decides and
deletes: a run waits for gc, and gc waits for runs (or says "store busy").
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.errors import StoreError
from trtflow.storage.journal import Journal
from trtflow.storage.lock import EXCLUSIVE, StoreLock
from trtflow.storage.pins import PinStore
from trtflow.storage.refs import RecipeRefs
from trtflow.storage.store import Store

DAY = 86400.0
FORGET_MISSING_DAYS = 7.0


@dataclass
class Removal:
    what: str  # "result" (a manifest and the objects only it used), "object", "scratch", "log", "refs"
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
    if not store.root.exists():
        return report
    if not dry_run:
        store.ensure()  # migrates an older store first: its refs become roots in today's form
    store.check_format()
    store.check_folders()
    with StoreLock(store.root).held(EXCLUSIVE, "trtflow gc" + (" --dry-run" if dry_run else ""), wait_s, on_wait):
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
        for node, entry in refs.nodes.items():
            key = entry.get("key")
            if key:
                roots[key] = f"{refs.recipe_id}:{node}"
                current_users[(refs.recipe_id, node)] = key
            if entry.get("run_id"):
                keep_runs.add(entry["run_id"])
        for record in store.refs.history(refs.folder):
            if float(record.get("time", 0)) >= keep_since and keep_days > 0:
                keep_runs.add(str(record.get("run_id")))
                for node, key in record["keys"].items():
                    roots.setdefault(key, f"{refs.recipe_id}:{node} (run {record.get('run_id')})")
    by_id = {r.recipe_id: r for r in recipes}

    live_digests: set[str] = PinStore(store).digests()
    doomed: list[tuple[Path, dict[str, Any] | None]] = []
    for path, manifest in store.iter_manifests():
        key = path.stem
        if key in roots and manifest is not None:
            report.kept_results += 1
            if manifest.get("run_id"):
                keep_runs.add(str(manifest["run_id"]))  # the logs of the run that built a kept result
            live_digests.update(o.get("digest", "") for o in manifest.get("outputs", {}).values())
        else:
            doomed.append((path, manifest))
    sizes = {}
    for obj in store.iter_objects():
        try:
            sizes[obj.name] = obj.lstat().st_size
        except OSError:
            sizes[obj.name] = 0
    for path, manifest in doomed:
        manifest = manifest or {}
        exclusive = {o.get("digest") for o in manifest.get("outputs", {}).values()} - live_digests
        size = sum(sizes.get(d, 0) for d in exclusive if d)
        committed = manifest.get("committed")
        report.removals.append(Removal(
            "result", str(manifest.get("recipe_id") or manifest.get("recipe") or "?"), str(manifest.get("node", "?")),
            size, (now - committed) if isinstance(committed, (int, float)) else None,
            _why(path.stem, manifest, by_id, current_users, forgotten)))
        if not dry_run:
            path.unlink(missing_ok=True)
            path.with_suffix(".damaged").unlink(missing_ok=True)
    claimed = {o.get("digest") for _, m in doomed if m for o in m.get("outputs", {}).values()}
    for obj in store.iter_objects():
        if obj.name in live_digests:
            report.kept_objects += 1
            continue
        if obj.name not in claimed:
            report.removals.append(Removal("object", "-", "-", sizes.get(obj.name, 0), _age(obj, now),
                                           "no stored result refers to it"))
        if not dry_run:
            _force_unlink(obj)
    for run_dir in _children(store.tmp_dir):
        report.removals.append(Removal("scratch", "-", run_dir.name, _tree_size(run_dir), _age(run_dir, now),
                                       "scratch space of a run that is no longer running"))
        if not dry_run:
            shutil.rmtree(run_dir, ignore_errors=True)
    for lock in _children(store.root / "locks"):
        if not dry_run:
            lock.unlink(missing_ok=True)
    latest_journal_runs = _latest_run_per_recipe(store)
    for log_dir in _children(store.root / "logs"):
        run_id = log_dir.name
        if not log_dir.is_dir():
            continue
        if run_id in keep_runs or run_id in latest_journal_runs or _run_started(run_id) >= keep_since:
            continue
        report.removals.append(Removal("log", "-", run_id, _tree_size(log_dir), _age(log_dir, now),
                                       "logs of a run no recipe's latest results come from"))
        if not dry_run:
            shutil.rmtree(log_dir, ignore_errors=True)
    for crash_dir in _children(store.root / "crashes"):
        run_id = crash_dir.name
        if run_id in keep_runs or run_id in latest_journal_runs or _run_started(run_id) >= keep_since:
            continue
        report.removals.append(Removal("crash", "-", crash_dir.name, _tree_size(crash_dir), _age(crash_dir, now),
                                       "inputs kept to reproduce a crash of a run that is no longer the latest"))
        if not dry_run:
            shutil.rmtree(crash_dir, ignore_errors=True)
    for partial in store.iter_partials():
        report.removals.append(Removal("scratch", "-", partial.name, partial.lstat().st_size, _age(partial, now),
                                       "a partial download or copy left by a killed run"))
        if not dry_run:
            _force_unlink(partial)
    for refs in forgotten:
        report.removals.append(Removal("refs", refs.recipe_id, "-", 0, now - refs.updated,
                                       f"the recipe file {refs.path} no longer exists"))
        if not dry_run:
            shutil.rmtree(refs.folder, ignore_errors=True)
    if not dry_run:
        for refs in active:
            store.refs.trim_history(refs.folder, keep_since if keep_days > 0 else now)


def _forgotten(store: Store, recipes: list[RecipeRefs], now: float, dry_run: bool, grace_days: float,
               report: GcReport) -> list[RecipeRefs]:
    """The recipes whose file has been missing for the grace period; the others that are missing go to the report."""
    forgotten = []
    for refs in recipes:
        if not refs.missing_on_this_host():
            if not dry_run:
                store.refs.found_again(refs.folder)
            continue
        since = store.refs.missing_since(refs.folder, now, record=not dry_run)
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
    if not store.db_path.exists():
        return set()
    journal = Journal(store.db_path, readonly=True)
    try:
        rows = journal._rows("SELECT id, recipe_id, recipe, started FROM runs ORDER BY started", ())
    except Exception:  # a damaged journal must not stop gc; `verify` reports it
        return set()
    finally:
        journal.close()
    latest: dict[str, str] = {}
    for row in rows:
        latest[row["recipe_id"] or row["recipe"]] = row["id"]
    return set(latest.values())


def _run_started(run_id: str) -> float:
    try:
        return time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return 0.0


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _age(path: Path, now: float) -> float | None:
    try:
        return now - path.lstat().st_mtime
    except OSError:
        return None


def _tree_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.lstat().st_size
        except OSError:
            continue
    return total


def _force_unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except PermissionError:
        path.chmod(0o644)
        path.unlink(missing_ok=True)
