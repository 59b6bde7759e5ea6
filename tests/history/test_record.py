"""What a run adds to the history: each measurement's figures once, from the stage's ``figures`` declaration."""

from __future__ import annotations

import sqlite3
import textwrap
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from tests.engine.toystages import STAGES
from trtflow.environment import Environment
from trtflow.execution.local import InlineExecutor
from trtflow.execution.results import NodeResult, RunOptions
from trtflow.execution.run import Runner
from trtflow.graph import build_graph
from trtflow.history.record import RunInfo, rows_of
from trtflow.history.trend import series_of
from trtflow.pipeline import identity_of
from trtflow.plan import make_plan
from trtflow.recipe.expand import expand
from trtflow.recipe.load import load_recipe
from trtflow.stage import Figure, Figures, Output, Stage, StageContext, StageParams
from trtflow.storage.journal import Journal
from trtflow.storage.store import Store

ENV = Environment({"python": "3.11"})


class TimedParams(StageParams):
    latency: float = Field(description="The latency the stage reports.")
    broken: bool = Field(False, description="figures() raises.")


def _timed(ctx: StageContext, inputs: dict[str, Path], params: TimedParams) -> dict[str, Any]:
    ctx.output("out").write_text(f"{params.latency} measured at {time.time()}")
    return {"latency_ms": params.latency, "interval": [params.latency * 0.9, params.latency * 1.1], "queries": 100,
            "measured_at": time.time()}


def _figures(params: TimedParams, summary: dict[str, Any]) -> Figures:
    if params.broken:
        raise KeyError("latency")
    low, high = summary["interval"]
    return Figures((Figure("p50 latency, batch 1", summary["latency_ms"], "ms", "lower", low, high,
                           summary["queries"], primary=True),
                    Figure("not a number", float("nan"), "ms", "lower")), {"gpu": "none"})


TIMED = Stage("timed", "1", "reports a latency", TimedParams, _timed, outputs={"out": Output("metrics", "t.txt")},
              figures=_figures)
LOOKUP = dict(STAGES, timed=TIMED)


def _run(tmp_path: Path, latency: float, broken: bool = False, rerun: frozenset[str] = frozenset()) -> Any:
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: r
        nodes:
          - {{name: bench, stage: timed, params: {{latency: {latency}, broken: {str(broken).lower()}}}}}
          - {{name: src, stage: source, params: {{value: x}}}}
        """))
    loaded = load_recipe(path)
    graph = build_graph(expand(loaded, LOOKUP.__getitem__), LOOKUP.__getitem__, loaded.recipe.name)
    store = Store(tmp_path / "store")
    store.ensure()
    identity = identity_of(loaded.path, loaded.recipe.name)
    journal = Journal(store.db_path)
    try:
        steps = make_plan(graph, store, ENV, loaded.directory, journal, identity.id, rerun)
        summary = Runner(graph, store, ENV, identity, journal, RunOptions(jobs=1, rerun=rerun),
                         executor=InlineExecutor(graph.stages)).run(steps)
        return summary, journal.history(identity.id), steps
    finally:
        journal.close()


def test_each_measurement_adds_its_figures_once(tmp_path: Path) -> None:
    first, rows, _ = _run(tmp_path, 2.0)
    assert first.ok
    assert [(r["node"], r["figure"], r["value"], r["low"], r["high"], r["n"], r["run_id"]) for r in rows] == [
        ("bench", "p50 latency, batch 1", 2.0, 1.8, 2.2, 100, first.run_id)], "a NaN figure is left out"
    assert rows[0]["is_primary"] == 1 and rows[0]["better"] == "lower" and '"gpu": "none"' in rows[0]["facts"]

    again, rows, _ = _run(tmp_path, 2.0)  # the same result, reused: not a new measurement
    assert again.results["bench"].status == "fresh"
    assert len(rows) == 1 and rows[0]["run_id"] == first.run_id

    third, rows, _ = _run(tmp_path, 2.5)
    assert [r["value"] for r in rows] == [2.0, 2.5] and rows[1]["run_id"] == third.run_id
    (series,) = series_of(rows)
    assert (series.node, series.figure, series.values, series.primary) == ("bench", "p50 latency, batch 1",
                                                                          [2.0, 2.5], True)
    assert series.points[1].facts == {"gpu": "none"}


def test_rerun_measures_a_stored_result_again_and_adds_a_point(tmp_path: Path) -> None:
    first, _, _ = _run(tmp_path, 2.0)
    again, rows, steps = _run(tmp_path, 2.0, rerun=frozenset({"bench"}))
    plan = {s.node.name: s for s in steps}
    assert plan["bench"].status == "stale" and "--rerun" in plan["bench"].reason
    assert plan["src"].status == "fresh", "only the nodes named run again"
    assert again.results["bench"].status == "done" and again.results["bench"].key == first.results["bench"].key
    assert [r["run_id"] for r in rows] == [first.run_id, again.run_id], "a new measurement under the same key"
    store = Store(tmp_path / "store")
    assert store.read_manifest(first.results["bench"].key)["run_id"] == again.run_id, "the stored result replaced"


def test_a_stage_whose_figures_fail_gets_a_warning_and_its_run_succeeds(tmp_path: Path) -> None:
    summary, rows, _ = _run(tmp_path, 2.0, broken=True)
    assert summary.ok, "the result is stored: a history the stage cannot describe fails nothing"
    assert rows == []
    assert any("bench: its figures were not added to the history" in w and "KeyError" in w
               for w in summary.warnings), summary.warnings


def test_rows_of_ignores_results_that_were_not_used(tmp_path: Path) -> None:
    result = NodeResult("bench", "timed", "failed", summary={"latency_ms": 1.0, "interval": [1, 1], "queries": 1})
    assert rows_of(RunInfo("run", "r.yaml"), result, TIMED, TimedParams(latency=1.0)) == []
    result.status = "cached"
    (row,) = rows_of(RunInfo("run", "r.yaml", recorded=5.0), result, TIMED, TimedParams(latency=1.0))
    assert row["recorded"] == 5.0 and row["measurement"]


def test_a_journal_from_before_the_history_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, recipe TEXT)")
    conn.commit()
    conn.close()
    journal = Journal(path, readonly=True)
    try:
        assert journal.history("r.yaml") == []
    finally:
        journal.close()
