"""Plan and run a loaded recipe in this process, as `trtflow run` would (for stages that are not installed)."""

from __future__ import annotations

from trtflow.environment import Environment
from trtflow.execution.local import InlineExecutor
from trtflow.execution.results import RunOptions, RunSummary
from trtflow.execution.run import Runner
from trtflow.graph import Graph
from trtflow.pipeline import identity_of
from trtflow.plan import Step, make_plan
from trtflow.recipe.load import LoadedRecipe
from trtflow.storage.journal import Journal
from trtflow.storage.store import Store


def run_inline(loaded: LoadedRecipe, graph: Graph, store: Store, env: Environment,
               options: RunOptions | None = None) -> tuple[list[Step], RunSummary]:
    """The plan the run started from, and the run's summary."""
    identity = identity_of(loaded.path, loaded.recipe.name)
    store.ensure()
    journal = Journal(store.db_path)
    try:
        steps = make_plan(graph, store, env, loaded.directory, journal, identity.id)
        summary = Runner(graph, store, env, identity, journal, options or RunOptions(jobs=1),
                         executor=InlineExecutor(graph.stages)).run(steps)
    finally:
        journal.close()
    return steps, summary
