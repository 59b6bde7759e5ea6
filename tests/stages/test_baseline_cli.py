"""`trtflow baseline save` on a real run, and the benchmark gate against the pinned file through the real runner:
gate params are left out of the node key, so pointing a node at a baseline re-judges its cached measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli

REPO = Path(__file__).resolve().parents[2]

RECIPE = """name: pinned
nodes:
  - name: export
    stage: export
    params: {model: 'python:m.py:build', inputs: {input: {shape: [2, 16], dynamic_axes: {0: batch}}}}
  - name: bench
    stage: benchmark
    inputs: {model: export}
    params: {backend: onnxruntime, shapes: {input: [2, 16]}, min_duration_s: 0.1, warmup_ms: 10, repeats: 3%s}
"""


trtflow = trtflow_cli


def _bench_reason(recipe: Path, cwd: Path) -> str:
    steps = json.loads(trtflow("plan", "--json", str(recipe), cwd=cwd).stdout)
    return next(step["reason"] for step in steps if step["node"] == "bench")


@pytest.mark.slow
def test_save_a_baseline_and_gate_on_it(tmp_path):
    (tmp_path / "m.py").write_text((REPO / "examples" / "models" / "tiny_mlp.py").read_text())
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE % "")
    assert "no benchmark or validate results" in trtflow("baseline", "save", str(recipe), cwd=tmp_path,
                                                         check=1).stderr
    trtflow("run", str(recipe), cwd=tmp_path)

    saved = trtflow("baseline", "save", str(recipe), cwd=tmp_path)
    path = tmp_path / "baselines" / "pinned.json"
    assert "wrote" in saved.stdout and "baseline: baselines/pinned.json" in saved.stdout
    document = json.loads(path.read_text())
    entry = document["nodes"]["bench"]
    assert document["format"] == "trtflow-baseline/1" and list(document["nodes"]) == ["bench"]
    assert entry["backend"] == "onnxruntime" and entry["repeats"] == 3
    assert entry["facts"]["cpu"] and entry["facts"]["onnxruntime"]
    (point,) = entry["points"]
    assert point["batch_size"] == 2 and point["latency_ms"]["p50"] > 0 and point["throughput_qps"] > 0
    assert "batch 2, 1 stream(s): p50" in trtflow("baseline", "show", str(path), cwd=tmp_path).stdout

    # pointing the node at the baseline changes no measurement: the node stays fresh, its gate is re-judged
    recipe.write_text(RECIPE % ",\n             baseline: baselines/pinned.json, max_regression_percent: 1000")
    plan = json.loads(trtflow("plan", "--json", str(recipe), cwd=tmp_path).stdout)
    assert [s["status"] for s in plan] == ["fresh", "fresh"]
    trtflow("run", str(recipe), cwd=tmp_path)

    # a baseline that was 100x faster (its interval too): the cached measurements now fail the gate, naming it
    assert point["queries"] >= 3 and point["latency_ci_ms"]["p50"][0] <= point["latency_ms"]["p50"]
    entry["points"][0]["latency_ms"]["p50"] /= 100
    entry["points"][0]["latency_ci_ms"]["p50"] = [v / 100 for v in point["latency_ci_ms"]["p50"]]
    path.write_text(json.dumps(document))
    trtflow("run", str(recipe), cwd=tmp_path, check=1)
    reason = _bench_reason(recipe, tmp_path)
    assert "gate failed" in reason and "above the baseline's" in reason and "max_regression_percent 1000" in reason

    # a baseline from another CPU is refused, saying why
    entry["points"][0]["latency_ms"]["p50"] *= 100
    entry["points"][0]["latency_ci_ms"]["p50"] = [v * 100 for v in point["latency_ci_ms"]["p50"]]
    entry["facts"]["cpu"] = "x86_64 Some Other CPU x64"
    path.write_text(json.dumps(document))
    trtflow("run", str(recipe), cwd=tmp_path, check=1)
    reason = _bench_reason(recipe, tmp_path)
    assert "not compared with baseline" in reason and "Some Other CPU" in reason


@pytest.mark.slow
def test_a_gate_too_noisy_to_judge_is_inconclusive_not_a_failure(tmp_path):
    """End to end: a pinned baseline whose median is known only loosely (a wide interval) cannot show the new run
    is within 10% of it, nor that it is beyond: the run succeeds (exit 0), and console, JUnit and Markdown say the
    gate was inconclusive."""
    (tmp_path / "m.py").write_text((REPO / "examples" / "models" / "tiny_mlp.py").read_text())
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE % "")
    trtflow("run", str(recipe), cwd=tmp_path)
    trtflow("baseline", "save", str(recipe), cwd=tmp_path)
    path = tmp_path / "baselines" / "pinned.json"
    document = json.loads(path.read_text())
    (point,) = document["nodes"]["bench"]["points"]
    median = point["latency_ms"]["p50"]
    point["latency_ci_ms"]["p50"] = [median / 20, median * 20]  # a baseline measured on a very noisy day
    point["throughput_ci_qps"] = [point["throughput_qps"] / 20, point["throughput_qps"] * 20]
    path.write_text(json.dumps(document))

    recipe.write_text(RECIPE % ",\n             baseline: baselines/pinned.json")
    env_store = ("--store", str(tmp_path / "fresh"))  # measured again, against the baseline
    ran = trtflow("run", str(recipe), *env_store, cwd=tmp_path)
    assert "gate inconclusive" in ran.stdout and "too noisy to tell" in ran.stdout
    junit = trtflow("report", str(recipe), *env_store, "-f", "junit", cwd=tmp_path).stdout
    assert 'failures="0"' in junit and '<property name="gate" value="inconclusive"/>' in junit
    assert "gate inconclusive: batch 2: inconclusive: median latency" in junit
    markdown = trtflow("report", str(recipe), *env_store, cwd=tmp_path).stdout
    assert "## Gate verdicts" in markdown and "| bench | baseline baselines/pinned.json | inconclusive |" in markdown
