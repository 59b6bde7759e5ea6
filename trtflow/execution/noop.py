"""The no-op run's shortcut: "nothing to do" without loading the recipe's schema or the stages, and without planning.

The planner is the one judge of "up to date"; this shortcut only replays what the planner observed. A run whose
plan found every node up to date (and that qualifies, below) leaves a *no-op record* in the store,
``noop/<invocation>.json``, made from the plan's `Evidence` (what its decisions rested on) and confirmed on disk:
  - the invocation (recipe file, --set values, targets, output folder, working folder, --require-gpu), Python, its
    ``sys.path`` and the mtime of each of its folders, trtflow's own files, the environment variables the recipe
    names (``${VAR}`` and ``$VAR``), ``HOME``, every ``TRTFLOW_*`` variable, ``CUDA_VISIBLE_DEVICES``, ``PYTHONPATH``
    (each by a keyed digest of its value, never the value: `storage.verified.keyed_digest`);
  - the recipe files' text (read and hashed again, never trusted on a stat), and each ``extends:`` as written;
  - every path as the recipe spells it (data files and folders, ``python:`` files) with what it resolved to, and
    each ``python:`` module name with the file it was found at: replayed by the planner's own resolver, so a link
    retargeted, ``~`` under another ``HOME`` or a ``$VAR`` with another value steps aside;
  - every file the keys hashed (data, ``python:`` files, the modules their code was recorded importing, the
    stages' code), by its signature (size, mtime, ctime, inode: the planner's stat-cache shortcut; ctime cannot be
    set back) and its digest: a file whose signature was not settled when it was read is read and hashed again;
    the module slots that must stay empty; the journal's index entry by which each such result was found;
  - the environment facts the keys were made with: computed again by the planner's own function;
  - the store's manifests and output objects, by their signatures.
If all of it holds, the run is recorded as an up-to-date run is (journal, refs, outputs under build/), under the
store lock, without planning; if anything differs, nothing is recorded and the normal path plans and decides.
Recipes with quality gates (a gate may read files the key does not name), GPU nodes (facts of a device), a remote
cache, or nodes that cannot run here get no record; ``TRTFLOW_NO_SHORTCUT=1`` turns the shortcut off (every run
plans). A differential test (tests/reliability/test_freshness_differential.py) checks on random edit sequences
that the shortcut never answers where the planner would rebuild.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import trtflow
from trtflow.codehash import stage_files, stage_module_place
from trtflow.errors import TrtflowError
from trtflow.evidence import Evidence
from trtflow.fingerprint import StatCache, hash_file, hash_file_content, hash_path, hash_text, hash_value, settled
from trtflow.fsutil import allowed_roots_for, project_root, recipe_id, resolve_user_path
from trtflow.status import FRESH
from trtflow.storage import records
from trtflow.storage.confined.names import is_plain_name
from trtflow.storage.store import Store

FORMAT = 2
MAX_TEXT = 16 << 20  # a recipe file's size limit (recipe.load.MAX_RECIPE_BYTES)
_ENV_NAME = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
Sig = list[int]  # [size, mtime_ns, ctime_ns, inode]


class Uncertain(Exception):
    """Something the record would rest on cannot be confirmed: write none."""


def _sig(path: Path | str) -> Sig:
    """A regular file's signature; OSError for anything else (a record may be planted: a named pipe it names must
    not be opened, a device not read)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path} is not a regular file")
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _confirm_object(store: Store, digest: str, size: int, cache: StatCache) -> Sig:
    """An output object's signature, once confirmed. Objects are written once, read-only, by an atomic rename (a
    new inode): a recent one is trusted by its signature as soon as its content is confirmed."""
    rel = store.object_rel(digest)
    sig = _store_sig(store, rel)
    if not store.object_intact(digest, size, cache) or _store_sig(store, rel) != sig:
        raise Uncertain(str(store.shown(rel)))
    return sig


