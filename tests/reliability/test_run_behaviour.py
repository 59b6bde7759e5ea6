"""How a run behaves around real-size work: memory-aware scheduling, progress a CI log can read, outputs under
build/ that never show a previous version as current, and quality gates whose measurements are cached."""

from __future__ import annotations

import itertools
import re
import sqlite3
import textwrap
from pathlib import Path
from typing import Any

from pydantic import Field

from tests.engine.inline import run_inline
from tests.engine.toystages import STAGES, get_stage
from trtflow.environment import Environment
from trtflow.execution import diagnosis
from trtflow.execution.results import RunOptions
from trtflow.execution.scheduler import Capacity, Scheduler
from trtflow.graph import build_graph
from trtflow.pipeline import identity_of
from trtflow.plan import make_plan
from trtflow.recipe.expand import expand
from trtflow.recipe.load import load_recipe
from trtflow.stage import GateContext, Input, Output, Resources, Stage, StageContext, StageParams
from trtflow.storage.journal import Journal
from trtflow.storage.store import Store

GIB = 1 << 30


def test_the_scheduler_never_starts_nodes_whose_memory_needs_exceed_the_machine() -> None:
    scheduler = Scheduler(Capacity(cpu_slots=4, memory=10 * GIB, gpus=[]))
    first = scheduler.try_allocate(Resources(cpu=1), 6 * GIB)
    assert first is not None
    assert scheduler.try_allocate(Resources(cpu=1), 6 * GIB) is None  # 12 GiB > 10 GiB: waits
    small = scheduler.try_allocate(Resources(cpu=1), 3 * GIB)
    assert small is not None  # 9 GiB fits
    scheduler.release(first)
    scheduler.release(small)
    alone = scheduler.try_allocate(Resources(cpu=1), 30 * GIB)
    assert alone is not None, "a node larger than the machine still runs, alone"
    assert scheduler.try_allocate(Resources(cpu=1), 1) is None


def test_an_exclusive_node_runs_alone() -> None:
    scheduler = Scheduler(Capacity(cpu_slots=4, memory=10 * GIB, gpus=[]))
    busy = scheduler.try_allocate(Resources(cpu=1), GIB)
    assert scheduler.try_allocate(Resources(cpu=1, exclusive=True), GIB) is None
    scheduler.release(busy)
    bench = scheduler.try_allocate(Resources(cpu=1, exclusive=True), GIB)
    assert bench is not None and scheduler.try_allocate(Resources(cpu=1), GIB) is None


def test_memory_heavy_nodes_run_one_after_the_other_under_memory(tmp_path: Path, trtflow) -> None:
    recipe = tmp_path / "heavy.yaml"
    nodes = "\n".join(f"  - {{name: h{i}, stage: synth, params: {{text: h{i}, sleep: 0.3}}, "
                      f"resources: {{memory_mb: 3000}}}}" for i in range(3))
    recipe.write_text(f"name: heavy\nnodes:\n{nodes}\n")
    proc = trtflow("run", str(recipe), "-j", "4", "--memory", "4G")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = sqlite3.connect(tmp_path / "store" / "trtflow.db").execute(
        "SELECT started, ended FROM node_runs WHERE status = 'done' ORDER BY started").fetchall()
    assert len(rows) == 3
    for (_, end), (start, _) in itertools.pairwise(rows):
        assert start >= end, f"two 3000 MiB nodes overlapped under --memory 4G: {rows}"


def test_progress_is_plain_lines_in_a_ci_log(tmp_path: Path, trtflow) -> None:
    recipe = tmp_path / "slow.yaml"
    recipe.write_text("name: slow\nnodes:\n  - {name: a, stage: synth, params: {sleep: 1.5}}\n")
    proc = trtflow("run", str(recipe))
    assert proc.returncode == 0
    assert re.search(r"^  a\s+0%  sleeping 1.5s  \d+s", proc.stdout, re.M), proc.stdout
    assert "\x1b[" not in proc.stdout and "\r" not in proc.stdout


