"""The Python API: plan and run recipes from code (the CLI is a thin layer over these functions).

The planner, the recipe schema and the runner are imported by the functions that use them, so that
`run_unchanged` (the no-op shortcut) decides without them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.execution.results import Hooks, RunOptions, RunSummary, resume_command
from trtflow.pipeline import Pipeline, default_store, load_pipeline

if TYPE_CHECKING:
    from trtflow.plan import Step


def plan(recipe: str | Path, targets: Sequence[str] = (), overrides: Sequence[str] = (),
         store: str | Path | None = None) -> list[Step]:
    """Which nodes of ``recipe`` are fresh, stale or skipped here, and why. Runs nothing; writes nothing."""
    from trtflow.environment import Environment
    from trtflow.plan import make_plan

    pipeline = load_pipeline(recipe, overrides, targets)
    st = default_store(store)
    st.check_format()
    journal = st.journal(readonly=True) if st.has_journal() else None
    try:
        return make_plan(pipeline.graph, st, Environment.from_env(), pipeline.loaded.directory, journal,
                         pipeline.identity.id)
    finally:
        if journal is not None:
            journal.close()


def run(recipe: str | Path, targets: Sequence[str] = (), overrides: Sequence[str] = (),
        store: str | Path | None = None, options: RunOptions | None = None,
        hooks: Hooks | None = None) -> tuple[Pipeline, list[Step], RunSummary]:
    """Run the stale nodes of ``recipe``; returns the pipeline, the plan and the per-node results."""
    from trtflow.environment import Environment
    from trtflow.evidence import Evidence
    from trtflow.execution import noop
    from trtflow.execution.run import Runner
    from trtflow.plan import make_plan

    options = options or RunOptions(command=resume_command(["run", str(recipe)]))
    st = default_store(store)
    call = noop.invocation(recipe, targets, overrides, st, options)  # before output_dir gets its default
    before = noop.snapshot() if call is not None else {}
    evidence = Evidence() if call is not None else None
    pipeline = load_pipeline(recipe, overrides, targets)
    options.rerun = rerun_nodes(pipeline, options.rerun)
    options.require_all_candidates = pipeline.loaded.recipe.require_all_candidates
    st.ensure()
    journal = st.journal()
    try:
        env = Environment.from_env()
        steps = make_plan(pipeline.graph, st, env, pipeline.loaded.directory, journal, pipeline.identity.id,
                          options.rerun, evidence)
        if options.output_dir is None:  # build/<recipe>: no link below the working folder is followed
            options.output_dir = (Path("build") / pipeline.name).absolute()
            options.output_base = Path.cwd()
        runner = Runner(pipeline.graph, st, env, pipeline.identity, journal, options, hooks,
                        recipe_nodes=pipeline.recipe_nodes)
        summary = runner.run(steps)
        noop.certify(call, before, pipeline, steps, st, journal, evidence, summary)
        return pipeline, steps, summary
    finally:
        journal.close()


def rerun_nodes(pipeline: Pipeline, names: Collection[str]) -> frozenset[str]:
    """The nodes ``--rerun`` names (a node, or a matrix node's name for all of its nodes), among those this run
    runs; an unknown name is a usage error (exit 2)."""
    from trtflow.errors import UsageError

    nodes = pipeline.graph.nodes
    found = frozenset(n for n, c in nodes.items() if n in names or c.template in names)
    unknown = sorted(set(names) - set(nodes) - {c.template for c in nodes.values()})
    if unknown:
        raise UsageError(f"--rerun {', '.join(unknown)}: no such node in this run",
                         hint=f"nodes: {', '.join(sorted({c.template or n for n, c in nodes.items()}))}")
    return found


def run_unchanged(recipe: str | Path, targets: Sequence[str] = (), overrides: Sequence[str] = (),
                  store: str | Path | None = None, options: RunOptions | None = None,
                  hooks: Hooks | None = None) -> RunSummary | None:
    """The no-op shortcut of `run`: if nothing the last up-to-date run of this command rested on has changed,
    record an up-to-date run without loading the recipe's schema, the stages or the planner, and return its
    summary; else None (call `run`). See `trtflow.execution.noop` for what is checked."""
    from trtflow.execution import noop

    options = options or RunOptions(command=resume_command(["run", str(recipe)]))
    return noop.run_unchanged(recipe, targets, overrides, default_store(store), options, hooks or Hooks())


def pin_latest(recipe: str | Path, nodes: Sequence[str], overrides: Sequence[str] = (),
               store: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Pin, in the store, the artifact each of ``nodes`` measured in its latest run: the outputs of the nodes that
    fed it (a model with its external weights, an engine with engine.json) and the recipe and code files it read
    (a ``python:`` model factory), so gc keeps them while the pin exists. Returns, per node, the pin's description
    (what a baseline file records, `trtflow.storage.pins.Pin.describe`) and its identity. Runs nothing."""
    from trtflow.storage.pins import Pin, PinStore, pin_record

    pipeline = load_pipeline(recipe, overrides)
    st = default_store(store)
    st.ensure()
    current = st.refs.current(pipeline.identity.id)
    pins = PinStore(st)
    graph = pipeline.graph
    root = _project_root(pipeline)
    pinned: dict[str, dict[str, Any]] = {}
    for name in nodes:
        node = graph.nodes[name]
        manifest = st.read_manifest(current[name]) if current.get(name) else None
        if manifest is None:
            continue
        inputs = {}
        for slot, refs in node.upstream.items():
            if graph.stages[node.stage].inputs[slot].many or len(refs) != 1:
                continue
            src, out = refs[0]
            produced = st.read_manifest(current[src]) if current.get(src) else None
            if produced is None or out not in (produced.get("outputs") or {}):
                continue
            objects = {o["filename"]: {"digest": o["digest"], "size": int(o["size"])}
                       for o in produced["outputs"].values()}
            inputs[slot] = {"file": produced["outputs"][out]["filename"], "objects": objects}
        files = pins.keep_files({path: root / path for path in manifest.get("files") or {}})
        pin = Pin(inputs, files, pin_record(name, pipeline.identity.id, node.params, manifest.get("summary") or {},
                                            manifest.get("key")))
        pinned[name] = {"identity": pins.write_pinned(pin), "artifact": pin.describe(), "params": dict(node.params)}
    return pinned


def unpin(identities: Sequence[str], store: str | Path | None = None) -> list[str]:
    """Remove the pins of these artifact identities from the store (what `trtflow baseline pin` made); returns the
    ones it removed. Their objects are freed by the next gc unless a recipe's results or another pin use them."""
    from trtflow.storage.pins import PinStore

    pins = PinStore(default_store(store))
    return [identity for identity in identities if pins.remove_pinned(identity)]


def _project_root(pipeline: Any) -> Path:
    from trtflow.fsutil import project_root

    folder = Path(pipeline.loaded.path).resolve().parent
    return project_root(folder) or folder


def latest_results(recipe: str | Path, overrides: Sequence[str] = (),
                   store: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Per node of ``recipe``: the stored result its latest run used (key, stage, summary, facts, outputs).

    Nodes with no stored result are left out. Reads only the store: runs nothing.
    """
    pipeline = load_pipeline(recipe, overrides)
    st = default_store(store)
    current = st.refs.current(pipeline.identity.id)
    results: dict[str, dict[str, Any]] = {}
    for name, node in pipeline.graph.nodes.items():
        key = current.get(name)
        manifest = st.read_manifest(key) if key else None
        if manifest is None:
            continue
        results[name] = {"key": key, "stage": node.stage, "summary": manifest.get("summary") or {},
                         "facts": manifest.get("facts") or {}, "outputs": manifest.get("outputs") or {},
                         "object_paths": {n: str(st.object_path(o["digest"]))
                                          for n, o in (manifest.get("outputs") or {}).items()}}
    return results