def _store_sig(store: Store, rel: tuple[str, ...]) -> Sig:
    """The signature of an entry of the store, reached through its real folders (a link is not followed)."""
    st = store.tree.stat(rel)
    if st is None:
        raise FileNotFoundError(str(store.shown(rel)))
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _text(path: str) -> str:
    """A recipe file's text, read only if it is a regular file (opened without blocking, checked on the open file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_TEXT + 1).decode("utf-8")
    finally:
        os.close(fd)


def _dir_mtime(path: str) -> int | None:
    try:
        return os.stat(path or ".").st_mtime_ns
    except OSError:
        return None


def invocation(recipe: str | Path, targets: Sequence[str], overrides: Sequence[str], store: Store,
               options: Any) -> dict[str, Any] | None:
    """What identifies a run command for the shortcut; None if the shortcut never applies to it."""
    if options.remote or options.executor not in ("local", "inline") or os.environ.get("TRTFLOW_NO_SHORTCUT") \
            or getattr(options, "rerun", None):
        return None
    return {"recipe": str(Path(recipe).resolve()), "targets": list(targets), "overrides": list(overrides),
            "store": str(store.root.resolve()), "output_dir": str(options.output_dir) if options.output_dir else None,
            "cwd": os.getcwd(), "require_gpu": bool(options.require_gpu)}


def record_name(call: dict[str, Any]) -> str:
    """The name of the record of ``call`` in the store (`Store.read_noop_record`: through the store's confined tree,
    so a ``noop`` folder that is a link is never written through; the shortcut is off then)."""
    return hash_value(call)[:24]


def _environment(names: Iterable[str]) -> dict[str, str | None]:
    """The variables a record rests on, each by a keyed digest of its value (None: unset), never the value (a
    record is a file of the store, and a value may be a secret: `storage.verified.keyed_digest`)."""
    from trtflow.depfile import keyed_env_names
    from trtflow.storage.verified import keyed_digest

    wanted = (set(names) | {"CUDA_VISIBLE_DEVICES", "PYTHONPATH", "HOME"} | set(keyed_env_names())
              | {n for n in os.environ if n.startswith("TRTFLOW_")})
    found = {}
    for name in sorted(wanted):
        value = os.environ.get(name)
        digest = None if value is None else keyed_digest("env", name, value)
        if value is not None and digest is None:
            raise Uncertain("no secret to key the environment's values with")
        found[name] = digest
    return found


def _engine_files() -> dict[str, Sig]:
    root = Path(trtflow.__file__).parent
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found[path] = _sig(path)
    return found


def _python() -> dict[str, Any]:
    return {"version": sys.version, "executable": sys.executable, "path": list(sys.path),
            "mtimes": [_dir_mtime(p) for p in sys.path]}


def snapshot() -> dict[str, Any]:
    """What a record rests on that must be taken before the recipe is loaded and planned: the installed
    distributions and trtflow's own code, as the planner then used them."""
    return {"python": _python(), "engine": _engine_files()}


# ---------------------------------------------------------------------------------------------- files
def _file_entry(path: str, expected: str | None, cache: StatCache | None) -> dict[str, Any]:
    """A file's signature and digest (``expected``: what the planner found, which it must still be). A signature
    not settled when the content was read (it could change again within the same timestamp granule) is marked
    racy: the check then hashes the file again instead of trusting the signature."""
    sig = _sig(path)
    read_at = time.time_ns()
    digest = hash_file(Path(path), cache) if settled(sig, read_at) else hash_file_content(Path(path))
    if (expected is not None and digest != expected) or _sig(path) != sig:
        raise Uncertain(path)
    return {"sig": sig, "digest": digest, "racy": not settled(sig, read_at)}


def _entry_holds(path: str, entry: dict[str, Any]) -> bool:
    if _sig(path) != entry["sig"]:
        return False
    return not entry["racy"] or hash_file_content(Path(path)) == entry["digest"]


