"""The no-op run's shortcut: "nothing to do" decided without the recipe schema, the stages or the planner.

A run whose plan found every node up to date (and that qualifies, below) leaves a *no-op record* in the store,
``noop/<invocation>.json``: what that decision rested on, each item with a check as exact as the planner's own:
  - the invocation (recipe file, --set values, targets, output folder, working folder, --require-gpu), Python, its
    ``sys.path`` and the mtime of each of its folders (installing, upgrading or removing any distribution changes
    one; library versions are facts), the environment variables the recipe names, every ``TRTFLOW_*`` variable,
    ``CUDA_VISIBLE_DEVICES`` and ``PYTHONPATH``;
  - the recipe files' text (``extends`` bases too): read and hashed again, never trusted on a stat;
  - code: trtflow's own files; each stage's code and each ``python:`` file, whose import closure is found again
    from the sources as the planner finds it; the entry-point files that name the stages;
  - the files and folders the parameters name; the store's manifests and output objects;
    files are compared by size, mtime and inode, the planner's own stat-cache shortcut (each one was confirmed
    against the digest in the node's key, through the stat cache, when the record was written);
  - the facts the nodes declare that do not come from installed distributions (python, platform, cpu, gpu,
    driver): computed again.
If all of it holds, the run is recorded as an up-to-date run is (journal, refs, outputs under build/), under the
store lock, without planning; if anything differs, nothing is recorded and the normal path plans and decides.
Recipes with quality gates (a gate may read files the key does not name), GPU nodes (facts of a device), a remote
cache, ``python:`` references by module name, or nodes that cannot run here get no record; ``TRTFLOW_NO_SHORTCUT=1``
turns the shortcut off (every run plans).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import trtflow
from trtflow.callables import PYTHON_PREFIX, code_references
from trtflow.codehash import callable_files, stage_files, stage_module_place
from trtflow.environment import FACTS, Environment
from trtflow.fingerprint import RACY_WINDOW_NS, StatCache, hash_file, hash_path, hash_text, hash_value
from trtflow.fsutil import MAX_RECIPE_BYTES, allowed_roots_for, project_root, read_regular, recipe_id
from trtflow.status import FRESH
from trtflow.storage import confined
from trtflow.storage.store import Store

FORMAT = 1
LOCAL_FACTS = ("python", "platform", "cpu", "gpu", "driver")  # facts not read from installed distributions
_ENV_NAME = re.compile(r"\$\{(?!\{)([A-Za-z_][A-Za-z0-9_]*)")
Sig = list[int]  # [size, mtime_ns, inode]


class Uncertain(Exception):
    """Something the record would rest on cannot be confirmed: write none."""


def _sig(path: Path) -> Sig:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _dir_mtime(path: str) -> int | None:
    try:
        return os.stat(path or ".").st_mtime_ns
    except OSError:
        return None


def invocation(recipe: str | Path, targets: Sequence[str], overrides: Sequence[str], store: Store,
               options: Any) -> dict[str, Any] | None:
    """What identifies a run command for the shortcut; None if the shortcut never applies to it."""
    if options.remote or options.executor not in ("local", "inline") or os.environ.get("TRTFLOW_NO_SHORTCUT"):
        return None
    return {"recipe": str(Path(recipe).resolve()), "targets": list(targets), "overrides": list(overrides),
            "store": str(store.root.resolve()), "output_dir": str(options.output_dir) if options.output_dir else None,
            "cwd": os.getcwd(), "require_gpu": bool(options.require_gpu)}


def record_name(call: dict[str, Any]) -> str:
    """The name of the record of ``call`` in the store (`Store.read_noop_record`: through the store's confined tree,
    so a ``noop`` folder that is a link is never written through; the shortcut is off then)."""
    return hash_value(call)[:24]


def _environment(names: Iterable[str]) -> dict[str, str | None]:
    wanted = set(names) | {"CUDA_VISIBLE_DEVICES", "PYTHONPATH"} | {n for n in os.environ if n.startswith("TRTFLOW_")}
    return {name: os.environ.get(name) for name in sorted(wanted)}


def _engine_files() -> dict[str, Sig]:
    root = Path(trtflow.__file__).parent
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                found[str(path)] = _sig(path)
    return found


def _python() -> dict[str, Any]:
    return {"version": sys.version, "executable": sys.executable, "path": list(sys.path),
            "mtimes": [_dir_mtime(p) for p in sys.path]}


def snapshot() -> dict[str, Any]:
    """What a record rests on that must be taken before the recipe is loaded and planned: the installed
    distributions (library versions are facts) and trtflow's own code, as the planner then used them."""
    return {"python": _python(), "engine": _engine_files()}