def test_outputs_of_a_node_that_must_run_again_are_removed_before_it_runs(tmp_path: Path, trtflow) -> None:
    recipe = tmp_path / "chain.yaml"
    body = textwrap.dedent("""\
        name: chain
        nodes:
          - {{name: src, stage: synth, params: {{text: {text}}}}}
          - {{name: bad, stage: faulty, params: {{mode: {mode}}}, inputs: {{source: src}}}}
        """)
    recipe.write_text(body.format(text="v1", mode="ok"))
    assert trtflow("run", str(recipe)).returncode == 0
    old = tmp_path / "build" / "chain" / "bad" / "data.bin"
    assert old.exists()
    recipe.write_text(body.format(text="v2", mode="raise"))
    proc = trtflow("run", str(recipe))
    assert proc.returncode == 1
    assert not old.exists(), "the previous model's output still looks current after the node failed"
    assert "Removed outdated outputs" in proc.stdout and "bad" in proc.stdout.split("Removed outdated outputs")[1]
    assert (tmp_path / "build" / "chain" / "src" / "data.bin").exists()


def test_an_out_of_memory_kill_is_reported_as_such(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(diagnosis, "oom_kills", lambda: 3)
    outcome = diagnosis.diagnose(-9, False, 7 * GIB, 2, tmp_path, tmp_path / "none.log", tmp_path)
    assert "out-of-memory killer" in outcome.error and "7.0 GiB" in outcome.error
    assert "-j 1" in outcome.hint
    killed = diagnosis.diagnose(-9, True, GIB, 3, tmp_path, tmp_path / "none.log", tmp_path)
    assert "out-of-memory" not in killed.error  # we killed it ourselves (timeout, Ctrl-C)


def test_a_crash_in_a_native_step_is_named_from_a_held_scratch_folder(tmp_path: Path) -> None:
    """The runner holds a node's scratch folder as a Tree (storage/confined/folders.py) and diagnoses a crash
    from it: the native call the process died in is read through that Tree, as through a path."""
    import json

    from trtflow.stage import NATIVE_STEP_FILE
    from trtflow.storage.confined.tree import Tree

    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / NATIVE_STEP_FILE).write_text(json.dumps({"library": "tensorrt", "what": "building"}))
    held = Tree(tmp_path / "scratch")
    try:
        for scratch in (held, tmp_path / "scratch"):
            outcome = diagnosis.diagnose(-11, False, None, None, scratch, tmp_path / "none.log", tmp_path)
            assert "segmentation fault" in outcome.error and "in tensorrt while building" in outcome.error
    finally:
        held.close()


# ---------------------------------------------------------------------------------------------- cached gates
class GatedParams(StageParams):
    value: float = Field(default=0.5, description="The measurement the stage reports.")
    minimum: float = Field(default=0.9, description="Gate threshold.")


RUNS: list[str] = []


def _measure(ctx: StageContext, inputs: dict[str, Path], params: GatedParams) -> dict[str, Any]:
    RUNS.append(ctx.node)
    ctx.output("metrics").write_text(f'{{"score": {params.value}}}')
    return {"score": params.value}


def _gate(params: GatedParams, summary: Any, gate_ctx: GateContext) -> list[str]:
    return [] if summary["score"] >= params.minimum else [f"score {summary['score']} < {params.minimum}"]


GATED = Stage("gated", "1", "measures, then the engine judges", GatedParams, _measure,
              outputs={"metrics": Output("onnx", "metrics.json")}, gate=_gate, gate_params=("minimum",))


class ChooserParams(StageParams):
    pass


def _choose(ctx: StageContext, inputs: dict[str, Path], params: ChooserParams) -> dict[str, Any]:
    RUNS.append(ctx.node)
    verdicts = {e["node"]: e.get("gate_failures") for e in ctx.input_sources["candidate"]}
    ctx.output("choice").write_text(repr(verdicts))
    return {"verdicts": verdicts}