def _tree(path: str) -> list[str]:
    """The files of a folder, walked as `hash_path` walks it."""
    found = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        found += [os.path.join(root, name) for name in sorted(files)]
    return found


def _path_entry(path: str, digest: str, cache: StatCache | None) -> dict[str, Any]:
    """The record of a data file or folder the planner hashed to ``digest`` (or of a link or folder on the way to
    a file python: code read: `depfile.path_digest`, checked again by the same function)."""
    from trtflow.depfile import FOLDER, LINK, path_digest

    if digest.startswith(LINK) or digest == FOLDER:
        if path_digest(path) != digest:
            raise Uncertain(path)
        return {"link": digest}
    if not os.path.isdir(path):
        return _file_entry(path, digest, cache)
    tree = {os.path.relpath(f, path): _file_entry(f, None, cache) for f in _tree(path)}
    if hash_path(Path(path), cache) != digest:
        raise Uncertain(path)
    return {"tree": tree, "digest": digest}


def _path_holds(path: str, entry: dict[str, Any]) -> bool:
    if "link" in entry:
        from trtflow.depfile import path_digest

        return bool(path_digest(path) == entry["link"])
    if "tree" not in entry:
        return not os.path.isdir(path) and _entry_holds(path, entry)
    if not os.path.isdir(path):
        return False
    files = _tree(path)
    return (sorted(os.path.relpath(f, path) for f in files) == sorted(entry["tree"])
            and all(_entry_holds(f, entry["tree"][os.path.relpath(f, path)]) for f in files))


# ---------------------------------------------------------------------------------------------- writing
def _stage_record(stage: Any, code_files: dict[str, str], closures: dict[str, Any], cache: StatCache
                  ) -> dict[str, Any]:
    """A stage's entry point and the code closures of its modules (each closure recorded once in ``closures``)."""
    from trtflow.registry import stage_entry_points

    ep = stage_entry_points().get(stage.name)
    dist_path = getattr(getattr(ep, "dist", None), "_path", None)
    if ep is None or dist_path is None:
        raise Uncertain(f"stage {stage.name} does not come from an entry point")
    entry_file = Path(dist_path) / "entry_points.txt"
    origins = []
    for module in dict.fromkeys([stage.run.__module__, ep.module]):
        place = stage_module_place(module)
        top = sys.modules.get(module.split(".")[0])
        if place is None:
            raise Uncertain(f"module {module} has no file")
        origin, package_dir = place
        origins.append(str(origin))
        if str(origin) in closures:
            continue
        files = stage_files(origin, module.split(".")[0], package_dir)
        entries = {}
        for path in files:
            label = _label(path, package_dir.parent)
            # the files of the key are confirmed against its digests; the entry point's module (its params'
            # defaults, its version) as the stage was loaded
            entries[str(path)] = _file_entry(str(path), code_files.get(label), cache)
        closures[str(origin)] = {"package": module.split(".")[0], "package_dir": str(package_dir),
                                 "top_file": getattr(top, "__file__", None) or str(origin), "files": entries}
    return {"entry_point": ep.value, "entry_file": str(entry_file), "entry": _file_entry(str(entry_file), None, cache),
            "closures": origins}