# ---------------------------------------------------------------------------------------------- writing
def _confirm(path: Path, digest: str, cache: StatCache) -> Sig:
    """The file's signature, once its content is confirmed to be ``digest`` (through the stat cache, or hashed).

    A file changed in the last couple of seconds could change again without its mtime moving on a coarse-grained
    filesystem: like the stat cache, the record does not trust its signature yet."""
    sig = _sig(path)
    if time.time_ns() - sig[1] <= RACY_WINDOW_NS:
        raise Uncertain(f"{path} changed just now")
    if hash_file(path, cache) != digest or _sig(path) != sig:
        raise Uncertain(str(path))
    return sig


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
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _tree(path: Path) -> dict[str, Sig]:
    """The signature of every file of a folder, walked as `hash_path` walks it."""
    found = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = Path(root) / name
            found[full.relative_to(path).as_posix()] = _sig(full)
    return found


def _confirm_path(path: Path, digest: str, cache: StatCache) -> Sig | dict[str, Sig]:
    if not path.is_dir():
        return _confirm(path, digest, cache)
    tree = _tree(path)
    if any(time.time_ns() - sig[1] <= RACY_WINDOW_NS for sig in tree.values()):
        raise Uncertain(f"a file in {path} changed just now")
    if hash_path(path, cache) != digest or _tree(path) != tree:
        raise Uncertain(str(path))
    return tree


def _stage_record(stage: Any, code_files: dict[str, str], cache: StatCache) -> dict[str, Any]:
    from trtflow.registry import stage_entry_points

    ep = stage_entry_points().get(stage.name)
    dist_path = getattr(getattr(ep, "dist", None), "_path", None)
    if ep is None or dist_path is None:
        raise Uncertain(f"stage {stage.name} does not come from an entry point")
    entry_file = Path(dist_path) / "entry_points.txt"
    closures = []
    for module in dict.fromkeys([stage.run.__module__, ep.module]):
        place = stage_module_place(module)
        if place is None:
            raise Uncertain(f"module {module} has no file")
        origin, package_dir = place
        files = stage_files(origin, module.split(".")[0], package_dir)
        sigs = {}
        for path in files:
            label = _label(path, package_dir.parent)
            # the files of the key are confirmed against its digests; the entry point's module (its params'
            # defaults, its version) by its signature as the stage was loaded
            sigs[str(path)] = _confirm(path, code_files[label], cache) if label in code_files else _sig(path)
        closures.append({"origin": str(origin), "package": module.split(".")[0], "package_dir": str(package_dir),
                         "files": sigs})
    return {"entry_point": ep.value, "entry_file": str(entry_file), "entry_sig": _sig(entry_file),
            "closures": closures}


