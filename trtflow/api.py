"""The Python API: plan and run recipes from code (the CLI is a thin layer over these functions)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtflow.environment import Environment
from trtflow.pipeline import Pipeline, default_store, load_pipeline
from trtflow.plan import Step, make_plan
from trtflow.runner import Hooks, Runner, RunOptions, RunSummary, resume_command
from trtflow.storage.journal import Journal


def plan(recipe: str | Path, targets: Sequence[str] = (), overrides: Sequence[str] = (),
         store: str | Path | None = None) -> list[Step]:
    """Which nodes of ``recipe`` are fresh or stale, and why. Runs nothing."""
    pipeline = load_pipeline(recipe, overrides, targets)
    st = default_store(store)
    journal = Journal(st.db_path) if st.root.exists() else None
    try:
        return make_plan(pipeline.graph, st, Environment.from_env(), pipeline.loaded.directory, journal)
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
        steps = make_plan(pipeline.graph, st, env, pipeline.loaded.directory, journal)
        options = options or RunOptions(command=resume_command(["run", str(recipe)]))
        if options.output_dir is None:
            options.output_dir = (Path("build") / pipeline.name).absolute()
        summary = Runner(pipeline.graph, st, env, pipeline.loaded.path, journal, options, hooks).run(steps)
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
    results: dict[str, dict[str, Any]] = {}
    for name, node in pipeline.graph.nodes.items():
        key = st.read_ref(pipeline.name, name)
        manifest = st.read_manifest(key) if key else None
        if manifest is None:
            continue
        results[name] = {"key": key, "stage": node.stage, "summary": manifest.get("summary") or {},
                         "facts": manifest.get("facts") or {}, "outputs": manifest.get("outputs") or {}}
    return results
