"""How a run records what it did, whatever way it ends (issue 20, items 7 and 10).

- A committed result is in the recipe's refs (gc's roots) before anything hears that its node is done, so a run
  killed right after a commit never leaves a result that gc takes for garbage.
- A run that dies of an error (a hook that raises, an executor that cannot start) still ends in the journal as
  failed, with the refs of what it used, instead of staying "running" forever.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from tests.engine.toystages import STAGES
from trtflow.environment import Environment
from trtflow.execution.local import InlineExecutor
from trtflow.execution.results import Hooks, NodeResult, RunOptions
from trtflow.execution.run import Runner
from trtflow.fsutil import recipe_id
from trtflow.graph import build_graph
from trtflow.pipeline import identity_of
from trtflow.plan import make_plan
from trtflow.recipe.expand import expand
from trtflow.recipe.load import load_recipe
from trtflow.stage import Input, Output, Stage, StageContext, StageParams
from trtflow.storage.journal import Journal
from trtflow.storage.store import Store

ENV = Environment({"python": "3.11"})


class WitnessParams(StageParams):
    store: str = Field(description="The store whose refs the stage reads.")
    recipe: str = Field(description="The recipe id whose refs the stage reads.")


def _witness(ctx: StageContext, inputs: dict[str, Path], params: WitnessParams) -> dict[str, Any]:
    """Reads the refs as gc would, at the moment the node starts."""
    ctx.output("out").write_text("seen")
    return {"refs": Store(Path(params.store)).refs.current(params.recipe)}


WITNESS = Stage("witness", "1", "reads the refs", WitnessParams, _witness,
                inputs={"model": Input("onnx")}, outputs={"out": Output("onnx", "seen.txt")})
LOOKUP = dict(STAGES, witness=WITNESS)


def _setup(tmp_path: Path, text: str) -> tuple[Any, Any, Store]:
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text))
    loaded = load_recipe(path)
    graph = build_graph(expand(loaded, LOOKUP.__getitem__), LOOKUP.__getitem__, loaded.recipe.name)
    store = Store(tmp_path / "store")
    store.ensure()
    return loaded, graph, store


def _run(loaded: Any, graph: Any, store: Store, hooks: Hooks | None = None) -> Any:
    identity = identity_of(loaded.path, loaded.recipe.name)
    journal = Journal(store.db_path)
    try:
        steps = make_plan(graph, store, ENV, loaded.directory, journal, identity.id)
        return Runner(graph, store, ENV, identity, journal, RunOptions(jobs=1), hooks,
                      executor=InlineExecutor(graph.stages)).run(steps)
    finally:
        journal.close()


def test_a_committed_result_is_in_the_refs_before_its_consumer_starts(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    rid = recipe_id(tmp_path / "r.yaml")
    first = "name: r\nnodes:\n  - {name: z, stage: source, params: {value: earlier}}\n"
    _run(*_setup(tmp_path, first))  # z is up to date in the next run: its refs are written when that run starts
    loaded, graph, store = _setup(tmp_path, first + f"""\
  - {{name: a, stage: source, params: {{value: hello}}}}
  - {{name: b, stage: witness, inputs: {{model: a}}, params: {{store: "{store_dir}", recipe: "{rid}"}}}}
""")
    summary = _run(loaded, graph, store)
    assert summary.ok, summary.results
    key_a = summary.results["a"].key
    assert summary.results["b"].summary["refs"].get("a") == key_a, \
        "a result was committed but gc's roots did not name it yet (a kill -9 now would lose it to gc)"
    assert store.refs.current(rid) == {"z": summary.results["z"].key, "a": key_a, "b": summary.results["b"].key}
    folder = store.refs.folder(rid)
    assert not (folder / ".pending.jsonl").exists(), "the run's end folds the pending records into current.json"


class Exploding(Hooks):
    def on_node_end(self, result: NodeResult) -> None:
        if result.node == "b":
            raise RuntimeError("a hook failed")


def test_a_run_stopped_by_a_failing_hook_ends_as_failed_and_keeps_its_refs(tmp_path: Path) -> None:
    loaded, graph, store = _setup(tmp_path, """\
        name: r
        nodes:
          - {name: a, stage: source, params: {value: hello}}
          - {name: b, stage: consume, inputs: {model: a}, params: {suffix: "!"}}
          - {name: c, stage: consume, inputs: {model: b}, params: {suffix: "?"}}
        """)
    with pytest.raises(RuntimeError, match="a hook failed"):
        _run(loaded, graph, store, Exploding())
    journal = Journal(store.db_path)
    try:
        run = journal.runs(1)[0]
        assert run["status"] == "failed", "the journal still says the dead run is running"
        assert journal.running_runs() == []
    finally:
        journal.close()
    refs = store.refs.current(recipe_id(tmp_path / "r.yaml"))
    assert set(refs) == {"a", "b"}, "results committed before the error must stay gc roots"
    again = _run(loaded, graph, store)
    assert again.ok and again.results["a"].status == "fresh" and again.results["b"].status == "fresh"
    assert again.results["c"].status == "done"


def test_a_runs_folders_are_made_under_the_store_lock_not_before(tmp_path: Path) -> None:
    """A run makes `logs/<run>` and `tmp/<run>` only once it holds the store lock: made before (the fork server's log
    folder, when the runner was built), gc holding the lock meanwhile removed it as an old run's logs and the run
    then failed with an internal error (seen once in CI: test_gc_in_a_tight_loop_beside_a_40_node_run)."""
    from trtflow.storage.gc import collect_garbage

    loaded, graph, store = _setup(tmp_path, """\
        name: folders
        nodes:
          - name: a
            stage: source
            params: {value: "1"}
        """)
    identity = identity_of(loaded.path, loaded.recipe.name)
    journal = Journal(store.db_path)
    try:
        runner = Runner(graph, store, ENV, identity, journal, RunOptions(jobs=1))  # the default (local) executor
        assert not (store.root / "logs" / runner.run_id).exists() and not (store.root / "tmp" / runner.run_id).exists()
        collect_garbage(store, wait_s=5.0)  # takes the lock the run has not taken yet
    finally:
        journal.close()