def _label(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def _node_inputs(graph: Any, node: Any, parts: Any, kctx: Any, cache: StatCache) -> dict[str, Any]:
    """The data files and ``python:`` code of one node, each confirmed against its digest in the key."""
    stage = graph.stages[node.stage]
    data: dict[str, Any] = {}
    covered = set()
    for ref in stage.files_for(node.params_model):
        path = kctx.resolve(ref)
        label = kctx.display(path)
        data[str(path)] = _confirm_path(path, parts.files[label], cache)
        covered.add(label)
    code = []
    for text in code_references(node.params):
        body = text[len(PYTHON_PREFIX):].rsplit(":", 1)[0]
        if not (body.endswith(".py") or "/" in body):
            raise Uncertain(f"{text} names a module, found through sys.path")
        entry = kctx.resolve(body)
        files = {}
        for path in callable_files(entry, kctx.project_root):
            label = kctx.display(path)
            files[str(path)] = _confirm(path, parts.files[label], cache)
            covered.add(label)
        code.append({"entry": str(entry), "root": str(kctx.project_root), "files": files})
    if set(parts.files) - covered:
        raise Uncertain(f"node {node.name}: files of its key not accounted for")
    return {"data": data, "code": code}


def certify(call: dict[str, Any] | None, before: dict[str, Any], pipeline: Any, steps: list[Any], store: Store,
            journal: StatCache, kctx: Any, summary: Any) -> bool:
    """Write the no-op record of a run whose plan found everything up to date (the slow path's last step), or
    remove an outdated one; True if written. ``before``: the `snapshot` taken before the recipe was loaded."""
    if call is None:
        return False
    name = record_name(call)
    try:
        store.remove_noop_record(name)
    except OSError:
        return False  # the noop folder is not a real folder: no record is read or written
    graph = pipeline.graph
    from trtflow.plan import node_resources

    if (not summary.ok or summary.problems or summary.warnings or not steps
            or any(s.status != FRESH or s.gate_failures or s.parts is None or s.manifest is None for s in steps)
            or any(graph.stages[s.node.stage].gate is not None or node_resources(graph, s.node).gpu > 0
                   for s in steps)):
        return False
    try:
        if before != snapshot():  # a distribution installed or trtflow changed while this run planned
            return False
        record = _gather(call, before, pipeline, steps, store, journal, kctx)
    except (Uncertain, OSError, KeyError, ValueError):
        return False
    try:
        store.write_noop_record(name, record, [n["key"] for n in record["nodes"]])
    except OSError:
        return False
    return True


def _gather(call: dict[str, Any], before: dict[str, Any], pipeline: Any, steps: list[Any], store: Store,
            cache: StatCache, kctx: Any) -> dict[str, Any]:
    graph = pipeline.graph
    loaded = pipeline.loaded
    texts = {str(p): hash_text(t) for p, t in loaded.sources.items()}
    names = {m for t in [*loaded.sources.values(), *call["overrides"]] for m in _ENV_NAME.findall(t)}
    stages = {}
    for step in steps:
        name = step.node.stage
        stages[name] = stages.get(name) or _stage_record(graph.stages[name], step.parts.code_files, cache)
    facts = sorted({f for s in steps for f in graph.stages[s.node.stage].environment_for(s.node.params_model)})
    nodes = []
    objects: dict[str, Sig] = {}
    for step in steps:
        manifest_file = store.manifest_rel(step.key)
        sig = _store_sig(store, manifest_file)
        if (store.tree.read_json(manifest_file, confined.MANIFEST) != step.manifest
                or _store_sig(store, manifest_file) != sig):
            raise Uncertain(str(store.shown(manifest_file)))
        for out in step.manifest["outputs"].values():
            objects[out["digest"]] = _confirm_object(store, out["digest"], out["size"], cache)
        nodes.append({"name": step.node.name, "stage": step.node.stage, "key": step.key, "reason": step.reason,
                      "manifest": sig, **_node_inputs(graph, step.node, step.parts, kctx, cache)})
    identity = pipeline.identity
    return {"format": FORMAT, "trtflow": trtflow.__version__, "call": call, **before,
            "environment": _environment(names), "texts": texts,
            "recipe": {"id": identity.id, "name": identity.name, "path": str(identity.path),
                       "nodes": list(pipeline.recipe_nodes), "output_dir": call["output_dir"],
                       "roots": [str(p) for p in allowed_roots_for(identity.path.parent)],
                       "project": str(project_root(identity.path.parent))},
            "stages": stages, "facts": {f: kctx.env.get(f) for f in facts if f in LOCAL_FACTS},
            "nodes": nodes, "objects": objects}


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
    return confined.is_plain_name(name) and isinstance(name, str) and not name.startswith(".")


def holds(record: dict[str, Any], store: Store) -> bool:
    """Whether everything the record rests on is as it was (cheapest checks first)."""
    try:
        return all(check(record, store) for check in _CHECKS)
    except (OSError, KeyError, TypeError, ValueError):
        return False


def _same_sigs(sigs: dict[str, Any]) -> bool:
    return all(_sig(Path(p)) == s for p, s in sigs.items())


def _check_python(record: dict[str, Any], store: Store) -> bool:
    return record["trtflow"] == trtflow.__version__ and record["python"] == _python()


def _check_environment(record: dict[str, Any], store: Store) -> bool:
    return record["environment"] == _environment(n for n in record["environment"] if not n.startswith("TRTFLOW_"))


def _check_recipe(record: dict[str, Any], store: Store) -> bool:
    recipe = record["recipe"]
    path = Path(recipe["path"])
    return (recipe_id(path) == recipe["id"] and str(project_root(path.parent)) == recipe["project"]
            and [str(p) for p in allowed_roots_for(path.parent)] == recipe["roots"]
            and all(hash_text(read_regular(p, MAX_RECIPE_BYTES).decode("utf-8")) == d
                    for p, d in record["texts"].items()))


def _check_code(record: dict[str, Any], store: Store) -> bool:
    if _engine_files() != record["engine"]:
        return False
    for stage in record["stages"].values():
        if _sig(Path(stage["entry_file"])) != stage["entry_sig"]:
            return False
        for c in stage["closures"]:
            found = stage_files(Path(c["origin"]), c["package"], Path(c["package_dir"]))
            if sorted(map(str, found)) != sorted(c["files"]) or not _same_sigs(c["files"]):
                return False
    for node in record["nodes"]:
        for c in node["code"]:
            found = callable_files(Path(c["entry"]), Path(c["root"]))
            if sorted(map(str, found)) != sorted(c["files"]) or not _same_sigs(c["files"]):
                return False
    return True


def _check_data(record: dict[str, Any], store: Store) -> bool:
    for node in record["nodes"]:
        for path, sig in node["data"].items():
            p = Path(path)
            if isinstance(sig, dict):
                if not p.is_dir() or _tree(p) != sig:
                    return False
            elif p.is_dir() or _sig(p) != sig:
                return False
    return True


def _check_facts(record: dict[str, Any], store: Store) -> bool:
    env = Environment.from_env()
    return all(name in FACTS and env.get(name) == value for name, value in record["facts"].items())


def _check_store(record: dict[str, Any], store: Store) -> bool:
    return (all(_store_sig(store, store.manifest_rel(n["key"])) == n["manifest"] for n in record["nodes"])
            and all(_store_sig(store, store.object_rel(d)) == s for d, s in record["objects"].items()))


_CHECKS: list[Callable[[dict[str, Any], Store], bool]] = [
    _check_python, _check_environment, _check_recipe, _check_store, _check_data, _check_code, _check_facts]


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
            if not holds(record, store):  # under the lock: gc cannot remove anything it checked
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