CHOOSER = Stage("chooser", "1", "reads its candidates' current verdicts", ChooserParams, _choose,
                inputs={"candidate": Input("onnx", accept_gate_failed=True)},
                outputs={"choice": Output("onnx", "choice.txt")})


def _run(tmp_path: Path, minimum: float) -> tuple[dict, dict]:
    stages = dict(STAGES, gated=GATED, chooser=CHOOSER)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nnodes:\n  - {{name: g, stage: gated, params: {{value: 0.5, minimum: {minimum}}}}}\n"
                      "  - {name: after, stage: consume, inputs: {model: g}}\n"
                      "  - {name: pick, stage: chooser, inputs: {candidate: g}}\n")
    lookup = stages.__getitem__
    loaded = load_recipe(recipe)
    graph = build_graph(expand(loaded, lookup), lookup, "r")
    steps, summary = run_inline(loaded, graph, Store(tmp_path / "store"), Environment({"python": "3.11"}),
                                RunOptions(jobs=1, output_dir=tmp_path / "build", keep_going=True))
    return {s.node.name: s for s in steps}, summary.results


def test_a_failed_gate_is_a_cached_result_rejudged_when_the_threshold_changes(tmp_path: Path) -> None:
    assert get_stage("source")  # the toy registry is importable
    RUNS.clear()
    plan, results = _run(tmp_path, 0.9)
    assert results["g"].status == "gate_failed" and "score 0.5 < 0.9" in results["g"].error
    assert results["after"].status == "blocked"
    assert results["pick"].status == "done", "a chooser takes candidates whose gate failed, with their verdict"
    assert results["pick"].summary["verdicts"] == {"g": ["score 0.5 < 0.9"]}
    assert (tmp_path / "build" / "g" / "metrics.json").exists(), "a failed gate still writes its metrics"
    plan, results = _run(tmp_path, 0.9)
    assert RUNS == ["g", "pick"], "an unchanged failing node must not be measured again"
    assert plan["g"].status == "fresh" and plan["g"].reason.startswith("gate failed last run: score 0.5 < 0.9")
    assert results["g"].status == "gate_failed" and plan["pick"].status == "fresh"
    plan, results = _run(tmp_path, 0.4)
    assert RUNS == ["g", "pick", "pick"], "a new threshold re-judges the measurement and re-runs the chooser only"
    assert plan["pick"].status == "stale" and "g now passes its gate" in plan["pick"].reason
    assert results["g"].status == "fresh" and results["after"].status == "done"
    assert results["pick"].summary["verdicts"] == {"g": []}


def test_a_journal_write_that_hits_a_full_disk_fails_the_run_cleanly(tmp_path: Path, monkeypatch) -> None:
    """Injection: SQLite reports a full disk while a finished node is recorded. The node's result is committed,
    the run ends "failed" with the store's message (exit 4 in the CLI), and nothing escapes as an internal error."""
    from trtflow.storage import journal as journal_module

    real = journal_module.Journal.node_state

    def full(self, run_id, node, stage, key, status, *args, **kwargs):
        if status == "done":
            raise journal_module.StoreFull("no space left on the disk holding the store /x while recording node a")
        return real(self, run_id, node, stage, key, status, *args, **kwargs)

    monkeypatch.setattr(journal_module.Journal, "node_state", full)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nnodes:\n  - {name: a, stage: source, params: {value: v}}\n")
    loaded = load_recipe(recipe)
    graph = build_graph(expand(loaded, get_stage), get_stage, "r")
    store = Store(tmp_path / "store")
    env = Environment({"python": "3.11"})
    _, summary = run_inline(loaded, graph, store, env)
    assert summary.results["a"].status == "done" and not summary.ok
    assert any("no space left" in p for p in summary.problems)
    monkeypatch.undo()
    journal = Journal(store.db_path)
    assert journal.runs(1)[0]["status"] == "failed"
    again = make_plan(graph, store, env, tmp_path, journal, identity_of(loaded.path, "r").id)
    assert again[0].status == "fresh"  # the committed result is there: the next run resumes from it
    journal.close()
