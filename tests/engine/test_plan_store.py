"""The planner on toy graphs with a real store, and the store's atomicity and integrity checks."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.engine.inline import run_inline
from tests.engine.toystages import get_stage
from trtflow.environment import Environment
from trtflow.graph import build_graph
from trtflow.pipeline import identity_of
from trtflow.plan import make_plan
from trtflow.recipe.expand import expand
from trtflow.recipe.load import load_recipe
from trtflow.storage.gc import collect_garbage
from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

RECIPE = """\
name: toy
nodes:
  - {name: a, stage: source, params: {value: hello}}
  - {name: b, stage: consume, params: {suffix: "!"}}
  - {name: c, stage: consume, inputs: {model: a}, params: {suffix: "?"}}
"""


def setup(tmp_path: Path, text: str = RECIPE, overrides=()):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text))
    loaded = load_recipe(path, overrides)
    graph = build_graph(expand(loaded, get_stage), get_stage, loaded.recipe.name)
    return loaded, graph


def plan_of(tmp_path, store, env=None, overrides=()):
    loaded, graph = setup(tmp_path, overrides=overrides)
    steps = make_plan(graph, store, env or Environment({"python": "3.11"}), tmp_path,
                      recipe_id=identity_of(loaded.path, "toy").id)
    return {s.node.name: s for s in steps}


def run_all(tmp_path, store, env=None, overrides=()):
    """Run the toy recipe in-process (the toy stages are not installed as entry points)."""
    loaded, graph = setup(tmp_path, overrides=overrides)
    return run_inline(loaded, graph, store, env or Environment({"python": "3.11"}))[1]


def test_fresh_after_run_and_reasons_for_changes(tmp_path):
    store = Store(tmp_path / "store")
    first = plan_of(tmp_path, store)
    assert {n: s.status for n, s in first.items()} == {"a": "stale", "b": "stale", "c": "stale"}
    assert first["a"].reason == "never built"
    assert first["b"].reason == "upstream a will run first"
    summary = run_all(tmp_path, store)
    assert summary.ok and summary.count("done") == 3
    again = plan_of(tmp_path, store)
    assert all(s.status == "fresh" for s in again.values())
    changed = plan_of(tmp_path, store, overrides=["nodes.b.params.suffix=??"])
    assert changed["a"].status == "fresh" and changed["c"].status == "fresh"
    assert changed["b"].status == "stale" and changed["b"].reason == "params.suffix changed ! -> ??"
    upstream = plan_of(tmp_path, store, overrides=["nodes.a.params.value=bye"])
    assert upstream["a"].reason == "params.value changed hello -> bye"
    assert upstream["b"].status == "stale" and upstream["c"].status == "stale"
    fact = plan_of(tmp_path, store, env=Environment({"python": "3.12"}))
    assert fact["a"].reason == "python 3.11 -> 3.12"
    assert fact["b"].reason == "upstream a will run first"


def test_changed_input_is_explained_at_run_time(tmp_path):
    store = Store(tmp_path / "store")
    run_all(tmp_path, store)
    summary = run_all(tmp_path, store, overrides=["nodes.a.params.value=bye"])
    assert summary.results["b"].status == "done"
    assert "input model changed (from a.out)" in summary.results["b"].reason


def test_identical_upstream_output_cuts_off_downstream_rebuilds(tmp_path):
    store = Store(tmp_path / "store")
    run_all(tmp_path, store)
    # precision is a param of `a` that does not change its output: b and c must be reused, not rebuilt
    summary = run_all(tmp_path, store, overrides=["nodes.a.params.precision=fp16"])
    assert summary.results["a"].status == "done"
    assert summary.results["b"].status == "cached" and summary.results["c"].status == "cached"


def test_missing_object_makes_node_stale(tmp_path):
    store = Store(tmp_path / "store")
    run_all(tmp_path, store)
    plan = plan_of(tmp_path, store)
    digest = plan["a"].manifest["outputs"]["out"]["digest"]
    os.chmod(store.object_path(digest), 0o644)
    store.object_path(digest).unlink()
    again = plan_of(tmp_path, store)
    assert again["a"].status == "stale" and "missing" in again["a"].reason


def test_committed_objects_are_read_only_and_verify_detects_a_changed_byte(tmp_path):
    store = Store(tmp_path / "store")
    run_all(tmp_path, store)
    objects = list(store.iter_objects())
    assert objects and all(not (o.stat().st_mode & 0o222) for o in objects)
    assert verify_store(store).problems == []
    victim = objects[0]
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    data[0] ^= 1
    victim.write_bytes(bytes(data))
    report = verify_store(store)
    assert len(report.problems) >= 2  # the object and the manifest(s) using it
    assert victim.name in report.problems[0]
    stale = [s for s in plan_of(tmp_path, store).values() if s.status == "stale"]
    assert stale and "damaged" in stale[0].reason  # plan re-hashes an object whose mtime changed
    verify_store(store, fix=True)
    assert verify_store(store).problems == []
    stale = [s for s in plan_of(tmp_path, store).values() if s.status == "stale"]
    assert stale and "removed by trtflow verify --fix" in stale[0].reason


def test_interrupted_commit_leaves_no_manifest(tmp_path, monkeypatch):
    store = Store(tmp_path / "store")
    store.ensure()
    out = tmp_path / "out"
    out.mkdir()
    (out / "out.txt").write_text("data")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("trtflow.storage.confined.tree.Tree.write_bytes", boom)
    with pytest.raises(OSError):
        store.commit("0f" * 16, {"node": "x"}, out, {"out": ("out.txt", "onnx")})
    assert store.read_manifest("0f" * 16) is None


def test_gc_keeps_latest_builds_only(tmp_path):
    store = Store(tmp_path / "store")
    run_all(tmp_path, store)
    run_all(tmp_path, store, overrides=["nodes.a.params.value=bye"])
    result = collect_garbage(store)
    removed = [r for r in result.removals if r.what == "result"]
    assert len(removed) == 3 and all(r.why.startswith("superseded") for r in removed)
    assert all(s.status == "fresh" for s in plan_of(tmp_path, store, overrides=["nodes.a.params.value=bye"]).values())
