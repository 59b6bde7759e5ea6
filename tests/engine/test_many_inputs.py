"""Many-slots: a slot that takes every artifact its references name (all variants of a matrix node), with
where each came from, through the real runner and worker processes; gate-failed producers feed a slot that
accepts them instead of blocking it."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from trtflow import api
from trtflow.errors import RecipeError
from trtflow.execution.results import RunOptions

PLUGIN = Path(__file__).resolve().parent / "many_plugin"


@pytest.fixture
def many_stages(tmp_path_factory, monkeypatch):
    from tests.reliability.plugins import activate_in_process

    dist = tmp_path_factory.mktemp("many-dist")
    info = dist / "trtflow_test_many-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trtflow-test-many\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[trtflow.stages]\nemit = trtflow_test_many:emit\n"
                                           "gather = trtflow_test_many:gather\n")
    paths = [str(dist), str(PLUGIN)]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])]))
    activate_in_process(paths)
    yield
    from trtflow import registry

    registry.stage_entry_points.cache_clear()
    registry.get_stage.cache_clear()


RECIPE = """\
name: many
nodes:
  - name: emit
    stage: emit
    matrix: {value: [a, bbb, cc]}
  - name: single
    stage: emit
    params: {value: zz}
  - name: gather
    stage: gather
    inputs: {items: [single, emit]}
"""


def run(tmp_path: Path, text: str = RECIPE, overrides=()):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(textwrap.dedent(text))
    options = RunOptions(jobs=2, output_dir=tmp_path / "build")
    return api.run(recipe, (), overrides, tmp_path / "store", options)


def test_many_slot_gets_every_variant_with_its_source(tmp_path, many_stages):
    pipeline, _, summary = run(tmp_path)
    assert pipeline.graph.nodes["gather"].upstream["items"] == [
        ("single", "text"), ("emit-a", "text"), ("emit-bbb", "text"), ("emit-cc", "text")]
    assert summary.ok, {n: (r.status, r.error) for n, r in summary.results.items()}
    gathered = json.loads((tmp_path / "build" / "gather" / "gathered.json").read_text())
    assert [(e["folder"], e["text"]) for e in gathered] == [
        ("single", "zz"), ("emit-a", "a"), ("emit-bbb", "bbb"), ("emit-cc", "cc")]
    assert gathered[1]["source"] == {"node": "emit-a", "template": "emit", "matrix": {"value": "a"}, "inputs": {}}


def test_many_slot_keyed_by_producer_names(tmp_path, many_stages):
    run(tmp_path)
    renamed = RECIPE.replace("name: single", "name: lone").replace("[single, emit]", "[lone, emit]")
    steps = {s.node.name: s for s in api.plan(_write(tmp_path, renamed), store=tmp_path / "store")}
    assert steps["lone"].status == "fresh"  # same content under another name...
    assert steps["gather"].status == "stale"  # ...but the chooser names its candidates, so it runs again
    assert "items[lone.text]" in steps["gather"].reason


def test_gate_failed_producer_feeds_an_accepting_slot_without_stopping_the_run(tmp_path, many_stages):
    _, _, summary = run(tmp_path, RECIPE.replace("params: {value: zz}", "params: {value: zz, min_length: 3}"))
    assert summary.results["single"].status == "gate_failed"
    assert summary.results["gather"].status == "done"
    assert not summary.ok  # a failed gate is still a failed gate
    gathered = json.loads((tmp_path / "build" / "gather" / "gathered.json").read_text())
    assert [e["folder"] for e in gathered] == ["single", "emit-a", "emit-bbb", "emit-cc"]


def test_wired_to_an_optional_output_that_was_not_written(tmp_path, many_stages):
    _, _, summary = run(tmp_path, RECIPE.replace("[single, emit]", "[single.extra]"))
    result = summary.results["gather"]
    assert result.status == "failed"
    assert result.error.startswith("input(s) not produced: items <- single.extra (optional outputs")


def test_many_slot_recipe_errors(tmp_path, many_stages):
    with pytest.raises(RecipeError, match="needs input 'items': a list of nodes"):
        run(tmp_path, RECIPE.replace("    inputs: {items: [single, emit]}\n", ""))
    with pytest.raises(RecipeError, match="unknown node 'emitt'") as error:
        run(tmp_path, RECIPE.replace("[single, emit]", "[single, emitt]"))
    assert "did you mean 'emit'" in (error.value.hint or "")


def _write(tmp_path: Path, text: str) -> Path:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(textwrap.dedent(text))
    return recipe