def _label(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def certify(call: dict[str, Any] | None, before: dict[str, Any], pipeline: Any, steps: list[Any], store: Store,
            journal: StatCache, evidence: Evidence | None, summary: Any) -> bool:
    """Write the no-op record of a run whose plan found everything up to date (the slow path's last step), or
    remove an outdated one; True if written. ``before``: the `snapshot` taken before the recipe was loaded;
    ``evidence``: what the plan observed (`make_plan(..., evidence=...)`)."""
    if call is None:
        return False
    name = record_name(call)
    try:
        store.remove_noop_record(name)
    except OSError:
        return False  # the noop folder is not a real folder: no record is read or written
    graph = pipeline.graph
    from trtflow.plan import node_resources

    if (evidence is None or not summary.ok or summary.problems or summary.warnings or not steps
            or any(s.status != FRESH or s.gate_failures or s.parts is None or s.manifest is None for s in steps)
            or any(graph.stages[s.node.stage].gate is not None or node_resources(graph, s.node).gpu > 0
                   for s in steps)):
        return False
    try:
        if before != snapshot():  # a distribution installed or trtflow changed while this run planned
            return False
        record = _gather(call, before, pipeline, steps, store, journal, evidence)
    except (Uncertain, OSError, KeyError, ValueError):
        return False
    try:
        store.write_noop_record(name, record, [n["key"] for n in record["nodes"]])
    except OSError:
        return False
    return True


def _gather(call: dict[str, Any], before: dict[str, Any], pipeline: Any, steps: list[Any], store: Store,
            cache: StatCache, evidence: Evidence) -> dict[str, Any]:
    graph = pipeline.graph
    loaded = pipeline.loaded
    texts = {str(p): hash_text(t) for p, t in loaded.sources.items()}
    names = {m for t in [*loaded.sources.values(), *call["overrides"], *evidence.paths]
             for m in _ENV_NAME.findall(t)}
    stages: dict[str, Any] = {}
    closures: dict[str, Any] = {}
    for step in steps:
        name = step.node.stage
        if name not in stages:
            stages[name] = _stage_record(graph.stages[name], step.parts.code_files, closures, cache)
    nodes = []
    objects: dict[str, Sig] = {}
    for step in steps:
        manifest_file = store.manifest_rel(step.key)
        sig = _store_sig(store, manifest_file)
        if (records.read(store.tree, manifest_file, records.MANIFEST) != step.manifest
                or _store_sig(store, manifest_file) != sig):
            raise Uncertain(str(store.shown(manifest_file)))
        for out in step.manifest["outputs"].values():
            objects[out["digest"]] = _confirm_object(store, out["digest"], out["size"], cache)
        nodes.append({"name": step.node.name, "stage": step.node.stage, "key": step.key, "reason": step.reason,
                      "manifest": sig})
    identity = pipeline.identity
    return {"format": FORMAT, "trtflow": trtflow.__version__, "call": call, **before,
            "environment": _environment(names), "texts": texts,
            "extends": [[spelled, str(base), str(resolved)] for spelled, base, resolved in loaded.extends],
            "recipe": {"id": identity.id, "name": identity.name, "path": str(identity.path),
                       "dir": str(loaded.directory), "nodes": list(pipeline.recipe_nodes),
                       "output_dir": call["output_dir"],
                       "roots": [str(p) for p in allowed_roots_for(identity.path.parent)],
                       "project": str(project_root(identity.path.parent))},
            "paths": dict(evidence.paths), "modules": dict(evidence.modules),
            "files": {p: _path_entry(p, d, cache) for p, d in sorted(evidence.files.items())},
            "absent": sorted(evidence.absent), "missing": sorted(evidence.missing),
            "dep_sets": [[pre, list(files), list(absent)] for pre, (files, absent) in evidence.dep_sets],
            "stages": stages, "closures": closures, "facts": dict(evidence.facts), "nodes": nodes,
            "objects": objects}


# ---------------------------------------------------------------------------------------------- checking
def read(store: Store, call: dict[str, Any]) -> dict[str, Any] | None:
    record = store.read_noop_record(record_name(call))
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("call") != call:
        return None
    return record if _names_safe(record) else None


def _names_safe(record: dict[str, Any]) -> bool:
    """The names and keys a record gives that become paths (build/<recipe>/<node>, nodes/<key>, objects/<digest>)
    are plain: a planted record naming node ``../elsewhere`` is not used."""
    from trtflow.storage.manifest import is_digest, is_key

    recipe, nodes, objects = record.get("recipe"), record.get("nodes"), record.get("objects")
    if not isinstance(recipe, dict) or not isinstance(nodes, list) or not isinstance(objects, dict):
        return False
    if not (_plain(recipe.get("name")) and isinstance(recipe.get("nodes"), list)
            and all(isinstance(n, str) for n in recipe["nodes"])):
        return False
    return all(isinstance(n, dict) and _plain(n.get("name")) and isinstance(n.get("stage"), str)
               and is_key(n.get("key")) for n in nodes) and all(is_digest(d) for d in objects)


def _plain(name: object) -> bool:
    return is_plain_name(name) and isinstance(name, str) and not name.startswith(".")


def holds(record: dict[str, Any], store: Store, journal: Any) -> bool:
    """Whether everything the record rests on is as it was (cheapest checks first)."""
    try:
        return all(check(record, store, journal) for check in _CHECKS)
    except (OSError, KeyError, TypeError, ValueError, RuntimeError, TrtflowError):  # TrtflowError: a path the
        return False  # resolver refuses now (it leaves the project): the planner says why


def _check_python(record: dict[str, Any], store: Store, journal: Any) -> bool:
    return record["trtflow"] == trtflow.__version__ and record["python"] == _python()


def _check_environment(record: dict[str, Any], store: Store, journal: Any) -> bool:
    try:
        return record["environment"] == _environment(n for n in record["environment"]
                                                     if not n.startswith("TRTFLOW_"))
    except Uncertain:
        return False


def _check_recipe(record: dict[str, Any], store: Store, journal: Any) -> bool:
    recipe = record["recipe"]
    path = Path(recipe["path"])
    roots = allowed_roots_for(path.parent)
    return (recipe_id(path) == recipe["id"] and str(project_root(path.parent)) == recipe["project"]
            and [str(p) for p in roots] == recipe["roots"]
            and all(hash_text(_text(p)) == d for p, d in record["texts"].items())
            and all(str(resolve_user_path(spelled, Path(base), roots)) == resolved
                    for spelled, base, resolved in record["extends"]))


def _check_paths(record: dict[str, Any], store: Store, journal: Any) -> bool:
    """Every path the planner resolved, resolved again by the same function from the same spelling."""
    from trtflow.callables import module_origin

    recipe_dir = Path(record["recipe"]["dir"])
    roots = allowed_roots_for(recipe_dir)
    return (all(str(resolve_user_path(spelled, recipe_dir, roots)) == resolved
                for spelled, resolved in record["paths"].items())
            and all((module_origin(name) or "") == origin for name, origin in record["modules"].items()))


def _check_store(record: dict[str, Any], store: Store, journal: Any) -> bool:
    return (all(_store_sig(store, store.manifest_rel(n["key"])) == n["manifest"] for n in record["nodes"])
            and all(_store_sig(store, store.object_rel(d)) == s for d, s in record["objects"].items()))


def _check_files(record: dict[str, Any], store: Store, journal: Any) -> bool:
    from trtflow.depfile import slot_taken

    return (all(_path_holds(p, entry) for p, entry in record["files"].items())
            and not any(slot_taken(slot) for slot in record["absent"])
            and not any(os.path.lexists(p) for p in record["missing"]))


def _check_dep_sets(record: dict[str, Any], store: Store, journal: Any) -> bool:
    """Each result of python: code was found through the journal's index: the planner finds it there again."""
    if not record["dep_sets"]:
        return True
    dep_sets = getattr(journal, "dep_sets", None)
    return dep_sets is not None and all((tuple(files), tuple(absent)) in dep_sets(pre)
                                        for pre, files, absent in record["dep_sets"])


def _check_code(record: dict[str, Any], store: Store, journal: Any) -> bool:
    if _engine_files() != record["engine"]:
        return False
    if not all(_entry_holds(stage["entry_file"], stage["entry"]) for stage in record["stages"].values()):
        return False
    for origin, c in record["closures"].items():
        package_dir = Path(c["top_file"]).resolve().parent  # resolved again: a package folder may be a link
        found = stage_files(Path(origin), c["package"], package_dir)
        if (str(package_dir) != c["package_dir"] or sorted(map(str, found)) != sorted(c["files"])
                or not all(_entry_holds(p, e) for p, e in c["files"].items())):
            return False
    return True


def _check_facts(record: dict[str, Any], store: Store, journal: Any) -> bool:
    """The facts as the planner computes them (`Environment.from_env`): a tool version changed in place (its
    metadata edited, a .pth file or sitecustomize changed) is seen as the planner sees it."""
    from trtflow.environment import FACTS, Environment

    env = Environment.from_env()
    return all(name in FACTS and env.get(name) == value for name, value in record["facts"].items())


_CHECKS: list[Callable[[dict[str, Any], Store, Any], bool]] = [
    _check_python, _check_environment, _check_recipe, _check_store, _check_paths, _check_files, _check_dep_sets,
    _check_code, _check_facts]


# ---------------------------------------------------------------------------------------------- replaying
def run_unchanged(recipe: str | Path, targets: Sequence[str], overrides: Sequence[str], store: Store, options: Any,
                  hooks: Any) -> Any:
    """Record an up-to-date run without planning, if this invocation's no-op record still holds; else None (the
    normal path plans and runs). ``options.output_dir`` is set to where the outputs are, as the normal path does."""
    from trtflow.execution.observers import HooksObserver, JournalObserver, Observers, RefsObserver
    from trtflow.execution.results import NodeResult, Notes, RunSummary, new_run_id
    from trtflow.storage.lock import SHARED, StoreLock
    from trtflow.storage.refs import RecipeIdentity

    call = invocation(recipe, targets, overrides, store, options)
    try:
        if call is None or not store.tree.is_dir():
            return None
    except OSError:  # a default store that is a link: the normal path says so
        return None
    record = read(store, call)
    if record is None:
        return None
    store.ensure()
    spec = record["recipe"]
    identity = RecipeIdentity(spec["id"], spec["name"], Path(spec["path"]))
    run_id = new_run_id()
    notes = Notes()
    journal = store.journal()
    try:
        journal_observer = JournalObserver(journal, run_id, identity, options.command, notes)
        observers = Observers([journal_observer, RefsObserver(store.refs, identity, run_id, spec["nodes"], notes),
                               HooksObserver(hooks)])
        # where outputs go: this invocation's --output-dir (part of the record's call, compared above), else
        # build/<recipe> below the working folder (no link below it followed)
        output_dir = Path(call["output_dir"]) if call["output_dir"] else (Path("build") / spec["name"]).absolute()
        output_base = None if call["output_dir"] else Path.cwd()
        results: dict[str, NodeResult] = {}
        with StoreLock(store.tree).held(SHARED, f"trtflow run {identity.id} (run {run_id})",
                                        on_wait=lambda msg: observers.node_waiting("(store)", msg)):
            if not holds(record, store, journal):  # under the lock: gc cannot remove anything it checked
                return None
            options.output_dir, options.output_base = output_dir, output_base
            journal_observer.reap_dead_runs(store)
            status = "failed"
            try:
                observers.run_started(run_id, [])
                for node in record["nodes"]:
                    manifest = store.read_manifest(node["key"]) or {}
                    outputs: dict[str, Path] = {}
                    try:
                        outputs = store.materialize(manifest, output_dir / node["name"], output_base)
                    except OSError as exc:
                        from trtflow.storage.store import materialize_error

                        notes.problem(materialize_error(node["name"], output_dir / node["name"], exc).message)
                    results[node["name"]] = NodeResult(node["name"], node["stage"], FRESH, node["reason"],
                                                       node["key"], outputs=outputs,
                                                       summary=manifest.get("summary", {}))
                observers.nodes_up_to_date(list(results.values()))
                status = "failed" if notes.problems else "ok"
            except KeyboardInterrupt:
                status = "interrupted"
                raise
            finally:
                observers.run_ended(status)
    finally:
        journal.close()
    summary = RunSummary(run_id, results)
    summary.problems, summary.warnings = notes.problems, notes.warnings
    return summary
