"""The Python API: plan and run recipes from code (the CLI is a thin layer over these functions)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtflow.environment import Environment
from trtflow.execution.results import Hooks, RunOptions, RunSummary, resume_command
from trtflow.execution.run import Runner
from trtflow.pipeline import Pipeline, default_store, load_pipeline
from trtflow.plan import Step, make_plan
from trtflow.storage.journal import Journal


def plan(recipe: str | Path, targets: Sequence[str] = (), overrides: Sequence[str] = (),
         store: str | Path | None = None) -> list[Step]:
    """Which nodes of ``recipe`` are fresh, stale or skipped here, and why. Runs nothing; writes nothing."""
    pipeline = load_pipeline(recipe, overrides, targets)
    st = default_store(store)
    st.check_format()
    journal = Journal(st.db_path, readonly=True) if st.db_path.exists() else None
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
    pipeline = load_pipeline(recipe, overrides, targets)
    st = default_store(store)
    st.ensure()
    journal = Journal(st.db_path)
    try:
        env = Environment.from_env()
        steps = make_plan(pipeline.graph, st, env, pipeline.loaded.directory, journal, pipeline.identity.id)
        options = options or RunOptions(command=resume_command(["run", str(recipe)]))
        if options.output_dir is None:
            options.output_dir = (Path("build") / pipeline.name).absolute()
        runner = Runner(pipeline.graph, st, env, pipeline.identity, journal, options, hooks,
                        recipe_nodes=pipeline.recipe_nodes)
        summary = runner.run(steps)
        return pipeline, steps, summary
    finally:
        journal.close()


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
